// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// restoreServices covers every kind of entry and backend the datapath can
// hold: draining and weight-0 backends, no eligible backend, DSR, affinity,
// source ranges.
var restoreServices = []lb.Service{
	web,
	api,
	edit(svc("dsr", "10.0.0.3", 53, be("10.3.0.1:53"), inState(be("10.3.0.2:53"), lb.Draining), weighted(be("10.3.0.3:53"), 0)), func(s *lb.Service) {
		s.Frontend.Proto = lb.UDP
		s.Mode, s.Dispatch = lb.ModeHybrid, lb.DispatchOpt
		s.TableSize = 13
		s.Affinity = lb.Affinity{ClientIP: true, Timeout: 3 * time.Hour}
		s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.0/24")}
	}),
	svc("idle", "10.0.0.4", 80, inState(be("10.4.0.1:80"), lb.Draining)),
	svc("v6", "2001:db8::1", 443, be("[2001:db8:1::1]:8443"), be("[2001:db8:1::2]:8443")),
}

func TestRestoreThenReconcileSameIssuesNoOps(t *testing.T) {
	for _, from := range []string{"datapath", "programmed"} {
		t.Run(from, func(t *testing.T) {
			r1, f := newFixture(t, testConfig())
			if err := r1.Reconcile(cloneAll(restoreServices)); err != nil {
				t.Fatal(err)
			}
			st := f.State()
			if from == "programmed" {
				st = r1.Programmed()
			}
			r2, err := reconciler.NewFromState(testConfig(), f, nil, st)
			if err != nil {
				t.Fatalf("NewFromState: %v", err)
			}
			checkView(t, r2, f)
			f.ResetOps()
			if err := r2.Reconcile(cloneAll(restoreServices)); err != nil {
				t.Fatal(err)
			}
			if ops := f.Ops(); len(ops) != 0 {
				t.Errorf("restored reconciler issued %d ops for an unchanged state: %v", len(ops), shortOps(ops))
			}
			if got := r2.Programmed().Services[0].Service.Name; got != "web" {
				t.Errorf("name after first pass = %q, want web", got)
			}
		})
	}
}

// After a restore, a change costs what it costs a reconciler that never
// restarted, with the same ids.
func TestRestoreThenChange(t *testing.T) {
	changes := []struct {
		name string
		fn   func([]lb.Service) []lb.Service
	}{
		{"add backend", func(ss []lb.Service) []lb.Service {
			ss[0].Backends = append(ss[0].Backends, be("10.1.0.3:80"))
			return ss
		}},
		{"remove backend", func(ss []lb.Service) []lb.Service { ss[0].Backends = ss[0].Backends[1:]; return ss }},
		{"weight", func(ss []lb.Service) []lb.Service { ss[4].Backends[0].Weight = 3; return ss }},
		{"drain", func(ss []lb.Service) []lb.Service { ss[1].Backends[0].State = lb.Draining; return ss }},
		{"undrain", func(ss []lb.Service) []lb.Service { ss[2].Backends[1].State = lb.Active; return ss }},
		{"mode", func(ss []lb.Service) []lb.Service { ss[3].Mode = lb.ModeDSR; return ss }},
		{"remove service", func(ss []lb.Service) []lb.Service { return ss[1:] }},
		{"add service", func(ss []lb.Service) []lb.Service {
			return append(ss, svc("more", "10.0.0.9", 80, be("10.9.0.1:80")))
		}},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			ref, fref := newFixture(t, testConfig())
			if err := ref.Reconcile(cloneAll(restoreServices)); err != nil {
				t.Fatal(err)
			}
			_, f := newFixture(t, testConfig())
			if err := reconciler.New(testConfig(), f, nil).Reconcile(cloneAll(restoreServices)); err != nil {
				t.Fatal(err)
			}
			r, err := reconciler.NewFromState(testConfig(), f, nil, f.State())
			if err != nil {
				t.Fatal(err)
			}
			changed := c.fn(cloneAll(restoreServices))
			fref.ResetOps()
			f.ResetOps()
			if err := ref.Reconcile(cloneAll(changed)); err != nil {
				t.Fatal(err)
			}
			if err := r.Reconcile(cloneAll(changed)); err != nil {
				t.Fatal(err)
			}
			if len(f.Ops()) == 0 {
				t.Fatal("change issued no op")
			}
			if diff := cmp.Diff(shortOps(fref.Ops()), shortOps(f.Ops())); diff != "" {
				t.Errorf("ops after restore differ from a reconciler that never restarted (-never restarted +restored):\n%s", diff)
			}
			if diff := cmp.Diff(fref.Dump(), f.Dump()); diff != "" {
				t.Errorf("dump (-never restarted +restored):\n%s", diff)
			}
			if err := f.CheckInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}

// Pieces left without a service entry (a crash between SetTable and
// SetService) are deleted by the first pass after a restore.
func TestRestoreDeletesOrphans(t *testing.T) {
	_, f := newFixture(t, testConfig())
	r0 := reconciler.New(testConfig(), f, nil)
	f.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpSetService && op.Frontend == web.Frontend {
			return errors.New("killed")
		}
		return nil
	})
	if err := r0.Reconcile([]lb.Service{web, api}); err == nil {
		t.Fatal("Reconcile succeeded with SetService failing")
	}
	f.FailOn(nil)
	st := f.State()
	if last := st.Services[len(st.Services)-1]; last.HasEntry || !last.HasTable || last.Service.Frontend.Addr.IsValid() {
		t.Fatalf("expected an orphaned table last in %+v", st)
	}
	r, err := reconciler.NewFromState(testConfig(), f, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	f.ResetOps()
	if err := r.Reconcile([]lb.Service{web, api}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"DeleteTable(1)",
		"DeleteBackend(1)",
		"DeleteBackend(2)",
		"SetBackend(4, 10.1.0.1:80 service=3 active)",
		"SetBackend(5, 10.1.0.2:80 service=3 active)",
		"SetTable(3, 7 slots)",
		"SetService(3, 10.0.0.1:80/tcp mode=snat dispatch=ipip table_size=7)",
	}
	if diff := cmp.Diff(want, shortOps(f.Ops())); diff != "" {
		t.Errorf("ops (-want +got):\n%s", diff)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Error(err)
	}
	checkView(t, r, f)
}

