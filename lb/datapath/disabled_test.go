// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// TestConntrackDisabled checks that a disabled backend gets nothing, not
// even its established flows, while its entry, id and counters stay; that
// State (what a restarted l4lbd adopts) reads it back as disabled; and
// that re-enabling it continues its counters.
func TestConntrackDisabled(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := newEnv(t)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			conns := e.open(t, svc, randomFlows(svc.Frontend, 64, 5))
			onB1 := 0
			for _, c := range conns {
				if c.backend == b[1] {
					onB1++
				}
			}
			if onB1 == 0 {
				t.Fatalf("none of %d flows went to %s: nothing to move", len(conns), b[1])
			}
			e.send(t, svc, randomFlows(svc.Frontend, 64, 5))
			idOf := func() (uint32, bool) {
				for _, entry := range e.state(t, svc.Frontend).Backends {
					if entry.Addr.Addr() == b[1] {
						return uint32(entry.ID), true
					}
				}
				return 0, false
			}
			id, _ := idOf()
			before, err := e.lb.BackendCounters(reconciler.BackendID(id))
			if err != nil || before.Packets == 0 {
				t.Fatalf("no traffic reached %s before the disable (%v)", b[1], err)
			}

			svc.Backends[1].State = lb.Disabled
			e.reconcile(t, svc)
			for _, c := range e.send(t, svc, flowsOf(conns)) {
				if c.backend == b[1] {
					t.Errorf("established flow %+v still goes to disabled backend %s", c.flow, b[1])
				}
			}
			after, ok := idOf()
			if !ok || after != id {
				t.Fatalf("disabled backend %s: id %d (present %v), want it kept at %d", b[1], after, ok, id)
			}
			if got, _ := e.lb.BackendCounters(reconciler.BackendID(id)); got != before {
				t.Errorf("counters of the disabled backend %+v, want them kept at %+v", got, before)
			}
			st, err := e.lb.State()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, s := range st.Services {
				for _, entry := range s.Backends {
					if uint32(entry.ID) == id {
						found = entry.State == lb.Disabled
					}
				}
			}
			if !found {
				t.Errorf("State does not read backend %d back as disabled: %+v", id, st)
			}

			svc.Backends[1].State = lb.Active
			e.reconcile(t, svc)
			if again, _ := idOf(); again != id {
				t.Errorf("re-enabled backend got id %d, want %d", again, id)
			}
			e.send(t, svc, randomFlows(svc.Frontend, 64, 6))
			if got, _ := e.lb.BackendCounters(reconciler.BackendID(id)); got.Packets <= before.Packets {
				t.Errorf("re-enabled backend's counters %+v do not continue from %+v", got, before)
			}
		})
	}
}
