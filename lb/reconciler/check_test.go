// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

type (
	tamperEntries  = map[lb.Frontend]reconcilertest.Entry
	tamperBackends = map[reconciler.BackendID]reconciler.Backend
	tamperTables   = map[reconciler.ServiceID][]reconciler.BackendID
)

// checkFixture programs two services, one with source ranges, and returns
// the reconciler and the fake.
func checkFixture(t *testing.T) (*reconciler.Reconciler, *reconcilertest.Fake, []lb.Service) {
	t.Helper()
	r, f := newFixture(t, testConfig())
	desired := []lb.Service{
		svc("web", "10.0.0.1", 80, be("10.1.0.1:80"), be("10.1.0.2:80"), be("10.1.0.3:80")),
		edit(svc("dns", "10.0.0.2", 53, be("10.1.0.4:53"), be("10.1.0.5:53")), func(s *lb.Service) {
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
		}),
	}
	if err := r.Reconcile(cloneAll(desired)); err != nil {
		t.Fatal(err)
	}
	return r, f, desired
}

var (
	webFE = lb.Frontend{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, Proto: lb.TCP}
	dnsFE = lb.Frontend{Addr: netip.MustParseAddr("10.0.0.2"), Port: 53, Proto: lb.TCP}
)

func TestCheckRepairsDrift(t *testing.T) {
	for _, tc := range []struct {
		name string
		// tamper changes the fake behind the reconciler's back.
		tamper func(e tamperEntries, b tamperBackends, tb tamperTables)
		// want are the maps the drifts name, in order.
		want []string
	}{
		{
			name: "table slot rewritten",
			tamper: func(e tamperEntries, _ tamperBackends, tb tamperTables) {
				t := tb[e[webFE].ID]
				t[0], t[1] = t[1], t[0]
				if t[0] == t[1] {
					t[0], t[2] = t[2], t[0]
				}
			},
			want: []string{reconciler.MapMaglev},
		},
		{
			name:   "table deleted",
			tamper: func(e tamperEntries, _ tamperBackends, tb tamperTables) { delete(tb, e[webFE].ID) },
			want:   []string{reconciler.MapMaglev},
		},
		{
			name: "backend entry rewritten",
			tamper: func(e tamperEntries, b tamperBackends, tb tamperTables) {
				id := tb[e[webFE].ID][0]
				x := b[id]
				x.Addr = netip.MustParseAddrPort("10.9.9.9:80")
				b[id] = x
			},
			want: []string{reconciler.MapBackends},
		},
		{
			name: "backend entry deleted",
			tamper: func(e tamperEntries, b tamperBackends, tb tamperTables) {
				delete(b, tb[e[dnsFE].ID][0])
			},
			want: []string{reconciler.MapBackends},
		},
		{
			name: "service entry rewritten",
			tamper: func(e tamperEntries, _ tamperBackends, _ tamperTables) {
				x := e[webFE]
				x.Service.Mode = lb.ModeDSR
				e[webFE] = x
			},
			want: []string{reconciler.MapServices},
		},
		{
			name: "service entry under another id",
			tamper: func(e tamperEntries, _ tamperBackends, _ tamperTables) {
				x := e[webFE]
				x.ID = e[dnsFE].ID
				e[webFE] = x
			},
			want: []string{reconciler.MapServices},
		},
		{
			name:   "service entry deleted",
			tamper: func(e tamperEntries, _ tamperBackends, _ tamperTables) { delete(e, dnsFE) },
			want:   []string{reconciler.MapServices},
		},
		{
			name: "source ranges changed",
			tamper: func(e tamperEntries, _ tamperBackends, _ tamperTables) {
				x := e[dnsFE]
				x.Service.SourceRanges = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
				e[dnsFE] = x
			},
			want: []string{reconciler.MapSourceRanges},
		},
		{
			name: "stray service entry",
			tamper: func(e tamperEntries, _ tamperBackends, _ tamperTables) {
				x := e[webFE]
				x.Service.Frontend.Port = 8080
				e[x.Service.Frontend] = x
			},
			want: []string{reconciler.MapServices},
		},
		{
			name: "everything at once",
			tamper: func(e tamperEntries, b tamperBackends, tb tamperTables) {
				delete(tb, e[webFE].ID)
				delete(b, tb[e[dnsFE].ID][0])
				delete(e, dnsFE)
			},
			// Services first (a table before its entry), then backends.
			want: []string{reconciler.MapMaglev, reconciler.MapServices, reconciler.MapBackends},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, f, _ := checkFixture(t)
			before := f.State()
			// The change itself breaks the rules the fake checks
			// after each op; the state after the repair is checked.
			f.CheckEachOp(false)
			f.Tamper(tc.tamper)
			f.ResetOps()
			drifts, got := runCheck(t, r, f)
			for _, d := range drifts {
				if d.Err != nil {
					t.Errorf("repair of %v failed", d)
				}
				if d.Found == "" || d.Want == "" {
					t.Errorf("drift %+v does not say what was found and what is wanted", d)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("drifts in maps %v, want %v: %v", got, tc.want, drifts)
			}
			if len(tc.want) > 0 {
				if diff := diffStates(before, f.State()); diff != "" {
					t.Errorf("datapath after repair differs from before the change:\n%s", diff)
				}
			}
			if err := f.CheckInvariants(); err != nil {
				t.Error(err)
			}
			again, err := r.NewCheck(f).Run()
			if err != nil || len(again) > 0 {
				t.Errorf("second check found %v (err %v), want nothing", again, err)
			}
		})
	}
}

