// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// A trace (bpf/include/trace.h) reports the datapath's decision for each
// packet a filter selects. One runs at a time per loaded datapath: its
// filter is the single entry of trace_ctl, whose nonzero session number
// arms the datapath; the events come back through the trace_events ring
// buffer, each stamped with the session so a later trace never reports an
// earlier one's leftovers.

// TraceFilter selects what a trace reports. Zero fields select anything.
type TraceFilter struct {
	// Client is the client's address or prefix.
	Client netip.Prefix
	// VIP and Port are the frontend's address and port.
	VIP  netip.Addr
	Port uint16
	// Proto is the frontend's protocol.
	Proto lb.Protocol
	// Backend is the backend the packet went to (or a SNAT reply came
	// from); port 0 matches any port of that address.
	Backend netip.AddrPort
	// Rate is how many events each CPU sends per second before it samples
	// (counts the rest as Sampled); 0 is no limit.
	Rate uint32
}

// TraceEvent is one traced packet.
type TraceEvent struct {
	Time time.Time
	// Hook is "xdp" or "tc"; Interface the interface the packet arrived on.
	Hook      string
	Interface string
	// Client and Frontend are the flow as its client sends it; for a
	// SNAT reply (Reply), the flow the reply belongs to.
	Client   netip.AddrPort
	Frontend lb.Frontend
	Length   int
	TCPFlags uint8
	// Verdict is the program's action: tx, redirect, pass, drop, aborted
	// (XDP) or next, pass, drop, redirect (tc).
	Verdict string
	// Reason is the reason the datapath counted for the packet (see
	// docs/metrics.md), "" when it counted none (a plain forward).
	Reason string
	// Service is 0 when the packet is to no frontend.
	Service  reconciler.ServiceID
	Mode     lb.Mode
	Dispatch lb.Dispatch
	// Backend is the backend the packet went to (its id in BackendID),
	// or a reply came from.
	BackendID reconciler.BackendID
	Backend   netip.AddrPort
	// Forwarded: counted as forwarded to a backend.
	Forwarded bool
	// Conntrack is what the connection table did: hit, miss, created,
	// insert_failed, or "" for a packet not forwarded.
	Conntrack string
	// SNAT is the flow's SNAT address and port when it has a binding.
	SNAT netip.AddrPort
	// Reply marks a backend's reply to a SNAT flow; ICMPError an ICMP
	// error about the flow; TooBig a packet too big for its path, which
	// the ICMP answer path handled (Reason says what it did).
	Reply, ICMPError, TooBig bool
}

// TraceStats are a trace's counts, summed over CPUs.
type TraceStats struct {
	// Matched packets the filter selected; Sent were written to the ring
	// buffer; Sampled were over the rate and not sent; Lost found the
	// ring buffer full.
	Matched, Sent, Sampled, Lost uint64
}

// Trace is a running trace. Close it to stop.
type Trace struct {
	d       *LB
	session uint32
	rd      *ringbuf.Reader
	ifnames map[uint32]string
}

// traceState is what LB keeps about traces: one at a time.
type traceState struct {
	mu      sync.Mutex
	running bool
	session uint32
}

// ErrTraceBusy is returned by StartTrace while another trace runs.
var ErrTraceBusy = errors.New("another trace is running on this datapath; wait for it to end (its budget or timeout) and try again")

// StartTrace arms the datapath with f. The datapath sends events until
// Close; read them with Next.
func (d *LB) StartTrace(f TraceFilter) (*Trace, error) {
	ctl, notes, events := d.coll.Maps[bpf.LbMapTraceCtl], d.coll.Maps[bpf.LbMapTraceNotes], d.coll.Maps[bpf.LbMapTraceEvents]
	if ctl == nil || notes == nil || events == nil {
		return nil, errors.New("trace: the loaded datapath object has no trace maps (an l4lb build before tracing)")
	}
	v, err := traceFilterValue(f)
	if err != nil {
		return nil, err
	}
	d.trace.mu.Lock()
	defer d.trace.mu.Unlock()
	if d.trace.running {
		return nil, ErrTraceBusy
	}
	rd, err := ringbuf.NewReader(events)
	if err != nil {
		return nil, fmt.Errorf("trace: open ring buffer: %w", err)
	}
	// Counts from zero; no packet writes them without a session.
	zero := make([]bpf.LbTraceNote, d.cpus)
	key := uint32(0)
	if err := notes.Update(&key, zero, ebpf.UpdateAny); err != nil {
		rd.Close()
		return nil, fmt.Errorf("trace: reset counts: %w", err)
	}
	d.trace.session++
	if d.trace.session == 0 {
		d.trace.session = 1
	}
	v.Session = d.trace.session
	if err := ctl.Update(&key, &v, ebpf.UpdateAny); err != nil {
		rd.Close()
		return nil, fmt.Errorf("trace: arm the datapath: %w", err)
	}
	d.trace.running = true
	return &Trace{d: d, session: v.Session, rd: rd, ifnames: map[uint32]string{}}, nil
}

