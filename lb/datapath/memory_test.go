// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/datapath"
)

// memlock is the kernel's own charge for a map: `memlock:` in its fdinfo.
func memlock(t *testing.T, fd int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "memlock:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no memlock in fdinfo %d:\n%s", fd, b)
	return 0
}

// TestEstimateMemory compares the estimate with what the kernel charges for
// the maps Load creates: within 10% for every preallocated map, and never
// below it for the maps that allocate on insert (empty at load).
func TestEstimateMemory(t *testing.T) {
	testnet.RequireRoot(t)
	cfg := datapath.Config{Seed: testSeed, MaxServices: 512, MaxBackends: 4096, ConntrackMax: 1 << 17, SNATMax: 1 << 16}
	est, err := datapath.EstimateMemory(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := datapath.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	maps := d.Maps()
	var sumEst, sumKernel uint64
	for _, e := range est {
		if e.Name == "conntrack filters" {
			// Inner maps, not in the collection: two of
			// ctFilterWords(1<<17) = 16384 words.
			if e.Bytes < 2*16384*8 {
				t.Errorf("conntrack filters: estimate %d, below two filters of 16384 words", e.Bytes)
			}
			continue
		}
		m, ok := maps[e.Name]
		if !ok {
			t.Errorf("estimated map %s is not loaded", e.Name)
			continue
		}
		got := memlock(t, m.FD())
		t.Logf("%-14s estimate %10d kernel %10d prealloc %v", e.Name, e.Bytes, got, e.Prealloc)
		if e.Prealloc {
			sumEst += e.Bytes
			sumKernel += got
			if lo, hi := got*9/10, got*11/10+4096; e.Bytes < lo || e.Bytes > hi {
				t.Errorf("%s: estimate %d, kernel charges %d: more than 10%% off", e.Name, e.Bytes, got)
			}
		} else if e.Bytes < got {
			t.Errorf("%s: estimate %d for a full map is below the kernel's %d for an empty one", e.Name, e.Bytes, got)
		}
	}
	for name := range maps {
		found := strings.HasPrefix(name, ".")
		for _, e := range est {
			found = found || e.Name == name
		}
		if !found {
			t.Errorf("map %s is missing from the estimate", name)
		}
	}
	t.Logf("preallocated maps: estimate %d MiB, kernel %d MiB", sumEst>>20, sumKernel>>20)
}
