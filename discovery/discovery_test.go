// SPDX-License-Identifier: Apache-2.0

package discovery

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb"
)

func svc(name, vip string, port uint16) lb.Service {
	return lb.Service{
		Name:     name,
		Frontend: lb.Frontend{Addr: netip.MustParseAddr(vip), Port: port, Proto: lb.TCP},
		Backends: []lb.Backend{{Addr: netip.MustParseAddrPort("10.1.0.1:80"), Weight: 1}},
	}
}

func names(svcs []lb.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Source+"/"+s.Name)
	}
	return out
}

func TestMergerConflicts(t *testing.T) {
	m := NewMerger()
	m.Update(Snapshot{Source: "file", Services: []lb.Service{svc("web", "10.0.0.1", 80), svc("api", "10.0.0.2", 80)}})
	got, conflicts := m.Desired()
	if want := []string{"file/web", "file/api"}; !slices.Equal(names(got), want) || len(conflicts) != 0 {
		t.Fatalf("one source: %v %v", names(got), conflicts)
	}

	// A later source claims web's frontend and api's name: both lose.
	m.Update(Snapshot{Source: "consul", Services: []lb.Service{svc("web2", "10.0.0.1", 80), svc("api", "10.0.0.9", 443), svc("db", "10.0.0.3", 5432)}})
	got, conflicts = m.Desired()
	if want := []string{"file/web", "file/api", "consul/db"}; !slices.Equal(names(got), want) {
		t.Fatalf("services %v, want %v", names(got), want)
	}
	if len(conflicts) != 2 {
		t.Fatalf("conflicts %v, want 2", conflicts)
	}
	var reasons []string
	for _, c := range conflicts {
		reasons = append(reasons, c.Reason)
		if c.Source != "consul" || c.WinnerSource != "file" {
			t.Errorf("conflict %v: the earlier claim (file) must win", c)
		}
	}
	slices.Sort(reasons)
	if !slices.Equal(reasons, []string{"frontend", "name"}) {
		t.Errorf("conflict reasons %v", reasons)
	}
	if s := conflicts[0].String(); !strings.Contains(s, "consul") || !strings.Contains(s, "file") {
		t.Errorf("conflict text %q should name both sources", s)
	}

	// The earlier claim keeps winning even when the sources update again
	// in another order.
	m.Update(Snapshot{Source: "consul", Services: []lb.Service{svc("web2", "10.0.0.1", 80), svc("api", "10.0.0.9", 443), svc("db", "10.0.0.3", 5432)}})
	m.Update(Snapshot{Source: "file", Services: []lb.Service{svc("web", "10.0.0.1", 80), svc("api", "10.0.0.2", 80)}})
	got, _ = m.Desired()
	if want := []string{"file/web", "file/api", "consul/db"}; !slices.Equal(names(got), want) {
		t.Fatalf("after re-updates %v, want %v", names(got), want)
	}

	// When the file drops web, consul's web2 takes the frontend over.
	m.Update(Snapshot{Source: "file", Services: []lb.Service{svc("api", "10.0.0.2", 80)}})
	got, conflicts = m.Desired()
	if want := []string{"consul/web2", "file/api", "consul/db"}; !slices.Equal(names(got), want) || len(conflicts) != 1 {
		t.Fatalf("after release %v %v", names(got), conflicts)
	}

	// Removing a source releases all its claims.
	m.Remove("file")
	got, conflicts = m.Desired()
	if want := []string{"consul/web2", "consul/db", "consul/api"}; !slices.Equal(names(got), want) || len(conflicts) != 0 {
		t.Fatalf("after removing file %v %v", names(got), conflicts)
	}
}

func TestMergerCopiesSnapshots(t *testing.T) {
	m := NewMerger()
	svcs := []lb.Service{svc("web", "10.0.0.1", 80)}
	m.Update(Snapshot{Source: "file", Services: svcs})
	svcs[0].Backends[0].Weight = 7
	svcs[0].Name = "changed"
	got, _ := m.Desired()
	if got[0].Name != "web" || got[0].Backends[0].Weight != 1 {
		t.Fatal("the merger must not share memory with a published snapshot")
	}
	got[0].Backends[0].Weight = 9
	again, _ := m.Desired()
	if again[0].Backends[0].Weight != 1 {
		t.Fatal("Desired must hand out copies")
	}
}

func TestMergerSameFrontendChangedBySameSource(t *testing.T) {
	m := NewMerger()
	m.Update(Snapshot{Source: "a", Services: []lb.Service{svc("web", "10.0.0.1", 80)}})
	m.Update(Snapshot{Source: "b", Services: []lb.Service{svc("other", "10.0.0.2", 80)}})
	m.Desired()
	// Source a moves web to b's frontend: b claimed it first.
	m.Update(Snapshot{Source: "a", Services: []lb.Service{svc("web", "10.0.0.2", 80)}})
	got, conflicts := m.Desired()
	if want := []string{"b/other"}; !slices.Equal(names(got), want) || len(conflicts) != 1 || conflicts[0].Service != "web" {
		t.Fatalf("%v %v", names(got), conflicts)
	}
}