// traceFilterValue is f as trace_ctl holds it (without the session).
func traceFilterValue(f TraceFilter) (bpf.LbTraceFilter, error) {
	var v bpf.LbTraceFilter
	if f.Client.IsValid() {
		p := f.Client.Masked()
		v.Client, v.ClientMask = p.Addr().As16(), mask16(p)
	}
	if f.VIP.IsValid() {
		v.Vip, v.VipMask = f.VIP.As16(), mask16(netip.PrefixFrom(f.VIP, f.VIP.BitLen()))
	}
	if f.Backend.Addr().IsValid() {
		a := f.Backend.Addr()
		v.Backend, v.BackendMask = a.As16(), mask16(netip.PrefixFrom(a, a.BitLen()))
		v.BackendPort = htons(f.Backend.Port())
	}
	switch f.Proto {
	case 0, lb.TCP, lb.UDP:
	default:
		return v, fmt.Errorf("trace: protocol %s: want tcp or udp", f.Proto)
	}
	v.Port, v.Proto, v.Rate = htons(f.Port), uint8(f.Proto), f.Rate
	return v, nil
}

// mask16 is the mask of p over the 16-byte (IPv4-mapped) address.
func mask16(p netip.Prefix) [16]byte {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	var m [16]byte
	for i := range m {
		switch {
		case bits >= 8:
			m[i] = 0xff
			bits -= 8
		case bits > 0:
			m[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	return m
}

// Close disarms the datapath and releases the ring buffer.
func (t *Trace) Close() error {
	d := t.d
	d.trace.mu.Lock()
	defer d.trace.mu.Unlock()
	if !d.trace.running || d.trace.session != t.session {
		return nil
	}
	d.trace.running = false
	key := uint32(0)
	var off bpf.LbTraceFilter
	err := d.coll.Maps[bpf.LbMapTraceCtl].Update(&key, &off, ebpf.UpdateAny)
	if cerr := t.rd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("trace: stop: %w", err)
	}
	return nil
}

// ErrTraceTimeout is what Next returns when no event came before its deadline.
var ErrTraceTimeout = os.ErrDeadlineExceeded

// Next returns the next event of this trace, waiting until deadline (zero:
// no deadline); ErrTraceTimeout when none came by then.
func (t *Trace) Next(deadline time.Time) (TraceEvent, error) {
	t.rd.SetDeadline(deadline)
	for {
		rec, err := t.rd.Read()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return TraceEvent{}, ErrTraceTimeout
			}
			return TraceEvent{}, fmt.Errorf("trace: read ring buffer: %w", err)
		}
		var ev bpf.LbTraceEvent
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &ev); err != nil {
			return TraceEvent{}, fmt.Errorf("trace: decode event of %d bytes: %w", len(rec.RawSample), err)
		}
		if ev.Session != t.session {
			continue // an earlier trace's
		}
		return t.event(ev), nil
	}
}

// Stats returns the trace's counts so far.
func (t *Trace) Stats() (TraceStats, error) {
	var notes []bpf.LbTraceNote
	key := uint32(0)
	if err := t.d.coll.Maps[bpf.LbMapTraceNotes].Lookup(&key, &notes); err != nil {
		return TraceStats{}, fmt.Errorf("trace: read counts: %w", err)
	}
	var s TraceStats
	for _, n := range notes {
		s.Matched += n.Matched
		s.Sent += n.Sent
		s.Sampled += n.Sampled
		s.Lost += n.Lost
	}
	return s, nil
}