// runCheck runs a whole check and returns its drifts and the maps they
// name, in order.
func runCheck(t *testing.T, r *reconciler.Reconciler, f *reconcilertest.Fake) ([]reconciler.Drift, []string) {
	t.Helper()
	drifts, err := r.NewCheck(f).Run()
	if err != nil {
		t.Fatal(err)
	}
	var maps []string
	for _, d := range drifts {
		maps = append(maps, d.Map)
	}
	return drifts, maps
}

func diffStates(a, b reconciler.State) string {
	if fmt.Sprint(normalize(a)) == fmt.Sprint(normalize(b)) {
		return ""
	}
	return fmt.Sprintf("before: %v\nafter:  %v", normalize(a), normalize(b))
}

// Strays at ids the reconciler has handed out and released are removed.
func TestCheckRemovesStraysAtReleasedIDs(t *testing.T) {
	r, f, desired := checkFixture(t)
	// Drop dns: its service id and backend ids are free again.
	st := f.State()
	var dnsID reconciler.ServiceID
	var dnsBackends []reconciler.BackendEntry
	for _, s := range st.Services {
		if s.Service.Frontend == dnsFE {
			dnsID, dnsBackends = s.ID, s.Backends
		}
	}
	if err := r.Reconcile(cloneAll(desired[:1])); err != nil {
		t.Fatal(err)
	}
	before := f.State()
	f.CheckEachOp(false)
	f.Tamper(func(_ tamperEntries, b tamperBackends, tb tamperTables) {
		tb[dnsID] = []reconciler.BackendID{dnsBackends[0].ID}
		b[dnsBackends[0].ID] = dnsBackends[0].Backend
	})
	drifts, got := runCheck(t, r, f)
	if want := []string{reconciler.MapMaglev, reconciler.MapBackends}; !slices.Equal(got, want) {
		t.Errorf("drifts in %v, want %v: %v", got, want, drifts)
	}
	if diff := diffStates(before, f.State()); diff != "" {
		t.Error(diff)
	}
}

// A repair that fails is reported with its error and done by the next
// check; an entry whose table could not be written is not written either.
func TestCheckRepairFailsThenSucceeds(t *testing.T) {
	r, f, _ := checkFixture(t)
	before := f.State()
	f.Tamper(func(e tamperEntries, _ tamperBackends, tb tamperTables) {
		delete(tb, e[webFE].ID)
		delete(e, webFE)
	})
	boom := errors.New("boom")
	f.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpSetTable {
			return boom
		}
		return nil
	})
	drifts, err := r.NewCheck(f).Run()
	if err != nil {
		t.Fatal(err)
	}
	if len(drifts) != 2 || !errors.Is(drifts[0].Err, boom) || !errors.Is(drifts[1].Err, boom) {
		t.Fatalf("drifts %v: want the table and the entry, both failed with %v", drifts, boom)
	}
	if err := f.CheckInvariants(); err != nil {
		t.Error(err)
	}
	f.FailOn(nil)
	drifts, err = r.NewCheck(f).Run()
	if err != nil || len(drifts) != 2 || drifts[0].Err != nil || drifts[1].Err != nil {
		t.Fatalf("second check: %v, %v; want the table and the entry repaired", drifts, err)
	}
	if diff := diffStates(before, f.State()); diff != "" {
		t.Error(diff)
	}
}

// manyServices returns n services, each with a backend that depends on gen,
// so that two generations differ in every table.
func generation(n, gen int) []lb.Service {
	out := make([]lb.Service, n)
	for i := range out {
		vip := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		out[i] = svc(fmt.Sprintf("s%d", i), vip.String(), 80,
			be(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 80).String()),
			be(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(gen), byte(i)}), 80).String()))
	}
	return out
}

// A pass that runs between two steps of a check is never undone by it: the
// check compares each slice with the record as of its own step.
func TestCheckStepsInterleavedWithPasses(t *testing.T) {
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 1024, MaxBackends: 4096}
	r, f := newFixture(t, cfg)
	f.CheckEachOp(false) // the final state is checked; each op's is slow at this size
	if err := r.Reconcile(generation(300, 0)); err != nil {
		t.Fatal(err)
	}
	c := r.NewCheck(f)
	for gen := 1; ; gen++ {
		drifts, done, err := c.Step()
		if err != nil || len(drifts) > 0 {
			t.Fatalf("step %d: %v, %v; want no drift", gen, drifts, err)
		}
		if done {
			break
		}
		// Remove a few services and change every other one, so that
		// ids are released and handed out again during the check.
		if err := r.Reconcile(generation(300-gen%3, gen)); err != nil {
			t.Fatal(err)
		}
	}
	checkView(t, r, f)
	if err := f.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// The same with the passes and the check in two goroutines (run with -race).
func TestCheckConcurrentWithPasses(t *testing.T) {
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 1024, MaxBackends: 4096}
	r, f := newFixture(t, cfg)
	if err := r.Reconcile(generation(200, 0)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for gen := 1; ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := r.Reconcile(generation(200-gen%7, gen%50)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 5 {
		drifts, err := r.NewCheck(f).Run()
		if err != nil || len(drifts) > 0 {
			t.Errorf("check during passes: %v, %v; want no drift", drifts, err)
		}
	}
	close(stop)
	wg.Wait()
	checkView(t, r, f)
}
