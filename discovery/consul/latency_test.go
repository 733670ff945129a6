// SPDX-License-Identifier: Apache-2.0

package consul_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/internal/discoverytest"
	"github.com/l4lb/l4lb/lb"
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

	pipes := discoverytest.Pipelines(t, defs)

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
	h.waitFor("the lat service", func(svcs []lb.Service) bool { _, ok := discoverytest.Find(svcs, "lat"); return ok })
	for _, p := range pipes {
		p.Apply(t, discovery.Snapshot{Source: consul.SourceName, Services: h.last}, fe, netip.MustParseAddrPort("10.2.5.1:80"), true)
	}

	var toSnap []time.Duration
	toDP := make([][]time.Duration, len(pipes))
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
			s, _ := discoverytest.Find(svcs, "lat")
			return slices.ContainsFunc(s.Backends, func(b lb.Backend) bool { return b.Addr == addr }) == add
		})
		got := time.Since(start)
		toSnap = append(toSnap, got)
		snap := discovery.Snapshot{Source: consul.SourceName, Services: svcs}
		for i, p := range pipes {
			toDP[i] = append(toDP[i], got+p.Apply(t, snap, fe, addr, add))
		}
	}
	t.Logf("propagation over %d changes (agent registration/deregistration, %v apart):", latencyChanges, latencyPace)
	t.Logf("  registration -> snapshot:          %s", discoverytest.Summary(toSnap))
	for i, p := range pipes {
		t.Logf("  registration -> %-17s %s", p.Name+":", discoverytest.Summary(toDP[i]))
	}
}
