// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// small returns n services named prefix0.. on 10.0.<net>.1.. with two
// backends each.
func small(prefix string, net byte, n int) []lb.Service {
	var out []lb.Service
	for i := range n {
		out = append(out, svc(fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("10.0.%d.%d", net, i+1), 80,
			be(fmt.Sprintf("10.%d.%d.1:80", 100+net, i)), be(fmt.Sprintf("10.%d.%d.2:80", 100+net, i))))
	}
	return out
}

// A pass that removes and adds many services pays for one table batch per
// phase; a datapath without batches gets the same calls one by one.
func TestBatchOnePerPhase(t *testing.T) {
	before := small("old", 1, 6)
	after := append([]lb.Service{
		edit(before[0], func(s *lb.Service) { s.Backends = append(s.Backends, be("10.200.0.1:80")) }),
		before[5],
	}, small("new", 2, 3)...)
	want := map[mode][]string{
		batched: {
			"DeleteService*4", "DeleteTables(4 entries)", "DeleteBackend*8",
			"SetBackend*7", "SetTables(4 entries)", "SetService*3",
		},
		unbatched: {
			"DeleteService*4", "DeleteTable*4", "DeleteBackend*8",
			"SetBackend*7", "SetTable*4", "SetService*3",
		},
	}
	ops := map[mode][]reconcilertest.Op{}
	dumps := map[mode]string{}
	for _, m := range modes {
		r, f := newFixtureMode(t, testConfig(), m)
		if err := r.Reconcile(cloneAll(before)); err != nil {
			t.Fatal(err)
		}
		f.ResetOps()
		if err := r.Reconcile(cloneAll(after)); err != nil {
			t.Fatal(err)
		}
		ops[m], dumps[m] = f.Ops(), f.Dump()
		if diff := cmp.Diff(want[m], shape(ops[m])); diff != "" {
			t.Errorf("%s: op log shape (-want +got):\n%s", m, diff)
		}
		if err := f.CheckInvariants(); err != nil {
			t.Errorf("%s: %v", m, err)
		}
		checkView(t, r, f)
		checkTables(t, after, r, f)
		checkHolds(t, after, r, f)
	}
	if diff := cmp.Diff(shortOps(flat(ops[batched])), shortOps(ops[unbatched])); diff != "" {
		t.Errorf("unbatched ops are not the batched ones taken apart (-batched +unbatched):\n%s", diff)
	}
	if diff := cmp.Diff(dumps[batched], dumps[unbatched]); diff != "" {
		t.Errorf("final datapath (-batched +unbatched):\n%s", diff)
	}
}

