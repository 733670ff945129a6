// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/health"
)

// applyServices is apply for a change that can only touch the services
// named: a runtime override of a backend, a health check's verdict on
// backends of a few services (flipped names the backends whose state
// changed), or a source's new definition of services it already had
// (discovery.Merger.Changes). It redoes those services' share of the pass (resolve, drain
// timeouts, health) from the sources' merge, programs them with
// reconciler.Update, which compares and writes nothing else, and publishes
// a view that differs from the last one in those services and backends
// only. So such a change costs about the same at 100 services and at
// 100,000.
//
// It answers false, having changed nothing, whenever the result might
// differ from a full pass's in anything but those services; the caller
// then runs apply. That is the case when the last pass left an error to
// retry, a service is not in the last view (new, refused, or in conflict),
// one resolves to something other than one programmable service with the
// same frontend (a rejection), its health verdict carries a warning now or
// did before, and when Update fails. A service whose backends changed has
// its probes updated (health.Manager.UpdateServices) once its new
// backends have ids, as the full pass does.
func (d *Daemon) applyServices(names []string, flipped []health.Key) bool {
	v := d.view.Load()
	if v == nil || v.recErr != "" || v.pos == nil || len(names) == 0 {
		return false
	}
	states := v.health
	if len(flipped) > 0 {
		e := v.health.Edit()
		for _, k := range flipped {
			if st, ok := d.health.Status(k); ok {
				e.Set(k, st)
			} else {
				e.Delete(k)
			}
		}
		states = e.Map()
	}
	at := make([]int, 0, len(names))
	desired := make([]lb.Service, 0, len(names))
	var moved []int // desired[k] whose backend set changed
	configStates := map[overrideKey]lb.BackendState{}
	for _, name := range names {
		i, ok := v.pos[name]
		if !ok || slices.Contains(at, i) {
			return false
		}
		prev := v.services.At(i)
		merged, ok := d.merger.Service(name)
		if !ok {
			return false
		}
		r := d.resolve([]lb.Service{merged}, d.cfg.Defaults())
		if len(r.desired) != 1 || r.desired[0].Frontend != prev.Frontend || atVIP(r.desired[0], v.vips) {
			return false
		}
		if !sameBackendSet(r.desired[0], prev) {
			moved = append(moved, len(desired))
		}
		warned := fmt.Sprintf("service %q:", name)
		if slices.ContainsFunc(v.healthWarnings, func(w string) bool { return strings.HasPrefix(w, warned) }) {
			return false
		}
		at = append(at, i)
		desired = append(desired, r.desired[0])
		maps.Copy(configStates, r.configStates)
	}
	now := time.Now()
	seen := map[overrideKey]bool{}
	var next time.Time
	for i := range desired {
		if n := d.drainTimeouts(&desired[i], now, seen); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	programmed, warnings := d.applyHealth(desired, states.Get)
	if len(warnings) > 0 {
		return false
	}
	if err := d.rec.Update(programmed); err != nil {
		d.log.Warn("pass over a few services failed; running a full pass", "services", names, "error", err)
		return false
	}
	for k := range d.drainSince {
		if slices.Contains(names, k.Service) && !seen[k] {
			delete(d.drainSince, k)
			delete(d.drainCut, k)
		}
	}
	if !next.IsZero() && (d.drainNext.IsZero() || next.Before(d.drainNext) || !d.drainNext.After(now)) {
		d.drainTimer.Reset(time.Until(next))
		d.drainNext = next
	}

	changed, gone := d.rec.Changes()
	index := updateIndex(d.index, d.cfg.Maglev.Seed, changed, gone, programmed)
	if programmedMoved(d.index, changed, gone) {
		d.reportProgrammed(index)
	}
	d.index = index
	if len(moved) > 0 {
		probe := make([]lb.Service, len(moved))
		for j, k := range moved {
			probe[j] = desired[k]
		}
		d.health.UpdateServices(probe, healthTargets(index))
		// The view shows the states this pass programmed: a backend
		// that left has none, one that came its initial state.
		e := states.Edit()
		for j, k := range moved {
			for _, b := range v.services.At(at[k]).Backends {
				e.Delete(health.Key{Service: probe[j].Name, Backend: b.Addr})
			}
			for _, b := range probe[j].Backends {
				k := health.Key{Service: probe[j].Name, Backend: b.Addr}
				if st, ok := states.Get(k); ok {
					e.Set(k, st)
				} else if st, ok := d.health.Status(k); ok {
					e.Set(k, st)
				}
			}
		}
		states = e.Map()
	}

	nv := *v
	for k, i := range at {
		nv.services = nv.services.With(i, desired[k])
	}
	nv.index, nv.health = index, states
	nv.configStates = maps.Clone(v.configStates)
	for k := range nv.configStates {
		if slices.Contains(names, k.Service) {
			delete(nv.configStates, k)
		}
	}
	maps.Copy(nv.configStates, configStates)
	nv.bgpVIPs, nv.l2VIPs = nil, nil
	d.announce(&nv)
	d.publishFleet(&nv)
	d.view.Store(&nv)
	return true
}

// atVIP reports whether a backend of svc is at another service's VIP: the
// full pass decides which of the two to refuse (resolved.across).
func atVIP(svc lb.Service, vips config.VIPIndex) bool {
	return slices.ContainsFunc(svc.Backends, func(b lb.Backend) bool {
		return b.Addr.Addr() != svc.Frontend.Addr && vips.Has(b.Addr.Addr())
	})
}

// sameBackendSet reports whether a and b list the same backend addresses
// in the same order: then a pass over one of them probes what the last
// pass probed.
func sameBackendSet(a, b lb.Service) bool {
	return slices.EqualFunc(a.Backends, b.Backends, func(x, y lb.Backend) bool { return x.Addr == y.Addr })
}

// maxFewServices is the most services a health burst may touch for its
// pass to be a partial one: past that, a full pass is cheaper than
// checking each one.
const maxFewServices = 64

// applyFlips is the pass after health checks changed the state of the
// backends flipped: over their services alone when they are few
// (applyServices), and false when a full pass must run.
func (d *Daemon) applyFlips(flipped []health.Key) bool {
	var names []string
	for _, k := range flipped {
		if !slices.Contains(names, k.Service) {
			if len(names) == maxFewServices {
				return false
			}
			names = append(names, k.Service)
		}
	}
	return d.applyServices(names, flipped)
}
