// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

var (
	web = svc("web", "10.0.0.1", 80, be("10.1.0.1:80"), be("10.1.0.2:80"))
	api = svc("api", "10.0.0.2", 443, be("10.2.0.1:443"))
)

// With web and api programmed from empty: web is service 1 with backends
// 1 (10.1.0.1) and 2 (10.1.0.2); api is service 2 with backend 3.
//
// Each case runs with and without batched table swaps. want is the sequence
// without batches; with them, the same calls are made except that the
// tables of one phase go in one batch when there are several, and both end
// in the same datapath. The golden files hold the batched sequence.
func TestReconcileSequences(t *testing.T) {
	withWeb := func(fn func(*lb.Service)) []lb.Service { return []lb.Service{edit(web, fn), api} }
	tests := []struct {
		name          string
		before, after []lb.Service
		want          []string
	}{
		{
			name:  "add service",
			after: []lb.Service{web},
			want: []string{
				"SetBackend(1, 10.1.0.1:80 service=1 active)",
				"SetBackend(2, 10.1.0.2:80 service=1 active)",
				"SetTable(1, 7 slots)",
				"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=7)",
			},
		},
		{
			name:  "services in frontend order whatever the input order",
			after: []lb.Service{api, web},
			want: []string{
				"SetBackend(1, 10.1.0.1:80 service=1 active)",
				"SetBackend(2, 10.1.0.2:80 service=1 active)",
				"SetBackend(3, 10.2.0.1:443 service=2 active)",
				"SetTable(1, 7 slots)",
				"SetTable(2, 7 slots)",
				"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=7)",
				"SetService(2, 10.0.0.2:443/tcp mode=snat dispatch=ipip table_size=7)",
			},
		},
		{
			name:   "no change",
			before: []lb.Service{web, api},
			after:  []lb.Service{web, api},
		},
		{
			name:   "control-plane-only fields and spelling change nothing",
			before: []lb.Service{edit(web, func(s *lb.Service) { s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")} }), api},
			after: withWeb(func(s *lb.Service) {
				s.Name = "www"
				s.Source = "consul"
				s.Health = lb.HealthCheck{Type: lb.HealthTCP, Interval: time.Second}
				s.Backends[0], s.Backends[1] = s.Backends[1], s.Backends[0]
				s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.1.1/16"), netip.MustParsePrefix("192.168.0.0/16")}
			}),
		},
		{
			name:   "add backend",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends = append(s.Backends, be("10.1.0.3:80")) }),
			want: []string{
				"SetBackend(4, 10.1.0.3:80 service=1 active)",
				"SetTable(1, 7 slots)",
			},
		},
		{
			name:   "remove backend",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends = s.Backends[:1] }),
			want: []string{
				"SetTable(1, 7 slots)",
				"DeleteBackend(2)",
			},
		},
		{
			name:   "weight change",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends[0].Weight = 3 }),
			want:   []string{"SetTable(1, 7 slots)"},
		},
		{
			name:   "drain",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends[1].State = lb.Draining }),
			want: []string{
				"SetBackend(2, 10.1.0.2:80 service=1 draining)",
				"SetTable(1, 7 slots)",
			},
		},
		{
			name:   "undrain",
			before: withWeb(func(s *lb.Service) { s.Backends[1].State = lb.Draining }),
			after:  []lb.Service{web, api},
			want: []string{
				"SetBackend(2, 10.1.0.2:80 service=1 active)",
				"SetTable(1, 7 slots)",
			},
		},
		{
			name:   "disable keeps the entry marked disabled and its id",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends[1].State = lb.Disabled }),
			want: []string{
				"SetBackend(2, 10.1.0.2:80 service=1 disabled)",
				"SetTable(1, 7 slots)",
			},
		},
		{
			name:   "re-enabled backend keeps its id and counters",
			before: withWeb(func(s *lb.Service) { s.Backends[1].State = lb.Disabled }),
			after:  []lb.Service{web, api},
			want: []string{
				"SetBackend(2, 10.1.0.2:80 service=1 active)",
				"SetTable(1, 7 slots)",
			},
		},
		{
			name:   "weight 0 keeps the entry and leaves the table",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends[1].Weight = 0 }),
			want:   []string{"SetTable(1, 7 slots)"},
		},
		{
			name:   "no eligible backend left",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Backends[0].State = lb.Disabled; s.Backends[1].State = lb.Disabled }),
			want: []string{
				"SetBackend(1, 10.1.0.1:80 service=1 disabled)",
				"SetBackend(2, 10.1.0.2:80 service=1 disabled)",
				"SetTable(1, empty)",
			},
		},
		{
			name:  "new service without eligible backend",
			after: []lb.Service{svc("web", "10.0.0.1", 80, inState(be("10.1.0.1:80"), lb.Draining), weighted(be("10.1.0.2:80"), 0))},
			want: []string{
				"SetBackend(1, 10.1.0.1:80 service=1 draining)",
				"SetBackend(2, 10.1.0.2:80 service=1 active)",
				"SetTable(1, empty)",
				"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=7)",
			},
		},
		{
			name:   "mode change",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Mode = lb.ModeDSR; s.Dispatch = lb.DispatchGeneve }),
			want:   []string{"SetService(1, 10.0.0.1:80/tcp mode=dsr dispatch=geneve table_size=7)"},
		},
		{
			name:   "source ranges change",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")} }),
			want:   []string{"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=7 source_ranges=192.0.2.0/24)"},
		},
		{
			name:   "table size change swaps the new table in before the entry",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.TableSize = 11 }),
			want: []string{
				"SetTable(1, 11 slots)",
				"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=11)",
			},
		},
		{
			name:   "table size change with no eligible backend",
			before: withWeb(func(s *lb.Service) { s.Backends[0].Weight = 0; s.Backends[1].Weight = 0 }),
			after:  withWeb(func(s *lb.Service) { s.Backends[0].Weight = 0; s.Backends[1].Weight = 0; s.TableSize = 11 }),
			want:   []string{"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=11)"},
		},
		{
			name:   "remove service deletes entry then table then backends",
			before: []lb.Service{web, api},
			after:  []lb.Service{api},
			want: []string{
				"DeleteService(1, 10.0.0.1:80/tcp)",
				"DeleteTable(1)",
				"DeleteBackend(1)",
				"DeleteBackend(2)",
			},
		},
		{
			name:   "frontend change is delete then add",
			before: []lb.Service{web, api},
			after:  withWeb(func(s *lb.Service) { s.Frontend.Port = 8080 }),
			want: []string{
				"DeleteService(1, 10.0.0.1:80/tcp)",
				"DeleteTable(1)",
				"DeleteBackend(1)",
				"DeleteBackend(2)",
				"SetBackend(4, 10.1.0.1:80 service=3 active)",
				"SetBackend(5, 10.1.0.2:80 service=3 active)",
				"SetTable(3, 7 slots)",
				"SetService(3, 10.0.0.1:8080/tcp mode=snat dispatch=ipip table_size=7)",
			},
		},
		{
			name:   "protocol change is delete then add",
			before: []lb.Service{api},
			after:  []lb.Service{edit(api, func(s *lb.Service) { s.Frontend.Proto = lb.UDP })},
			want: []string{
				"DeleteService(1, 10.0.0.2:443/tcp)",
				"DeleteTable(1)",
				"DeleteBackend(1)",
				"SetBackend(2, 10.2.0.1:443 service=2 active)",
				"SetTable(2, 7 slots)",
				"SetService(2, 10.0.0.2:443/udp mode=snat dispatch=ipip table_size=7)",
			},
		},
		{
			name:   "same address in two services gets two ids",
			before: []lb.Service{web},
			after:  []lb.Service{web, svc("web2", "10.0.0.3", 80, be("10.1.0.1:80"))},
			want: []string{
				"SetBackend(3, 10.1.0.1:80 service=2 active)",
				"SetTable(2, 7 slots)",
				"SetService(2, 10.0.0.3:80/tcp mode=snat dispatch=ipip table_size=7)",
			},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops := map[mode][]reconcilertest.Op{}
			dumps := map[mode]string{}
			for _, m := range modes {
				r, f := newFixtureMode(t, testConfig(), m)
				if err := r.Reconcile(cloneAll(tt.before)); err != nil {
					t.Fatalf("%s: Reconcile(before): %v", m, err)
				}
				f.ResetOps()
				if err := r.Reconcile(cloneAll(tt.after)); err != nil {
					t.Fatalf("%s: Reconcile(after): %v", m, err)
				}
				ops[m], dumps[m] = f.Ops(), f.Dump()
				if diff := cmp.Diff(tt.want, shortOps(flat(ops[m])), cmpOpts...); diff != "" {
					t.Errorf("%s: ops without batches (-want +got):\n%s", m, diff)
				}
				if err := f.CheckInvariants(); err != nil {
					t.Errorf("%s: invariants: %v", m, err)
				}
				checkView(t, r, f)
				checkTables(t, tt.after, r, f)

				// A second pass with the same state has nothing left to do.
				f.ResetOps()
				if err := r.Reconcile(cloneAll(tt.after)); err != nil {
					t.Fatalf("%s: Reconcile(after) again: %v", m, err)
				}
				if ops := f.Ops(); len(ops) != 0 {
					t.Errorf("%s: second pass issued %d ops, want 0: %v", m, len(ops), shortOps(ops))
				}
			}
			if diff := cmp.Diff(shortOps(flat(ops[batched])), shortOps(ops[unbatched])); diff != "" {
				t.Errorf("unbatched ops are not the batched ones taken apart (-batched +unbatched):\n%s", diff)
			}
			if diff := cmp.Diff(dumps[batched], dumps[unbatched]); diff != "" {
				t.Errorf("final datapath (-batched +unbatched):\n%s", diff)
			}
			golden(t, "sequences/"+tt.name, "ops:\n"+opsText(ops[batched])+dumps[batched])
		})
	}
}

