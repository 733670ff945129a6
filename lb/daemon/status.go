// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"net/netip"
	"os"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

var _ api.Provider = (*Daemon)(nil)

// Status implements api.Provider.
func (d *Daemon) Status() api.Status {
	v := d.view.Load()
	d.mu.Lock()
	rl := d.lastReload
	d.mu.Unlock()
	st := api.Status{
		Version:         Version,
		PID:             os.Getpid(),
		StartedAt:       d.started,
		ConfigFile:      d.opts.ConfigPath,
		DevSeed:         v.cfg.Maglev.DevSeed,
		SeedFingerprint: seedFingerprint(v.cfg.Maglev.Seed),
		LastReload:      rl,
		Services:        len(v.services),
		Conflicts:       v.conflicts,
		Rejected:        v.rejected,
		ReconcileError:  v.recErr,
	}
	for _, s := range v.state.Services {
		st.Backends += len(s.Backends)
	}
	for _, ifc := range v.cfg.Datapath.Interfaces {
		st.Interfaces = append(st.Interfaces, api.Interface{Name: ifc, Attach: v.cfg.Datapath.Attach.String(), Mode: v.cfg.Datapath.XDPMode.String()})
	}
	if d.dp != nil {
		if reasons, err := d.dp.Reasons(); err == nil {
			for _, name := range d.dp.ReasonNames() {
				r := reasons[name]
				st.Reasons = append(st.Reasons, api.Reason{Name: name, Packets: r.Packets, Bytes: r.Bytes})
			}
		}
	}
	return st
}

// Services implements api.Provider: the desired services joined with what
// is programmed and the live counters.
func (d *Daemon) Services() []api.Service {
	v := d.view.Load()
	byFE := map[lb.Frontend]reconciler.ServiceState{}
	for _, s := range v.state.Services {
		byFE[s.Service.Frontend] = s
	}
	out := make([]api.Service, 0, len(v.services))
	for _, svc := range v.services {
		ps := byFE[svc.Frontend]
		as := api.Service{
			Name:        svc.Name,
			Frontend:    svc.Frontend.String(),
			Mode:        svc.Mode.String(),
			Dispatch:    svc.Dispatch.String(),
			TableSize:   svc.TableSize,
			Source:      svc.Source,
			Fingerprint: maglev.Fingerprint(v.cfg.Maglev.Seed, svc.TableSize, eligible(svc)),
		}
		if d.dp != nil && ps.ID != 0 {
			if c, err := d.dp.ServiceCounters(ps.ID); err == nil {
				as.Counters = api.Counters(c)
			}
		}
		ids := map[netip.AddrPort]reconciler.BackendID{}
		for _, b := range ps.Backends {
			ids[b.Addr] = b.ID
		}
		slots := map[reconciler.BackendID]int{}
		for _, id := range ps.Table {
			slots[id]++
		}
		for _, b := range svc.Backends {
			ab := api.Backend{Address: b.Addr.String(), Weight: b.Weight, State: b.State.String()}
			if id, ok := ids[b.Addr]; ok {
				ab.Slots = slots[id]
				if d.dp != nil {
					if c, err := d.dp.BackendCounters(id); err == nil {
						ab.Counters = api.Counters(c)
					}
				}
			}
			as.Backends = append(as.Backends, ab)
		}
		out = append(out, as)
	}
	return out
}

// eligible are the backends that take part in the Maglev table.
func eligible(svc lb.Service) []maglev.Backend {
	var out []maglev.Backend
	for _, b := range svc.Backends {
		if b.State == lb.Active && b.Weight > 0 {
			out = append(out, maglev.Backend{Addr: b.Addr, Weight: b.Weight})
		}
	}
	return out
}
