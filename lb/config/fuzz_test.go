// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/l4lb/l4lb/lb"
)

// addSeeds feeds the fuzzers every config this package knows about, valid
// and invalid, so mutations start from realistic documents.
func addSeeds(f *testing.F) {
	var paths []string
	for _, pattern := range []string{"testdata/*/*.toml", "../../etc/*.toml", "../../etc/*/*.toml"} {
		m, _ := filepath.Glob(pattern)
		paths = append(paths, m...)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"name":"web","vip":"10.0.0.10","port":80,"protocol":"tcp","backend":[{"address":"10.1.0.11"}]}`))
	f.Add([]byte("service = [{backend = [{}]}]\n[[service.backend]]\n"))
}

// checkResult holds for every input: either a config or an ErrorList of
// located errors, never both, never a panic.
func checkResult(t *testing.T, name string, data []byte, ok bool, err error) {
	t.Helper()
	if ok == (err != nil) {
		t.Fatalf("result and error disagree: ok %t, err %v", ok, err)
	}
	if err == nil {
		return
	}
	var list ErrorList
	if !errors.As(err, &list) || len(list) == 0 {
		t.Fatalf("error is not a non-empty ErrorList: %v", err)
	}
	lines := bytes.Count(data, []byte("\n")) + 1
	for _, e := range list {
		if e.File != name || e.Line < 0 || e.Line > lines || e.Msg == "" {
			t.Fatalf("badly located error (document has %d lines): %#v", lines, e)
		}
	}
}

func FuzzParse(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, dev := range []bool{false, true} {
			cfg, err := Parse("fuzz.toml", data, Options{Dev: dev})
			checkResult(t, "fuzz.toml", data, cfg != nil, err)
		}
	})
}

func FuzzParseService(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		svc, err := ParseService("fuzz", data, lb.Defaults{})
		checkResult(t, "fuzz", data, svc.Name != "", err)
	})
}
