// SPDX-License-Identifier: Apache-2.0

package reconcilertest_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

var fe = lb.Frontend{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, Proto: lb.TCP}

func entry(f lb.Frontend, size uint32) lb.Service {
	return lb.Service{Name: "ignored", Frontend: f, Mode: lb.ModeSNAT, TableSize: size}
}

func backend(addr string, svc reconciler.ServiceID) reconciler.Backend {
	return reconciler.Backend{Addr: netip.MustParseAddrPort(addr), Service: svc, State: lb.Active}
}

// programmed returns a fake holding one consistent service: id 1 with
// backends 1 and 2 and a 3-slot table.
func programmed(t *testing.T) *reconcilertest.Fake {
	t.Helper()
	f := reconcilertest.NewFake()
	for _, err := range []error{
		f.SetBackend(1, backend("10.1.0.1:80", 1)),
		f.SetBackend(2, backend("10.1.0.2:80", 1)),
		f.SetTable(1, []reconciler.BackendID{1, 2, 1}),
		f.SetService(1, entry(fe, 3)),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := f.CheckInvariants(); err != nil {
		t.Fatalf("consistent fake: %v", err)
	}
	return f
}

func TestCheckInvariantsFindsHalfProgrammedStates(t *testing.T) {
	other := lb.Frontend{Addr: netip.MustParseAddr("10.0.0.2"), Port: 80, Proto: lb.TCP}
	tests := []struct {
		name string
		do   func(f *reconcilertest.Fake) error
		want string
	}{
		{"entry without table", func(f *reconcilertest.Fake) error { return f.DeleteTable(1) },
			"service 10.0.0.1:80/tcp (id 1): entry present but no table"},
		{"table names a missing backend", func(f *reconcilertest.Fake) error { return f.DeleteBackend(2) },
			"table of service id 1: slot 1 names backend id 2, which is not programmed"},
		{"table names another service's backend", func(f *reconcilertest.Fake) error { return f.SetBackend(2, backend("10.1.0.2:80", 7)) },
			"slot 1 names backend id 2 (10.1.0.2:80), owned by service id 7"},
		{"two frontends, one id", func(f *reconcilertest.Fake) error { return f.SetService(1, entry(other, 3)) },
			"id 1 is also the id of 10.0.0.1:80/tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := programmed(t)
			if err := tt.do(f); err != nil {
				t.Fatal(err)
			}
			err := f.CheckInvariants()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckInvariants = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestCheckEachOpRemembersTransientViolations(t *testing.T) {
	f := programmed(t)
	f.ResetOps()
	f.CheckEachOp(true)
	// Break the rules for one operation, then repair them.
	if err := f.DeleteBackend(2); err != nil {
		t.Fatal(err)
	}
	if err := f.SetBackend(2, backend("10.1.0.2:80", 1)); err != nil {
		t.Fatal(err)
	}
	err := f.CheckInvariants()
	if err == nil || !strings.Contains(err.Error(), "after op 1 DeleteBackend(2)") {
		t.Errorf("CheckInvariants = %v, want the violation after op 1", err)
	}
}

func TestFaultInjection(t *testing.T) {
	f := programmed(t)
	f.ResetOps()
	before := f.Dump()
	boom := errors.New("boom")
	f.FailNth(2, boom)
	if err := f.SetBackend(3, backend("10.1.0.3:80", 1)); err != nil {
		t.Fatalf("op 1 failed: %v", err)
	}
	if err := f.SetTable(1, []reconciler.BackendID{3, 3, 3}); !errors.Is(err, boom) {
		t.Fatalf("op 2 = %v, want boom", err)
	}
	if err := f.SetTable(1, []reconciler.BackendID{3, 3, 3}); err != nil {
		t.Fatalf("op 3 failed: %v", err)
	}
	failed := f.Failed()
	if len(failed) != 1 || failed[0].Kind != reconcilertest.OpSetTable || !errors.Is(failed[0].Err, boom) {
		t.Errorf("Failed() = %v, want the one SetTable", failed)
	}
	if got, want := failed[0].String(), "SetTable(1, [3 3 3]) failed: boom"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if len(f.Ops()) != 3 {
		t.Errorf("recorded %d ops, want 3", len(f.Ops()))
	}

	g := programmed(t)
	g.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpDeleteService {
			return boom
		}
		return nil
	})
	if err := g.DeleteService(1, fe); !errors.Is(err, boom) {
		t.Fatalf("DeleteService = %v, want boom", err)
	}
	if g.Dump() != before {
		t.Errorf("a failed op changed the maps:\n%s", g.Dump())
	}
}

func TestKernelLikeRefusals(t *testing.T) {
	f := programmed(t)
	f.SetLimits(4, 8)
	for name, err := range map[string]error{
		"backend id 0":           f.SetBackend(0, backend("10.1.0.9:80", 1)),
		"backend id over limit":  f.SetBackend(9, backend("10.1.0.9:80", 1)),
		"service id over limit":  f.SetService(5, entry(fe, 3)),
		"table id 0":             f.SetTable(0, nil),
		"delete missing backend": f.DeleteBackend(7),
		"delete missing table":   f.DeleteTable(3),
		"delete missing service": f.DeleteService(1, lb.Frontend{}),
		"delete with wrong id":   f.DeleteService(2, fe),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := f.CheckInvariants(); err != nil {
		t.Errorf("refused ops changed the maps: %v", err)
	}
}

func TestDumpAndState(t *testing.T) {
	f := programmed(t)
	// An orphaned backend: its service has neither entry nor table.
	if err := f.SetBackend(5, backend("10.9.0.1:80", 4)); err != nil {
		t.Fatal(err)
	}
	if err := f.SetService(2, lb.Service{
		Frontend: lb.Frontend{Addr: netip.MustParseAddr("2001:db8::1"), Port: 53, Proto: lb.UDP},
		Mode:     lb.ModeDSR, Dispatch: lb.DispatchGeneve, TableSize: 7,
		Algorithm:    lb.Random,
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetTable(2, nil); err != nil {
		t.Fatal(err)
	}
	want := `services:
  10.0.0.1:80/tcp id=1 mode=snat table_size=3
  [2001:db8::1]:53/udp id=2 mode=dsr dispatch=geneve table_size=7 algorithm=random source_ranges=2001:db8::/32
backends:
  1 10.1.0.1:80 service=1 active
  2 10.1.0.2:80 service=1 active
  5 10.9.0.1:80 service=4 active
tables:
  1 size=3 slots: 1=2 2=1 table: 1 2 1
  2 size=0
`
	if got := f.Dump(); got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
	st := f.State()
	if len(st.Services) != 3 {
		t.Fatalf("State has %d services, want 3: %+v", len(st.Services), st)
	}
	s1, s2, orphan := st.Services[0], st.Services[1], st.Services[2]
	if s1.ID != 1 || !s1.HasEntry || !s1.HasTable || len(s1.Backends) != 2 || s1.Service.Name != "" {
		t.Errorf("service 1 = %+v", s1)
	}
	if s2.ID != 2 || !s2.HasTable || len(s2.Table) != 0 || s2.Service.Algorithm != lb.Random {
		t.Errorf("service 2 = %+v", s2)
	}
	if orphan.ID != 4 || orphan.HasEntry || orphan.HasTable || len(orphan.Backends) != 1 || orphan.Service.Frontend.Addr.IsValid() {
		t.Errorf("orphan = %+v", orphan)
	}
}