func TestDrainDisableWeightSemantics(t *testing.T) {
	r, f := newFixture(t, testConfig())
	s := svc("mixed", "10.0.0.1", 80,
		be("10.1.0.1:80"),
		inState(be("10.1.0.2:80"), lb.Draining),
		inState(be("10.1.0.3:80"), lb.Disabled),
		weighted(be("10.1.0.4:80"), 0),
		weighted(be("10.1.0.5:80"), 2),
	)
	if err := r.Reconcile([]lb.Service{s}); err != nil {
		t.Fatal(err)
	}
	st := f.State()
	if len(st.Services) != 1 {
		t.Fatalf("got %d services, want 1", len(st.Services))
	}
	got := make(map[reconciler.BackendID]string)
	for _, b := range st.Services[0].Backends {
		got[b.ID] = b.Addr.String() + " " + b.State.String()
	}
	want := map[reconciler.BackendID]string{
		1: "10.1.0.1:80 active",
		2: "10.1.0.2:80 draining",
		3: "10.1.0.3:80 disabled",
		4: "10.1.0.4:80 active",
		5: "10.1.0.5:80 active",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("programmed backends (-want +got); disabled, draining and weight 0 keep an entry (and their counters):\n%s", diff)
	}
	counts := make(map[reconciler.BackendID]int)
	for _, id := range st.Services[0].Table {
		counts[id]++
	}
	if counts[2] != 0 || counts[3] != 0 || counts[4] != 0 {
		t.Errorf("draining, disabled or weight-0 backends hold slots: %v", counts)
	}
	if counts[1] == 0 || counts[5] <= counts[1] {
		t.Errorf("slot counts %v: want both eligible backends, the weight-2 one with more slots", counts)
	}
	checkTables(t, []lb.Service{s}, r, f)
	golden(t, "semantics", f.Dump())
}

