// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// sameAsParse fails t unless p.Parse gave what Parse gives for the same
// input: the same Config, or the same errors in the same order.
func sameAsParse(t *testing.T, p *Parser, name string, data []byte, opts Options) *Config {
	t.Helper()
	got, gotErr := p.Parse(name, data, opts)
	want, wantErr := Parse(name, data, opts)
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
		t.Fatalf("Parser.Parse error:\n%v\nParse error:\n%v", gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parser.Parse and Parse differ (stats %+v):\ngot  %+v\nwant %+v", p.Stats(), got, want)
	}
	return got
}

// TestParserMatchesParse: on every config this repository holds, valid
// and invalid, a Parser's result is Parse's, whether it starts cold or has
// the file's blocks cached already.
func TestParserMatchesParse(t *testing.T) {
	var paths []string
	for _, pattern := range []string{"testdata/*/*.toml", "../../etc/*.toml", "../../etc/*/*.toml"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, m...)
	}
	if len(paths) < 50 {
		t.Fatalf("found %d configs, want the corpus", len(paths))
	}
	for _, path := range paths {
		t.Run(filepath.Base(filepath.Dir(path))+"/"+filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Dev: bytes.Contains(data, []byte("# dev: true\n"))}
			if strings.HasPrefix(string(data), "# want: ") {
				cc := readCorpusCase(t, path, data)
				opts = Options{Dev: cc.dev, Host: cc.host}
			}
			p := NewParser()
			sameAsParse(t, p, path, data, opts)
			sameAsParse(t, p, path, data, opts) // warm
			// The same services after a valid head: the cached blocks
			// must not hide an error the file has.
			sameAsParse(t, p, path, append([]byte(head), data...), Options{Dev: true})
		})
	}
}

// TestParserDecodesOnlyChangedBlocks walks one Parser through the edits
// of an operator's day on a large file and checks, at each, that the
// result is Parse's and how many blocks were decoded again.
func TestParserDecodesOnlyChangedBlocks(t *testing.T) {
	const n = 200
	orig := string(bigConfig(n, 4))
	cases := []struct {
		name    string
		edit    func(string) string
		decoded int  // blocks decoded again
		whole   bool // went through Parse whole
	}{
		{"first parse", func(s string) string { return s }, n, false},
		{"unchanged", func(s string) string { return s }, 0, false},
		{"one service's port", func(s string) string {
			return strings.Replace(s, `name = "svc-100"`+"\nvip = \"10.0.100.1\"\nport = 80", `name = "svc-100"`+"\nvip = \"10.0.100.1\"\nport = 81", 1)
		}, 1, false},
		// Each edit is of the original: svc-100 is back on port 80,
		// which the cache no longer holds.
		{"a comment in the head", func(s string) string { return "# edited\n" + s }, 1, false},
		{"the service defaults", func(s string) string {
			return strings.Replace(s, "[maglev]\n", "[maglev]\ntable_size = 1021\n", 1)
		}, n, false},
		{"back to the original", func(s string) string { return s }, n, false},
		{"an error in one service", func(s string) string {
			return strings.Replace(s, `name = "svc-7"`, `name = "svc 7"`, 1)
		}, n, true},
		{"the error undone", func(s string) string { return s }, 0, false},
		{"two services with one name", func(s string) string {
			return strings.Replace(s, `name = "svc-8"`, `name = "svc-9"`, 1)
		}, n, true},
		{"a table after the services", func(s string) string { return s + "\n[l2]\n" }, n, true},
		{"services removed", func(s string) string {
			i := strings.Index(s, "\n[[service]]\nname = \"svc-150\"")
			return s[:i+1]
		}, 0, false},
	}
	p := NewParser()
	for _, c := range cases {
		data := []byte(c.edit(orig))
		sameAsParse(t, p, "big.toml", data, Options{})
		st := p.Stats()
		if st.Whole != c.whole || (!c.whole && st.Decoded != c.decoded) {
			t.Errorf("%s: stats %+v, want %d decoded, whole %t", c.name, st, c.decoded, c.whole)
		}
	}
}