// The kernel stops a batch at the first entry it cannot apply. The
// services before it go on to their entries; the others stop, keep what
// they had, and are retried, again in one batch.
func TestBatchStopsPartWay(t *testing.T) {
	before := small("old", 1, 4)
	after := small("new", 2, 4)
	r, f := newFixture(t, testConfig())
	if err := r.Reconcile(cloneAll(before)); err != nil {
		t.Fatal(err)
	}
	f.ResetOps()
	refused := errors.New("E2BIG")
	f.FailOn(func(op reconcilertest.Op) error {
		if (op.Kind == reconcilertest.OpSetTable || op.Kind == reconcilertest.OpDeleteTable) && op.Batch >= 3 {
			return refused
		}
		return nil
	})
	err := r.Reconcile(cloneAll(after))
	if err == nil {
		t.Fatal("Reconcile succeeded with batch entries failing")
	}
	for _, want := range []string{
		`service "old2": DeleteTables entry 3 of 4 (id 3): E2BIG; the next reconcile retries`,
		`service "old3": DeleteTables entry 4 of 4 (id 4): E2BIG; the next reconcile retries`,
		`service "new2": SetTables entry 3 of 4 (id 7, 7 slots): E2BIG; the next reconcile retries`,
		`service "new3": SetTables entry 4 of 4 (id 8, 7 slots): E2BIG; the next reconcile retries`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 4 {
		t.Errorf("error joins %d errors, want one per failed service (4):\n%s", n, err)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	checkView(t, r, f)
	// new0 and new1 serve; new2 and new3 have backends only; old2 and old3
	// lost their entries but keep tables and backends.
	st := map[string]reconciler.ServiceState{}
	for _, s := range r.Programmed().Services {
		st[s.Service.Name] = s
	}
	for name, want := range map[string]string{
		"new0": "entry table 2", "new1": "entry table 2",
		"new2": "2", "new3": "2",
		"old2": "table 2", "old3": "table 2",
	} {
		s, ok := st[name]
		if !ok {
			t.Errorf("%s not programmed", name)
			continue
		}
		var got []string
		if s.HasEntry {
			got = append(got, "entry")
		}
		if s.HasTable {
			got = append(got, "table")
		}
		got = append(got, fmt.Sprint(len(s.Backends)))
		if g := strings.Join(got, " "); g != want {
			t.Errorf("%s holds %q, want %q", name, g, want)
		}
	}
	if len(st) != 6 {
		t.Errorf("programmed %d services, want 6:\n%s", len(st), f.Dump())
	}

	f.FailOn(nil)
	f.ResetOps()
	if err := r.Reconcile(cloneAll(after)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if diff := cmp.Diff([]string{
		"DeleteTables(2 entries)", "DeleteBackend*4", "SetTables(2 entries)", "SetService*2",
	}, shape(f.Ops())); diff != "" {
		t.Errorf("retry op log shape (-want +got):\n%s", diff)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	checkView(t, r, f)
	checkHolds(t, after, r, f)
	checkTables(t, after, r, f)
}

// A batch that fails as a whole fails every service in it.
func TestBatchFailsWhole(t *testing.T) {
	r, f := newFixture(t, testConfig())
	f.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpSetTables {
			return errors.New("ENOMEM")
		}
		return nil
	})
	err := r.Reconcile([]lb.Service{web, api})
	want := `service "web": SetTables entry 1 of 2 (id 1, 7 slots): ENOMEM; the next reconcile retries` + "\n" +
		`service "api": SetTables entry 2 of 2 (id 2, 7 slots): ENOMEM; the next reconcile retries`
	if err == nil || err.Error() != want {
		t.Fatalf("Reconcile = %v, want %q", err, want)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	checkView(t, r, f)
	f.FailOn(nil)
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	checkHolds(t, []lb.Service{web, api}, r, f)
}

// wrongCount answers its first batch with one result too few.
type wrongCount struct {
	*reconcilertest.Fake
	broken bool
}

func (w *wrongCount) SetTables(svcs []reconciler.ServiceID, tables [][]reconciler.BackendID) []error {
	res := w.Fake.SetTables(svcs, tables)
	if !w.broken {
		w.broken = true
		return res[1:]
	}
	return res
}

// A datapath that breaks the one-result-per-entry contract fails every
// entry of that batch rather than making the reconciler guess, and the
// retry completes.
func TestBatchWithWrongResultCount(t *testing.T) {
	f := reconcilertest.NewFake()
	f.CheckEachOp(true)
	r := reconciler.New(testConfig(), &wrongCount{Fake: f}, nil)
	err := r.Reconcile([]lb.Service{web, api})
	if err == nil || strings.Count(err.Error(), "datapath returned 1 results for a batch of 2, so the outcome is unknown") != 2 {
		t.Fatalf("Reconcile = %v, want both services failed with an unknown outcome", err)
	}
	for _, s := range r.Programmed().Services {
		if s.HasEntry {
			t.Errorf("service %s got its entry after its table failed", s.Service.Name)
		}
	}
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	checkHolds(t, []lb.Service{web, api}, r, f)
}

// Very many tables go in chunks, each a batch; a lone table left for the
// last chunk goes through SetTable.
func TestChunks(t *testing.T) {
	desired := small("s", 1, 7)
	tests := []struct {
		name                   string
		tables, slots, entries int
		want                   []string
	}{
		{"by tables", 3, 1 << 30, 1 << 30, []string{
			"SetBackend*6", "SetTables(3 entries)", "SetService*3",
			"SetBackend*6", "SetTables(3 entries)", "SetService*3",
			"SetBackend*2", "SetTable", "SetService",
		}},
		{"by slots", 1 << 30, 14, 1 << 30, []string{ // two 7-slot tables
			"SetBackend*4", "SetTables(2 entries)", "SetService*2",
			"SetBackend*4", "SetTables(2 entries)", "SetService*2",
			"SetBackend*4", "SetTables(2 entries)", "SetService*2",
			"SetBackend*2", "SetTable", "SetService",
		}},
		{"by services", 1 << 30, 1 << 30, 4, []string{
			"SetBackend*8", "SetTables(4 entries)", "SetService*4",
			"SetBackend*6", "SetTables(3 entries)", "SetService*3",
		}},
	}
	ref, fref := newFixture(t, testConfig())
	if err := ref.Reconcile(cloneAll(desired)); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, f := newFixture(t, testConfig())
			r.SetChunkLimits(tt.tables, tt.slots, tt.entries)
			if err := r.Reconcile(cloneAll(desired)); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, shape(f.Ops())); diff != "" {
				t.Errorf("op log shape (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(fref.Dump(), f.Dump()); diff != "" {
				t.Errorf("datapath (-one chunk +several):\n%s", diff)
			}
			checkView(t, r, f)
		})
	}
}

