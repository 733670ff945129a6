// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// ids maps each programmed service name to its id and its backends'.
func ids(r *reconciler.Reconciler) map[string]string {
	out := make(map[string]string)
	for _, s := range r.Programmed().Services {
		v := fmt.Sprintf("svc=%d", s.ID)
		for _, b := range s.Backends {
			v += fmt.Sprintf(" %s=%d", b.Addr, b.ID)
		}
		out[s.Service.Name] = v
	}
	return out
}

func one(name, vip, backend string) lb.Service { return svc(name, vip, 80, be(backend)) }

func TestIDReuseIsFIFO(t *testing.T) {
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 4, MaxBackends: 4}
	r, f := newFixture(t, cfg)
	s1 := one("s1", "10.0.0.1", "10.1.0.1:80")
	s2 := one("s2", "10.0.0.2", "10.1.0.2:80")
	s3 := one("s3", "10.0.0.3", "10.1.0.3:80")
	s4 := one("s4", "10.0.0.4", "10.1.0.4:80")
	s5 := one("s5", "10.0.0.5", "10.1.0.5:80")
	s6 := one("s6", "10.0.0.6", "10.1.0.6:80")
	steps := [][]lb.Service{
		{s1, s2, s3, s4},
		{s1, s2, s4}, // releases 3 first
		{s2, s4},     // then 1
		{s2, s4, s5}, // takes 3, the oldest release
		{s2, s4, s5, s6},
	}
	for i, st := range steps {
		if err := r.Reconcile(st); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	want := map[string]string{
		"s2": "svc=2 10.1.0.2:80=2",
		"s4": "svc=4 10.1.0.4:80=4",
		"s5": "svc=3 10.1.0.5:80=3",
		"s6": "svc=1 10.1.0.6:80=1",
	}
	if diff := cmp.Diff(want, ids(r)); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// Ids never used come before released ones, so a released id waits for the
// whole space to be used once.
func TestReleasedIDWaitsBehindFreshOnes(t *testing.T) {
	r, _ := newFixture(t, testConfig())
	a := one("a", "10.0.0.1", "10.1.0.1:80")
	b := one("b", "10.0.0.2", "10.1.0.2:80")
	c := one("c", "10.0.0.3", "10.1.0.3:80")
	for i, st := range [][]lb.Service{{a, b}, {b}, {b, c}} {
		if err := r.Reconcile(st); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if got := ids(r)["c"]; got != "svc=3 10.1.0.3:80=3" {
		t.Errorf("c got %q, want fresh ids 3 and 3", got)
	}
}

func TestIDsStable(t *testing.T) {
	r, _ := newFixture(t, testConfig())
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	before := ids(r)
	changed := edit(web, func(s *lb.Service) {
		s.Backends = []lb.Backend{weighted(s.Backends[1], 3), be("10.1.0.7:80")}
		s.Mode = lb.ModeDSR
	})
	if err := r.Reconcile([]lb.Service{svc("new", "10.0.0.0", 80, be("10.9.0.1:80")), changed, api}); err != nil {
		t.Fatal(err)
	}
	after := ids(r)
	if after["api"] != before["api"] {
		t.Errorf("api ids changed: %s -> %s", before["api"], after["api"])
	}
	if want := "svc=1 10.1.0.2:80=2 10.1.0.7:80=5"; after["web"] != want { // "new" sorts first and takes 4
		t.Errorf("web ids %s, want %s (kept backend keeps id 2)", after["web"], want)
	}
}

func TestIDExhaustion(t *testing.T) {
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 3, MaxBackends: 5}
	a := svc("a", "10.0.0.1", 80, be("10.1.0.1:80"), be("10.1.0.2:80"))
	b := svc("b", "10.0.0.2", 80, be("10.2.0.1:80"), be("10.2.0.2:80"))
	c := svc("c", "10.0.0.3", 80, be("10.3.0.1:80"), be("10.3.0.2:80"), be("10.3.0.3:80"))
	d := svc("d", "10.0.0.4", 80, be("10.4.0.1:80"))

	r, f := newFixture(t, cfg)
	err := r.Reconcile([]lb.Service{c, b, a})
	const full = `service "c": backend map full (max_backends = 5); raise datapath.max_backends`
	if err == nil || err.Error() != full {
		t.Fatalf("Reconcile = %v, want %q", err, full)
	}
	if got := ids(r); len(got) != 2 || got["a"] == "" || got["b"] == "" {
		t.Fatalf("programmed %v, want a and b", got)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Fatal(err)
	}

	// An update that needs more ids is refused too; b keeps serving as is.
	bigger := edit(b, func(s *lb.Service) { s.Backends = append(s.Backends, be("10.2.0.3:80"), be("10.2.0.4:80")) })
	dumpBefore := f.Dump()
	err = r.Reconcile([]lb.Service{a, bigger})
	if want := `service "b": backend map full (max_backends = 5); raise datapath.max_backends`; err == nil || err.Error() != want {
		t.Fatalf("Reconcile = %v, want %q", err, want)
	}
	if got := f.Dump(); got != dumpBefore {
		t.Errorf("refused update changed the datapath:\n%s", got)
	}

	// Removing a in the same pass makes room: removals run first.
	if err := r.Reconcile([]lb.Service{b, c}); err != nil {
		t.Fatalf("Reconcile after freeing ids: %v", err)
	}
	if got := ids(r); len(got) != 2 || got["c"] == "" {
		t.Fatalf("programmed %v, want b and c", got)
	}

	// Service ids run out the same way.
	r2, _ := newFixture(t, reconciler.Config{Seed: testSeed, MaxServices: 2, MaxBackends: 100})
	err = r2.Reconcile([]lb.Service{a, b, d})
	if want := `service "d": service map full (max_services = 2); raise datapath.max_services`; err == nil || err.Error() != want {
		t.Fatalf("Reconcile = %v, want %q", err, want)
	}
}

// randomDesired returns a random small desired state over a fixed pool of
// frontends and backend addresses, so consecutive states overlap.
func randomDesired(rng *rand.Rand) []lb.Service {
	var out []lb.Service
	for i := range 6 {
		if rng.IntN(4) == 0 {
			continue
		}
		s := svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.0.0.%d", i+1), 80)
		s.TableSize = []uint32{7, 11, 13}[rng.IntN(3)]
		s.Mode = []lb.Mode{lb.ModeSNAT, lb.ModeDSR}[rng.IntN(2)]
		for j := range 5 {
			if rng.IntN(3) == 0 {
				continue
			}
			b := be(fmt.Sprintf("10.1.%d.%d:80", i, j))
			b.Weight = uint32(rng.IntN(3))
			b.State = lb.BackendState(rng.IntN(3))
			s.Backends = append(s.Backends, b)
		}
		rng.Shuffle(len(s.Backends), func(a, b int) { s.Backends[a], s.Backends[b] = s.Backends[b], s.Backends[a] })
		out = append(out, s)
	}
	rng.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

// checkHolds fails unless the fake holds exactly desired: one entry per
// service, the non-disabled backends with their states, and tables that an
// independent build produces.
func checkHolds(t *testing.T, desired []lb.Service, r *reconciler.Reconciler, f interface{ State() reconciler.State }) {
	t.Helper()
	got := make(map[string]string)
	for _, s := range f.State().Services {
		if !s.HasEntry {
			t.Errorf("service id %d without entry left behind", s.ID)
			continue
		}
		v := fmt.Sprintf("%s size=%d", s.Service.Mode, s.Service.TableSize)
		for _, b := range s.Backends {
			v += fmt.Sprintf(" %s:%s", b.Addr, b.State)
		}
		got[s.Service.Frontend.String()] = v
	}
	want := make(map[string]string)
	for _, d := range desired {
		v := fmt.Sprintf("%s size=%d", d.Mode, d.TableSize)
		bs := slices.Clone(d.Backends)
		slices.SortFunc(bs, func(a, b lb.Backend) int { return a.Addr.Compare(b.Addr) })
		for _, b := range bs {
			v += fmt.Sprintf(" %s:%s", b.Addr, b.State)
		}
		want[d.Frontend.String()] = v
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("datapath content (-desired +datapath):\n%s", diff)
	}
}

// A long random walk through desired states, with random operation
// failures on some passes: the rules hold after every operation, the view
// matches the datapath after every pass, ids of what persists never change,
// and a clean pass always converges to the desired state. It runs with and
// without batched table swaps; with them, failures hit whole batches and
// single entries.
func TestRandomWalk(t *testing.T) {
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) { testRandomWalk(t, m) })
	}
}

