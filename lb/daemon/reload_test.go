// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// appliedOnReload are the settings of [daemon], [datapath] and [maglev] a
// reload applies; every other one must wait for a restart and be named.
var appliedOnReload = []string{
	"Daemon.MaxFlowMove", "Daemon.WatchConfig",
	"Datapath.Mode", "Datapath.Dispatch", "Datapath.DrainTimeout",
	"Maglev.TableSize",
}

// TestKeepRunningNamesEverySetting changes each setting of [daemon],
// [datapath] and [maglev] alone and checks that a reload either applies it
// (the list above) or keeps the running value and names it as pending a
// restart. A setting added later fails here until keepRunning knows it:
// otherwise a reload would ignore it without saying so.
func TestKeepRunningNamesEverySetting(t *testing.T) {
	const doc = "[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \"5f1c0ffee0ddba11deadbeef00c0ffee\"\n"
	base := mustParse(t, doc)
	for _, section := range []string{"Daemon", "Datapath", "Maglev"} {
		for _, path := range leafFields(reflect.ValueOf(base).Elem().FieldByName(section).Type(), section) {
			if path == "Maglev.DevSeed" {
				continue // follows Seed; not a setting of its own
			}
			t.Run(path, func(t *testing.T) {
				running, cur := mustParse(t, doc), mustParse(t, doc)
				changed := mutate(t, field(reflect.ValueOf(cur).Elem(), path))
				pending := keepRunning(running, cur)
				got := field(reflect.ValueOf(cur).Elem(), path).Interface()
				if slices.Contains(appliedOnReload, path) {
					if len(pending) != 0 || !reflect.DeepEqual(got, changed) {
						t.Errorf("a reload must apply %s: pending %q, value %v, want %v", path, pending, got, changed)
					}
					return
				}
				want := field(reflect.ValueOf(running).Elem(), path).Interface()
				if len(pending) != 1 || !reflect.DeepEqual(got, want) {
					t.Errorf("%s applies only at start: pending %q (want it named once), value after reload %v (want the running %v)", path, pending, got, want)
				}
			})
		}
	}
}

// leafFields lists the paths of the non-struct fields of t.
func leafFields(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		p := prefix + "." + f.Name
		if f.Type.Kind() == reflect.Struct {
			out = append(out, leafFields(f.Type, p)...)
			continue
		}
		out = append(out, p)
	}
	return out
}

func field(v reflect.Value, path string) reflect.Value {
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
	}
	return v
}

// mutate gives v another value of its type and returns it.
func mutate(t *testing.T, v reflect.Value) any {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 0.5)
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
	case reflect.Array:
		e := v.Index(0)
		e.SetUint(e.Uint() + 1)
	default:
		t.Fatalf("cannot change a %s", v.Type())
	}
	return v.Interface()
}

// TestReloadAfterARejectedOne: the parser names the services that changed
// since its previous result, and the merger looks at those alone; after a
// reload that the max_flow_move guard refused, that previous result is not
// what the merger holds. Each step's services must be the file's, whatever
// the parser compared them with.
func TestReloadAfterARejectedOne(t *testing.T) {
	d, path, data := reloadRig(t, 20, "max_flow_move = 0.2\n")
	// Every backend of s000005 on another port: all its flows move.
	at := strings.Index(data, `name = "s000005"`)
	end := at + strings.Index(data[at:], "[[service]]")
	moved := data[:at] + strings.ReplaceAll(data[at:end], "port = 800", "port = 900") + data[end:]
	unguarded := strings.Replace(moved, "max_flow_move = 0.2\n", "", 1)
	// One weight of s000007 too, after the guard is gone.
	at = strings.Index(unguarded, `name = "s000007"`)
	at += strings.Index(unguarded[at:], "weight = 1")
	weighted := unguarded[:at] + "weight = 3" + unguarded[at+len("weight = 1"):]
	port := func(svc string) uint16 { s, _ := d.merger.Service(svc); return s.Backends[0].Addr.Port() }
	weight := func(svc string) uint32 { s, _ := d.merger.Service(svc); return s.Backends[0].Weight }
	steps := []struct {
		name, file string
		rejected   bool
		port       uint16 // of s000005's first backend
		weight     uint32 // of s000007's first backend
	}{
		{"all of one service's flows move", moved, true, 8000, 1},
		{"the guard removed", unguarded, false, 9000, 1},
		{"one weight", weighted, false, 9000, 3},
		{"the first services again", strings.Replace(data, "max_flow_move = 0.2\n", "", 1), false, 8000, 1},
	}
	for _, s := range steps {
		if err := os.WriteFile(path, []byte(s.file), 0o600); err != nil {
			t.Fatal(err)
		}
		err := d.doReload()
		if (err != nil) != s.rejected {
			t.Fatalf("%s: reload error %v, want rejected %t", s.name, err, s.rejected)
		}
		if err := d.run(d.plan.Pass(time.Now())); err != nil {
			t.Fatalf("%s: pass: %v", s.name, err)
		}
		if got, w := port("s000005"), weight("s000007"); got != s.port || w != s.weight {
			t.Errorf("%s: s000005's first backend at port %d, s000007's of weight %d; want %d and %d", s.name, got, w, s.port, s.weight)
		}
	}
}
