// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"net/netip"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Pinned is the datapath a stopped l4lbd left pinned, read without it
// (`l4lbctl --offline`, and l4lbctl when no l4lbd answers): what the kernel
// forwards now, in the shapes the admin API answers. The kernel holds no
// service names, sources, weights, health or overrides: names come from
// the config file's services by frontend (the frontend itself for a
// service of another source), and the rest is left empty.
type Pinned struct {
	dp    *datapath.LB
	st    reconciler.State
	names map[lb.Frontend]string
	// Dir is the bpffs directory read.
	Dir string
}

// OpenPinned reads the datapath pinned under cfg's daemon.bpffs, naming
// its services after cfg's.
func OpenPinned(cfg *config.Config) (*Pinned, error) {
	dp, err := datapath.OpenPinned(cfg.Daemon.BPFFS)
	if err != nil {
		return nil, err
	}
	st, err := dp.State()
	if err != nil {
		dp.Close()
		return nil, fmt.Errorf("read the pinned datapath under %s: %w", cfg.Daemon.BPFFS, err)
	}
	p := &Pinned{dp: dp, st: st, names: map[lb.Frontend]string{}, Dir: cfg.Daemon.BPFFS}
	for _, s := range cfg.Services {
		p.names[s.Frontend] = s.Name
	}
	return p, nil
}

// Close releases the maps.
func (p *Pinned) Close() error { return p.dp.Close() }

// Services lists every service that has an entry, as `service list` shows
// it; a service's table slots are counted from its pinned Maglev table.
func (p *Pinned) Services() []api.Service {
	var out []api.Service
	for _, s := range p.st.Services {
		if !s.HasEntry {
			continue
		}
		out = append(out, p.service(s))
	}
	return out
}

// Service is the service named name (or whose frontend is name), as
// `service get` shows it.
func (p *Pinned) Service(name string) (api.Service, error) {
	for _, s := range p.Services() {
		if s.Name == name || s.Frontend == name {
			return s, nil
		}
	}
	return api.Service{}, fmt.Errorf("no service %q pinned under %s: %w", name, p.Dir, api.ErrNotFound)
}

// name is the config's name of a pinned service, or its frontend.
func (p *Pinned) name(s reconciler.ServiceState) string {
	if name, ok := p.names[s.Service.Frontend]; ok {
		return name
	}
	return s.Service.Frontend.String()
}

func (p *Pinned) service(s reconciler.ServiceState) api.Service {
	svc := s.Service
	name := p.name(s)
	source := "pinned (" + p.Dir + ")"
	as := api.Service{Name: name, Frontend: svc.Frontend.String(), Mode: svc.Mode.String(), TableSize: svc.TableSize, Source: source}
	if svc.Mode != lb.ModeSNAT {
		as.Dispatch = svc.Dispatch.String()
	}
	if c, err := p.dp.ServiceCounters(s.ID); err == nil {
		as.Counters = api.Counters(c)
	}
	slots := map[reconciler.BackendID]int{}
	for _, id := range s.Table {
		slots[id]++
	}
	for _, b := range s.Backends {
		ab := api.Backend{Address: b.Addr.String(), State: b.State.String(), ConfigState: b.State.String(), Slots: slots[b.ID]}
		if c, err := p.dp.BackendCounters(b.ID); err == nil {
			ab.Counters = api.Counters(c)
		}
		as.Backends = append(as.Backends, ab)
	}
	return as
}

// Flows lists the pinned connection table's flows as `conntrack list`
// does, services named as Services names them.
func (p *Pinned) Flows(q api.FlowQuery) (api.FlowList, error) {
	svcs := make([]flowService, 0, len(p.st.Services))
	for _, s := range p.st.Services {
		fs := flowService{name: p.name(s), id: s.ID, ids: make(map[netip.AddrPort]reconciler.BackendID, len(s.Backends))}
		for _, b := range s.Backends {
			fs.ids[b.Addr] = b.ID
		}
		svcs = append(svcs, fs)
	}
	return listFlows(p.dp, svcs, q)
}

// Conntrack is the connection table's fill and insert failures.
func (p *Pinned) Conntrack() (api.Conntrack, error) { return conntrackOf(p.dp, 0) }
