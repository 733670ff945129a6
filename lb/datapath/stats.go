// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

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
	// ReplyPackets and ReplyBytes count a service's SNAT replies (its
	// backends' packets sent back to clients); always 0 for a backend
	// (the reply path knows the service, not the backend id) and for
	// DSR, whose replies bypass the box.
	ReplyPackets uint64
	ReplyBytes   uint64
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

// ServiceCounters returns the counters of service id, SNAT replies
// included.
func (d *LB) ServiceCounters(id reconciler.ServiceID) (Counters, error) {
	c, err := d.readStats(d.svcStats, uint32(id))
	if err != nil || d.svcReplies == nil {
		return c, err
	}
	key := uint32(id)
	var per []bpf.LbReplyStats
	if err := d.svcReplies.Lookup(&key, &per); err != nil {
		return c, fmt.Errorf("read counters %s[%d]: %w", d.svcReplies, key, err)
	}
	for _, s := range per {
		c.ReplyPackets += s.Packets
		c.ReplyBytes += s.Bytes
	}
	return c, nil
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

// ConntrackEntries counts the entries of the connection table now.
func (d *LB) ConntrackEntries() (int, error) { return d.ConntrackEntriesWithin(0) }

// ConntrackEntriesWithin counts the entries of the connection table, or
// returns a count at most maxAge old. Counting walks the table (in batches
// of 4096 entries per syscall), so status and metrics, which may ask on
// every scrape, accept a slightly old count.
func (d *LB) ConntrackEntriesWithin(maxAge time.Duration) (int, error) {
	return d.counts.count(d.conntrack, maxAge, func(cur *ebpf.MapBatchCursor) (int, error) {
		var (
			k [countBatch]bpf.LbFlowKey
			v [countBatch]bpf.LbCtValue
		)
		return d.conntrack.BatchLookup(cur, k[:], v[:], nil)
	})
}

// ConntrackCapacity is the connection table's size (conntrack_max), shared
// by all CPUs.
func (d *LB) ConntrackCapacity() uint32 { return d.conntrack.MaxEntries() }

const countBatch = 4096

// entryCounts caches map entry counts.
type entryCounts struct {
	mu sync.Mutex
	m  map[*ebpf.Map]cachedCount
}

type cachedCount struct {
	n  int
	at time.Time
}

// count returns m's entry count, walking it with batch (which reads the
// next batch at cur) unless a count at most maxAge old is cached. Maps without batch
// support are walked one entry at a time.
func (c *entryCounts) count(m *ebpf.Map, maxAge time.Duration, batch func(cur *ebpf.MapBatchCursor) (int, error)) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.m[m]; ok && time.Since(cc.at) < maxAge {
		return cc.n, nil
	}
	var (
		cur ebpf.MapBatchCursor
		n   int
	)
	for {
		got, err := batch(&cur)
		n += got
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			return c.slowCount(m)
		}
		if err != nil {
			return n, fmt.Errorf("walk %s: %w", m, err)
		}
	}
	if c.m == nil {
		c.m = map[*ebpf.Map]cachedCount{}
	}
	c.m[m] = cachedCount{n: n, at: time.Now()}
	return n, nil
}

func (c *entryCounts) slowCount(m *ebpf.Map) (int, error) {
	var (
		n  int
		it = m.Iterate()
		k  = make([]byte, m.KeySize())
		v  = make([]byte, m.ValueSize())
	)
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("walk %s: %w", m, err)
	}
	return n, nil
}

// ConntrackLookup returns the backend id the connection table holds for a
// client's flow to a service, if any.
func (d *LB) ConntrackLookup(client netip.AddrPort, fe lb.Frontend) (reconciler.BackendID, reconciler.ServiceID, bool) {
	k := flowKey(FlowID{Client: client, Frontend: fe})
	var v bpf.LbCtValue
	if err := d.conntrack.Lookup(&k, &v); err != nil {
		return 0, 0, false
	}
	return reconciler.BackendID(ctBackend(&v)), reconciler.ServiceID(v.SvcId), true
}

// Events returns the event counters (enum l4lb_event: things that happened
// besides a packet's verdict, such as a fallback to bpf_fib_lookup) by
// name, summed over CPUs.
func (d *LB) Events() (map[string]uint64, error) {
	out := make(map[string]uint64, len(d.eventNames))
	var errs []error
	for i, name := range d.eventNames {
		key := uint32(i)
		var per []uint64
		if err := d.events.Lookup(&key, &per); err != nil {
			errs = append(errs, fmt.Errorf("read event %s: %w", name, err))
			continue
		}
		var n uint64
		for _, c := range per {
			n += c
		}
		out[name] = n
	}
	return out, errors.Join(errs...)
}

// EventNames are the names of the event counters, by index.
func (d *LB) EventNames() []string { return append([]string(nil), d.eventNames...) }