// TestParserConfigsShareNothing: a caller changing a Config it got must
// not change what the next parse returns.
func TestParserConfigsShareNothing(t *testing.T) {
	data := bigConfig(3, 2)
	p := NewParser()
	a, err := p.Parse("f.toml", data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a.Services[1].Backends[0].Weight = 99
	a.Services[1].Name = "changed"
	sameAsParse(t, p, "f.toml", data, Options{})
}

// TestSplitServices checks where a file is cut, and which files are not.
func TestSplitServices(t *testing.T) {
	cases := []struct {
		name   string
		doc    string
		blocks int
		why    string
	}{
		{"no services", "[daemon]\nbpffs = \"/x\"\n", 0, ""},
		{"two services", "a = 1\n[[service]]\nname = \"a\"\n[[service.backend]]\n  [service.health]\n[[service]] # b\n", 2, ""},
		{"indented header", "  [[service]]\n\t[[service]]\r\n", 2, ""},
		{"in a value or comment", "x = \"[[service]]\"\n# [[service]]\n", 0, ""},
		{"multi-line string", "[[service]]\nname = \"\"\"a\n[[service]]\"\"\"\n", 0, "multi-line"},
		{"another table after", "[[service]]\n[daemon]\n", 0, "other than a service's"},
		{"spelled otherwise", "[[ service ]]\n", 0, "another way"},
	}
	for _, c := range cases {
		head, blocks, why := splitServices([]byte(c.doc))
		if c.why != "" {
			if !strings.Contains(why, c.why) {
				t.Errorf("%s: why %q, want %q", c.name, why, c.why)
			}
			continue
		}
		if why != "" || len(blocks) != c.blocks {
			t.Errorf("%s: %d blocks (%q), want %d", c.name, len(blocks), why, c.blocks)
			continue
		}
		// The pieces are the file, in order.
		joined := string(head)
		for _, b := range blocks {
			joined += string(b)
			if !isServiceHeader(bytes.TrimLeft(b, " \t")) {
				t.Errorf("%s: block %q does not start at its header", c.name, b)
			}
		}
		if joined != c.doc {
			t.Errorf("%s: pieces %q do not make up the file", c.name, joined)
		}
	}
}

// FuzzParser: on any input, a Parser, cold and then warm, returns what
// Parse returns.
func FuzzParser(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		p := NewParser()
		sameAsParse(t, p, "fuzz.toml", data, Options{Dev: true})
		sameAsParse(t, p, "fuzz.toml", data, Options{Dev: true})
		sameAsParse(t, p, "fuzz.toml", append([]byte(head), data...), Options{Dev: true})
	})
}

