// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// FlowState is what the control plane can tell about one connection-table
// entry. An entry records the backend, when the flow was last seen and
// whether the client's latest segment ended the connection (a FIN or RST
// not followed by a SYN); the full TCP state is known only where the LB
// sees both directions, from the SNAT binding of a SNAT flow.
type FlowState int

// Flow states. Only FlowEstablished is active (see FlowState.Active).
const (
	// FlowEstablished is a TCP flow seen within the established timeout
	// (datapath.snat_timeouts.tcp) whose SNAT binding, if it has one, is
	// past the handshake and saw no FIN or RST (without one: whose client
	// sent none).
	FlowEstablished FlowState = iota
	// FlowSynSent is a TCP flow whose SNAT binding saw a SYN again and no
	// ACK after the backend's answer yet (the client reuses its port for a
	// new connection, or sent an ACK the backend had not asked for).
	FlowSynSent
	// FlowClosing is a TCP flow whose SNAT binding saw a FIN or RST, or,
	// without a binding (DSR), whose client sent one.
	FlowClosing
	// FlowIdle is a TCP flow not seen within the established timeout.
	FlowIdle
	// FlowUDP is a UDP flow: UDP has no connection state, so it is never
	// active (as IPVS counts it).
	FlowUDP
)

// String names the state as `l4lbctl conntrack list` prints it.
func (s FlowState) String() string {
	switch s {
	case FlowEstablished:
		return "established"
	case FlowSynSent:
		return "syn_sent"
	case FlowClosing:
		return "closing"
	case FlowIdle:
		return "idle"
	}
	return "udp"
}

// Active reports whether a flow in state s counts as an active connection.
func (s FlowState) Active() bool { return s == FlowEstablished }

// Flow is one entry of the connection table.
type Flow struct {
	Client   netip.AddrPort
	Frontend lb.Frontend
	Service  reconciler.ServiceID
	Backend  reconciler.BackendID
	// Age is how long ago the flow's latest packet from the client was
	// seen (the datapath refreshes it at most once a second).
	Age   time.Duration
	State FlowState
	// Expires is how long until the flow, without another packet, is
	// idle: its state's timeout (datapath.snat_timeouts: tcp, tcp_closing
	// for a SNAT binding that saw a FIN or RST, udp) less its age; 0 once
	// idle. The entry itself stays until the table evicts it.
	Expires time.Duration
	// SNAT is the source the flow's SNAT binding gives it towards the
	// backend; invalid for DSR flows and flows without a binding.
	SNAT netip.AddrPort
	// Packets and Bytes are the client packets forwarded and their IP
	// octets since the flow's counter was made (flowcounts.go): 0 when
	// the filter did not ask for them (FlowFilter.Counts), the datapath
	// does not count (Config.FlowCounts) or the flow has no counter.
	Packets, Bytes uint64
}

// FlowFilter selects connection-table entries. A nil set matches all.
type FlowFilter struct {
	Services map[reconciler.ServiceID]bool
	Backends map[reconciler.BackendID]bool
	// Counts fills each Flow's Packets and Bytes, at the price of a read
	// of the whole per-flow counter table first (flowcounts.go); only
	// the IPFIX scan needs them.
	Counts bool
}

func (f FlowFilter) match(svc, be uint32) bool {
	return (f.Services == nil || f.Services[reconciler.ServiceID(svc)]) &&
		(f.Backends == nil || f.Backends[reconciler.BackendID(be)])
}

// FlowCount is the number of active and inactive flows of a backend.
type FlowCount struct {
	Active, Inactive uint64
}

// FlowOwner is the service and backend a connection-table entry holds.
type FlowOwner struct {
	Service reconciler.ServiceID
	Backend reconciler.BackendID
}

// kernelNow is the clock the datapath stamps entries with
// (bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC, coarse).
func kernelNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read the kernel's monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// age is now - seen; an entry stamped by another CPU's coarse clock may be
// a tick ahead of now.
func age(now, seen uint64) time.Duration {
	if seen >= now {
		return 0
	}
	return time.Duration(now - seen)
}

// binding is what the control plane needs of a live SNAT binding.
type binding struct {
	state bpf.LbL4lbSnatState
	snat  netip.AddrPort
}

