// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

const passConfig = `[datapath]
interfaces = ["lo"]
mode = "snat"
[maglev]
table_size = 251
[[service]]
name = "a"
vip = "192.0.2.1"
port = 80
protocol = "tcp"
[[service.backend]]
address = "198.51.100.1"
port = 80
[[service.backend]]
address = "198.51.100.2"
port = 80
[[service.backend]]
address = "198.51.100.3"
port = 80
[[service]]
name = "b"
vip = "192.0.2.2"
port = 80
protocol = "tcp"
drain_timeout = "1h"
[[service.backend]]
address = "198.51.100.4"
port = 80
[[service.backend]]
address = "198.51.100.5"
port = 80
[[service]]
name = "c"
vip = "192.0.2.3"
port = 443
protocol = "tcp"
[[service.backend]]
address = "198.51.100.6"
port = 443
`

// testPlan is a plan whose passes program a fake datapath, with the
// configuration and the merger it was built from.
type testPlan struct {
	*Plan
	cfg       *config.Config
	merger    *discovery.Merger
	rec       *reconciler.Reconciler
	overrides Overrides
}

// newTestPlan builds a plan over the fake f for the services of doc, with
// the health checks h (nil: none); the file's services are merged, not
// applied yet.
func newTestPlan(t testing.TB, doc string, f *reconcilertest.Fake, h Health) *testPlan {
	t.Helper()
	cfg, err := config.Parse("test.toml", []byte(doc), config.Options{Dev: true})
	if err != nil {
		t.Fatal(err)
	}
	tp := &testPlan{cfg: cfg, merger: discovery.NewMerger(), overrides: Overrides{}}
	tp.rec = reconciler.New(reconciler.Config{Seed: cfg.Maglev.Seed, MaxServices: 16, MaxBackends: 64}, f, slog.New(slog.DiscardHandler))
	tp.Plan = New(Config{Seed: cfg.Maglev.Seed, Rec: tp.rec, Merger: tp.merger, Health: h})
	tp.SetDefaults(cfg.Defaults())
	tp.SetOverrides(tp.overrides)
	tp.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: cfg.Services})
	return tp
}

// apply runs a full pass.
func (d *testPlan) apply() error { return d.Full(time.Now()).Err }

// applyServices runs a pass over names, false when it declined.
func (d *testPlan) applyServices(names []string, flipped []health.Key) bool {
	_, ok := d.Services(names, flipped, time.Now())
	return ok
}