// A service that needs backend ids which an earlier service of the same
// pass releases gets them, as it would if services were programmed one by
// one: running out of ids flushes the chunk first.
func TestChunkFlushesWhenIDsRunOut(t *testing.T) {
	a := svc("a", "10.0.0.1", 80, be("10.1.0.1:80"), be("10.1.0.2:80"))
	b := svc("b", "10.0.0.2", 80, be("10.2.0.1:80"))
	a2 := svc("a", "10.0.0.1", 80, be("10.1.0.3:80"))
	b2 := svc("b", "10.0.0.2", 80, be("10.2.0.1:80"), be("10.2.0.2:80"), be("10.2.0.3:80"))
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 4, MaxBackends: 4}
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			r, f := newFixtureMode(t, cfg, m)
			if err := r.Reconcile([]lb.Service{a, b}); err != nil {
				t.Fatal(err)
			}
			f.ResetOps()
			// a takes the last free id (4) and releases 1 and 2, which b
			// needs.
			if err := r.Reconcile([]lb.Service{a2, b2}); err != nil {
				t.Fatalf("Reconcile = %v, want b to get the ids a released", err)
			}
			if diff := cmp.Diff([]string{
				"SetBackend(4, 10.1.0.3:80 service=1 active)",
				"SetTable(1, 7 slots)",
				"DeleteBackend(1)",
				"DeleteBackend(2)",
				"SetBackend(1, 10.2.0.2:80 service=2 active)",
				"SetBackend(2, 10.2.0.3:80 service=2 active)",
				"SetTable(2, 7 slots)",
			}, shortOps(f.Ops())); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
			if err := f.CheckInvariants(); err != nil {
				t.Error(err)
			}
			checkView(t, r, f)
			checkHolds(t, []lb.Service{a2, b2}, r, f)
		})
	}
}

// The batched and unbatched paths take the same steps through a long walk
// of random desired states: the same calls, batches taken apart, and the
// same datapath after every pass.
func TestBatchedAndUnbatchedAgree(t *testing.T) {
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 16, MaxBackends: 64}
	rb, fb := newFixtureMode(t, cfg, batched)
	ru, fu := newFixtureMode(t, cfg, unbatched)
	rng := rand.New(rand.NewPCG(3, 5))
	batches := 0
	for step := range 300 {
		desired := randomDesired(rng)
		fb.ResetOps()
		fu.ResetOps()
		eb := rb.Reconcile(cloneAll(desired))
		eu := ru.Reconcile(cloneAll(desired))
		if eb != nil || eu != nil {
			t.Fatalf("step %d: batched %v, unbatched %v", step, eb, eu)
		}
		if diff := cmp.Diff(shortOps(flat(fb.Ops())), shortOps(fu.Ops())); diff != "" {
			t.Fatalf("step %d: ops (-batched +unbatched):\n%s", step, diff)
		}
		if diff := cmp.Diff(fb.Dump(), fu.Dump()); diff != "" {
			t.Fatalf("step %d: datapath (-batched +unbatched):\n%s", step, diff)
		}
		for _, op := range fb.Ops() {
			if op.IsBatch() {
				batches++
			}
		}
	}
	if err := errors.Join(fb.CheckInvariants(), fu.CheckInvariants()); err != nil {
		t.Fatal(err)
	}
	if batches < 100 {
		t.Errorf("only %d batches in 300 passes: the walk does not exercise them", batches)
	}
}
