// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Counters are the summed per-CPU counters of a service or a backend.
type Counters struct {
	Packets  uint64
	Bytes    uint64
	NewFlows uint64
}

// ReasonCounters count packets by what happened to them (see ReasonNames).
type ReasonCounters struct {
	Packets uint64
	Bytes   uint64
}

func (d *LB) readStats(m *ebpf.Map, key uint32) (Counters, error) {
	var per []bpf.LbLbStats
	if err := m.Lookup(&key, &per); err != nil {
		return Counters{}, fmt.Errorf("read counters %s[%d]: %w", m, key, err)
	}
	var c Counters
	for _, s := range per {
		c.Packets += s.Packets
		c.Bytes += s.Bytes
		c.NewFlows += s.NewFlows
	}
	return c, nil
}

// ServiceCounters returns the counters of service id.
func (d *LB) ServiceCounters(id reconciler.ServiceID) (Counters, error) {
	return d.readStats(d.svcStats, uint32(id))
}

// BackendCounters returns the counters of backend id.
func (d *LB) BackendCounters(id reconciler.BackendID) (Counters, error) {
	return d.readStats(d.backendStats, uint32(id))
}

// Reasons returns the reason counters by name.
func (d *LB) Reasons() (map[string]ReasonCounters, error) {
	out := make(map[string]ReasonCounters, len(d.reasonNames))
	var errs []error
	for i, name := range d.reasonNames {
		key := uint32(i)
		var per []bpf.LbReasonStats
		if err := d.reasons.Lookup(&key, &per); err != nil {
			errs = append(errs, fmt.Errorf("read reason %s: %w", name, err))
			continue
		}
		var c ReasonCounters
		for _, s := range per {
			c.Packets += s.Packets
			c.Bytes += s.Bytes
		}
		out[name] = c
	}
	return out, errors.Join(errs...)
}

// ConntrackEntries counts the entries of the connection table by walking
// it; it costs one syscall per batch, so callers poll it sparingly.
func (d *LB) ConntrackEntries() (int, error) {
	var (
		k  bpf.LbFlowKey
		v  bpf.LbCtValue
		n  int
		it = d.conntrack.Iterate()
	)
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("walk connection table: %w", err)
	}
	return n, nil
}

// ConntrackCapacity is the connection table's size.
func (d *LB) ConntrackCapacity() uint32 { return d.cfg.ConntrackMax }

// ConntrackLookup returns the backend id the connection table holds for a
// client's flow to a service, if any.
func (d *LB) ConntrackLookup(client netip.AddrPort, fe lb.Frontend) (reconciler.BackendID, reconciler.ServiceID, bool) {
	k := bpf.LbFlowKey{
		Src:   client.Addr().As16(),
		Dst:   fe.Addr.As16(),
		Sport: htons(client.Port()),
		Dport: htons(fe.Port),
		Proto: uint8(fe.Proto),
	}
	var v bpf.LbCtValue
	if err := d.conntrack.Lookup(&k, &v); err != nil {
		return 0, 0, false
	}
	return reconciler.BackendID(v.BackendId), reconciler.ServiceID(v.SvcId), true
}
