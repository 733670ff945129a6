// SPDX-License-Identifier: Apache-2.0

package ipfix

import (
	"hash/fnv"
	"net/netip"
	"time"
)

// Flow is one connection-table entry as a scan reads it.
type Flow struct {
	Client, VIP netip.AddrPort
	Proto       uint8
	Backend     netip.AddrPort
	// SNAT is the flow's SNAT source; invalid for DSR.
	SNAT          netip.AddrPort
	Service, Mode string
	// LastSeen is when the client's latest packet was seen (the datapath
	// refreshes it at most once a second).
	LastSeen time.Time
	// Closing: the client sent a FIN or RST (or the SNAT binding saw one).
	Closing bool
	// Packets and Bytes are the flow's client packets and IP octets since
	// its counter was made (0 without one). The records carry what they
	// grew by since the flow's previous record.
	Packets, Bytes uint64
}

// TrackerConfig sets what a Tracker reports.
type TrackerConfig struct {
	// ActiveTimeout is how often a flow that lasts is reported again.
	ActiveTimeout time.Duration
	// IdleTimeout ends a flow whose latest packet is older: its entry
	// stays in the connection table (an LRU) until evicted.
	IdleTimeout time.Duration
	// Sampling reports 1 flow in Sampling, chosen by a hash of its
	// 5-tuple so that every record of a flow is kept or none; 0 or 1
	// reports all.
	Sampling uint32
	// MaxFlows bounds the flows tracked (memory); a flow beyond it is not
	// reported, and counted by Scan.
	MaxFlows int
}

type flowKey struct {
	client, vip netip.AddrPort
	proto       uint8
}

type tracked struct {
	start, lastSeen, lastExport time.Time
	backend, snat               netip.AddrPort
	service, mode               string
	closing                     bool
	// ended: reported as ended (idle) while its entry stays; a newer
	// packet makes it a new flow.
	ended bool
	gen   uint64
	// counts are the latest totals a scan read, reported the totals
	// the flow's previous record went up to.
	counts, reported flowCounts
}

// flowCounts are a flow's packet and byte totals.
type flowCounts struct{ packets, bytes uint64 }

// Tracker follows the connection table from scan to scan and says, for
// each flow, when it was created, when it lasted another active timeout,
// and when it ended. It is not safe for concurrent use: one goroutine
// scans.
type Tracker struct {
	cfg   TrackerConfig
	flows map[flowKey]*tracked
	gen   uint64
}

// NewTracker returns a tracker with nothing seen yet.
func NewTracker(cfg TrackerConfig) *Tracker {
	return &Tracker{cfg: cfg, flows: map[flowKey]*tracked{}}
}

// Tracked is the number of flows the tracker holds.
func (t *Tracker) Tracked() int { return len(t.flows) }

// sampled reports whether the flow of k is one Sampling reports.
func (t *Tracker) sampled(k flowKey) bool {
	if t.cfg.Sampling <= 1 {
		return true
	}
	h := fnv.New32a()
	c, v := k.client.Addr().As16(), k.vip.Addr().As16()
	h.Write(c[:])
	h.Write(v[:])
	h.Write([]byte{byte(k.client.Port() >> 8), byte(k.client.Port()), byte(k.vip.Port() >> 8), byte(k.vip.Port()), k.proto})
	return h.Sum32()%t.cfg.Sampling == 0
}

// record makes the flow's next record: its counts are what the totals
// grew by since the previous one.
func (tr *tracked) record(k flowKey, ev Event, reason EndReason) Record {
	d := flowCounts{tr.counts.packets - tr.reported.packets, tr.counts.bytes - tr.reported.bytes}
	if tr.counts.packets < tr.reported.packets || tr.counts.bytes < tr.reported.bytes {
		// The counter was made again (the datapath's table evicted it,
		// or the flow's counter was deleted when it ended): counted
		// from zero since.
		d = tr.counts
	}
	tr.reported = tr.counts
	return Record{
		Event: ev, Reason: reason, Client: k.client, VIP: k.vip, Proto: k.proto,
		Backend: tr.backend, SNAT: tr.snat, Start: tr.start, End: tr.lastSeen,
		Service: tr.service, Mode: tr.mode, Packets: d.packets, Bytes: d.bytes,
	}
}

