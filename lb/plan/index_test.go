// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// TestUpdateIndexIsFullIndex: over random passes (services added,
// removed, backends changed in address, weight and state; full passes and
// one-service updates), the index a pass updates from the last one is the
// index built from nothing, with the same totals, and the last pass's
// index is never modified.
func TestUpdateIndexIsFullIndex(t *testing.T) {
	seed := maglev.Seed{9}
	rec := reconciler.New(reconciler.Config{Seed: seed, MaxServices: 40, MaxBackends: 400}, reconcilertest.NewFake(), nil)
	rng := rand.New(rand.NewPCG(1, 2))
	desired := map[int]lb.Service{}
	var idx Index
	for pass := range 200 {
		for range rng.IntN(3) + 1 {
			i := rng.IntN(30)
			if rng.IntN(4) == 0 {
				delete(desired, i)
				continue
			}
			s := lb.Service{Name: fmt.Sprintf("s%d", i), Frontend: lb.Frontend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), Port: 80, Proto: lb.TCP},
				Mode: lb.ModeSNAT, TableSize: 13}
			for j := range rng.IntN(5) {
				s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j + 1)}), 80),
					Weight: uint32(rng.IntN(3)), State: lb.BackendState(rng.IntN(3))})
			}
			desired[i] = s
		}
		var list []lb.Service
		for i := range 30 {
			if s, ok := desired[i]; ok {
				list = append(list, s)
			}
		}
		if err := rec.Reconcile(list); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		changed, gone := rec.Changes()
		before := deref(idx)
		next := updateIndex(idx, seed, changed, gone, list)
		if !reflect.DeepEqual(deref(idx), before) {
			t.Fatalf("pass %d: the last pass's index was modified", pass)
		}
		full := updateIndex(Index{}, seed, rec.Programmed().Services, nil, list)
		if got, want := deref(next), deref(full); !reflect.DeepEqual(got, want) {
			t.Fatalf("pass %d: updated index differs from the full one:\n%v\n%v", pass, got, want)
		}
		if next.Services != full.Services || next.Backends != full.Backends || next.Tables != full.Tables {
			t.Fatalf("pass %d: updated totals %d/%d/%d, full %d/%d/%d", pass, next.Services, next.Backends, next.Tables, full.Services, full.Backends, full.Tables)
		}
		idx = next
	}
}

// deref copies an index's entries, to see later whether any was modified.
func deref(idx Index) map[lb.Frontend]Programmed {
	out := map[lb.Frontend]Programmed{}
	for fe, ps := range idx.byFrontend.All() {
		out[fe] = *ps
	}
	return out
}

// TestProgrammedMoved: a pass over a few services hands the Kubernetes
// source a new programmed set exactly when one of them gained or lost
// its entry and table.
func TestProgrammedMoved(t *testing.T) {
	fe := func(i byte) lb.Frontend {
		return lb.Frontend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, i}), Port: 80, Proto: lb.TCP}
	}
	st := func(i byte, entry, table bool) reconciler.ServiceState {
		return reconciler.ServiceState{Service: lb.Service{Frontend: fe(i)}, HasEntry: entry, HasTable: table}
	}
	prev := updateIndex(Index{}, maglev.Seed{}, []reconciler.ServiceState{st(1, true, true), st(2, true, false)}, nil, nil)
	tests := []struct {
		name    string
		changed []reconciler.ServiceState
		gone    []lb.Frontend
		want    bool
	}{
		{"still programmed", []reconciler.ServiceState{st(1, true, true)}, nil, false},
		{"lost its table", []reconciler.ServiceState{st(1, true, false)}, nil, true},
		{"got its table", []reconciler.ServiceState{st(2, true, true)}, nil, true},
		{"new and programmed", []reconciler.ServiceState{st(3, true, true)}, nil, true},
		{"new, not yet programmed", []reconciler.ServiceState{st(3, false, true)}, nil, false},
		{"programmed one gone", nil, []lb.Frontend{fe(1)}, true},
		{"unprogrammed one gone", nil, []lb.Frontend{fe(2)}, false},
	}
	for _, tc := range tests {
		if got := programmedMoved(prev, tc.changed, tc.gone); got != tc.want {
			t.Errorf("%s: programmedMoved = %v, want %v", tc.name, got, tc.want)
		}
	}
}