// passDaemon is a plan whose passes program a fake datapath: the
// file's services are merged and applied once.
func passDaemon(t *testing.T) (*testPlan, *reconcilertest.Fake) {
	t.Helper()
	f := reconcilertest.NewFake()
	f.CheckEachOp(true)
	hm := health.New(health.Options{Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(hm.Stop)
	d := newTestPlan(t, passConfig, f, hm)
	if err := d.apply(); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	return d, f
}

// TestOneServicePass: after a runtime override, the pass that redoes only
// the overridden service (applyService) programs and publishes exactly
// what a full pass would, writes nothing for any other service, and a full
// pass after it finds nothing left to do.
func TestOneServicePass(t *testing.T) {
	type step struct {
		service string
		backend string
		state   lb.BackendState
		clear   bool
		// backends, when set, is the service's new backend list from
		// its source instead of an override.
		backends []string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "drain", steps: []step{{service: "a", backend: "198.51.100.2:80", state: lb.Draining}}},
		{name: "disable", steps: []step{{service: "a", backend: "198.51.100.1:80", state: lb.Disabled}}},
		{name: "drain then enable", steps: []step{
			{service: "a", backend: "198.51.100.3:80", state: lb.Draining},
			{service: "a", backend: "198.51.100.3:80", state: lb.Active},
		}},
		{name: "drain with a timeout, then clear", steps: []step{
			{service: "b", backend: "198.51.100.4:80", state: lb.Draining},
			{service: "b", backend: "198.51.100.4:80", clear: true},
		}},
		{name: "last backend disabled", steps: []step{{service: "c", backend: "198.51.100.6:443", state: lb.Disabled}}},
		{name: "source replaces a backend", steps: []step{{service: "a", backends: []string{"198.51.100.1:80", "198.51.100.2:80", "198.51.100.10:80"}}}},
		{name: "source adds then removes backends", steps: []step{
			{service: "b", backends: []string{"198.51.100.4:80", "198.51.100.5:80", "198.51.100.11:80", "198.51.100.12:80"}},
			{service: "b", backends: []string{"198.51.100.12:80"}},
		}},
		{name: "override then source", steps: []step{
			{service: "a", backend: "198.51.100.1:80", state: lb.Draining},
			{service: "a", backends: []string{"198.51.100.1:80", "198.51.100.3:80"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, f := passDaemon(t)
			ids := map[string]reconciler.ServiceID{}
			for _, s := range d.rec.Programmed().Services {
				ids[s.Service.Name] = s.ID
			}
			svcs := make([]lb.Service, len(d.cfg.Services))
			for i, s := range d.cfg.Services {
				svcs[i] = s.Clone()
			}
			for _, st := range tc.steps {
				var k Key
				switch {
				case st.backends != nil:
					for i := range svcs {
						if svcs[i].Name != st.service {
							continue
						}
						svcs[i] = svcs[i].Clone()
						svcs[i].Backends = nil
						for _, b := range st.backends {
							svcs[i].Backends = append(svcs[i].Backends, lb.Backend{Addr: netip.MustParseAddrPort(b), Weight: 1})
						}
					}
					d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: svcs})
					if names, all := d.merger.Changes(); all || !slices.Equal(names, []string{st.service}) {
						t.Fatalf("the merger reports changes %v (all %v), want %q alone", names, all, st.service)
					}
				case st.clear:
					k = Key{Service: st.service, Backend: netip.MustParseAddrPort(st.backend)}
					delete(d.overrides, k)
				default:
					k = Key{Service: st.service, Backend: netip.MustParseAddrPort(st.backend)}
					d.overrides[k] = Override{Key: k, State: st.state, Since: time.Now()}
				}
				f.ResetOps()
				if !d.applyServices([]string{st.service}, nil) {
					t.Fatalf("step %+v: the one-service pass declined", st)
				}
				for _, op := range f.Ops() {
					if op.Service != reconciler.NoService && op.Service != ids[st.service] {
						t.Errorf("the pass for %q wrote service id %d: %s", st.service, op.Service, op)
					}
				}
				if st.service == "b" && !st.clear && st.backends == nil {
					if _, ok := d.drainSince[k]; !ok || d.drainNext.IsZero() {
						t.Errorf("draining %s with a drain timeout started no clock (since %v, timer at %v)", k, d.drainSince[k], d.drainNext)
					}
				}
				if st.clear {
					if _, ok := d.drainSince[k]; ok {
						t.Errorf("%s no longer drains but its drain clock stayed", k)
					}
				}
				one := d.View()
				f.ResetOps()
				if err := d.apply(); err != nil {
					t.Fatalf("full pass: %v", err)
				}
				if ops := f.Ops(); len(ops) != 0 {
					t.Errorf("a full pass after the one-service pass still wrote %v", ops)
				}
				full := d.View()
				opts := []cmp.Option{cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
					cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}
				if diff := cmp.Diff(slices.Collect(valuesOf(full.Services)), slices.Collect(valuesOf(one.Services)), opts...); diff != "" {
					t.Errorf("services (-full pass +one-service pass):\n%s", diff)
				}
				if diff := cmp.Diff(full.ConfigStates, one.ConfigStates, opts...); diff != "" {
					t.Errorf("config states (-full pass +one-service pass):\n%s", diff)
				}
				if diff := cmp.Diff(full.Pos, one.Pos); diff != "" {
					t.Errorf("positions (-full pass +one-service pass):\n%s", diff)
				}
				if full.Index.Len() != one.Index.Len() || full.Index.Services != one.Index.Services ||
					full.Index.Backends != one.Index.Backends || full.Index.Tables != one.Index.Tables {
					t.Errorf("index totals differ between the full pass and the one-service pass")
				}
				for fe, ps := range full.Index.All() {
					got, ok := one.Index.Get(fe)
					if !ok || got.Fingerprint != ps.Fingerprint || !cmp.Equal(got.ServiceState, ps.ServiceState, opts...) || !cmp.Equal(got.IDs, ps.IDs, opts...) || !cmp.Equal(got.Slots, ps.Slots) {
						t.Errorf("index of %s differs between the full pass and the one-service pass", fe)
					}
				}
			}
		})
	}
}

// downSet is a health checker whose verdicts the test sets: a backend
// address in the set fails its check.
type downSet struct{ m sync.Map }

func (s *downSet) Check(_ context.Context, t health.Target) error {
	if _, down := s.m.Load(t.Addr); down {
		return errors.New("down by the test")
	}
	return nil
}

// TestHealthFlipPass: when a health check flips a backend, the pass over
// its service alone (applyFlips) programs and publishes what a full pass
// would, and writes nothing for the other services.
func TestHealthFlipPass(t *testing.T) {
	doc := passConfig + `[[service]]
name = "h"
vip = "192.0.2.4"
port = 80
protocol = "tcp"
[service.health]
type = "tcp"
interval = "20ms"
rise = 1
fall = 1
[[service.backend]]
address = "198.51.100.7"
port = 80
[[service.backend]]
address = "198.51.100.8"
port = 80
[[service.backend]]
address = "198.51.100.9"
port = 80
`
	f := reconcilertest.NewFake()
	f.CheckEachOp(true)
	checks := &downSet{}
	hm := health.New(health.Options{Log: slog.New(slog.DiscardHandler), Damping: health.Damping{Off: true},
		NewChecker: func(lb.HealthCheck) (health.Checker, error) { return checks, nil }})
	t.Cleanup(hm.Stop)
	d := newTestPlan(t, doc, f, hm)
	if err := d.apply(); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	var hID reconciler.ServiceID
	for _, s := range d.rec.Programmed().Services {
		if s.Service.Name == "h" {
			hID = s.ID
		}
	}
	// waitFlip waits for the checker's verdict on backend to reach
	// state, and returns the keys of the events that said so.
	waitFlip := func(backend netip.AddrPort, state health.State) []health.Key {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev := <-hm.Events():
				if ev.Backend == backend && ev.State == state {
					return []health.Key{{Service: ev.Service, Backend: ev.Backend}}
				}
			case <-timeout:
				t.Fatalf("%s never went %v", backend, state)
			}
		}
	}
	b := netip.MustParseAddrPort("198.51.100.8:80")
	for _, state := range []health.State{health.Down, health.Up} {
		if state == health.Down {
			checks.m.Store(b, true)
		} else {
			checks.m.Delete(b)
		}
		flipped := waitFlip(b, state)
		f.ResetOps()
		if !func() bool { _, ok := d.Flips(flipped, time.Now()); return ok }() {
			t.Fatalf("%s went %v: the pass over its service declined", b, state)
		}
		for _, op := range f.Ops() {
			if op.Service != reconciler.NoService && op.Service != hID {
				t.Errorf("the pass for h wrote service id %d: %s", op.Service, op)
			}
		}
		one := d.View()
		if got, _ := one.Health.Get(health.Key{Service: "h", Backend: b}); (state == health.Down) != (got.State == health.Down) {
			t.Errorf("after %s went %v the view shows it %v", b, state, got.State)
		}
		f.ResetOps()
		if err := d.apply(); err != nil {
			t.Fatalf("full pass: %v", err)
		}
		if ops := f.Ops(); len(ops) != 0 {
			t.Errorf("a full pass after the pass over h still wrote %v", ops)
		}
		full := d.View()
		fp, _ := full.Index.Get(one.Services.At(one.Pos["h"]).Frontend)
		op, _ := one.Index.Get(one.Services.At(one.Pos["h"]).Frontend)
		if fp.Fingerprint != op.Fingerprint || !slices.Equal(fp.Table, op.Table) {
			t.Errorf("after %s went %v: h's table differs between the full pass and the pass over h", b, state)
		}
		if slices.Contains(op.Table, op.IDs[b]) == (state == health.Down) {
			t.Errorf("after %s went %v, h's table names it: %v", b, state, slices.Contains(op.Table, op.IDs[b]))
		}
	}

	// The source swaps a checked backend for a new one: the pass over h
	// probes the new one and forgets the old one, as a full pass does.
	svcs := make([]lb.Service, len(d.cfg.Services))
	for i, s := range d.cfg.Services {
		svcs[i] = s.Clone()
	}
	h := &svcs[len(svcs)-1]
	gone, added := h.Backends[0].Addr, netip.MustParseAddrPort("198.51.100.20:80")
	h.Backends[0].Addr = added
	d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: svcs})
	if names, all := d.merger.Changes(); all || !slices.Equal(names, []string{"h"}) {
		t.Fatalf("the merger reports changes %v (all %v), want h alone", names, all)
	}
	if !d.applyServices([]string{"h"}, nil) {
		t.Fatal("the pass over h declined a new backend")
	}
	one := d.View()
	if _, ok := one.Health.Get(health.Key{Service: "h", Backend: added}); !ok {
		t.Errorf("the view has no health state for h's new backend")
	}
	if _, ok := one.Health.Get(health.Key{Service: "h", Backend: gone}); ok {
		t.Errorf("the view keeps the health state of h's removed backend")
	}
	if _, ok := hm.Status(health.Key{Service: "h", Backend: added}); !ok {
		t.Errorf("h's new backend is not probed")
	}
	f.ResetOps()
	if err := d.apply(); err != nil {
		t.Fatalf("full pass: %v", err)
	}
	if ops := f.Ops(); len(ops) != 0 {
		t.Errorf("a full pass after the pass over h still wrote %v", ops)
	}
	full := d.View()
	keys := func(m cow.Map[health.Key, health.Status]) []string {
		var out []string
		for k := range m.All() {
			out = append(out, k.Service+"/"+k.Backend.String())
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(keys(full.Health), keys(one.Health)) {
		t.Errorf("health states of the full pass %v, of the pass over h %v", keys(full.Health), keys(one.Health))
	}
}

// TestOneServicePassDeclines: what the one-service pass cannot prove it
// does like a full pass, it leaves to one, having changed nothing.
func TestOneServicePassDeclines(t *testing.T) {
	t.Run("unknown service", func(t *testing.T) {
		d, f := passDaemon(t)
		f.ResetOps()
		if d.applyServices([]string{"nope"}, nil) || len(f.Ops()) != 0 {
			t.Errorf("a pass for a service not in the view ran (ops %v)", f.Ops())
		}
	})
	t.Run("last pass failed", func(t *testing.T) {
		d, f := passDaemon(t)
		v := *d.View()
		v.RecErr = "a failed write"
		d.last = &v
		f.ResetOps()
		if d.applyServices([]string{"a"}, nil) || len(f.Ops()) != 0 {
			t.Errorf("a one-service pass ran over a failed full pass (ops %v)", f.Ops())
		}
	})
	t.Run("service gone from the sources", func(t *testing.T) {
		d, f := passDaemon(t)
		d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: d.cfg.Services[1:]})
		f.ResetOps()
		if d.applyServices([]string{"a"}, nil) || len(f.Ops()) != 0 {
			t.Errorf("a one-service pass ran for a service the sources dropped (ops %v)", f.Ops())
		}
	})
	t.Run("frontend moved", func(t *testing.T) {
		d, f := passDaemon(t)
		svcs := make([]lb.Service, len(d.cfg.Services))
		for i, s := range d.cfg.Services {
			svcs[i] = s.Clone()
		}
		svcs[0].Frontend.Port = 8080
		d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: svcs})
		if _, all := d.merger.Changes(); !all {
			t.Errorf("the merger kept up in place with a service that moved")
		}
		f.ResetOps()
		if d.applyServices([]string{"a"}, nil) || len(f.Ops()) != 0 {
			t.Errorf("a one-service pass ran for a service that moved to another frontend (ops %v)", f.Ops())
		}
	})
}

