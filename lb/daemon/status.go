// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/plan"
	"github.com/l4lb/l4lb/lb/reconciler"
)

var _ api.Provider = (*Daemon)(nil)

// Status implements api.Provider.
func (d *Daemon) Status() api.Status {
	v := d.view.Load()
	d.mu.Lock()
	rl := d.lastReload
	pending := slices.Clone(d.pending)
	d.mu.Unlock()
	st := api.Status{
		Version:         Version,
		PID:             os.Getpid(),
		StartedAt:       d.started,
		ConfigFile:      d.opts.ConfigPath,
		DevSeed:         v.cfg.Maglev.DevSeed,
		SeedFingerprint: seedFingerprint(v.cfg.Maglev.Seed),
		LastReload:      rl,
		PendingRestart:  pending,
		Services:        v.Services.Len(),
		Conflicts:       v.Conflicts,
		Rejected:        v.Rejected,
		HealthWarnings:  v.HealthWarnings,
		ReconcileError:  v.RecErr,
		Discovery:       d.discoveryStatus(),
		BGP:             d.bgpStatus(v),
		L2:              d.l2Status(v),
		SelfCheck:       d.selfCheckStatus(),
	}
	if rep, fst, ok := d.fleetReport(); ok {
		st.FleetWarnings = rep.Warnings()
		if fst.Error != "" {
			st.FleetWarnings = append(st.FleetWarnings, "fleet check failing: "+fst.Error)
		}
	}
	st.Backends = v.Index.Backends
	for _, ifc := range v.cfg.Datapath.Interfaces {
		ai := api.Interface{Name: ifc, Attach: v.cfg.Datapath.Attach.String(), Mode: v.cfg.Datapath.XDPMode.String(), Attached: "not attached"}
		if d.dp != nil {
			if a, err := d.dp.Attached(ifc); err == nil {
				ai.Attached = a.String()
			} else {
				ai.Attached, ai.AttachedError = "unknown", err.Error()
			}
		}
		st.Interfaces = append(st.Interfaces, ai)
	}
	if reasons, err := d.reasons(); err == nil {
		for _, r := range reasons {
			st.Reasons = append(st.Reasons, api.Reason{Name: r.Name, Packets: r.Packets, Bytes: r.Bytes})
		}
	}
	return st
}

// reasons reads the datapath's reason counters in the enum's order.
func (d *Daemon) reasons() ([]metrics.Reason, error) {
	if d.dp == nil {
		return nil, nil
	}
	counts, err := d.dp.Reasons()
	if err != nil {
		return nil, err
	}
	var out []metrics.Reason
	for _, name := range d.dp.ReasonNames() {
		r := counts[name]
		out = append(out, metrics.Reason{Name: name, Packets: r.Packets, Bytes: r.Bytes})
	}
	return out, nil
}

// Services implements api.Provider: the desired services joined with what
// is programmed and the live counters.
func (d *Daemon) Services() []api.Service {
	v := d.view.Load()
	// A failed count leaves the connection columns at 0; status and
	// metrics report the table's errors.
	conns, _ := d.flowCounts()
	out := make([]api.Service, 0, v.Services.Len())
	for _, svc := range v.Services.All() {
		out = append(out, d.apiService(v, svc, conns))
	}
	return out
}

// Service implements api.Provider: one service as Services lists it,
// without building the others (`l4lbctl service get`, and whoever polls
// it to see a change in force).
func (d *Daemon) Service(name string) (api.Service, error) {
	v := d.view.Load()
	if i, ok := v.Pos[name]; ok {
		conns, _ := d.flowCounts()
		return d.apiService(v, v.Services.At(i), conns), nil
	}
	return api.Service{}, fmt.Errorf("no service %q: %w", name, api.ErrNotFound)
}