var (
	xdpVerdicts = map[int32]string{0: "aborted", 1: "drop", 2: "pass", 3: "tx", 4: "redirect"}
	tcVerdicts  = map[int32]string{-1: "next", 0: "pass", 2: "drop", 7: "redirect"}
	traceCT     = map[bpf.LbL4lbTraceCt]string{
		bpf.LbL4lbTraceCtL4LB_TRACE_CT_HIT:           "hit",
		bpf.LbL4lbTraceCtL4LB_TRACE_CT_MISS:          "miss",
		bpf.LbL4lbTraceCtL4LB_TRACE_CT_CREATED:       "created",
		bpf.LbL4lbTraceCtL4LB_TRACE_CT_INSERT_FAILED: "insert_failed",
	}
)

// addrOf is a 16-byte datapath address in its family.
func addrOf(a [16]byte, family uint8) netip.Addr {
	if family == 4 {
		return netip.AddrFrom16(a).Unmap()
	}
	return netip.AddrFrom16(a)
}

func (t *Trace) event(ev bpf.LbTraceEvent) TraceEvent {
	out := TraceEvent{
		Time:      monoToWall(ev.TimeNs),
		Interface: t.ifname(ev.Ifindex),
		Client:    netip.AddrPortFrom(addrOf(ev.Key.Src, ev.Family), ntohs(ev.Key.Sport)),
		Frontend:  lb.Frontend{Addr: addrOf(ev.Key.Dst, ev.Family), Port: ntohs(ev.Key.Dport), Proto: lb.Protocol(ev.Key.Proto)},
		Length:    int(ev.L3Len),
		TCPFlags:  ev.TcpFlags,
		Service:   reconciler.ServiceID(ev.SvcId),
		BackendID: reconciler.BackendID(ev.BackendId),
		Conntrack: traceCT[ev.Ct],
		Forwarded: ev.Flags&bpf.LbL4lbTraceFlagsL4LB_TRACE_F_FORWARDED != 0,
		Reply:     ev.Flags&bpf.LbL4lbTraceFlagsL4LB_TRACE_F_REPLY != 0,
		ICMPError: ev.Flags&bpf.LbL4lbTraceFlagsL4LB_TRACE_F_ICMP_ERROR != 0,
		TooBig:    ev.Flags&bpf.LbL4lbTraceFlagsL4LB_TRACE_F_TOO_BIG != 0,
	}
	if ev.Hook == bpf.LbL4lbTraceHookL4LB_TRACE_TC {
		out.Hook, out.Verdict = "tc", tcVerdicts[ev.Verdict]
	} else {
		out.Hook, out.Verdict = "xdp", xdpVerdicts[ev.Verdict]
	}
	if out.Verdict == "" {
		out.Verdict = fmt.Sprintf("verdict-%d", ev.Verdict)
	}
	if ev.Reason >= 0 && int(ev.Reason) < len(t.d.reasonNames) {
		out.Reason = t.d.reasonNames[ev.Reason]
	}
	for m, bm := range modes {
		if uint8(bm) == ev.Mode {
			out.Mode = m
		}
	}
	if out.Mode == lb.ModeDSR {
		for dsp, bd := range dispatches {
			if uint8(bd) == ev.Dispatch {
				out.Dispatch = dsp
			}
		}
	}
	if ev.Backend != ([16]byte{}) {
		out.Backend = netip.AddrPortFrom(addrOf(ev.Backend, ev.Family), ntohs(ev.BackendPort))
	}
	if ev.Flags&bpf.LbL4lbTraceFlagsL4LB_TRACE_F_SNAT != 0 {
		out.SNAT = netip.AddrPortFrom(addrOf(ev.SnatAddr, ev.Family), ntohs(ev.SnatPort))
	}
	return out
}

// ifname names an interface index, remembered for the trace.
func (t *Trace) ifname(idx uint32) string {
	if n, ok := t.ifnames[idx]; ok {
		return n
	}
	n := fmt.Sprintf("if%d", idx)
	// In the datapath's namespace, which need not be the process's.
	if h, err := netlinkIn(t.d.cfg.Netns); err == nil {
		if l, err := h.LinkByIndex(int(idx)); err == nil {
			n = l.Attrs().Name
		}
		h.Close()
	}
	t.ifnames[idx] = n
	return n
}

// monoToWall turns a bpf_ktime_get_ns stamp (CLOCK_MONOTONIC) into wall time.
func monoToWall(ns uint64) time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(uint64(ts.Nano()) - ns))
}
