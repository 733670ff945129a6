// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// TestUpdate checks the partial pass: Update programs the services it is
// given exactly as a Reconcile of the whole set with them would, issues no
// operation for any other service, and refuses what only a full pass may
// decide (a new or renamed service, a duplicate frontend).
func TestUpdate(t *testing.T) {
	a := svc("a", "10.0.0.1", 80, be("10.1.0.1:80"), be("10.1.0.2:80"), be("10.1.0.3:80"))
	b := svc("b", "10.0.0.2", 80, be("10.1.0.4:80"), be("10.1.0.5:80"))
	c := svc("c", "10.0.0.3", 80, be("10.1.0.6:80"))
	drained := edit(a, func(s *lb.Service) { s.Backends[1] = inState(s.Backends[1], lb.Draining) })
	reweighted := edit(b, func(s *lb.Service) { s.Backends[0] = weighted(s.Backends[0], 5) })

	tests := []struct {
		name    string
		update  []lb.Service
		want    []lb.Service // the desired set the update amounts to
		wantErr string       // substring; "" for none
	}{
		{name: "one service changed", update: []lb.Service{drained}, want: []lb.Service{drained, b, c}},
		{name: "two services changed", update: []lb.Service{reweighted, drained}, want: []lb.Service{drained, reweighted, c}},
		{name: "unchanged costs nothing", update: []lb.Service{b}, want: []lb.Service{a, b, c}},
		{name: "new service refused", update: []lb.Service{svc("d", "10.0.0.4", 80, be("10.1.0.7:80"))}, want: []lb.Service{a, b, c},
			wantErr: `service "d" (10.0.0.4:80/tcp): not programmed under this name`},
		{name: "renamed service refused", update: []lb.Service{edit(b, func(s *lb.Service) { s.Name = "b2" })}, want: []lb.Service{a, b, c},
			wantErr: `service "b2"`},
		{name: "duplicate frontend refused", update: []lb.Service{drained, edit(a, func(s *lb.Service) { s.Name = "a2" })}, want: []lb.Service{drained, b, c},
			wantErr: `frontend 10.0.0.1:80/tcp is already claimed by service "a"`},
	}
	for _, m := range modes {
		for _, tc := range tests {
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				r, f := newFixtureMode(t, testConfig(), m)
				if err := r.Reconcile(cloneAll([]lb.Service{a, b, c})); err != nil {
					t.Fatal(err)
				}
				r.Changes()
				f.ResetOps()
				err := r.Update(cloneAll(tc.update))
				switch {
				case tc.wantErr == "" && err != nil:
					t.Fatalf("Update: %v", err)
				case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
					t.Fatalf("Update: %v, want an error containing %q", err, tc.wantErr)
				}
				// Only the services whose definition changed were written.
				touched := map[reconciler.ServiceID]bool{}
				ids := map[lb.Frontend]reconciler.ServiceID{}
				for _, s := range r.Programmed().Services {
					ids[s.Service.Frontend] = s.ID
				}
				changed := map[reconciler.ServiceID]bool{}
				for _, s := range tc.want {
					for _, o := range []lb.Service{a, b, c} {
						if o.Frontend == s.Frontend && !sameDefinition(o, s) {
							changed[ids[s.Frontend]] = true
						}
					}
				}
				for _, op := range f.Ops() {
					if op.Service != 0 {
						touched[op.Service] = true
					}
				}
				for id := range touched {
					if !changed[id] {
						t.Errorf("Update wrote service id %d, which it was not asked to change: %v", id, shortOps(f.Ops()))
					}
				}
				checkView(t, r, f)
				checkTables(t, tc.want, r, f)

				// A full pass over the set the update amounts to has
				// nothing left to do, and the view reports exactly the
				// changed services.
				states, gone := r.Changes()
				if len(states) != len(changed) || len(gone) != 0 {
					t.Errorf("Changes after Update reports %d changed services and %v gone, want %d changed", len(states), gone, len(changed))
				}
				f.ResetOps()
				if err := r.Reconcile(cloneAll(tc.want)); err != nil {
					t.Fatal(err)
				}
				if ops := f.Ops(); len(ops) != 0 {
					t.Errorf("a full pass after Update still wrote %v", shortOps(ops))
				}
			})
		}
	}
}

// sameDefinition reports whether two services of the test program alike.
func sameDefinition(a, b lb.Service) bool {
	if a.Name != b.Name || len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		if a.Backends[i] != b.Backends[i] {
			return false
		}
	}
	return true
}