// bindings reads the live SNAT bindings of both reverse tables (the
// authority on a binding's state and liveness), by the client flow they
// belong to. With all false, only those that make a flow inactive (a SYN
// or closing state) are kept: a count then holds few of them however many
// flows there are.
func (d *LB) bindings(now uint64, all bool, f FlowFilter) (map[bpf.LbFlowKey]binding, error) {
	out := map[bpf.LbFlowKey]binding{}
	ovf := d.snatRevOvf
	if d.coll != nil {
		ovf = d.coll.Maps[bpf.LbMapSnatRevOvf]
	}
	for _, m := range []*ebpf.Map{d.snatRev, ovf} {
		if m == nil {
			continue
		}
		err := walk(m, func(k *bpf.LbSnatRevKey, v *bpf.LbSnatRevValue) bool {
			if f.Services != nil && !f.Services[reconciler.ServiceID(v.SvcId)] {
				return true
			}
			if !all && (v.State == bpf.LbL4lbSnatStateL4LB_SNAT_OPEN || v.State == bpf.LbL4lbSnatStateL4LB_SNAT_UNANSWERED) {
				return true
			}
			if age(now, v.LastSeen) > d.snatTimeout(k.Proto, v.State) {
				return true // dead: its port is free, the flow has no binding
			}
			fk := bpf.LbFlowKey{Src: v.ClientAddr, Dst: v.Vip, Sport: v.ClientPort, Dport: v.VipPort, Proto: k.Proto}
			out[fk] = binding{state: v.State, snat: netip.AddrPortFrom(netip.AddrFrom16(k.SnatAddr).Unmap(), ntohs(k.SnatPort))}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// snatTimeout mirrors snat_timeout in bpf/include/snat.h.
func (d *LB) snatTimeout(proto uint8, state bpf.LbL4lbSnatState) time.Duration {
	t := d.cfg.SNATTimeouts
	switch {
	case proto != uint8(lb.TCP):
		return t.UDP
	case state == bpf.LbL4lbSnatStateL4LB_SNAT_OPEN:
		return t.TCP
	}
	return t.TCPClosing
}

// ctClosing is L4LB_CT_CLOSING (bpf/include/types.h): the top bit of an
// entry's backend id, set while the client's latest FIN or RST is not
// followed by a SYN.
const ctClosing = 1 << 31

// ctBackend is the backend id of an entry, without its flag.
func ctBackend(v *bpf.LbCtValue) uint32 { return v.BackendId &^ ctClosing }

// flowState classifies one entry: see FlowState. A SNAT flow's binding
// saw both directions and says more than the entry's flag.
func (d *LB) flowState(k *bpf.LbFlowKey, v *bpf.LbCtValue, a time.Duration, b binding, bound bool) FlowState {
	switch {
	case k.Proto != uint8(lb.TCP):
		return FlowUDP
	case a > d.cfg.SNATTimeouts.TCP:
		return FlowIdle
	case bound && (b.state == bpf.LbL4lbSnatStateL4LB_SNAT_SYN || b.state == bpf.LbL4lbSnatStateL4LB_SNAT_SYN_ANSWERED):
		return FlowSynSent
	case bound && b.state == bpf.LbL4lbSnatStateL4LB_SNAT_CLOSING:
		return FlowClosing
	case !bound && v.BackendId&ctClosing != 0:
		return FlowClosing
	}
	return FlowEstablished
}

// Flows calls fn for each connection-table entry f matches, until fn
// returns false. It walks the table in batches of 4096 entries per
// syscall, and the SNAT reverse tables for the flows' states.
func (d *LB) Flows(f FlowFilter, fn func(Flow) bool) error {
	now, err := kernelNow()
	if err != nil {
		return err
	}
	binds, err := d.bindings(now, true, f)
	if err != nil {
		return err
	}
	var counts map[bpf.LbFlowKey]bpf.LbFlowCount
	if f.Counts {
		if counts, err = d.readFlowCounts(); err != nil {
			return err
		}
	}
	return walk(d.conntrack, func(k *bpf.LbFlowKey, v *bpf.LbCtValue) bool {
		if !f.match(v.SvcId, ctBackend(v)) {
			return true
		}
		b, bound := binds[*k]
		a := age(now, v.LastSeen)
		fl := Flow{
			Client:   netip.AddrPortFrom(netip.AddrFrom16(k.Src).Unmap(), ntohs(k.Sport)),
			Frontend: lb.Frontend{Addr: netip.AddrFrom16(k.Dst).Unmap(), Port: ntohs(k.Dport), Proto: lb.Protocol(k.Proto)},
			Service:  reconciler.ServiceID(v.SvcId),
			Backend:  reconciler.BackendID(ctBackend(v)),
			Age:      a,
			State:    d.flowState(k, v, a, b, bound),
		}
		fl.Expires = d.flowExpiry(fl.State, a, bound)
		if bound {
			fl.SNAT = b.snat
		}
		if c, ok := counts[*k]; ok {
			fl.Packets, fl.Bytes = c.Packets, c.Bytes
		}
		return fn(fl)
	})
}

// flowExpiry is Flow.Expires for a flow in state st of age a; bound says
// whether it has a SNAT binding, whose closing timeout is its own.
func (d *LB) flowExpiry(st FlowState, a time.Duration, bound bool) time.Duration {
	t := d.cfg.SNATTimeouts.TCP
	switch {
	case st == FlowIdle:
		return 0
	case st == FlowUDP:
		t = d.cfg.SNATTimeouts.UDP
	case st == FlowClosing && bound:
		t = d.cfg.SNATTimeouts.TCPClosing
	}
	return max(t-a, 0)
}

// FlowCounts counts the connection table's entries per service and
// backend, active and inactive (FlowState.Active), or returns a count at
// most maxAge old: counting walks the whole table, and status and metrics
// may ask on every scrape. The map is shared with later callers: read it,
// never write it.
//
// Inactive counts decay, as IPVS's InActConn does when a connection's
// timer fires: an entry whose state's time is up (decayed) is counted in
// neither, though it stays in the table until the LRU evicts it.
func (d *LB) FlowCounts(maxAge time.Duration) (map[FlowOwner]FlowCount, error) {
	d.flowCounts.mu.Lock()
	defer d.flowCounts.mu.Unlock()
	if c := &d.flowCounts; c.m != nil && time.Since(c.at) < maxAge {
		return c.m, nil
	}
	now, err := kernelNow()
	if err != nil {
		return nil, err
	}
	inactive, err := d.bindings(now, false, FlowFilter{})
	if err != nil {
		return nil, err
	}
	out := map[FlowOwner]FlowCount{}
	err = walk(d.conntrack, func(k *bpf.LbFlowKey, v *bpf.LbCtValue) bool {
		b, bound := inactive[*k]
		o := FlowOwner{Service: reconciler.ServiceID(v.SvcId), Backend: reconciler.BackendID(ctBackend(v))}
		c := out[o]
		a := age(now, v.LastSeen)
		switch st := d.flowState(k, v, a, b, bound); {
		case st.Active():
			c.Active++
		case !d.decayed(st, a, bound):
			c.Inactive++
		}
		out[o] = c
		return true
	})
	if err != nil {
		return nil, err
	}
	d.flowCounts.m, d.flowCounts.at = out, time.Now()
	return out, nil
}

// decayed reports whether an inactive flow in state st, quiet for a, has
// outlived its state: idle TCP (past the established timeout), UDP past
// datapath.snat_timeouts.udp, and a DSR flow its client closed past
// tcp_closing, as IPVS's FIN_WAIT and TIME_WAIT run out. A flow with a
// SNAT binding in a closing or SYN state lives as long as its binding,
// whose timeout counts both directions' packets (bindings drops dead ones).
func (d *LB) decayed(st FlowState, a time.Duration, bound bool) bool {
	t := d.cfg.SNATTimeouts
	switch st {
	case FlowIdle:
		return true
	case FlowUDP:
		return a > t.UDP
	case FlowClosing, FlowSynSent:
		return !bound && a > t.TCPClosing
	}
	return false
}

// FlushResult is what FlushFlows deleted.
type FlushResult struct {
	// Flows are connection-table entries, Bindings SNAT bindings (each
	// one entry in a forward and one in a reverse table).
	Flows, Bindings int
}

// FlushFlows deletes the connection-table entries f matches, and the SNAT
// bindings of the matching services' and backends' flows, whether the
// connection table holds those flows or not (flows over
// datapath.flow_insert_rate have a binding only).
//
// The flows themselves go on: the next packet of each is balanced again as
// a new flow. One whose backend is still the Maglev table's choice lands
// there again (a SNAT flow, whose new binding starts probing at the same
// hashed port, most often gets the same source port back, so its
// connection survives); one that stayed on its backend only through its
// entry (a draining backend, a changed table) moves to the table's choice,
// which resets a TCP connection it does not know.
func (d *LB) FlushFlows(f FlowFilter) (FlushResult, error) {
	var res FlushResult
	n, err := flushEntries(d.conntrack, f)
	res.Flows = n
	// Even after a partial delete: whatever was deleted must not live on
	// in the CPUs' flow caches.
	if gerr := d.cache.bump(); gerr != nil && err == nil {
		err = gerr
	}
	if err != nil {
		return res, fmt.Errorf("delete connection-table entry: %w", err)
	}
	// The SYNs' choices too, or a flushed flow's next packet would find
	// its backend there. Not counted: an established flow's handshake
	// slot lingers until another SYN takes it.
	if err := d.flushHandshakes(f); err != nil {
		return res, err
	}
	for _, pair := range []struct{ fwd, rev *ebpf.Map }{
		{d.snatFwd, d.snatRev},
		{d.coll.Maps[bpf.LbMapSnatFwdOvf], d.coll.Maps[bpf.LbMapSnatRevOvf]},
	} {
		n, err := d.flushBindings(pair.fwd, pair.rev, f)
		res.Bindings += n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// flushEntries deletes the connection-table entries f matches and returns
// how many.
func flushEntries(m *ebpf.Map, f FlowFilter) (int, error) {
	var keys []bpf.LbFlowKey
	err := walk(m, func(k *bpf.LbFlowKey, v *bpf.LbCtValue) bool {
		if f.match(v.SvcId, ctBackend(v)) {
			keys = append(keys, *k)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range keys {
		if err := m.Delete(&keys[i]); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, err
		}
	}
	return n, nil
}

// flushHandshakes clears the handshakes ways f matches. A SYN writing
// the bucket meanwhile may lose its way: its first ACK then goes by
// Maglev, as after a collision.
func (d *LB) flushHandshakes(f FlowFilter) error {
	m := d.coll.Maps[bpf.LbMapHandshakes]
	changed := map[uint32]bpf.LbHandshakeBucket{}
	err := walk(m, func(k *uint32, v *bpf.LbHandshakeBucket) bool {
		hit := false
		for i := range v.Way {
			if w := &v.Way[i]; w.Hash != 0 && f.match(w.SvcId, w.BackendId) {
				*w, hit = bpf.LbHandshake{}, true
			}
		}
		if hit {
			changed[*k] = *v
		}
		return true
	})
	if err != nil {
		return err
	}
	for k, v := range changed {
		if err := m.Update(k, v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("clear handshakes bucket %d: %w", k, err)
		}
	}
	return nil
}

// flushBindings deletes the bindings of one forward/reverse table pair
// whose backend and service f matches. The reverse entry is deleted only
// while it is still this flow's (its port may have passed to another).
func (d *LB) flushBindings(fwd, rev *ebpf.Map, f FlowFilter) (int, error) {
	type pair struct {
		fk bpf.LbFlowKey
		rk bpf.LbSnatRevKey
	}
	var found []pair
	err := walk(fwd, func(k *bpf.LbFlowKey, v *bpf.LbSnatFwdValue) bool {
		if f.Backends != nil && !f.Backends[reconciler.BackendID(v.BackendId)] {
			return true
		}
		found = append(found, pair{fk: *k, rk: bpf.LbSnatRevKey{
			BackendAddr: v.BackendAddr, SnatAddr: v.SnatAddr,
			BackendPort: v.BackendPort, SnatPort: v.SnatPort, Proto: k.Proto,
		}})
		return true
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range found {
		p := &found[i]
		var rv bpf.LbSnatRevValue
		owned := rev.Lookup(&p.rk, &rv) == nil && rv.ClientAddr == p.fk.Src && rv.ClientPort == p.fk.Sport &&
			rv.Vip == p.fk.Dst && rv.VipPort == p.fk.Dport
		if f.Services != nil && (!owned || !f.Services[reconciler.ServiceID(rv.SvcId)]) {
			continue
		}
		if err := fwd.Delete(&p.fk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete SNAT binding from %s: %w", fwd, err)
		}
		if owned {
			if err := rev.Delete(&p.rk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return n, fmt.Errorf("delete SNAT binding from %s: %w", rev, err)
			}
		}
		n++
	}
	return n, nil
}

// walk calls fn for each entry of the hash map m, reading it in batches
// (one syscall per countBatch entries), or one entry at a time on kernels
// without batch lookups, until fn returns false. Entries inserted or
// deleted meanwhile may or may not be seen.
func walk[K, V any](m *ebpf.Map, fn func(*K, *V) bool) error {
	var (
		cur  ebpf.MapBatchCursor
		keys = make([]K, countBatch)
		vals = make([]V, countBatch)
	)
	for {
		n, err := m.BatchLookup(&cur, keys, vals, nil)
		for i := range n {
			if !fn(&keys[i], &vals[i]) {
				return nil
			}
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case errors.Is(err, ebpf.ErrNotSupported):
			var (
				k  K
				v  V
				it = m.Iterate()
			)
			for it.Next(&k, &v) {
				if !fn(&k, &v) {
					return nil
				}
			}
			if err := it.Err(); err != nil {
				return fmt.Errorf("walk %s: %w", m, err)
			}
			return nil
		case err != nil:
			return fmt.Errorf("walk %s: %w", m, err)
		}
	}
}
