// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/*.json from the current output")

// TestGolden parses each testdata/golden/*.toml and compares a JSON dump of
// the model with the .json next to it. The dump is generic (reflection), so
// a field added to the model shows up as a diff here and gets reviewed.
// Regenerate with `go test ./lb/config -run TestGolden -update`.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden inputs in testdata/golden")
	}
	for _, in := range files {
		name := strings.TrimSuffix(filepath.Base(in), ".toml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Dev: bytes.HasPrefix(data, []byte("# dev: true\n"))}
			cfg, err := Parse(filepath.ToSlash(in), data, opts)
			if err != nil {
				t.Fatalf("Parse:\n%v", err)
			}
			got, err := json.MarshalIndent(dump(reflect.ValueOf(cfg)), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			out := strings.TrimSuffix(in, ".toml") + ".json"
			if *update {
				if err := os.WriteFile(out, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the model; if the change is intended, run with -update.\ngot:\n%s", out, got)
			}
		})
	}
}

// object is a JSON object that keeps the order of its keys, so the dump
// reads in the order of the struct fields.
type object []field

type field struct {
	key string
	val any
}

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.key)
		v, err := json.Marshal(f.val)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// dump turns a model value into JSON-friendly data. Types with a String
// method (addresses, modes, durations, the seed) are shown as their
// string, which is how operators write them.
func dump(v reflect.Value) any {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	switch v.Kind() {
	case reflect.Struct:
		o := object{}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				o = append(o, field{v.Type().Field(i).Name, dump(v.Field(i))})
			}
		}
		return o
	case reflect.Slice, reflect.Array:
		l := make([]any, v.Len())
		for i := range l {
			l[i] = dump(v.Index(i))
		}
		return l
	}
	return v.Interface()
}
