// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"reflect"
	"slices"
	"strings"
	"testing"
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
