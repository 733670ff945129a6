// SPDX-License-Identifier: Apache-2.0

package daemon

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

// passDaemon is a daemon, not running, whose passes program a fake
// datapath: the file's services are merged and applied once.
func passDaemon(t *testing.T) (*Daemon, *reconcilertest.Fake) {
	t.Helper()
	d := testDaemon(t, passConfig)
	f := reconcilertest.NewFake()
	f.CheckEachOp(true)
	d.rec = reconciler.New(reconciler.Config{Seed: d.cfg.Maglev.Seed, MaxServices: 16, MaxBackends: 64}, f, slog.New(slog.DiscardHandler))
	d.health = health.New(health.Options{Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(d.health.Stop)
	d.supported = func(lb.Service) error { return nil }
	d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: d.cfg.Services})
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
				var k overrideKey
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
					k = overrideKey{Service: st.service, Backend: netip.MustParseAddrPort(st.backend)}
					delete(d.overrides.m, k)
				default:
					k = overrideKey{Service: st.service, Backend: netip.MustParseAddrPort(st.backend)}
					d.overrides.m[k] = override{overrideKey: k, State: st.state, Since: time.Now()}
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
				one := d.view.Load()
				f.ResetOps()
				if err := d.apply(); err != nil {
					t.Fatalf("full pass: %v", err)
				}
				if ops := f.Ops(); len(ops) != 0 {
					t.Errorf("a full pass after the one-service pass still wrote %v", ops)
				}
				full := d.view.Load()
				opts := []cmp.Option{cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
					cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}
				if diff := cmp.Diff(slices.Collect(valuesOf(full.services)), slices.Collect(valuesOf(one.services)), opts...); diff != "" {
					t.Errorf("services (-full pass +one-service pass):\n%s", diff)
				}
				if diff := cmp.Diff(full.configStates, one.configStates, opts...); diff != "" {
					t.Errorf("config states (-full pass +one-service pass):\n%s", diff)
				}
				if diff := cmp.Diff(full.pos, one.pos); diff != "" {
					t.Errorf("positions (-full pass +one-service pass):\n%s", diff)
				}
				if full.index.byFrontend.Len() != one.index.byFrontend.Len() || full.index.services != one.index.services ||
					full.index.backends != one.index.backends || full.index.tables != one.index.tables {
					t.Errorf("index totals differ between the full pass and the one-service pass")
				}
				for fe, ps := range full.index.byFrontend.All() {
					got, ok := one.index.get(fe)
					if !ok || got.fingerprint != ps.fingerprint || !cmp.Equal(got.ServiceState, ps.ServiceState, opts...) || !cmp.Equal(got.ids, ps.ids, opts...) || !cmp.Equal(got.slots, ps.slots) {
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
	d := testDaemon(t, doc)
	f := reconcilertest.NewFake()
	f.CheckEachOp(true)
	d.rec = reconciler.New(reconciler.Config{Seed: d.cfg.Maglev.Seed, MaxServices: 16, MaxBackends: 64}, f, slog.New(slog.DiscardHandler))
	checks := &downSet{}
	d.health = health.New(health.Options{Log: slog.New(slog.DiscardHandler), Damping: health.Damping{Off: true},
		NewChecker: func(lb.HealthCheck) (health.Checker, error) { return checks, nil }})
	t.Cleanup(d.health.Stop)
	d.supported = func(lb.Service) error { return nil }
	d.merger.Update(discovery.Snapshot{Source: "file:test.toml", Services: d.cfg.Services})
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
			case ev := <-d.health.Events():
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
		if !d.applyFlips(flipped) {
			t.Fatalf("%s went %v: the pass over its service declined", b, state)
		}
		for _, op := range f.Ops() {
			if op.Service != reconciler.NoService && op.Service != hID {
				t.Errorf("the pass for h wrote service id %d: %s", op.Service, op)
			}
		}
		one := d.view.Load()
		if got := healthName(healthOf(one, one.services.At(one.pos["h"]), lb.Backend{Addr: b})); (state == health.Down) != (got == "unhealthy") {
			t.Errorf("after %s went %v the view shows it %s", b, state, got)
		}
		f.ResetOps()
		if err := d.apply(); err != nil {
			t.Fatalf("full pass: %v", err)
		}
		if ops := f.Ops(); len(ops) != 0 {
			t.Errorf("a full pass after the pass over h still wrote %v", ops)
		}
		full := d.view.Load()
		fp, _ := full.index.get(one.services.At(one.pos["h"]).Frontend)
		op, _ := one.index.get(one.services.At(one.pos["h"]).Frontend)
		if fp.fingerprint != op.fingerprint || !slices.Equal(fp.Table, op.Table) {
			t.Errorf("after %s went %v: h's table differs between the full pass and the pass over h", b, state)
		}
		if slices.Contains(op.Table, op.ids[b]) == (state == health.Down) {
			t.Errorf("after %s went %v, h's table names it: %v", b, state, slices.Contains(op.Table, op.ids[b]))
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
	one := d.view.Load()
	if _, ok := one.health.Get(health.Key{Service: "h", Backend: added}); !ok {
		t.Errorf("the view has no health state for h's new backend")
	}
	if _, ok := one.health.Get(health.Key{Service: "h", Backend: gone}); ok {
		t.Errorf("the view keeps the health state of h's removed backend")
	}
	if _, ok := d.health.Status(health.Key{Service: "h", Backend: added}); !ok {
		t.Errorf("h's new backend is not probed")
	}
	f.ResetOps()
	if err := d.apply(); err != nil {
		t.Fatalf("full pass: %v", err)
	}
	if ops := f.Ops(); len(ops) != 0 {
		t.Errorf("a full pass after the pass over h still wrote %v", ops)
	}
	full := d.view.Load()
	keys := func(m cow.Map[health.Key, health.Status]) []string {
		var out []string
		for k := range m.All() {
			out = append(out, k.Service+"/"+k.Backend.String())
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(keys(full.health), keys(one.health)) {
		t.Errorf("health states of the full pass %v, of the pass over h %v", keys(full.health), keys(one.health))
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
		v := *d.view.Load()
		v.recErr = "a failed write"
		d.view.Store(&v)
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