// manyServices returns n services of four backends each, on distinct VIPs.
func manyServices(n int, size uint32) []lb.Service {
	out := make([]lb.Service, n)
	for i := range out {
		vip := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		var bs []lb.Backend
		for j := range 4 {
			bs = append(bs, lb.Backend{
				Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128 + byte(i>>8), byte(i), byte(j + 1)}), 8080),
				Weight: 1,
			})
		}
		s := svc(fmt.Sprintf("svc-%d", i), vip.String(), 80, bs...)
		s.TableSize = size
		out[i] = s
	}
	return out
}

func TestOneBackendChangeOpCount(t *testing.T) {
	changes := []struct {
		name string
		want int
		fn   func(*lb.Service)
	}{
		{"add", 2, func(s *lb.Service) {
			s.Backends = append(s.Backends, lb.Backend{Addr: netip.MustParseAddrPort("10.250.0.1:8080"), Weight: 1})
		}},
		{"remove", 2, func(s *lb.Service) { s.Backends = s.Backends[1:] }},
		{"weight", 1, func(s *lb.Service) { s.Backends[0].Weight = 5 }},
		{"drain", 2, func(s *lb.Service) { s.Backends[0].State = lb.Draining }},
		{"disable", 2, func(s *lb.Service) { s.Backends[0].State = lb.Disabled }},
	}
	for _, n := range []int{10, 10000} {
		cfg := reconciler.Config{Seed: testSeed, MaxServices: 20000, MaxBackends: 50000}
		f := reconcilertest.NewFake()
		r := reconciler.New(cfg, f, nil)
		desired := manyServices(n, 251)
		if err := r.Reconcile(desired); err != nil {
			t.Fatal(err)
		}
		for _, c := range changes {
			k := n / 2
			orig := desired[k]
			desired[k] = edit(orig, c.fn)
			f.ResetOps()
			if err := r.Reconcile(desired); err != nil {
				t.Fatal(err)
			}
			got := f.Ops()
			t.Logf("services=%d change=%s ops=%d %v", n, c.name, len(got), shortOps(got))
			if len(got) != c.want {
				t.Errorf("services=%d change=%s: %d ops %v, want %d", n, c.name, len(got), shortOps(got), c.want)
			}
			// Undo it, at the same constant cost as doing it.
			desired[k] = orig
			f.ResetOps()
			if err := r.Reconcile(desired); err != nil {
				t.Fatal(err)
			}
			if got := f.Ops(); len(got) != c.want {
				t.Errorf("services=%d undo %s: %d ops %v, want %d", n, c.name, len(got), shortOps(got), c.want)
			}
		}
		if err := f.CheckInvariants(); err != nil {
			t.Error(err)
		}
	}
}

