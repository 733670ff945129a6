// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// corpusCase is what an invalid config declares about itself in its header:
//
//	# want: <substring of one expected error>   (one line per expected error)
//	# line: <N>                                  (optional, in want order)
//	# dev: true                                  (optional: Options.Dev)
//	# host-addr: <prefix> <interface>            (optional: an address of the box)
//	# host-file: <path> regular|dir|fifo|socket  (optional: what is at a path)
//	# host-iface: <name>                         (optional: an interface of the box)
//	# host-mode: <octal>                         (optional: the file's own mode)
//
// A host-* line makes the case run with Options.Host holding those facts,
// as l4lbd and `l4lbctl config check` run on a box that has them.
//
// Lines not given with `# line:` come from trailing `# <- error` markers,
// in file order. The number of errors must match the number of wants
// exactly, so spurious errors fail the test as well as missing ones.
type corpusCase struct {
	wants []string
	lines []int
	dev   bool
	host  *Host
}

// corpusHost adds one host-* fact to cc.
func corpusHost(t *testing.T, cc *corpusCase, kind, v string) {
	t.Helper()
	if cc.host == nil {
		cc.host = &Host{}
	}
	f := strings.Fields(v)
	if len(f) != 2 {
		t.Fatalf("host-%s: want two fields, got %q", kind, v)
	}
	switch kind {
	case "addr":
		cc.host.Addresses = append(cc.host.Addresses, HostAddr{Prefix: netip.MustParsePrefix(f[0]), Interface: f[1]})
	case "file":
		modes := map[string]fs.FileMode{"regular": 0, "dir": fs.ModeDir, "fifo": fs.ModeNamedPipe, "socket": fs.ModeSocket}
		mode, ok := modes[f[1]]
		if !ok {
			t.Fatalf("host-file: unknown kind %q", f[1])
		}
		prev := cc.host.Lstat
		cc.host.Lstat = func(p string) (fs.FileMode, bool) {
			if p == f[0] {
				return mode, true
			}
			if prev != nil {
				return prev(p)
			}
			return 0, false
		}
	}
}

func readCorpusCase(t *testing.T, path string, data []byte) corpusCase {
	t.Helper()
	var cc corpusCase
	var markers []int
	for i, l := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(l, "# want: "):
			cc.wants = append(cc.wants, strings.TrimPrefix(l, "# want: "))
		case strings.HasPrefix(l, "# line: "):
			n, err := strconv.Atoi(strings.TrimPrefix(l, "# line: "))
			if err != nil {
				t.Fatalf("%s:%d: bad line header: %v", path, i+1, err)
			}
			cc.lines = append(cc.lines, n)
		case l == "# dev: true":
			cc.dev = true
		case strings.HasPrefix(l, "# host-addr: "):
			corpusHost(t, &cc, "addr", strings.TrimPrefix(l, "# host-addr: "))
		case strings.HasPrefix(l, "# host-mode: "):
			if cc.host == nil {
				cc.host = &Host{}
			}
			m, err := strconv.ParseUint(strings.TrimPrefix(l, "# host-mode: "), 8, 32)
			if err != nil {
				t.Fatalf("%s:%d: bad host-mode: %v", path, i+1, err)
			}
			cc.host.Stat = func(string) (fs.FileMode, bool) { return fs.FileMode(m), true }
		case strings.HasPrefix(l, "# host-iface: "):
			if cc.host == nil {
				cc.host = &Host{}
			}
			cc.host.Interfaces = append(cc.host.Interfaces, strings.TrimPrefix(l, "# host-iface: "))
		case strings.HasPrefix(l, "# host-file: "):
			corpusHost(t, &cc, "file", strings.TrimPrefix(l, "# host-file: "))
		case strings.HasSuffix(l, "# <- error"):
			markers = append(markers, i+1)
		}
	}
	cc.lines = append(cc.lines, markers...)
	if len(cc.wants) == 0 || !strings.HasPrefix(string(data), "# want: ") {
		t.Fatalf("%s: the first line must be `# want: <expected error>`", path)
	}
	if len(cc.lines) != len(cc.wants) {
		t.Fatalf("%s: %d wants but %d lines (# line: or # <- error)", path, len(cc.wants), len(cc.lines))
	}
	return cc
}

func TestInvalidCorpus(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found %d invalid configs, want at least 50", len(files))
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".toml"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cc := readCorpusCase(t, path, data)
			cfg, err := Parse(path, data, Options{Dev: cc.dev, Host: cc.host})
			if err == nil {
				t.Fatalf("Parse succeeded (%d services), want errors %q", len(cfg.Services), cc.wants)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config along with errors")
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error is %T, want ErrorList: %v", err, err)
			}
			if len(list) != len(cc.wants) {
				t.Errorf("got %d errors, want %d:\n%v", len(list), len(cc.wants), err)
			}
			for i, want := range cc.wants {
				prefix := fmt.Sprintf("%s:%d: ", path, cc.lines[i])
				if cc.lines[i] == 0 {
					prefix = path + ": "
				}
				found := false
				for _, e := range list {
					if s := e.Error(); strings.HasPrefix(s, prefix) && strings.Contains(s, want) {
						found = true
						break
					}
				}
				if !found {
					t.Errorf("no error starts with %q and contains %q; got:\n%v", prefix, want, err)
				}
			}
			for i := 1; i < len(list); i++ {
				if list[i].Line < list[i-1].Line {
					t.Errorf("errors not sorted by line:\n%v", err)
					break
				}
			}
		})
	}
}