func testRandomWalk(t *testing.T, m mode) {
	rng := rand.New(rand.NewPCG(7, 11))
	r, f := newFixtureMode(t, reconciler.Config{Seed: testSeed, MaxServices: 16, MaxBackends: 64}, m)
	prev := map[string]reconciler.BackendID{}
	prevSvc := map[lb.Frontend]reconciler.ServiceID{}
	for step := range 400 {
		desired := randomDesired(rng)
		if rng.IntN(3) == 0 {
			rate := rng.IntN(4) + 1
			f.FailOn(func(op reconcilertest.Op) error {
				if rng.IntN(rate+1) == 0 {
					return fmt.Errorf("random failure")
				}
				return nil
			})
			_ = r.Reconcile(cloneAll(desired))
			f.FailOn(nil)
			if err := f.CheckInvariants(); err != nil {
				t.Fatalf("step %d, after failures: %v", step, err)
			}
			checkView(t, r, f)
		}
		if err := r.Reconcile(cloneAll(desired)); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if err := f.CheckInvariants(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		checkView(t, r, f)
		checkHolds(t, desired, r, f)
		checkTables(t, desired, r, f)

		cur := map[string]reconciler.BackendID{}
		curSvc := map[lb.Frontend]reconciler.ServiceID{}
		for _, s := range r.Programmed().Services {
			curSvc[s.Service.Frontend] = s.ID
			if old, ok := prevSvc[s.Service.Frontend]; ok && old != s.ID {
				t.Errorf("step %d: service %s changed id %d -> %d", step, s.Service.Frontend, old, s.ID)
			}
			for _, b := range s.Backends {
				k := s.Service.Frontend.String() + " " + b.Addr.String()
				cur[k] = b.ID
				if old, ok := prev[k]; ok && old != b.ID {
					t.Errorf("step %d: backend %s changed id %d -> %d", step, k, old, b.ID)
				}
			}
		}
		prev, prevSvc = cur, curSvc
		if t.Failed() {
			t.Fatalf("stopping at step %d", step)
		}
	}
}
