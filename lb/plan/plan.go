// SPDX-License-Identifier: Apache-2.0

// Package plan is the control plane's pipeline, between the sources and
// the datapath: the sources' merged services, the defaults, the runtime
// overrides, the box's own addresses, the health checks' states and the
// drain clock go in; the services to program, the rejections and refusals,
// and an index of what the datapath holds (for status, metrics, health
// targets and the fleet record) come out, as one immutable View per pass.
// The datapath is behind a reconciler.Reconciler, so every pass runs
// against the fake datapath in tests, without root.
//
// A pass is either full (every service, after a reload, a new or removed
// service, or anything only a full pass may decide) or over a few named
// services (Services: a runtime override, a health verdict, a source's new
// definition of services it had), which costs about the same at 100 and
// at 100,000 services and yields exactly what a full pass would. lb/daemon
// owns the I/O around it: the sources, the API, the lock, persistence of
// overrides, timers, the announcers and the fleet record.
package plan

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Health is what a pass needs of the health checks: their states, and
// which backends to probe (health.Manager).
type Health interface {
	// States are all checks' states; Status one check's.
	States() map[health.Key]health.Status
	Status(health.Key) (health.Status, bool)
	// Update probes the backends of services, and stops probing any
	// other; UpdateServices does so for the services given only.
	Update(services []lb.Service, targets func(lb.Service, lb.Backend) health.Target)
	UpdateServices(services []lb.Service, targets func(lb.Service, lb.Backend) health.Target)
}

// Config is what a Plan is built with; everything but Rec and Merger is
// optional.
type Config struct {
	// Seed is the Maglev seed, for the index's fingerprints.
	Seed maglev.Seed
	// Rec programs the datapath.
	Rec *reconciler.Reconciler
	// Merger holds the sources' snapshots; the caller updates it.
	Merger *discovery.Merger
	// Health, when set, drains backends whose checks fail.
	Health Health
	// Supported says whether the datapath can serve a service (nil: all).
	Supported func(lb.Service) error
	// ProbeMark is the socket mark that sends a health probe through
	// the VIP to backend id (datapath.HealthMarkFor); nil: DSR backends
	// are probed on their own address.
	ProbeMark func(reconciler.BackendID) uint32
	Log       *slog.Logger
}

// Plan is the pipeline's state between passes. It is not safe for
// concurrent use: one control loop drives it; the Views it returns are
// immutable and may be read anywhere.
type Plan struct {
	seed      maglev.Seed
	rec       *reconciler.Reconciler
	merger    *discovery.Merger
	health    Health
	supported func(lb.Service) error
	probeMark func(reconciler.BackendID) uint32
	log       *slog.Logger

	defaults  lb.Defaults
	local     map[netip.Addr]string
	overrides Overrides
	// full is set when an input that every service depends on changed
	// (defaults, the box's addresses): only a full pass may follow.
	full bool

	// Drain timeouts: when each draining backend started draining, which
	// ones were cut, and the next deadline the caller was told of.
	drainSince map[Key]time.Time
	drainCut   map[Key]bool
	drainNext  time.Time

	index Index
	last  *View
}

// View is the result of one pass: what readers (API, metrics, announcers,
// the fleet record) see until the next. It is never modified; a pass over
// a few services shares every unchanged part with the last View.
type View struct {
	// Services are the desired services (defaults resolved, overrides
	// applied) in the merge's order; Pos indexes them by name.
	Services cow.Slice[lb.Service]
	Pos      map[string]int
	// Index is what the datapath holds per frontend.
	Index Index
	// ConfigStates are the sources' states of overridden backends.
	ConfigStates map[Key]lb.BackendState
	Conflicts    []string
	ConflictList []discovery.Conflict
	Rejected     []string
	Refused      []metrics.Refusal
	// HealthWarnings are the services whose checks all fail (fail open).
	HealthWarnings []string
	// Health is the checks' state when Services was programmed.
	Health cow.Map[health.Key, health.Status]
	// RecErr is the last reconcile's error, "" when it succeeded.
	RecErr string
	// VIPs indexes the services' VIP addresses.
	VIPs config.VIPIndex
}

