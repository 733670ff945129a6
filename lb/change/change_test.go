// SPDX-License-Identifier: Apache-2.0

package change

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

var (
	seedA = maglev.Seed{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	seedB = maglev.Seed{16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
)

func service(size uint32, backends ...lb.Backend) lb.Service {
	return lb.Service{Name: "web", Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80, Proto: lb.TCP},
		TableSize: size, Backends: backends}
}

func be(n int, weight uint32, st lb.BackendState) lb.Backend {
	return lb.Backend{Addr: netip.MustParseAddrPort(fmt.Sprintf("10.1.0.%d:80", n)), Weight: weight, State: st}
}

func activeBackends(n int) []lb.Backend {
	var out []lb.Backend
	for i := 1; i <= n; i++ {
		out = append(out, be(i, 1, lb.Active))
	}
	return out
}

// simulate sends flows through both tables the way the datapath picks a
// backend (lb/maglev's flow hash and slot) and counts those whose backend
// differs: the oracle Moved must agree with.
func simulate(t *testing.T, old, cur Table, flows int) float64 {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	vip := netip.MustParseAddr("10.0.0.10")
	moved := 0
	for range flows {
		src := netip.AddrFrom4([4]byte{198, 51, byte(r.IntN(256)), byte(r.IntN(256))})
		f := maglev.Flow{Src: src, Dst: vip, SrcPort: uint16(1024 + r.IntN(60000)), DstPort: 80, Proto: 6}
		o := old.Owners[maglev.Slot(maglev.FlowHash(old.Seed, f), uint32(len(old.Owners)))]
		c := cur.Owners[maglev.Slot(maglev.FlowHash(cur.Seed, f), uint32(len(cur.Owners)))]
		if o != c {
			moved++
		}
	}
	return float64(moved) / float64(flows)
}

func TestMovedAgainstFlows(t *testing.T) {
	five := activeBackends(5)
	drained := activeBackends(5)
	drained[2].State = lb.Draining
	heavier := activeBackends(5)
	heavier[0].Weight = 3
	tests := []struct {
		name     string
		old, cur lb.Service
		seeds    [2]maglev.Seed
		exact    float64 // when >= 0, the exact expected share
	}{
		{"unchanged", service(1021, five...), service(1021, five...), [2]maglev.Seed{seedA, seedA}, 0},
		{"one drained", service(1021, five...), service(1021, drained...), [2]maglev.Seed{seedA, seedA}, -1},
		{"one added", service(1021, five...), service(1021, activeBackends(6)...), [2]maglev.Seed{seedA, seedA}, -1},
		{"reweighted", service(1021, five...), service(1021, heavier...), [2]maglev.Seed{seedA, seedA}, -1},
		{"table size", service(1021, five...), service(2039, five...), [2]maglev.Seed{seedA, seedA}, -1},
		{"seed", service(1021, five...), service(1021, five...), [2]maglev.Seed{seedA, seedB}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, err := Build(tt.seeds[0], tt.old)
			if err != nil {
				t.Fatal(err)
			}
			cur, err := Build(tt.seeds[1], tt.cur)
			if err != nil {
				t.Fatal(err)
			}
			got := Moved(old, cur)
			sim := simulate(t, old, cur, 200000)
			t.Logf("moved %s, simulated over 200000 flows %s", Percent(got), Percent(sim))
			if tt.exact >= 0 && got != tt.exact {
				t.Errorf("moved %v, want exactly %v", got, tt.exact)
			}
			// 200000 flows: a standard error below 0.12 points.
			if math.Abs(got-sim) > 0.006 {
				t.Errorf("moved %v but %v of simulated flows changed backend", got, sim)
			}
		})
	}
}

func TestMovedEdges(t *testing.T) {
	full, err := Build(seedA, service(251, activeBackends(3)...))
	if err != nil {
		t.Fatal(err)
	}
	empty := Table{Seed: seedA}
	if m := Moved(full, empty); m != 1 {
		t.Errorf("losing every backend moves %v, want 1", m)
	}
	if m := Moved(empty, full); m != 0 {
		t.Errorf("gaining the first backend moves %v, want 0", m)
	}
}

func TestCompare(t *testing.T) {
	oldSvc := service(251, be(1, 1, lb.Active), be(2, 1, lb.Active), be(3, 1, lb.Active))
	newSvc := service(251, be(1, 2, lb.Active), be(3, 1, lb.Draining), be(4, 1, lb.Active))
	ot, _ := Build(seedA, oldSvc)
	nt, _ := Build(seedA, newSvc)
	gone := service(251, be(9, 1, lb.Active))
	gone.Name = "gone"
	fresh := service(251, be(8, 1, lb.Active))
	fresh.Name = "fresh"
	got := Compare(
		map[string]Side{"web": {oldSvc, ot}, "gone": {gone, Table{}}},
		map[string]Side{"web": {newSvc, nt}, "fresh": {fresh, Table{}}})
	if len(got) != 3 || got[0].Name != "fresh" || got[0].Status != "added" || got[1].Name != "gone" || got[1].Status != "removed" {
		t.Fatalf("got %+v", got)
	}
	w := got[2]
	if w.Status != "changed" || len(w.Added) != 1 || w.Added[0] != be(4, 1, lb.Active).Addr ||
		len(w.Removed) != 1 || w.Removed[0] != be(2, 1, lb.Active).Addr ||
		len(w.Reweighted) != 1 || w.Reweighted[0].New != 2 || len(w.Restated) != 1 || w.Restated[0].New != lb.Draining {
		t.Errorf("web: %+v", w)
	}
	if w.Moved <= 0 || w.Moved >= 1 {
		t.Errorf("web moved %v", w.Moved)
	}
}