// TestMergerReusesMerge: Desired without a new snapshot in between gives
// the same result from the last merge; Update, Remove and Clone+Update each
// merge again, and the clone's merge leaves the original's alone.
func TestMergerReusesMerge(t *testing.T) {
	m := NewMerger()
	m.Update(Snapshot{Source: "a", Services: []lb.Service{svc("web", "10.0.0.1", 80)}})
	m.Update(Snapshot{Source: "b", Services: []lb.Service{svc("dup", "10.0.0.1", 80), svc("dns", "10.0.0.3", 53)}})
	first, c1 := m.Desired()
	first[0].Backends[0].Weight = 5
	c1[0].Service = "changed"
	second, c2 := m.Desired()
	if !slices.Equal(names(second), []string{"a/web", "b/dns"}) || second[0].Backends[0].Weight != 1 || len(c2) != 1 || c2[0].Service != "dup" {
		t.Fatalf("second Desired: %v %v", names(second), c2)
	}
	if s, ok := m.Service("dns"); !ok || s.Frontend.Port != 53 {
		t.Fatalf("Service(dns) = %v, %t", s, ok)
	}
	if _, ok := m.Service("dup"); ok {
		t.Fatal("Service returned a service left out by a conflict")
	}
	preview := m.Clone()
	preview.Update(Snapshot{Source: "a", Services: nil})
	if got, _ := preview.Desired(); !slices.Equal(names(got), []string{"b/dup", "b/dns"}) {
		t.Fatalf("clone after update: %v", names(got))
	}
	if got, _ := m.Desired(); !slices.Equal(names(got), []string{"a/web", "b/dns"}) {
		t.Fatalf("original after the clone's update: %v", names(got))
	}
	m.Remove("b")
	if got, conflicts := m.Desired(); !slices.Equal(names(got), []string{"a/web"}) || len(conflicts) != 0 {
		t.Fatalf("after Remove: %v %v", names(got), conflicts)
	}
}

// TestMergerChanges updates random sources with random snapshots (backends
// changed, services added, removed, renamed, moved to another frontend,
// colliding across sources) and checks after each that the merge kept up
// in place equals a full merge of the same snapshots, and that Changes
// names every service whose merged definition moved, or says all.
func TestMergerChanges(t *testing.T) {
	for _, collide := range []bool{true, false} {
		t.Run(fmt.Sprintf("collisions=%v", collide), func(t *testing.T) { testMergerChanges(t, collide) })
	}
}

func testMergerChanges(t *testing.T, collide bool) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := NewMerger()
	sources := []string{"a-file", "b-consul", "c-kubernetes"}
	defs := map[string]map[int]lb.Service{}
	for _, src := range sources {
		defs[src] = map[int]lb.Service{}
	}
	prev, _ := m.Desired()
	m.Changes()
	partial, patched := 0, 0
	for step := range 2000 {
		src := sources[rng.IntN(len(sources))]
		var touched []int
		for range 1 + rng.IntN(3) {
			i := rng.IntN(12)
			touched = append(touched, i)
			switch r := rng.IntN(30); {
			case r == 0:
				delete(defs[src], i)
			case r == 1 && collide:
				// Another source's frontend, or a fresh one.
				defs[src][i] = svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.0.0.%d", rng.IntN(30)), 80)
			default:
				s, ok := defs[src][i]
				if !ok {
					s = svc(fmt.Sprintf("%s-s%d", src, i), fmt.Sprintf("10.%d.0.%d", len(src), i), 80)
				}
				s = s.Clone()
				s.Backends = append(s.Backends[:0:0], lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 9, byte(i), byte(rng.IntN(4))}), 80), Weight: uint32(1 + rng.IntN(3))})
				defs[src][i] = s
			}
		}
		var snap []lb.Service
		for i := range 12 {
			if s, ok := defs[src][i]; ok {
				snap = append(snap, s)
			}
		}
		update := Snapshot{Source: src, Services: snap}
		if rng.IntN(2) == 0 {
			// Say which services the step touched, as a source that
			// patches its snapshot does; the merger must take the hint
			// only where it fits.
			update.Changed = []string{}
			for _, i := range touched {
				if s, ok := defs[src][i]; ok {
					update.Changed = append(update.Changed, s.Name)
				}
			}
		}
		m.Update(update)
		changed, all := m.Changes()
		got, gotConflicts := m.Desired()

		full := m.Clone()
		full.fresh = false
		want, wantConflicts := full.Desired()
		// Which of two collisions a conflict reports may depend on the
		// order claims were made in; who is left out may not.
		left := func(cs []Conflict) []string {
			var out []string
			for _, c := range cs {
				out = append(out, c.Source+"/"+c.Service)
			}
			slices.Sort(out)
			return out
		}
		if !slices.EqualFunc(got, want, lb.Service.Equal) || !slices.Equal(left(gotConflicts), left(wantConflicts)) {
			t.Fatalf("step %d (all=%v): the merge kept up in place differs from a full merge:\n%v %v\n%v %v", step, all, names(got), left(gotConflicts), names(want), left(wantConflicts))
		}
		if !all {
			partial++
			if update.Changed != nil {
				patched++
			}
			before := map[string]lb.Service{}
			for _, s := range prev {
				before[s.Name] = s
			}
			for _, s := range got {
				if b, ok := before[s.Name]; (!ok || !b.Equal(s)) && !slices.Contains(changed, s.Name) {
					t.Fatalf("step %d: %s changed but Changes named only %v", step, s.Name, changed)
				}
			}
		}
		prev = got
	}
	if partial == 0 || patched == 0 {
		t.Fatalf("updates kept up in place %d, of them from a hint %d: the test does not exercise it", partial, patched)
	}
	t.Logf("%d of 2000 updates kept up in place, %d of them from a hint", partial, patched)
}
