// SPDX-License-Identifier: Apache-2.0

package consul_test

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/discovery/discoverytest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// latencyChanges is how many registrations and deregistrations are timed.
const latencyChanges = 120

// latencyPace separates changes so that each finds a token in the watch
// loops' buckets (10 per second): what is measured is propagation, not the
// rate limit, which a faster stream of changes would add.
const latencyPace = 120 * time.Millisecond

// TestPropagationLatency times registration -> snapshot -> reconciler state
// over latencyChanges agent registrations and deregistrations, into the
// fake datapath and, as root, into the real BPF maps. It logs the figures;
// it asserts only that every change arrives.
func TestPropagationLatency(t *testing.T) {
	a := startAgent(t, 0)
	defs := lb.Defaults{Mode: lb.ModeDSR, Dispatch: lb.DispatchIPIP, TableSize: 251}
	h := runSource(t, consulConfig(a.Addr), consul.Options{Defaults: defs})

	seed := maglev.Seed{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	rcfg := reconciler.Config{Seed: seed, MaxServices: 64, MaxBackends: 256}
	fake := reconcilertest.NewFake()
	pipes := []*discoverytest.Pipeline{{
		Name: "fake datapath", Merger: discovery.NewMerger(), Rec: reconciler.New(rcfg, fake, nil), Defaults: defs,
		State: func() (reconciler.State, error) { return fake.State(), nil },
	}}
	if os.Geteuid() == 0 {
		dp, err := datapath.Load(datapath.Config{
			Seed: seed, MaxServices: 64, MaxBackends: 256, ConntrackMax: 4096,
			Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatalf("load the datapath: %v", err)
		}
		t.Cleanup(func() { dp.Close() })
		pipes = append(pipes, &discoverytest.Pipeline{Name: "BPF maps", Merger: discovery.NewMerger(), Rec: reconciler.New(rcfg, dp, nil), State: dp.State, Defaults: defs})
	} else {
		t.Log("not root: timing the fake datapath only")
	}

	fe := lb.Frontend{Addr: netip.MustParseAddr("192.0.2.50"), Port: 80, Proto: lb.TCP}
	reg := func(i int) *api.AgentServiceRegistration {
		return &api.AgentServiceRegistration{ID: fmt.Sprintf("lat-%d", i), Name: "lat", Tags: []string{"l4lb"},
			Address: fmt.Sprintf("10.2.%d.%d", i/200, 1+i%200), Port: 80, Meta: meta(fe.Addr.String(), "80", "tcp")}
	}
	// One instance stays throughout, so the service itself never comes
	// and goes: each change is one backend.
	if err := a.API.Agent().ServiceRegister(reg(1000)); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the lat service", func(svcs []lb.Service) bool { _, ok := find(svcs, "lat"); return ok })
	for _, p := range pipes {
		p.Apply(t, discovery.Snapshot{Source: consul.SourceName, Services: h.last}, fe, netip.MustParseAddrPort("10.2.5.1:80"), true)
	}

	var toSnap []time.Duration
	for i := range latencyChanges {
		time.Sleep(latencyPace)
		r := reg(i / 2)
		addr := netip.MustParseAddrPort(fmt.Sprintf("%s:80", r.Address))
		add := i%2 == 0
		start := time.Now()
		var err error
		if add {
			err = a.API.Agent().ServiceRegister(r)
		} else {
			err = a.API.Agent().ServiceDeregister(r.ID)
		}
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		svcs := h.waitFor(fmt.Sprintf("change %d (%s %v)", i, addr, add), func(svcs []lb.Service) bool {
			s, _ := find(svcs, "lat")
			return slices.ContainsFunc(s.Backends, func(b lb.Backend) bool { return b.Addr == addr }) == add
		})
		got := time.Since(start)
		toSnap = append(toSnap, got)
		snap := discovery.Snapshot{Source: consul.SourceName, Services: svcs}
		for _, p := range pipes {
			t0 := time.Now()
			p.Apply(t, snap, fe, addr, add)
			p.Lat = append(p.Lat, got+time.Since(t0))
		}
	}
	t.Logf("propagation over %d changes (agent registration/deregistration, %v apart):", latencyChanges, latencyPace)
	t.Logf("  registration -> snapshot:          median %v, p99 %v", discoverytest.Percentile(toSnap, 0.5).Round(time.Microsecond), discoverytest.Percentile(toSnap, 0.99).Round(time.Microsecond))
	for _, p := range pipes {
		t.Logf("  registration -> %-17s median %v, p99 %v", p.Name+":", discoverytest.Percentile(p.Lat, 0.5).Round(time.Microsecond), discoverytest.Percentile(p.Lat, 0.99).Round(time.Microsecond))
	}
}
