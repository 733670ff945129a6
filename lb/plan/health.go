// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/health"
)

// targets says how each backend is probed. A DSR backend is checked the
// way clients reach it: a probe to the VIP whose socket mark names the
// backend (Config.ProbeMark), which the datapath's probe program
// dispatches to exactly that backend. SNAT backends, and DSR backends not
// programmed yet (no id to mark), are probed on their own address.
func (p *Plan) targets(idx Index) func(svc lb.Service, b lb.Backend) health.Target {
	return func(svc lb.Service, b lb.Backend) health.Target {
		if svc.Mode == lb.ModeDSR && p.probeMark != nil {
			if ps, ok := idx.Get(svc.Frontend); ok {
				if id, ok := ps.IDs[b.Addr]; ok {
					return health.ThroughVIP(svc, p.probeMark(id))
				}
			}
		}
		return health.Direct(svc, b)
	}
}

// applyHealth drains backends whose checks fail: they leave the Maglev
// table (only their slots move) and get no new flow, session affinity
// included, but their entries stay programmed, so established flows are not
// cut by a false alarm and the through-VIP probe can still reach them and
// bring them back. When every checked backend of
// a service is down, the checks are ignored for it (fail open): more likely
// the probes are broken than every backend at once, and dropping all of the
// service's traffic would be the worst answer.
func (p *Plan) applyHealth(svcs []lb.Service, states func(health.Key) (health.Status, bool)) (out []lb.Service, warnings []string) {
	if p.health == nil {
		return svcs, nil
	}
	up := func(svc lb.Service, b lb.Backend) bool {
		st, ok := states(health.Key{Service: svc.Name, Backend: b.Addr})
		return !ok || st.State == health.Up
	}
	out = make([]lb.Service, len(svcs))
	for i, svc := range svcs {
		out[i] = svc
		if svc.Health.Type == lb.HealthNone {
			continue
		}
		down, candidates := 0, 0
		for _, b := range svc.Backends {
			if b.State != lb.Active || b.Weight == 0 {
				continue
			}
			candidates++
			if !up(svc, b) {
				down++
			}
		}
		if down == 0 {
			continue
		}
		if down == candidates {
			warnings = append(warnings, fmt.Sprintf("service %q: every backend fails its health check; ignoring the checks (fail open) until one passes", svc.Name))
			continue
		}
		bs := append([]lb.Backend(nil), svc.Backends...)
		for j, b := range bs {
			if b.State == lb.Active && !up(svc, b) {
				bs[j].State = lb.Draining
			}
		}
		out[i].Backends = bs
	}
	return out, warnings
}

// applyDrainTimeouts turns draining backends whose drain timeout passed
// into disabled ones, which moves their remaining flows. It returns the
// time of the next deadline (zero when none), for the control loop's timer.
// A draining backend's clock starts when this plan first sees it
// draining, or when its runtime override was set.
func (p *Plan) applyDrainTimeouts(svcs []lb.Service, now time.Time) (next time.Time) {
	seen := map[Key]bool{}
	for i := range svcs {
		if n := p.drainTimeouts(&svcs[i], now, seen); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	for k := range p.drainSince {
		if !seen[k] {
			delete(p.drainSince, k)
			delete(p.drainCut, k)
		}
	}
	return next
}

// drainTimeouts is applyDrainTimeouts for one service: it adds the keys of
// svc's draining backends to seen and returns svc's next deadline.
func (p *Plan) drainTimeouts(svc *lb.Service, now time.Time, seen map[Key]bool) (next time.Time) {
	for j, b := range svc.Backends {
		if b.State != lb.Draining {
			continue
		}
		k := Key{Service: svc.Name, Backend: b.Addr}
		seen[k] = true
		since, ok := p.drainSince[k]
		if !ok {
			since = now
			if ov, ok := p.overrides[k]; ok && ov.State == lb.Draining && !ov.Since.IsZero() {
				since = ov.Since
			}
			p.drainSince[k] = since
		}
		if svc.DrainTimeout <= 0 {
			continue
		}
		deadline := since.Add(svc.DrainTimeout)
		if !now.Before(deadline) {
			if !p.drainCut[k] {
				p.drainCut[k] = true
				p.log.Info("drain timeout passed; moving the backend's remaining flows", "service", svc.Name, "backend", b.Addr)
			}
			bs := append([]lb.Backend(nil), svc.Backends...)
			bs[j].State = lb.Disabled
			svc.Backends = bs
			continue
		}
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	return next
}

// MapLookup is a plain map's look-up, for applyHealth and the announcer.
func MapLookup(m map[health.Key]health.Status) func(health.Key) (health.Status, bool) {
	return func(k health.Key) (health.Status, bool) {
		st, ok := m[k]
		return st, ok
	}
}
