// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/plan"
)

var _ metrics.Source = (*Daemon)(nil)

// countMaxAge is how old a count of the connection or SNAT tables may be
// when status or a scrape asks: counting walks the whole table.
const countMaxAge = 5 * time.Second

// Snapshot implements metrics.Source: the view the control loop published
// last, and the datapath's counters read now.
func (d *Daemon) Snapshot() metrics.Snapshot {
	v := d.view.Load()
	var snap metrics.Snapshot
	conns, err := d.flowCounts()
	if err != nil {
		snap.Errors = append(snap.Errors, err)
	}
	for _, svc := range v.Services.All() {
		ps := v.programmedOf(svc.Frontend)
		ms := metrics.Service{
			Name: svc.Name, Frontend: svc.Frontend, Mode: svc.Mode, Dispatch: svc.Dispatch,
			Source: svc.Source, Fingerprint: ps.Fingerprint,
		}
		if d.dp != nil && ps.ID != 0 {
			if c, err := d.dp.ServiceCounters(ps.ID); err == nil {
				mc := metrics.Counters(c)
				ms.Counters = &mc
			} else {
				snap.Errors = append(snap.Errors, err)
			}
		}
		for _, b := range svc.Backends {
			mb := metrics.Backend{Addr: b.Addr, Weight: b.Weight, State: b.State, Health: healthOf(v, svc, b)}
			_, mb.Override = v.ConfigStates[plan.Key{Service: svc.Name, Backend: b.Addr}]
			if id, ok := ps.IDs[b.Addr]; ok && d.dp != nil {
				if c, err := d.dp.BackendCounters(id); err == nil {
					mc := metrics.Counters(c)
					mb.Counters = &mc
				} else {
					snap.Errors = append(snap.Errors, err)
				}
				if conns != nil {
					c := conns[datapath.FlowOwner{Service: ps.ID, Backend: id}]
					mb.Connections = &metrics.Connections{Active: c.Active, Inactive: c.Inactive}
				}
			}
			ms.Backends = append(ms.Backends, mb)
		}
		snap.Services = append(snap.Services, ms)
	}
	if d.dp != nil {
		if reasons, err := d.reasons(); err == nil {
			snap.Reasons = reasons
		} else {
			snap.Errors = append(snap.Errors, err)
		}
		if evs, err := d.dp.Events(); err == nil {
			for _, name := range d.dp.EventNames() {
				snap.Events = append(snap.Events, metrics.Event{Name: name, Count: evs[name]})
			}
		} else {
			snap.Errors = append(snap.Errors, err)
		}
		if n, err := d.dp.ConntrackEntriesWithin(countMaxAge); err == nil {
			snap.Conntrack = &metrics.Table{Entries: uint64(n), Capacity: uint64(d.dp.ConntrackCapacity())}
		} else {
			snap.Errors = append(snap.Errors, err)
		}
		if flows, _, err := d.dp.SNATEntriesWithin(countMaxAge); err == nil {
			snap.SNAT = &metrics.Table{Entries: uint64(flows), Capacity: uint64(d.dp.SNATCapacity())}
		} else {
			snap.Errors = append(snap.Errors, err)
		}
		snap.Maps = d.mapOccupancy(v)
	}
	for _, s := range d.discoveryStatus() {
		snap.Discovery = append(snap.Discovery, metrics.Discovery{Name: s.Name, LastSync: s.LastSync})
	}
	for _, c := range v.ConflictList {
		snap.Conflicts = append(snap.Conflicts, metrics.Conflict{Service: c.Service, Source: c.Source, Reason: c.Reason})
	}
	snap.Refused = append(snap.Refused, v.Refused...)
	d.mu.Lock()
	snap.PendingRestart = append(snap.PendingRestart, d.pending...)
	d.mu.Unlock()
	snap.SeedFingerprint = seedFingerprint(v.cfg.Maglev.Seed)
	snap.IPFIX = d.ipfixMetrics()
	if rep, _, ok := d.fleetReport(); ok {
		snap.Fleet = &metrics.Fleet{Boxes: len(rep.Boxes), Mismatch: rep.Mismatched(d.fleet.f.Name())}
	}
	if b := d.bgpStatus(v); b != nil {
		mb := &metrics.BGP{Announced: announcedCount(b.VIPs)}
		for _, p := range b.Peers {
			mp := metrics.BGPPeer{Address: p.Address, Up: p.Up, Advertised: p.Advertised, UpdatesSent: p.UpdatesSent, UpdatesReceived: p.UpdatesReceived}
			if b := p.BFD; b != nil {
				mp.BFD = &metrics.BFD{Up: b.State == "up", Transitions: b.Transitions}
			}
			mb.Peers = append(mb.Peers, mp)
		}
		snap.BGP = mb
	}
	if l := d.l2Status(v); l != nil {
		ml := &metrics.L2{Announced: announcedCount(l.VIPs)}
		for _, i := range l.Interfaces {
			ml.Interfaces = append(ml.Interfaces, metrics.L2Interface{Name: i.Name, ARPReplies: i.ARPReplies, NDReplies: i.NDReplies, Gratuitous: i.GratuitousSent})
		}
		if f := l.Failover; f != nil {
			ml.Failover = &metrics.L2Failover{Role: f.Role, Transitions: f.Transitions, Peers: len(f.Peers), Conflicts: f.Conflicts}
		}
		snap.L2 = ml
	}
	return snap
}

// healthOf is the health state of a backend as of the view, so status
// agrees with what is programmed.
func healthOf(v *view, svc lb.Service, b lb.Backend) metrics.Health {
	if svc.Health.Type == lb.HealthNone {
		return metrics.HealthUnchecked
	}
	st, ok := v.Health.Get(health.Key{Service: svc.Name, Backend: b.Addr})
	switch {
	case !ok:
		return metrics.HealthUnknown
	case st.State == health.Up:
		return metrics.HealthHealthy
	default:
		return metrics.HealthUnhealthy
	}
}

// mapOccupancy is the fill of the maps the control plane sizes: derived
// from what is programmed (the service, backend and table maps hold one
// entry per programmed object) and from the walks done for conntrack/SNAT.
func (d *Daemon) mapOccupancy(v *view) []metrics.Map {
	return []metrics.Map{
		{Name: "services", Entries: uint64(v.Index.Services), Capacity: uint64(v.cfg.Datapath.MaxServices)},
		{Name: "backends", Entries: uint64(v.Index.Backends), Capacity: uint64(v.cfg.Datapath.MaxBackends)},
		{Name: "maglev", Entries: uint64(v.Index.Tables), Capacity: uint64(v.cfg.Datapath.MaxServices)},
	}
}

func announcedCount(vips []api.AnnouncedVIP) (n int) {
	for _, v := range vips {
		if v.Announced {
			n++
		}
	}
	return n
}
