// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/l4lb/l4lb/lb"
)

// applyService is apply for a change that can only touch the service named
// name: a runtime override of one of its backends. It redoes that service's
// share of the pass (resolve, drain timeouts, health) from the sources'
// merge, programs it with reconciler.Update, which compares and writes
// nothing else, and publishes a view that differs from the last one in that
// service only. So an override costs about the same at 100 services and at
// 100,000.
//
// It answers false, having changed nothing, whenever the result might
// differ from a full pass's in anything but that service; the caller then
// runs apply. That is the case when the last pass left an error to retry,
// the service is not in the last view (new, refused, or in conflict), it
// resolves to something other than one programmable service with the same
// frontend and backends (a rejection, a new backend), or its health
// verdict carries a warning now or did before, and when Update fails.
func (d *Daemon) applyService(name string) bool {
	v := d.view.Load()
	if v == nil || v.recErr != "" || v.pos == nil {
		return false
	}
	i, ok := v.pos[name]
	if !ok {
		return false
	}
	prev := v.services.At(i)
	merged, ok := d.merger.Service(name)
	if !ok {
		return false
	}
	r := d.resolve([]lb.Service{merged}, d.cfg.Defaults())
	if len(r.desired) != 1 || !sameBackendSet(r.desired[0], prev) || r.desired[0].Frontend != prev.Frontend {
		return false
	}
	warned := fmt.Sprintf("service %q:", name)
	if slices.ContainsFunc(v.healthWarnings, func(w string) bool { return strings.HasPrefix(w, warned) }) {
		return false
	}
	desired := r.desired
	now := time.Now()
	seen := map[overrideKey]bool{}
	next := d.drainTimeouts(&desired[0], now, seen)
	// The health states are the last view's: a check's verdict that came
	// since waits in the health events, whose full pass follows.
	programmed, warnings := d.applyHealth(desired, v.health)
	if len(warnings) > 0 {
		return false
	}
	if err := d.rec.Update(programmed); err != nil {
		d.log.Warn("one-service pass failed; running a full pass", "service", name, "error", err)
		return false
	}
	for k := range d.drainSince {
		if k.Service == name && !seen[k] {
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
	d.index = index
	d.reportProgrammed(index)

	nv := *v
	nv.services = v.services.With(i, desired[0])
	nv.index = index
	nv.configStates = maps.Clone(v.configStates)
	for k := range nv.configStates {
		if k.Service == name {
			delete(nv.configStates, k)
		}
	}
	maps.Copy(nv.configStates, r.configStates)
	nv.bgpVIPs, nv.l2VIPs = nil, nil
	d.announce(&nv)
	d.publishFleet(&nv)
	d.view.Store(&nv)
	return true
}

// sameBackendSet reports whether a and b list the same backend addresses
// in the same order: then a pass over one of them probes what the last
// pass probed, and programs no new backend entry.
func sameBackendSet(a, b lb.Service) bool {
	return slices.EqualFunc(a.Backends, b.Backends, func(x, y lb.Backend) bool { return x.Addr == y.Addr })
}