// endReason is why a flow that went idle or left the table ended: its
// client closed it, or else the table's idle timeout or eviction (gone).
func (tr *tracked) endReason(gone bool) EndReason {
	switch {
	case tr.closing:
		return EndOfFlowDetected
	case gone:
		return EndLackOfResources
	}
	return EndIdleTimeout
}

// Walk is one pass over the connection table: it calls yield for each
// flow until yield returns false, and fails when it cannot read the table.
type Walk func(yield func(Flow) bool) error

// Scan reads one pass over the connection table at now and returns the
// records it makes, and how many new flows it could not track
// (MaxFlows). A flow already idle when first seen is never reported. When
// the walk fails, the flows it did not reach are kept as they were (none
// is taken for gone) and the error is returned with the records made.
func (t *Tracker) Scan(now time.Time, walk Walk) (recs []Record, untracked int, err error) {
	t.gen++
	err = walk(func(f Flow) bool {
		recs, untracked = t.observe(now, f, recs, untracked)
		return true
	})
	if err != nil {
		for _, tr := range t.flows {
			tr.gen = t.gen
		}
		return recs, untracked, err
	}
	for k, tr := range t.flows {
		if tr.gen == t.gen {
			continue
		}
		if !tr.ended {
			recs = append(recs, tr.record(k, EventEnded, tr.endReason(true)))
		}
		delete(t.flows, k)
	}
	return recs, untracked, nil
}

// observe is Scan's step for one flow f.
func (t *Tracker) observe(now time.Time, f Flow, recs []Record, untracked int) ([]Record, int) {
	k := flowKey{f.Client, f.VIP, f.Proto}
	if !t.sampled(k) {
		return recs, untracked
	}
	tr := t.flows[k]
	if tr != nil && tr.ended && f.LastSeen.After(tr.lastSeen) {
		tr = nil // the tuple is in use again: a new flow
	}
	// A re-balanced flow keeps its counter: the new flow's counts start
	// where the old one's last record left them.
	var carried flowCounts
	if tr != nil && !tr.ended && tr.backend != f.Backend {
		// Re-balanced: the old flow ends, a new one starts. The old
		// one's record takes the packets up to this scan.
		tr.counts = flowCounts{f.Packets, f.Bytes}
		recs = append(recs, tr.record(k, EventEnded, EndForced))
		carried = tr.reported
		tr = nil
	}
	idle := now.Sub(f.LastSeen) >= t.cfg.IdleTimeout
	if tr == nil {
		if _, ok := t.flows[k]; !ok && len(t.flows) >= t.cfg.MaxFlows && t.cfg.MaxFlows > 0 {
			return recs, untracked + 1
		}
		start := now
		if f.LastSeen.Before(start) {
			start = f.LastSeen
		}
		tr = &tracked{start: start, lastExport: now, ended: idle, reported: carried}
		t.flows[k] = tr
		if !idle {
			tr.backend, tr.snat, tr.service, tr.mode, tr.lastSeen = f.Backend, f.SNAT, f.Service, f.Mode, f.LastSeen
			tr.counts = flowCounts{f.Packets, f.Bytes}
			recs = append(recs, tr.record(k, EventCreated, 0))
		}
	}
	tr.gen = t.gen
	if tr.ended {
		tr.lastSeen = f.LastSeen
		return recs, untracked
	}
	tr.backend, tr.snat, tr.service, tr.mode, tr.lastSeen, tr.closing = f.Backend, f.SNAT, f.Service, f.Mode, f.LastSeen, f.Closing
	tr.counts = flowCounts{f.Packets, f.Bytes}
	switch {
	case idle:
		recs = append(recs, tr.record(k, EventEnded, tr.endReason(false)))
		tr.ended = true
	case now.Sub(tr.lastExport) >= t.cfg.ActiveTimeout:
		recs = append(recs, tr.record(k, EventActive, EndActiveTimeout))
		tr.lastExport = now
	}
	return recs, untracked
}