// Result is what a pass did, for the caller's I/O.
type Result struct {
	View *View
	// Err is the reconcile's error: the caller retries with a full pass.
	Err error
	// Full is set for a full pass, whose reconcile took Took.
	Full bool
	Took time.Duration
	// ProgrammedMoved is set when the frontends clients can reach
	// (Index.Frontends) may have changed.
	ProgrammedMoved bool
	// OverridesPruned is set when overrides were forgotten (their
	// backends left): the caller saves them.
	OverridesPruned bool
	// NextDrain, when not zero, is when the next pass must run for a
	// drain timeout.
	NextDrain time.Time
	// NewRefusals are the refusals the last View did not have.
	NewRefusals []metrics.Refusal
	// Changed names the services a pass over a few services covered
	// (nil after a full pass): only their part of the View differs from
	// the last one.
	Changed []string
}

// New returns a plan with no services programmed by it yet.
func New(c Config) *Plan {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Supported == nil {
		c.Supported = func(lb.Service) error { return nil }
	}
	return &Plan{seed: c.Seed, rec: c.Rec, merger: c.Merger, health: c.Health, supported: c.Supported, probeMark: c.ProbeMark, log: c.Log,
		local: map[netip.Addr]string{}, overrides: Overrides{},
		drainSince: map[Key]time.Time{}, drainCut: map[Key]bool{}, last: &View{}}
}

// SetDefaults sets the services' defaults; a change makes the next pass a
// full one.
func (p *Plan) SetDefaults(d lb.Defaults) {
	if d != p.defaults {
		p.full = true
	}
	p.defaults = d
}

// LocalAddrs are the addresses of h by address, with their interfaces,
// for SetLocal (nil h: none).
func LocalAddrs(h *config.Host) map[netip.Addr]string {
	m := map[netip.Addr]string{}
	if h != nil {
		for _, a := range h.Addresses {
			m[a.Prefix.Addr().Unmap()] = a.Interface
		}
	}
	return m
}

// SetLocal sets the box's own addresses (address → interface; nil: no
// host checks); a change makes the next pass a full one.
func (p *Plan) SetLocal(local map[netip.Addr]string) {
	if local == nil {
		local = map[netip.Addr]string{}
	}
	if !maps.Equal(local, p.local) {
		p.full = true
	}
	p.local = local
}

// SetOverrides sets the runtime overrides. The plan shares the map: the
// caller may change entries between passes, and then runs a pass over the
// services whose overrides it changed.
func (p *Plan) SetOverrides(o Overrides) {
	p.overrides = o
	p.full = true
}

// SetDatapath sets the reconciler that programs the datapath and the
// datapath's own check of what it can serve (nil: everything).
func (p *Plan) SetDatapath(rec *reconciler.Reconciler, supported func(lb.Service) error) {
	if supported == nil {
		supported = func(lb.Service) error { return nil }
	}
	p.rec, p.supported = rec, supported
	p.full = true
}

// SetHealth sets the health checks a pass reads.
func (p *Plan) SetHealth(h Health) { p.health = h }

// View is the last pass's result.
func (p *Plan) View() *View { return p.last }

// onBox says which interface of the box holds a.
func (p *Plan) onBox(a netip.Addr) (string, bool) {
	ifc, ok := p.local[a]
	return ifc, ok
}

// Full merges, resolves defaults, drops what the datapath cannot serve
// and reconciles every service.
func (p *Plan) Full(now time.Time) Result {
	p.full = false
	// A full pass covers whatever the sources changed.
	p.merger.Changes()
	merged, conflicts := p.merger.Desired()
	r := p.Resolve(merged, p.defaults)
	desired := r.Desired
	res := Result{Full: true, OverridesPruned: p.overrides.prune(r.seen)}
	for _, c := range conflicts {
		p.log.Warn("service conflict", "conflict", c.String())
	}
	for _, r := range r.Rejected {
		p.log.Error("service refused", "reason", r)
	}
	if res.NextDrain = p.applyDrainTimeouts(desired, now); !res.NextDrain.IsZero() {
		p.drainNext = res.NextDrain
	}
	// One snapshot of the checks serves both the reconcile and the view,
	// so status never shows a state this pass did not program.
	healthStates := map[health.Key]health.Status{}
	if p.health != nil {
		healthStates = p.health.States()
	}
	programmed, warnings := p.applyHealth(desired, MapLookup(healthStates))
	for _, w := range warnings {
		p.log.Warn(w)
	}
	start := time.Now()
	err := p.rec.Reconcile(programmed)
	res.Took, res.Err = time.Since(start), err
	if err != nil {
		p.log.Error("reconcile failed; retrying", "error", err)
	}
	// Only what this pass changed is copied and indexed again.
	changed, gone := p.rec.Changes()
	p.index = updateIndex(p.index, p.seed, changed, gone, programmed)
	res.ProgrammedMoved = true
	if p.health != nil {
		// Probe every backend that has an entry, healthy or not: a
		// backend that failed must be able to come back.
		p.health.Update(desired, p.targets(p.index))
		// The view shows the states this pass programmed; backends the
		// update just started probing show their initial state, which
		// is what they were programmed with (a backend not probed yet
		// counts as up).
		for k, st := range p.health.States() {
			if _, ok := healthStates[k]; !ok {
				healthStates[k] = st
			}
		}
	}
	refused := append(r.Refused, mapFull(err, desired)...)
	res.NewRefusals = newRefusals(p.last.Refused, refused)
	v := &View{Services: cow.SliceOf(desired), Index: p.index, ConfigStates: r.configStates, Rejected: r.Rejected, Refused: refused,
		ConflictList: conflicts, HealthWarnings: warnings, Health: cow.MapOf(healthStates), VIPs: r.vips}
	for _, c := range conflicts {
		v.Conflicts = append(v.Conflicts, c.String())
	}
	v.Pos = make(map[string]int, len(desired))
	for i, svc := range desired {
		v.Pos[svc.Name] = i
	}
	if err != nil {
		v.RecErr = err.Error()
	}
	p.last = v
	res.View = v
	return res
}