// apiService is svc of view v as the API shows it, with its counters and,
// from conns, its backends' connections.
func (d *Daemon) apiService(v *view, svc lb.Service, conns map[datapath.FlowOwner]datapath.FlowCount) api.Service {
	states := v.Health
	ps := v.programmedOf(svc.Frontend)
	as := api.Service{
		Name:        svc.Name,
		Frontend:    svc.Frontend.String(),
		Mode:        svc.Mode.String(),
		Dispatch:    svc.Dispatch.String(),
		TableSize:   svc.TableSize,
		Source:      svc.Source,
		Fingerprint: ps.Fingerprint,
	}
	if d.dp != nil && ps.ID != 0 {
		if c, err := d.dp.ServiceCounters(ps.ID); err == nil {
			as.Counters = api.Counters(c)
		}
	}
	for _, b := range svc.Backends {
		ab := api.Backend{Address: b.Addr.String(), Weight: b.Weight, State: b.State.String(), ConfigState: b.State.String()}
		if cs, ok := v.ConfigStates[plan.Key{Service: svc.Name, Backend: b.Addr}]; ok {
			ab.Override = true
			ab.ConfigState = cs.String()
		}
		ab.Health = healthName(healthOf(v, svc, b))
		if st, ok := states.Get(health.Key{Service: svc.Name, Backend: b.Addr}); ok && st.State == health.Down {
			ab.HealthError = d.healthError(st)
		}
		if id, ok := ps.IDs[b.Addr]; ok {
			ab.Slots = ps.Slots[id]
			c := conns[datapath.FlowOwner{Service: ps.ID, Backend: id}]
			ab.ActiveConns, ab.InactiveConns = c.Active, c.Inactive
			if d.dp != nil {
				if c, err := d.dp.BackendCounters(id); err == nil {
					ab.Counters = api.Counters(c)
				}
			}
		}
		as.Backends = append(as.Backends, ab)
	}
	return as
}

// healthError is why a backend programmed down (st, as of the view) is
// still down: the error of its latest probe, not the one that took it down
// (the view changes only when a state does; the probes go on between).
func (d *Daemon) healthError(st health.Status) string {
	if d.health == nil {
		return st.LastError
	}
	cur, ok := d.health.Status(health.Key{Service: st.Service, Backend: st.Backend})
	return currentHealthError(st, cur, ok)
}

// currentHealthError is healthError once the checker's current status of
// the backend (cur, ok) is known: its latest error, or, when its latest
// probes passed but not yet rise of them, how far it is.
func currentHealthError(programmed, cur health.Status, ok bool) string {
	switch {
	case !ok:
		return programmed.LastError
	case cur.LastError != "":
		return cur.LastError
	case cur.Successes > 0:
		return fmt.Sprintf("recovering: %d of %d successful checks (last error: %s)", cur.Successes, cur.Check.Rise, programmed.LastError)
	}
	return programmed.LastError
}

func healthName(h metrics.Health) string {
	switch h {
	case metrics.HealthHealthy:
		return "healthy"
	case metrics.HealthUnhealthy:
		return "unhealthy"
	case metrics.HealthUnknown:
		return "unknown"
	}
	return "unchecked"
}

// Conntrack implements api.Provider.
func (d *Daemon) Conntrack() (api.Conntrack, error) {
	if d.dp == nil {
		return api.Conntrack{}, errors.New("datapath not loaded")
	}
	return conntrackOf(d.dp, countMaxAge)
}

// conntrackOf is the connection table's fill of dp, counted at most maxAge
// ago, and its insert failures.
func conntrackOf(dp *datapath.LB, maxAge time.Duration) (api.Conntrack, error) {
	n, err := dp.ConntrackEntriesWithin(maxAge)
	if err != nil {
		return api.Conntrack{}, err
	}
	ct := api.Conntrack{Entries: n, Capacity: dp.ConntrackCapacity()}
	if reasons, err := dp.Reasons(); err == nil {
		ct.InsertFailures = reasons["event_ct_insert_failed"].Packets
	}
	return ct, nil
}