func BenchmarkReconcileOneBackendChange(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			cfg := reconciler.Config{Seed: testSeed, MaxServices: 20000, MaxBackends: 50000}
			f := reconcilertest.NewFake()
			r := reconciler.New(cfg, f, nil)
			desired := manyServices(n, 1021)
			if err := r.Reconcile(desired); err != nil {
				b.Fatal(err)
			}
			k := n / 2
			w := uint32(1)
			b.ReportAllocs()
			for b.Loop() {
				// Flip one backend's weight: one SetTable per pass.
				w = 3 - w
				desired[k].Backends[0].Weight = w
				if err := r.Reconcile(desired); err != nil {
					b.Fatal(err)
				}
				f.ResetOps()
			}
		})
	}
}

func TestFaultInjection(t *testing.T) {
	before := []lb.Service{
		web,
		api,
		svc("old", "10.0.0.3", 80, be("10.3.0.1:80"), be("10.3.0.2:80")),
		svc("moves", "10.0.0.4", 80, be("10.4.0.1:80")),
		svc("resize", "10.0.0.5", 80, be("10.5.0.1:80"), be("10.5.0.2:80")),
	}
	after := []lb.Service{
		// web: one backend added, one drained, one reweighted.
		edit(web, func(s *lb.Service) {
			s.Backends[0].Weight = 2
			s.Backends[1].State = lb.Draining
			s.Backends = append(s.Backends, be("10.1.0.3:80"), be("10.1.0.4:80"))
		}),
		// api: backend replaced and mode changed.
		edit(api, func(s *lb.Service) {
			s.Backends = []lb.Backend{be("10.2.0.9:443")}
			s.Mode = lb.ModeDSR
		}),
		// old is gone; moves changes port (delete + add).
		svc("moves", "10.0.0.4", 81, be("10.4.0.1:80")),
		edit(before[4], func(s *lb.Service) { s.TableSize = 11; s.Backends = append(s.Backends, be("10.5.0.3:80")) }),
		svc("new", "10.0.0.6", 80, be("10.6.0.1:80"), be("10.6.0.2:80"), inState(be("10.6.0.3:80"), lb.Disabled)),
	}

	// With batches, old and moves lose their tables in one DeleteTables and
	// the five other services get theirs in one SetTables, so failing the
	// k-th op for every k also fails each batch as a whole and each of its
	// entries.
	dumps := map[mode]string{}
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			dumps[m] = testFaultInjection(t, m, before, after)
		})
	}
	if diff := cmp.Diff(dumps[batched], dumps[unbatched]); diff != "" {
		t.Errorf("fault-free end state (-batched +unbatched):\n%s", diff)
	}
}

