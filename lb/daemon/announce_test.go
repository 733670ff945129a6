// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"net/netip"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/plan"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// TestAnnounceInputs: which backends count toward announcing a VIP. A
// checked backend counts once a probe of it passed and it is up; the
// checker's initial up is not evidence.
func TestAnnounceInputs(t *testing.T) {
	fe := lb.Frontend{Addr: netip.MustParseAddr("192.0.2.10"), Port: 80, Proto: lb.TCP}
	b1, b2 := netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80")
	svc := lb.Service{Name: "web", Frontend: fe, Health: lb.HealthCheck{Type: lb.HealthTCP},
		Backends: []lb.Backend{{Addr: b1, Weight: 1, State: lb.Active}, {Addr: b2, Weight: 1, State: lb.Active}}}
	programmed := plan.IndexOf(map[lb.Frontend]*plan.Programmed{fe: {ServiceState: reconciler.ServiceState{HasEntry: true, HasTable: true}}})
	probed := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := func(s health.State, passed bool, checked bool) health.Status {
		out := health.Status{State: s, Passed: passed}
		if checked {
			out.LastCheck = probed
		}
		return out
	}
	key := func(b netip.AddrPort) health.Key { return health.Key{Service: "web", Backend: b} }

	tests := []struct {
		name                      string
		svc                       lb.Service
		states                    map[health.Key]health.Status
		healthy, unchecked        int
		wantWaiting, wantUnprobed bool
	}{
		{
			name:      "just started: up, never probed",
			svc:       svc,
			states:    map[health.Key]health.Status{key(b1): st(health.Up, false, false), key(b2): st(health.Up, false, false)},
			unchecked: 2, wantWaiting: true, wantUnprobed: true,
		},
		{
			name:    "one passed, one failed its first probe (still up by fall)",
			svc:     svc,
			states:  map[health.Key]health.Status{key(b1): st(health.Up, true, true), key(b2): st(health.Up, false, true)},
			healthy: 1, unchecked: 1, wantWaiting: true,
		},
		{
			name:    "passed, and down after passing",
			svc:     svc,
			states:  map[health.Key]health.Status{key(b1): st(health.Up, true, true), key(b2): st(health.Down, true, true)},
			healthy: 1,
		},
		{
			name:    "no state at all does not count",
			svc:     svc,
			states:  map[health.Key]health.Status{key(b1): st(health.Up, true, true)},
			healthy: 1,
		},
		{
			name: "unchecked service: every active backend with weight counts",
			svc: func() lb.Service {
				s := svc
				s.Health = lb.HealthCheck{}
				s.Backends = []lb.Backend{{Addr: b1, Weight: 1, State: lb.Active}, {Addr: b2, Weight: 0, State: lb.Active}}
				return s
			}(),
			healthy: 1,
		},
		{
			name: "draining and disabled backends never count",
			svc: func() lb.Service {
				s := svc
				s.Backends = []lb.Backend{{Addr: b1, Weight: 1, State: lb.Draining}, {Addr: b2, Weight: 1, State: lb.Disabled}}
				return s
			}(),
			states: map[health.Key]health.Status{key(b1): st(health.Up, true, true), key(b2): st(health.Up, false, false)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, waiting, unprobed := announceInputs(cow.SliceOf([]lb.Service{tt.svc}), programmed, plan.MapLookup(tt.states))
			if len(in) != 1 || !in[0].Programmed || in[0].Healthy != tt.healthy || in[0].Unchecked != tt.unchecked {
				t.Errorf("inputs %+v, want programmed with %d healthy, %d unchecked", in, tt.healthy, tt.unchecked)
			}
			if waiting != tt.wantWaiting || unprobed != tt.wantUnprobed {
				t.Errorf("waiting %v, unprobed %v; want %v, %v", waiting, unprobed, tt.wantWaiting, tt.wantUnprobed)
			}
		})
	}
}
