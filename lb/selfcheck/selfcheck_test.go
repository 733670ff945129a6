// SPDX-License-Identifier: Apache-2.0

package selfcheck_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
	"github.com/l4lb/l4lb/lb/selfcheck"
)

func setup(t *testing.T) (*reconciler.Reconciler, *reconcilertest.Fake, lb.Frontend) {
	t.Helper()
	f := reconcilertest.NewFake()
	r := reconciler.New(reconciler.Config{Seed: maglev.Seed{1}, MaxServices: 16, MaxBackends: 64}, f, nil)
	fe := lb.Frontend{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, Proto: lb.TCP}
	svc := lb.Service{Name: "web", Frontend: fe, Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 7}
	for _, a := range []string{"10.1.0.1:80", "10.1.0.2:80", "10.1.0.3:80"} {
		svc.Backends = append(svc.Backends, lb.Backend{Addr: netip.MustParseAddrPort(a), Weight: 1})
	}
	if err := r.Reconcile([]lb.Service{svc}); err != nil {
		t.Fatal(err)
	}
	return r, f, fe
}

func rotate(f *reconcilertest.Fake, fe lb.Frontend) {
	f.Tamper(func(e map[lb.Frontend]reconcilertest.Entry, _ map[reconciler.BackendID]reconciler.Backend, tb map[reconciler.ServiceID][]reconciler.BackendID) {
		t := tb[e[fe].ID]
		tb[e[fe].ID] = append(t[1:], t[0])
	})
}

// A pass counts, reports and repairs each difference, and keeps the last
// pass and the totals for status.
func TestPassReportsAndCounts(t *testing.T) {
	r, f, fe := setup(t)
	var seen []reconciler.Drift
	var passes []selfcheck.Pass
	c := selfcheck.New(r, f, selfcheck.Options{
		Drift:  func(d reconciler.Drift) { seen = append(seen, d) },
		Passed: func(p selfcheck.Pass) { passes = append(passes, p) },
	})
	if p, ok := c.Pass(context.Background(), false); !ok || p.Drifts != 0 {
		t.Fatalf("pass over an untouched datapath: %+v, %v", p, ok)
	}
	rotate(f, fe)
	f.Tamper(func(e map[lb.Frontend]reconcilertest.Entry, _ map[reconciler.BackendID]reconciler.Backend, _ map[reconciler.ServiceID][]reconciler.BackendID) {
		delete(e, fe)
	})
	p, ok := c.Pass(context.Background(), true)
	if !ok || p.Drifts != 2 || p.Unrepaired != 0 || p.Err != nil {
		t.Fatalf("pass: %+v, %v; want 2 drifts repaired", p, ok)
	}
	if len(seen) != 2 || seen[0].Map != reconciler.MapMaglev || seen[1].Map != reconciler.MapServices {
		t.Errorf("reported %v, want a maglev then a services drift", seen)
	}
	if len(passes) != 2 {
		t.Errorf("%d passes reported, want 2", len(passes))
	}
	st := c.Status()
	if st.Passes != 2 || st.Drifts[reconciler.MapMaglev] != 1 || st.Drifts[reconciler.MapServices] != 1 || st.LastDrift.Map != reconciler.MapServices || st.Interval != selfcheck.DefaultInterval {
		t.Errorf("status %+v", st)
	}
	if p, _ := c.Pass(context.Background(), false); p.Drifts != 0 {
		t.Errorf("pass after the repair found %d drifts", p.Drifts)
	}
}

// A repair that fails is counted as unrepaired and tried again.
func TestPassUnrepaired(t *testing.T) {
	r, f, fe := setup(t)
	c := selfcheck.New(r, f, selfcheck.Options{})
	rotate(f, fe)
	f.FailOn(func(op reconcilertest.Op) error {
		if op.Kind == reconcilertest.OpSetTable {
			return errors.New("boom")
		}
		return nil
	})
	if p, _ := c.Pass(context.Background(), false); p.Drifts != 1 || p.Unrepaired != 1 {
		t.Fatalf("pass %+v: want one unrepaired drift", p)
	}
	if u := c.Unverified(); len(u) != 1 || !strings.HasPrefix(u[fe], "maglev: ") {
		t.Errorf("unverified %v, want %s with its maglev drift", u, fe)
	}
	f.FailOn(nil)
	if p, _ := c.Pass(context.Background(), false); p.Drifts != 1 || p.Unrepaired != 0 {
		t.Fatalf("pass %+v: want the drift repaired", p)
	}
	if u := c.Unverified(); len(u) != 0 {
		t.Errorf("unverified %v after the repair, want none", u)
	}
	if st := c.Status(); st.Unrepaired != 1 || st.Drifts[reconciler.MapMaglev] != 2 {
		t.Errorf("status %+v", st)
	}
}

// Run repairs a change within one interval, and returns when ctx ends.
func TestRunRepairsWithinAnInterval(t *testing.T) {
	r, f, fe := setup(t)
	passed := make(chan selfcheck.Pass, 16)
	c := selfcheck.New(r, f, selfcheck.Options{Interval: 10 * time.Millisecond, Budget: 0.5, Passed: func(p selfcheck.Pass) { passed <- p }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	<-passed
	rotate(f, fe)
	deadline := time.After(time.Minute)
	for repaired := false; !repaired; {
		select {
		case p := <-passed:
			repaired = p.Drifts == 1
		case <-deadline:
			t.Fatal("no pass repaired the change within a minute")
		}
	}
	cancel()
	<-done
}

// A pass whose CPU time at the configured share would not fit in the
// interval gets a larger share, up to a whole CPU.
func TestShareGrowsToFitTheInterval(t *testing.T) {
	r, f, _ := setup(t)
	c := selfcheck.New(r, f, selfcheck.Options{Interval: time.Hour})
	c.Pass(context.Background(), false)
	if p, _ := c.Pass(context.Background(), true); p.Share != selfcheck.DefaultBudget {
		t.Errorf("share %v with an hour to spare, want the default %v", p.Share, selfcheck.DefaultBudget)
	}
	c = selfcheck.New(r, f, selfcheck.Options{Interval: time.Nanosecond})
	c.Pass(context.Background(), false)
	if p, _ := c.Pass(context.Background(), true); p.Share != 1 {
		t.Errorf("share %v when a pass cannot fit its interval, want 1", p.Share)
	}
}