// testFaultInjection fails each op of the pass from before to after in
// turn and checks that the failed pass leaves a consistent datapath and
// that a retry converges. It returns the fault-free end state.
func testFaultInjection(t *testing.T, m mode, before, after []lb.Service) string {
	// The fault-free run fixes the expected end state and the op count.
	r, f := newFixtureMode(t, testConfig(), m)
	if err := r.Reconcile(cloneAll(before)); err != nil {
		t.Fatal(err)
	}
	f.ResetOps()
	if err := r.Reconcile(cloneAll(after)); err != nil {
		t.Fatal(err)
	}
	ops := f.Ops()
	total, totalWrites := len(ops), writes(ops)
	wantDump := f.Dump()
	t.Logf("fault-free pass: %d ops, %d writes: %v", total, totalWrites, shape(ops))
	if totalWrites < 20 {
		t.Fatalf("scenario too small to be interesting: %d writes", totalWrites)
	}
	// The last phase is per service: api's entry, then its replaced
	// backend, then the entries of moves, resize and new.
	wantShape := map[mode][]string{
		batched: {
			"DeleteService*2", "DeleteTables(2 entries)", "DeleteBackend*3",
			"SetBackend*9", "SetTables(5 entries)", "SetService", "DeleteBackend", "SetService*3",
		},
		unbatched: {
			"DeleteService*2", "DeleteTable*2", "DeleteBackend*3",
			"SetBackend*9", "SetTable*5", "SetService", "DeleteBackend", "SetService*3",
		},
	}[m]
	if diff := cmp.Diff(wantShape, shape(ops)); diff != "" {
		t.Errorf("phases of the fault-free pass (-want +got):\n%s", diff)
	}

	for k := 1; k <= total; k++ {
		t.Run(fmt.Sprintf("fail op %d %s", k, ops[k-1].Kind), func(t *testing.T) {
			r, f := newFixtureMode(t, testConfig(), m)
			if err := r.Reconcile(cloneAll(before)); err != nil {
				t.Fatal(err)
			}
			f.ResetOps()
			injected := errors.New("injected: map update failed")
			f.FailNth(k, injected)
			err := r.Reconcile(cloneAll(after))
			if !errors.Is(err, injected) {
				t.Fatalf("Reconcile = %v, want an error wrapping the injected one", err)
			}
			failed := f.Failed()
			if len(failed) != 1 {
				t.Fatalf("failed ops %v, want exactly op %d", failed, k)
			}
			if !strings.Contains(err.Error(), failed[0].Kind.String()) || !strings.Contains(err.Error(), "service ") {
				t.Errorf("error %q does not name the service and the op %s", err, failed[0].Kind)
			}
			if err := f.CheckInvariants(); err != nil {
				t.Fatalf("invariants after failing op %d (%s): %v", k, failed[0], err)
			}
			checkView(t, r, f)
			first := succeeded(f.Ops())

			f.ResetOps()
			if err := r.Reconcile(cloneAll(after)); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if err := f.CheckInvariants(); err != nil {
				t.Fatalf("invariants after retry: %v", err)
			}
			if diff := cmp.Diff(wantDump, f.Dump()); diff != "" {
				t.Errorf("retry did not converge to the fault-free state (-want +got):\n%s", diff)
			}
			// The retry writes exactly what the failed pass left undone
			// (batches may be cut differently, so ops opening one are
			// not counted).
			if got := first + writes(f.Ops()); got != totalWrites {
				t.Errorf("failed pass applied %d writes and the retry %d (%v): sum %d, want %d", first, writes(f.Ops()), shortOps(f.Ops()), got, totalWrites)
			}
			checkView(t, r, f)
			checkTables(t, after, r, f)
		})
	}
	return wantDump
}

