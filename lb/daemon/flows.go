// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// flowService is what listing flows needs of one programmed service: its
// name and ids.
type flowService struct {
	name string
	id   reconciler.ServiceID
	ids  map[netip.AddrPort]reconciler.BackendID
}

// viewFlowServices are v's programmed services.
func viewFlowServices(v *view) []flowService {
	out := make([]flowService, 0, v.Services.Len())
	for _, svc := range v.Services.All() {
		if ps := v.programmedOf(svc.Frontend); ps.ID != 0 {
			out = append(out, flowService{name: svc.Name, id: ps.ID, ids: ps.IDs})
		}
	}
	return out
}

// flowNames names the service and backend ids of a view.
type flowNames struct {
	services map[reconciler.ServiceID]string
	backends map[reconciler.BackendID]netip.AddrPort
	// owner is the service id each backend id is programmed in.
	owner map[reconciler.BackendID]reconciler.ServiceID
}

func namesOf(svcs []flowService) flowNames {
	n := flowNames{services: map[reconciler.ServiceID]string{}, backends: map[reconciler.BackendID]netip.AddrPort{}, owner: map[reconciler.BackendID]reconciler.ServiceID{}}
	for _, s := range svcs {
		n.services[s.id] = s.name
		for addr, id := range s.ids {
			n.backends[id], n.owner[id] = addr, s.id
		}
	}
	return n
}

// flowFilter turns a service name and a backend (ip:port, of any service
// unless one is named) into the datapath's filter.
func flowFilter(svcs []flowService, service, backend string) (datapath.FlowFilter, error) {
	var f datapath.FlowFilter
	var be netip.AddrPort
	if backend != "" {
		var err error
		if be, err = netip.ParseAddrPort(backend); err != nil {
			return f, fmt.Errorf("backend %q: want ip:port (IPv6 as [addr]:port): %w", backend, api.ErrInvalid)
		}
		be = netip.AddrPortFrom(be.Addr().Unmap(), be.Port())
		f.Backends = map[reconciler.BackendID]bool{}
	}
	if service != "" {
		f.Services = map[reconciler.ServiceID]bool{}
	}
	svcFound, beFound := service == "", backend == ""
	for _, s := range svcs {
		if service != "" && s.name != service {
			continue
		}
		svcFound = true
		if f.Services != nil {
			f.Services[s.id] = true
		}
		if id, ok := s.ids[be]; ok && f.Backends != nil {
			f.Backends[id], beFound = true, true
		}
	}
	switch {
	case !svcFound:
		return f, fmt.Errorf("no service %q: %w", service, api.ErrNotFound)
	case beFound:
		return f, nil
	case service == "":
		return f, fmt.Errorf("no programmed service has backend %s: %w", be, api.ErrNotFound)
	}
	return f, fmt.Errorf("service %q has no programmed backend %s: %w", service, be, api.ErrNotFound)
}

// Flows implements api.Provider.
func (d *Daemon) Flows(q api.FlowQuery) (api.FlowList, error) {
	if d.dp == nil {
		return api.FlowList{Flows: []api.Flow{}}, errors.New("datapath not loaded")
	}
	return listFlows(d.dp, viewFlowServices(d.view.Load()), q)
}

// listFlows lists dp's flows that q asks for, named after svcs.
func listFlows(dp *datapath.LB, svcs []flowService, q api.FlowQuery) (api.FlowList, error) {
	out := api.FlowList{Flows: []api.Flow{}}
	f, err := flowFilter(svcs, q.Service, q.Backend)
	if err != nil {
		return out, err
	}
	names := namesOf(svcs)
	err = dp.Flows(f, func(fl datapath.Flow) bool {
		out.Matched++
		if q.Limit > 0 && len(out.Flows) >= q.Limit {
			return true // counted, not listed
		}
		af := api.Flow{
			Proto:          fl.Frontend.Proto.String(),
			Client:         fl.Client.String(),
			VIP:            netip.AddrPortFrom(fl.Frontend.Addr, fl.Frontend.Port).String(),
			Service:        names.services[fl.Service],
			Backend:        fmt.Sprintf("id %d", fl.Backend),
			State:          fl.State.String(),
			Active:         fl.State.Active(),
			AgeSeconds:     fl.Age.Seconds(),
			ExpiresSeconds: fl.Expires.Seconds(),
		}
		if be, ok := names.backends[fl.Backend]; ok && names.owner[fl.Backend] == fl.Service {
			af.Backend = be.String()
		}
		if fl.SNAT.IsValid() {
			af.SNAT = fl.SNAT.String()
		}
		out.Flows = append(out.Flows, af)
		return true
	})
	return out, err
}

// Flush implements api.Provider. It runs on the control loop, so no
// reconcile hands the ids it resolved to other backends meanwhile.
func (d *Daemon) Flush(ctx context.Context, req api.FlushRequest) (api.FlushResult, error) {
	if d.dp == nil {
		return api.FlushResult{}, errors.New("datapath not loaded")
	}
	var res datapath.FlushResult
	err := d.query(ctx, func() error {
		var f datapath.FlowFilter
		if !req.All || req.Service != "" || req.Backend != "" {
			var err error
			if f, err = flowFilter(viewFlowServices(d.view.Load()), req.Service, req.Backend); err != nil {
				return err
			}
		}
		var err error
		res, err = d.dp.FlushFlows(f)
		return err
	})
	return api.FlushResult{Flows: res.Flows, Bindings: res.Bindings}, err
}

// flowCounts are the connection table's counts per service and backend,
// at most countMaxAge old; nil without a datapath or when they cannot be
// read (err says why).
func (d *Daemon) flowCounts() (map[datapath.FlowOwner]datapath.FlowCount, error) {
	if d.dp == nil {
		return nil, nil
	}
	return d.dp.FlowCounts(countMaxAge)
}