// programmedOf returns what is programmed for fe; the zero value (no id,
// no table, nothing indexed) when nothing is.
func (v *view) programmedOf(fe lb.Frontend) *plan.Programmed {
	if ps, ok := v.Index.Get(fe); ok {
		return ps
	}
	return &plan.Programmed{}
}

// programmed returns the desired service named name and what is programmed
// for it.
func (d *Daemon) programmed(name string) (lb.Service, reconciler.ServiceState, *view, error) {
	v := d.view.Load()
	if i, ok := v.Pos[name]; ok {
		svc := v.Services.At(i)
		if ps := v.programmedOf(svc.Frontend); ps.HasTable {
			return svc, ps.ServiceState, v, nil
		}
		return svc, reconciler.ServiceState{}, v, fmt.Errorf("service %q is not programmed (yet): see l4lbctl status", name)
	}
	return lb.Service{}, reconciler.ServiceState{}, v, fmt.Errorf("no service %q: %w", name, api.ErrNotFound)
}

// liveTable turns a programmed table of backend ids into the shape of
// `l4lbctl maglev table`: backends in canonical order, slots as indexes.
func liveTable(st reconciler.ServiceState) api.MaglevTable {
	addrs := map[reconciler.BackendID]netip.AddrPort{}
	for _, b := range st.Backends {
		addrs[b.ID] = b.Addr
	}
	var bs []maglev.Backend
	seen := map[reconciler.BackendID]bool{}
	for _, id := range st.Table {
		if !seen[id] {
			seen[id] = true
			bs = append(bs, maglev.Backend{Addr: addrs[id]})
		}
	}
	maglev.SortBackends(bs)
	index := map[netip.AddrPort]int32{}
	t := api.MaglevTable{Size: uint32(len(st.Table)), Backends: []string{}, Table: make([]int32, len(st.Table))}
	for i, b := range bs {
		index[b.Addr] = int32(i)
		t.Backends = append(t.Backends, b.Addr.String())
	}
	for i, id := range st.Table {
		t.Table[i] = index[addrs[id]]
	}
	return t
}

// Maglev implements api.Provider.
func (d *Daemon) Maglev(service string) (api.MaglevTable, error) {
	_, st, _, err := d.programmed(service)
	if err != nil {
		return api.MaglevTable{}, err
	}
	return liveTable(st), nil
}

// Lookup implements api.Provider: the backend the live table picks for
// the flow, and the connection table's entry when the flow has one.
func (d *Daemon) Lookup(service string, client netip.AddrPort) (api.Lookup, error) {
	svc, st, v, err := d.programmed(service)
	if err != nil {
		return api.Lookup{}, err
	}
	if client.Addr().Unmap().Is4() != svc.Frontend.Addr.Is4() {
		return api.Lookup{}, fmt.Errorf("client %s and VIP %s are of different address families: %w", client, svc.Frontend.Addr, api.ErrInvalid)
	}
	t := liveTable(st)
	if len(t.Table) == 0 {
		return api.Lookup{}, fmt.Errorf("service %q has no eligible backend: new flows are dropped", service)
	}
	f := maglev.Flow{Src: client.Addr().Unmap(), Dst: svc.Frontend.Addr, SrcPort: client.Port(), DstPort: svc.Frontend.Port, Proto: uint8(svc.Frontend.Proto)}
	h := maglev.FlowHash(v.cfg.Maglev.Seed, f)
	slot := maglev.Slot(h, t.Size)
	l := api.Lookup{Backend: t.Backends[t.Table[slot]], Index: t.Table[slot], Slot: slot, Hash: fmt.Sprintf("%016x", h)}
	if d.dp != nil {
		if id, sid, ok := d.dp.ConntrackLookup(netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), svc.Frontend); ok && sid == st.ID {
			for _, b := range st.Backends {
				if b.ID == id {
					l.Conntrack = b.Addr.String()
				}
			}
		}
	}
	return l, nil
}