func TestOpErrorNamesServiceOpAndBackend(t *testing.T) {
	r, f := newFixture(t, testConfig())
	f.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpSetBackend && op.Addr.String() == "10.1.0.2:80" {
			return errors.New("no space left on device")
		}
		return nil
	})
	err := r.Reconcile([]lb.Service{web, api})
	want := `service "web": SetBackend 2 (10.1.0.2:80, active): no space left on device; the next reconcile retries`
	if err == nil || err.Error() != want {
		t.Fatalf("Reconcile = %v, want %q", err, want)
	}
	// api was programmed anyway; web holds only its first backend.
	st := f.State()
	if len(st.Services) != 2 || !st.Services[0].HasEntry || st.Services[0].Service.Frontend != api.Frontend {
		t.Fatalf("api not programmed after web failed:\n%s", f.Dump())
	}
	if st.Services[1].HasEntry || st.Services[1].HasTable || len(st.Services[1].Backends) != 1 {
		t.Errorf("web should hold one backend and nothing else:\n%s", f.Dump())
	}
	checkView(t, r, f)
	f.FailOn(nil)
	f.ResetOps()
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{
		"SetBackend(2, 10.1.0.2:80 service=1 active)",
		"SetTable(1, 7 slots)",
		"SetService(1, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=7)",
	}, shortOps(f.Ops())); diff != "" {
		t.Errorf("retry ops (-want +got):\n%s", diff)
	}
}