// TestParserNamesChanges walks one Parser through edits, each of the last
// valid file, and checks what it says changed since its previous valid
// result: the services it names, and that every service it does not name
// is the previous result's, at the same position. Edits that break a rule
// across services, with a changed service on one side and an unchanged one
// on the other, must give Parse's errors.
func TestParserNamesChanges(t *testing.T) {
	const n = 40
	svc := func(i int) string { return fmt.Sprintf("name = \"svc-%d\"\nvip = \"10.0.%d.1\"\nport = 80\n", i, i) }
	replace := func(old, new string) func(string) string {
		return func(s string) string {
			if !strings.Contains(s, old) {
				t.Fatalf("edit: %q is not in the file", old)
			}
			return strings.Replace(s, old, new, 1)
		}
	}
	cases := []struct {
		name    string
		edit    func(string) string
		invalid bool
		since   bool     // Since is the previous valid result
		changed []string // when since
	}{
		{"first parse", func(s string) string { return s }, false, false, nil},
		{"unchanged", func(s string) string { return s }, false, true, []string{}},
		{"one backend's weight", replace(svc(10)+"protocol = \"tcp\"\n[service.health]\ntype = \"tcp\"\n[[service.backend]]\naddress = \"172.16.0.1\"\nweight = 1",
			svc(10)+"protocol = \"tcp\"\n[service.health]\ntype = \"tcp\"\n[[service.backend]]\naddress = \"172.16.0.1\"\nweight = 7"), false, true, []string{"svc-10"}},
		{"two services' ports", func(s string) string {
			s = replace(svc(3), strings.Replace(svc(3), "port = 80", "port = 81", 1))(s)
			return replace(svc(30), strings.Replace(svc(30), "port = 80", "port = 81", 1))(s)
		}, false, true, []string{"svc-3", "svc-30"}},
		{"a name an unchanged service has", replace(`name = "svc-5"`, `name = "svc-6"`), true, false, nil},
		{"the previous file again", func(s string) string { return s }, false, true, []string{}},
		{"a second service at a VIP", replace(svc(4), `name = "svc-4"`+"\nvip = \"10.0.3.1\"\nport = 82\n"), false, true, []string{"svc-4"}},
		{"a frontend an unchanged service has", replace(`vip = "10.0.3.1"`+"\nport = 82", `vip = "10.0.3.1"`+"\nport = 81"), true, false, nil},
		{"a backend at an unchanged service's VIP", replace("svc-12\"\nvip = \"10.0.12.1\"\nport = 80\nprotocol = \"tcp\"\n[service.health]\ntype = \"tcp\"\n[[service.backend]]\naddress = \"172.16.0.1\"",
			"svc-12\"\nvip = \"10.0.12.1\"\nport = 80\nprotocol = \"tcp\"\n[service.health]\ntype = \"tcp\"\n[[service.backend]]\naddress = \"10.0.13.1\""), true, false, nil},
		{"a VIP at unchanged services' backend", replace(`vip = "10.0.12.1"`, `vip = "172.16.0.2"`), true, false, nil},
		{"a name moved to another changed service", func(s string) string {
			s = replace(`name = "svc-14"`, `name = "svc-x"`)(s)
			return replace(`name = "svc-15"`, `name = "svc-14"`)(s)
		}, false, true, []string{"svc-x", "svc-14"}},
		{"two services swap places", func(s string) string {
			a, b := strings.Index(s, "[[service]]\n"+svc(20)), strings.Index(s, "[[service]]\n"+svc(21))
			c := b + strings.Index(s[b:], "\n[[service]]") + 1
			return s[:a] + s[b:c] + s[a:b] + s[c:]
		}, false, true, []string{"svc-21", "svc-20"}},
		{"a service removed", func(s string) string { return s[:strings.LastIndex(s, "\n[[service]]")+1] }, false, false, nil},
		{"the service defaults", replace("[maglev]\n", "[maglev]\ntable_size = 1021\n"), false, true, nil},
	}
	cur := string(bigConfig(n, 2))
	p := NewParser()
	var prev *Config
	for _, c := range cases {
		data := c.edit(cur)
		got := sameAsParse(t, p, "f.toml", []byte(data), Options{})
		st := p.Stats()
		if (got == nil) != c.invalid {
			t.Fatalf("%s: valid %t, want %t", c.name, got != nil, !c.invalid)
		}
		if c.invalid {
			continue
		}
		if c.since != (st.Since != nil && st.Since == prev) {
			t.Fatalf("%s: Since is the previous result %t, want %t (stats %+v)", c.name, st.Since == prev, c.since, st)
		}
		if c.since {
			want := c.changed
			if want == nil { // every service
				want = []string{}
				for _, s := range got.Services {
					want = append(want, s.Name)
				}
			}
			if !slices.Equal(st.Changed, want) || st.Changed == nil {
				t.Errorf("%s: changed %q, want %q", c.name, st.Changed, want)
			}
			for i, s := range got.Services {
				if !slices.Contains(st.Changed, s.Name) && !reflect.DeepEqual(s, prev.Services[i]) {
					t.Errorf("%s: service %d (%s) is not named changed but differs from the previous result's %s", c.name, i, s.Name, prev.Services[i].Name)
				}
			}
		}
		cur, prev = data, got
	}
}