// newRefusals are the refusals of now that were not in before.
func newRefusals(before, now []metrics.Refusal) []metrics.Refusal {
	was := make(map[metrics.Refusal]bool, len(before))
	for _, r := range before {
		was[r] = true
	}
	var out []metrics.Refusal
	for _, r := range now {
		if !was[r] {
			out = append(out, r)
		}
	}
	return out
}

// Services is the pass for a change that can only touch the services
// named: a runtime override of a backend, a health check's verdict on
// backends of a few services (flipped names the backends whose state
// changed), or a source's new definition of services it already had
// (discovery.Merger.Changes). It redoes those services' share of the pass
// (resolve, drain timeouts, health) from the sources' merge, programs them
// with reconciler.Update, which compares and writes nothing else, and
// makes a View that differs from the last one in those services and
// backends only. So such a change costs about the same at 100 services and
// at 100,000.
//
// It answers false, having changed nothing, whenever the result might
// differ from a full pass's in anything but those services; the caller
// then runs Full. That is the case when an input every service depends on
// changed, the last pass left an error to retry, a service is not in the
// last View (new, refused, or in conflict), one resolves to something
// other than one programmable service with the same frontend (a
// rejection), its health verdict carries a warning now or did before, and
// when Update fails. A service whose backends changed has its probes
// updated (Health.UpdateServices) once its new backends have ids, as the
// full pass does.
func (p *Plan) Services(names []string, flipped []health.Key, now time.Time) (Result, bool) {
	v := p.last
	if p.full || v.RecErr != "" || v.Pos == nil || len(names) == 0 {
		return Result{}, false
	}
	states := v.Health
	if len(flipped) > 0 && p.health != nil {
		e := v.Health.Edit()
		for _, k := range flipped {
			if st, ok := p.health.Status(k); ok {
				e.Set(k, st)
			} else {
				e.Delete(k)
			}
		}
		states = e.Map()
	}
	at := make([]int, 0, len(names))
	desired := make([]lb.Service, 0, len(names))
	var moved []int // desired[k] whose probes changed
	configStates := map[Key]lb.BackendState{}
	for _, name := range names {
		i, ok := v.Pos[name]
		if !ok || slices.Contains(at, i) {
			return Result{}, false
		}
		prev := v.Services.At(i)
		merged, ok := p.merger.Service(name)
		if !ok {
			return Result{}, false
		}
		r := p.Resolve([]lb.Service{merged}, p.defaults)
		if len(r.Desired) != 1 || r.Desired[0].Frontend != prev.Frontend || atVIP(r.Desired[0], v.VIPs) {
			return Result{}, false
		}
		if !sameProbes(r.Desired[0], prev) {
			moved = append(moved, len(desired))
		}
		warned := fmt.Sprintf("service %q:", name)
		if slices.ContainsFunc(v.HealthWarnings, func(w string) bool { return strings.HasPrefix(w, warned) }) {
			return Result{}, false
		}
		at = append(at, i)
		desired = append(desired, r.Desired[0])
		maps.Copy(configStates, r.configStates)
	}
	seen := map[Key]bool{}
	var next time.Time
	for i := range desired {
		if n := p.drainTimeouts(&desired[i], now, seen); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	programmed, warnings := p.applyHealth(desired, states.Get)
	if len(warnings) > 0 {
		return Result{}, false
	}
	if err := p.rec.Update(programmed); err != nil {
		p.log.Warn("pass over a few services failed; running a full pass", "services", names, "error", err)
		return Result{}, false
	}
	for k := range p.drainSince {
		if slices.Contains(names, k.Service) && !seen[k] {
			delete(p.drainSince, k)
			delete(p.drainCut, k)
		}
	}
	res := Result{Changed: names}
	if !next.IsZero() && (p.drainNext.IsZero() || next.Before(p.drainNext) || !p.drainNext.After(now)) {
		res.NextDrain = next
		p.drainNext = next
	}

	changed, gone := p.rec.Changes()
	index := updateIndex(p.index, p.seed, changed, gone, programmed)
	res.ProgrammedMoved = programmedMoved(p.index, changed, gone)
	p.index = index
	if len(moved) > 0 && p.health != nil {
		probe := make([]lb.Service, len(moved))
		for j, k := range moved {
			probe[j] = desired[k]
		}
		p.health.UpdateServices(probe, p.targets(index))
		// The view shows the states this pass programmed: a backend
		// that left has none, one that came its initial state.
		e := states.Edit()
		for j, k := range moved {
			for _, b := range v.Services.At(at[k]).Backends {
				e.Delete(health.Key{Service: probe[j].Name, Backend: b.Addr})
			}
			for _, b := range probe[j].Backends {
				k := health.Key{Service: probe[j].Name, Backend: b.Addr}
				if st, ok := states.Get(k); ok {
					e.Set(k, st)
				} else if st, ok := p.health.Status(k); ok {
					e.Set(k, st)
				}
			}
		}
		states = e.Map()
	}

	nv := *v
	for k, i := range at {
		nv.Services = nv.Services.With(i, desired[k])
	}
	nv.Index, nv.Health = index, states
	nv.ConfigStates = maps.Clone(v.ConfigStates)
	for k := range nv.ConfigStates {
		if slices.Contains(names, k.Service) {
			delete(nv.ConfigStates, k)
		}
	}
	maps.Copy(nv.ConfigStates, configStates)
	p.last = &nv
	res.View = &nv
	return res, true
}

// Pass runs the pass that the merger's changes since the last pass need:
// none when nothing changed (the Result's View is nil), one over the
// changed services when they are few and changed within themselves, and a
// full pass otherwise. Every caller that updates the merger (l4lbd's
// control loop, the sources' tests, the benchmarks) runs this.
func (p *Plan) Pass(now time.Time) Result {
	names, all := p.merger.Changes()
	if !all && !p.full && p.last.Pos != nil {
		if len(names) == 0 {
			return Result{}
		}
		if len(names) <= MaxFewServices {
			if res, ok := p.Services(names, nil, now); ok {
				return res
			}
		}
	}
	return p.Full(now)
}

// Programmed runs the health checks over svcs as a pass would, with the
// states of the last View: what the datapath would get (for a preview).
func (p *Plan) Programmed(svcs []lb.Service) []lb.Service {
	out, _ := p.applyHealth(svcs, p.last.Health.Get)
	return out
}

// atVIP reports whether a backend of svc is at another service's VIP: the
// full pass decides which of the two to refuse (Resolved.across).
func atVIP(svc lb.Service, vips config.VIPIndex) bool {
	return slices.ContainsFunc(svc.Backends, func(b lb.Backend) bool {
		return b.Addr.Addr() != svc.Frontend.Addr && vips.Has(b.Addr.Addr())
	})
}

// sameProbes reports whether a and b list the same backend addresses in
// the same order, with the same check and mode (which decides whether a
// probe goes through the VIP): then a pass over one of them probes what
// the last pass probed.
func sameProbes(a, b lb.Service) bool {
	return a.Health == b.Health && a.Mode == b.Mode &&
		slices.EqualFunc(a.Backends, b.Backends, func(x, y lb.Backend) bool { return x.Addr == y.Addr })
}

// MaxFewServices is the most services a pass over named services should
// cover: past that, a full pass is cheaper than checking each one.
const MaxFewServices = 64

// Flips is the pass after health checks changed the state of the
// backends flipped: over their services alone when they are few, and
// false when a full pass must run.
func (p *Plan) Flips(flipped []health.Key, now time.Time) (Result, bool) {
	var names []string
	for _, k := range flipped {
		if !slices.Contains(names, k.Service) {
			if len(names) == MaxFewServices {
				return Result{}, false
			}
			names = append(names, k.Service)
		}
	}
	return p.Services(names, flipped, now)
}