// A service removed while its removal keeps failing is retried, and a
// service whose add failed and that is then dropped is cleaned up.
func TestFailedServiceChangesItsMind(t *testing.T) {
	r, f := newFixture(t, testConfig())
	f.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpSetService {
			return errors.New("EBUSY")
		}
		return nil
	})
	if err := r.Reconcile([]lb.Service{web}); err == nil {
		t.Fatal("Reconcile succeeded with SetService failing")
	}
	f.FailOn(nil)
	f.ResetOps()
	if err := r.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"DeleteTable(1)", "DeleteBackend(1)", "DeleteBackend(2)"}, shortOps(f.Ops())); diff != "" {
		t.Errorf("cleanup ops (-want +got):\n%s", diff)
	}
	if got := f.Dump(); got != "services:\nbackends:\ntables:\n" {
		t.Errorf("datapath not empty:\n%s", got)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

func TestRefusals(t *testing.T) {
	tests := []struct {
		name    string
		bad     lb.Service
		wantErr string
	}{
		{"unresolved mode", edit(api, func(s *lb.Service) { s.Mode = lb.ModeDefault }),
			`service "api" (10.0.0.2:443/tcp): mode is unresolved; apply lb.Service.WithDefaults before reconciling`},
		{"unresolved dispatch", edit(api, func(s *lb.Service) { s.Mode = lb.ModeDSR; s.Dispatch = lb.DispatchDefault }),
			`service "api" (10.0.0.2:443/tcp): dsr_dispatch is unresolved; apply lb.Service.WithDefaults before reconciling`},
		{"table size 0", edit(api, func(s *lb.Service) { s.TableSize = 0 }),
			`service "api" (10.0.0.2:443/tcp): table size is 0; apply lb.Service.WithDefaults before reconciling`},
		{"table size not prime", edit(api, func(s *lb.Service) { s.TableSize = 1000 }),
			`service "api": build Maglev table (table_size = 1000, 1 eligible backends): table size 1000 is not prime`},
		{"more backends than slots", edit(api, func(s *lb.Service) {
			s.TableSize = 3
			s.Backends = []lb.Backend{be("10.2.0.1:1"), be("10.2.0.1:2"), be("10.2.0.1:3"), be("10.2.0.1:4")}
		}), `service "api": build Maglev table (table_size = 3, 4 eligible backends)`},
		{"duplicate backend", edit(api, func(s *lb.Service) { s.Backends = append(s.Backends, inState(be("10.2.0.1:443"), lb.Disabled)) }),
			`service "api" (10.0.0.2:443/tcp): backend 10.2.0.1:443 is listed twice; list each backend once`},
		{"address family", edit(api, func(s *lb.Service) { s.Backends = append(s.Backends, be("[2001:db8::1]:443")) }),
			`service "api" (10.0.0.2:443/tcp): backend [2001:db8::1]:443 is not in the VIP's address family`},
		{"duplicate frontend", edit(web, func(s *lb.Service) { s.Name = "api" }),
			`service "api": frontend 10.0.0.1:80/tcp is already claimed by service "web"; give one of them another VIP, port or protocol`},
		{"duplicate name", edit(api, func(s *lb.Service) { s.Name = "web"; s.Frontend.Port = 444 }),
			`service "web" (10.0.0.2:444/tcp): name already used by the service at 10.0.0.1:80/tcp; service names must be unique`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			other := svc("other", "10.0.0.9", 80, be("10.9.0.1:80"))
			r, f := newFixture(t, testConfig())
			err := r.Reconcile([]lb.Service{web, tt.bad, other})
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Fatalf("Reconcile = %v, want an error starting with %q", err, tt.wantErr)
			}
			st := f.State()
			var fes []string
			for _, s := range st.Services {
				fes = append(fes, s.Service.Frontend.String())
			}
			if diff := cmp.Diff([]string{"10.0.0.1:80/tcp", "10.0.0.9:80/tcp"}, fes); diff != "" {
				t.Errorf("programmed services (-want +got); only the refused one may be missing:\n%s", diff)
			}
			if err := f.CheckInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}

// A programmed service whose update is refused keeps serving as it was.
func TestRefusedUpdateKeepsLastGoodState(t *testing.T) {
	r, f := newFixture(t, testConfig())
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	good := f.Dump()
	f.ResetOps()
	bad := edit(web, func(s *lb.Service) { s.TableSize = 8 })
	for range 2 { // refused every time, not only once
		if err := r.Reconcile([]lb.Service{bad, api}); err == nil {
			t.Fatal("Reconcile accepted table size 8")
		}
	}
	if ops := f.Ops(); len(ops) != 0 {
		t.Errorf("refused update issued ops: %v", shortOps(ops))
	}
	if got := f.Dump(); got != good {
		t.Errorf("datapath changed:\n%s\nwant:\n%s", got, good)
	}
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	if ops := f.Ops(); len(ops) != 0 {
		t.Errorf("returning to the programmed state issued ops: %v", shortOps(ops))
	}
}

func TestDesiredNotRetained(t *testing.T) {
	r, f := newFixture(t, testConfig())
	desired := cloneAll([]lb.Service{web})
	if err := r.Reconcile(desired); err != nil {
		t.Fatal(err)
	}
	// Changing the caller's slice in place must be seen as a change.
	desired[0].Backends[0].Weight = 4
	f.ResetOps()
	if err := r.Reconcile(desired); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"SetTable(1, 7 slots)"}, shortOps(f.Ops())); diff != "" {
		t.Errorf("ops (-want +got):\n%s", diff)
	}
}

func TestProgrammedIsADeepCopy(t *testing.T) {
	r, _ := newFixture(t, testConfig())
	if err := r.Reconcile([]lb.Service{edit(web, func(s *lb.Service) {
		s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	})}); err != nil {
		t.Fatal(err)
	}
	a := r.Programmed()
	a.Services[0].Table[0] = 99
	a.Services[0].Backends[0].ID = 99
	a.Services[0].Service.SourceRanges[0] = netip.Prefix{}
	b := r.Programmed()
	if b.Services[0].Table[0] == 99 || b.Services[0].Backends[0].ID == 99 || !b.Services[0].Service.SourceRanges[0].IsValid() {
		t.Error("Programmed shares memory with the reconciler")
	}
	if b.Services[0].Service.Name != "web" || b.Services[0].ID != 1 || len(b.Services[0].Table) != 7 {
		t.Errorf("Programmed = %+v", b.Services[0])
	}
}