// valuesOf yields the values of a cow.Slice in order.
func valuesOf[T any](s cow.Slice[T]) iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, v := range s.All() {
			if !yield(v) {
				return
			}
		}
	}
}

// TestPass: Pass runs no pass when the sources changed nothing, a pass
// over the services that changed within themselves, and a full pass when
// services came or went or an input of every service changed; a changed
// health check is probed as the full pass would probe it.
func TestPass(t *testing.T) {
	clone := func(svcs []lb.Service) []lb.Service {
		out := make([]lb.Service, len(svcs))
		for i, s := range svcs {
			out[i] = s.Clone()
		}
		return out
	}
	tests := []struct {
		name string
		// change edits the file's services or the plan's inputs.
		change   func(d *testPlan, svcs []lb.Service) []lb.Service
		wantRun  bool
		wantFull bool
	}{
		{"nothing changed", func(d *testPlan, svcs []lb.Service) []lb.Service { return svcs }, false, false},
		{"a backend's weight", func(d *testPlan, svcs []lb.Service) []lb.Service {
			svcs[0].Backends[1].Weight = 7
			return svcs
		}, true, false},
		{"a health check added", func(d *testPlan, svcs []lb.Service) []lb.Service {
			svcs[1].Health = lb.HealthCheck{Type: lb.HealthTCP, Interval: time.Hour}
			return svcs
		}, true, false},
		{"a service added", func(d *testPlan, svcs []lb.Service) []lb.Service {
			s := svcs[0].Clone()
			s.Name, s.Frontend.Port = "new", 8080
			return append(svcs, s)
		}, true, true},
		{"a service removed", func(d *testPlan, svcs []lb.Service) []lb.Service { return svcs[1:] }, true, true},
		{"defaults changed", func(d *testPlan, svcs []lb.Service) []lb.Service {
			defs := d.cfg.Defaults()
			defs.DrainTimeout = time.Minute
			d.SetDefaults(defs)
			return svcs
		}, true, true},
		{"the box's addresses changed", func(d *testPlan, svcs []lb.Service) []lb.Service {
			d.SetLocal(map[netip.Addr]string{netip.MustParseAddr("203.0.113.1"): "eth0"})
			return svcs
		}, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, f := passDaemon(t)
			svcs := tc.change(d, clone(d.cfg.Services))
			d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: svcs})
			f.ResetOps()
			res := d.Pass(time.Now())
			if ran := res.View != nil; ran != tc.wantRun || res.Full != tc.wantFull {
				t.Fatalf("pass ran %v, full %v; want %v, %v", ran, res.Full, tc.wantRun, tc.wantFull)
			}
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			one := d.View()
			f.ResetOps()
			if err := d.apply(); err != nil {
				t.Fatal(err)
			}
			if ops := f.Ops(); len(ops) != 0 {
				t.Errorf("a full pass after Pass still wrote %v", ops)
			}
			full := d.View()
			if !slices.EqualFunc(slices.Collect(valuesOf(full.Services)), slices.Collect(valuesOf(one.Services)), lb.Service.Equal) {
				t.Errorf("services differ between Pass and a full pass after it")
			}
			for _, s := range full.Services.All() {
				for _, b := range s.Backends {
					k := health.Key{Service: s.Name, Backend: b.Addr}
					_, probed := d.health.Status(k)
					_, shown := one.Health.Get(k)
					if want := s.Health.Type != lb.HealthNone; probed != want || shown != want {
						t.Errorf("%s: probed %v, shown %v; want %v", k, probed, shown, want)
					}
				}
			}
		})
	}
}
