// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/announce"
	"github.com/l4lb/l4lb/lb/config"
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

// TestAnnounceSomeEqualsAll: after a pass over a few services, deciding
// again for their VIPs alone and keeping the last decision for the rest
// (announceSome) gives the decision over every service, over random
// services that share VIPs, opt out, lose their entry and flip health.
func TestAnnounceSomeEqualsAll(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 40
	svcs := make([]lb.Service, n)
	programmed := map[lb.Frontend]*plan.Programmed{}
	states := map[health.Key]health.Status{}
	checked := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	randomize := func(i int) {
		s := lb.Service{Name: fmt.Sprintf("s%d", i), Frontend: lb.Frontend{Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(i / 3)}), Port: uint16(80 + i%3), Proto: lb.TCP},
			Health: lb.HealthCheck{Type: lb.HealthTCP}, Announce: lb.Announce{Off: rng.IntN(8) == 0, MinHealthy: rng.IntN(3)}}
		for j := range 3 {
			b := lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), byte(j)}), 80), Weight: 1, State: lb.BackendState(rng.IntN(2))}
			s.Backends = append(s.Backends, b)
			states[health.Key{Service: s.Name, Backend: b.Addr}] = health.Status{State: health.State(rng.IntN(2)), Passed: true, LastCheck: checked}
		}
		svcs[i] = s
		programmed[s.Frontend] = &plan.Programmed{ServiceState: reconciler.ServiceState{HasEntry: rng.IntN(6) != 0, HasTable: true}}
	}
	viewOf := func() *view { return testView(svcs, programmed, states) }
	all := func(v *view) []announce.VIP {
		in, _, _ := announceInputs(v.Services, v.Index, v.Health.Get)
		return announce.Decide(in, 1)
	}
	last := []announce.VIP(nil)
	randomSteps(rng, n, randomize, func(i int) string { return svcs[i].Name }, func(step int, changed []string) {
		v := viewOf()
		if changed == nil {
			last = all(v)
			return
		}
		in, addrs, _ := someInputs(v, changed)
		got := spliceVIPs(last, announce.Decide(in, 1), addrs)
		want := all(v)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d, %v changed:\ngot  %+v\nwant %+v", step, changed, got, want)
		}
		last = got
	})
}

// testView is a view of svcs with what is programmed and the health
// states given (copied), as a pass would publish it.
func testView(svcs []lb.Service, programmed map[lb.Frontend]*plan.Programmed, states map[health.Key]health.Status) *view {
	pos := map[string]int{}
	for i, s := range svcs {
		pos[s.Name] = i
	}
	return &view{View: &plan.View{Services: cow.SliceOf(slices.Clone(svcs)), Pos: pos, Index: plan.IndexOf(maps.Clone(programmed)),
		Health: cow.MapOf(maps.Clone(states)), VIPs: config.IndexVIPs(svcs)}}
}

// randomSteps makes n random services (randomize(i)), calls step(0, nil),
// then 300 times changes one to three of them and calls step with the
// names (name(i)) of those changed.
func randomSteps(rng *rand.Rand, n int, randomize func(int), name func(int) string, step func(int, []string)) {
	for i := range n {
		randomize(i)
	}
	step(0, nil)
	for k := range 300 {
		var changed []string
		for range 1 + rng.IntN(3) {
			i := rng.IntN(n)
			randomize(i)
			changed = append(changed, name(i))
		}
		step(k+1, changed)
	}
}