func TestRestoreValidation(t *testing.T) {
	good := func() reconciler.State {
		_, f := newFixture(t, testConfig())
		if err := reconciler.New(testConfig(), f, nil).Reconcile([]lb.Service{web, api}); err != nil {
			t.Fatal(err)
		}
		return f.State()
	}
	tests := []struct {
		name    string
		corrupt func(*reconciler.State)
		wantErr string
	}{
		{"service id out of range", func(st *reconciler.State) {
			st.Services[1].ID = 65
			st.Services[1].Backends[0].Service = 65
		}, "service id 65 (10.0.0.2:443/tcp): id out of range 1..64 (max_services)"},
		{"service id zero", func(st *reconciler.State) { st.Services[0].ID = 0 }, "service id 0 (10.0.0.1:80/tcp): id out of range"},
		{"duplicate service id", func(st *reconciler.State) { st.Services[1].ID = 1 }, "service id 1 (10.0.0.2:443/tcp): id listed twice"},
		{"backend id out of range", func(st *reconciler.State) { st.Services[1].Backends[0].ID = 300 },
			"backend id 300 (10.2.0.1:443) out of range 1..256 (max_backends)"},
		{"duplicate backend id", func(st *reconciler.State) { st.Services[1].Backends[0].ID = 1 },
			"backend id 1 (10.2.0.1:443) also listed under service id 1"},
		{"backend owned elsewhere", func(st *reconciler.State) { st.Services[1].Backends[0].Service = 1 },
			"backend id 3 (10.2.0.1:443) is owned by service id 1"},
		{"table names unknown backend", func(st *reconciler.State) { st.Services[0].Table[3] = 9 },
			"table slot 3 names backend id 9, which is not a backend of this service"},
		{"table names another service's backend", func(st *reconciler.State) { st.Services[0].Table[0] = 3 },
			"table slot 0 names backend id 3, which is not a backend of this service"},
		{"entry without table", func(st *reconciler.State) { st.Services[0].HasTable = false; st.Services[0].Table = nil },
			"service id 1 (10.0.0.1:80/tcp): service entry without a Maglev table"},
		{"table of the wrong size", func(st *reconciler.State) { st.Services[0].Service.TableSize = 11 },
			"table has 7 slots but the entry says table_size = 11"},
		{"duplicate frontend", func(st *reconciler.State) { st.Services[1].Service.Frontend = st.Services[0].Service.Frontend },
			"frontend also held by service id 1"},
		{"backend listed twice", func(st *reconciler.State) { st.Services[0].Backends[1].Addr = st.Services[0].Backends[0].Addr },
			"backend 10.1.0.1:80 programmed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := good()
			tt.corrupt(&st)
			_, err := reconciler.NewFromState(testConfig(), reconcilertest.NewFake(), nil, st)
			if err == nil {
				t.Fatal("NewFromState accepted a corrupt state")
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), "l4lbd --cleanup") {
				t.Errorf("error %q does not say what to do", err)
			}
		})
	}
	if _, err := reconciler.NewFromState(testConfig(), reconcilertest.NewFake(), nil, good()); err != nil {
		t.Errorf("NewFromState(good) = %v", err)
	}
}

// TestKeepUnclaimed: while keep is on, a restored service that the desired
// state does not name stays programmed; once off, the next pass removes it.
func TestKeepUnclaimed(t *testing.T) {
	fake := reconcilertest.NewFake()
	r := reconciler.New(testConfig(), fake, nil)
	a, b := svc("a", "10.0.0.1", 80, be("10.1.0.1:80")), svc("b", "10.0.0.2", 80, be("10.1.0.2:80"))
	if err := r.Reconcile([]lb.Service{a, b}); err != nil {
		t.Fatal(err)
	}
	restored, err := reconciler.NewFromState(testConfig(), fake, nil, fake.State())
	if err != nil {
		t.Fatal(err)
	}
	restored.SetKeepUnclaimed(true)
	fake.ResetOps()
	if err := restored.Reconcile([]lb.Service{a}); err != nil {
		t.Fatal(err)
	}
	if ops := fake.Ops(); len(ops) != 0 {
		t.Fatalf("keep on: %d ops %v, want none (b is kept, a unchanged)", len(ops), ops)
	}
	restored.SetKeepUnclaimed(false)
	if err := restored.Reconcile([]lb.Service{a}); err != nil {
		t.Fatal(err)
	}
	if n := len(restored.Programmed().Services); n != 1 {
		t.Fatalf("keep off: %d services programmed, want 1", n)
	}
	if err := fake.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
