// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/metrics"
)

// Resolved are merged services as the datapath gets them.
type Resolved struct {
	// Desired are the services to program; Rejected and Refused say
	// why the others are left out (for the log and status, and for
	// metrics).
	Desired  []lb.Service
	Rejected []string
	Refused  []metrics.Refusal
	// seen are the overrides that still apply; configStates the
	// sources' states of the overridden backends.
	seen         map[Key]bool
	configStates map[Key]lb.BackendState
	// vips indexes the VIP addresses of desired.
	vips config.VIPIndex
}

// Resolve gives merged services their defaults and runtime overrides, and
// leaves out those the datapath cannot serve. It changes nothing: a pass
// programs its result, a preview only compares it.
func (p *Plan) Resolve(merged []lb.Service, defs lb.Defaults) Resolved {
	r := Resolved{seen: map[Key]bool{}, configStates: map[Key]lb.BackendState{}}
	for _, svc := range merged {
		svc = Normalize(svc.WithDefaults(defs))
		for _, b := range svc.Backends {
			k := Key{Service: svc.Name, Backend: b.Addr}
			if _, ok := p.overrides[k]; ok {
				r.configStates[k] = b.State
			}
		}
		svc = p.overrides.apply(svc, r.seen)
		// Validation refuses it in the file; other sources get the
		// same rule here.
		if ifc, ok := p.local[svc.Frontend.Addr]; ok {
			r.Rejected = append(r.Rejected, fmt.Sprintf("service %q (%s): vip %s is an address of this box (%s): l4lb would take over %s for every client; use an address the box does not hold",
				svc.Name, svc.Source, svc.Frontend.Addr, ifc, svc.Frontend))
			r.Refused = append(r.Refused, metrics.Refusal{Service: svc.Name, Source: svc.Source, Reason: metrics.RefusedLocalVIP})
			continue
		}
		if ps := config.ServiceProblems(svc, p.onBox); len(ps) > 0 {
			r.cannotWork(svc, ps[0].Describe(svc))
			continue
		}
		// The datapath's own check also knows its SNAT addresses.
		if err := p.supported(svc); err != nil {
			r.Rejected = append(r.Rejected, fmt.Sprintf("service %q (%s): %v", svc.Name, svc.Source, err))
			r.Refused = append(r.Refused, metrics.Refusal{Service: svc.Name, Source: svc.Source, Reason: metrics.RefusedUnsupported})
			continue
		}
		r.Desired = append(r.Desired, svc)
	}
	r.across()
	return r
}

// cannotWork refuses svc for a rule that means it can never work.
func (r *Resolved) cannotWork(svc lb.Service, why string) {
	r.Rejected = append(r.Rejected, fmt.Sprintf("service %q (%s): %s", svc.Name, svc.Source, why))
	r.Refused = append(r.Refused, metrics.Refusal{Service: svc.Name, Source: svc.Source, Reason: metrics.RefusedCannotWork})
}

// across refuses the services that break a rule across services (a backend
// at another service's VIP, config.AcrossServices) and indexes the VIPs of
// those that stay. Of a pair, the file's service keeps serving (the file
// refuses such a pair outright, so the other one comes from another
// source); of two from other sources, the one later by frontend is
// refused. The common case, no such pair, costs one index of the VIPs and
// one look-up per backend.
func (r *Resolved) across() {
	r.vips = config.IndexVIPs(r.Desired)
	name := func(svcs []lb.Service) func(int) string {
		return func(i int) string { return fmt.Sprintf("service %q (%s)", svcs[i].Name, svcs[i].Source) }
	}
	if len(config.AcrossServices(r.Desired, r.vips, name(r.Desired))) == 0 {
		return
	}
	ordered := slices.Clone(r.Desired)
	slices.SortStableFunc(ordered, func(a, b lb.Service) int {
		return cmpBool(!strings.HasPrefix(a.Source, "file:"), !strings.HasPrefix(b.Source, "file:"))
	})
	out := map[string]bool{}
	for _, p := range config.AcrossServices(ordered, config.IndexVIPs(ordered), name(ordered)) {
		if svc := ordered[p.Service]; !out[svc.Name] {
			out[svc.Name] = true
			r.cannotWork(svc, p.Describe(svc))
		}
	}
	r.Desired = slices.DeleteFunc(r.Desired, func(s lb.Service) bool { return out[s.Name] })
	r.vips = config.IndexVIPs(r.Desired)
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// Normalize resolves what the datapath stores per frontend: a frontend has
// one protocol, so hybrid becomes DSR (TCP) or SNAT (UDP), and SNAT has no
// dispatch. The reconciler then compares like with like after a restart.
func Normalize(s lb.Service) lb.Service {
	s.Mode = s.ModeFor(s.Frontend.Proto)
	if s.Mode == lb.ModeSNAT {
		s.Dispatch = lb.DispatchDefault
	}
	return s
}
