// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/datapath"
)

// traceTick is how often a running trace reports its counts while they
// change, and how long it waits for an event at most before checking its
// timeout and its client.
const traceTick = time.Second

// traceFilter turns an API trace request into the datapath's filter,
// resolving a service name to its frontend.
func traceFilter(v *view, req api.TraceRequest) (datapath.TraceFilter, error) {
	var f datapath.TraceFilter
	if req.Client != "" {
		p, err := netip.ParsePrefix(req.Client)
		if err != nil {
			a, aerr := netip.ParseAddr(req.Client)
			if aerr != nil {
				return f, fmt.Errorf("client %q: want an address or a prefix (198.51.100.0/24): %w", req.Client, api.ErrInvalid)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		f.Client = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr()))
	}
	if req.VIP != "" {
		a, err := netip.ParseAddr(req.VIP)
		if err != nil {
			return f, fmt.Errorf("vip %q: want an address: %w", req.VIP, api.ErrInvalid)
		}
		f.VIP = a.Unmap()
	}
	f.Port = req.Port
	if req.Proto != "" {
		p, err := lb.ParseProtocol(req.Proto)
		if err != nil {
			return f, fmt.Errorf("proto: %v: %w", err, api.ErrInvalid)
		}
		f.Proto = p
	}
	if req.Service != "" {
		i, ok := v.Pos[req.Service]
		if !ok {
			return f, fmt.Errorf("no service %q: %w", req.Service, api.ErrNotFound)
		}
		svc := v.Services.At(i)
		if (f.VIP.IsValid() && f.VIP != svc.Frontend.Addr) || (f.Port != 0 && f.Port != svc.Frontend.Port) ||
			(f.Proto != 0 && f.Proto != svc.Frontend.Proto) {
			return f, fmt.Errorf("service %q is %s, which the vip, port or proto given contradict: %w", req.Service, svc.Frontend, api.ErrInvalid)
		}
		f.VIP, f.Port, f.Proto = svc.Frontend.Addr, svc.Frontend.Port, svc.Frontend.Proto
	}
	if req.Backend != "" {
		be, err := netip.ParseAddrPort(req.Backend)
		if err != nil {
			a, aerr := netip.ParseAddr(req.Backend)
			if aerr != nil {
				return f, fmt.Errorf("backend %q: want ip or ip:port (IPv6 as [addr]:port): %w", req.Backend, api.ErrInvalid)
			}
			be = netip.AddrPortFrom(a, 0)
		}
		f.Backend = netip.AddrPortFrom(be.Addr().Unmap(), be.Port())
	}
	f.Rate = req.Rate
	return f, nil
}

// unmapBits is what an IPv4-mapped address's prefix counts beyond IPv4.
func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

// Trace implements api.Provider: one datapath trace, streamed until its
// count or timeout, or until ctx ends.
func (d *Daemon) Trace(ctx context.Context, req api.TraceRequest, emit func(api.TraceMessage) error) error {
	if d.dp == nil {
		return errors.New("datapath not loaded")
	}
	if req.Count < 0 || req.Timeout < 0 {
		return fmt.Errorf("count and timeout must not be negative: %w", api.ErrInvalid)
	}
	v := d.view.Load()
	f, err := traceFilter(v, req)
	if err != nil {
		return err
	}
	tr, err := d.dp.StartTrace(f)
	if errors.Is(err, datapath.ErrTraceBusy) {
		return fmt.Errorf("%w: %w", err, api.ErrBusy)
	}
	if err != nil {
		return err
	}
	defer tr.Close()
	d.log.Info("trace started", "client", req.Client, "vip", req.VIP, "port", req.Port, "proto", req.Proto,
		"service", req.Service, "backend", req.Backend, "count", req.Count, "timeout", req.Timeout)

	var end time.Time
	if req.Timeout > 0 {
		end = time.Now().Add(req.Timeout)
	}
	names := &traceNames{}
	names.refresh(d, time.Now())
	var last api.TraceStats
	reported := 0
	stats := func() (api.TraceStats, error) {
		s, err := tr.Stats()
		return api.TraceStats{Matched: s.Matched, Sent: s.Sent, Sampled: s.Sampled, Lost: s.Lost, Reported: reported}, err
	}
	finish := func(why string) error {
		s, err := stats()
		if err != nil {
			return err
		}
		if err := emit(api.TraceMessage{Stats: &s}); err != nil {
			return err
		}
		return emit(api.TraceMessage{End: why})
	}
	// The stream starts with the (zero) counts: the client knows the
	// trace runs before any packet comes.
	if err := emit(api.TraceMessage{Stats: &last}); err != nil {
		return err
	}
	tick := time.Now().Add(traceTick)
	for {
		if ctx.Err() != nil {
			// The client left, or the daemon stops: say so to
			// whoever may still read.
			_ = emit(api.TraceMessage{End: "closed"})
			return nil
		}
		now := time.Now()
		if !end.IsZero() && !now.Before(end) {
			return finish("timeout")
		}
		if !now.Before(tick) {
			tick = now.Add(traceTick)
			s, err := stats()
			if err != nil {
				return err
			}
			if s != last {
				last = s
				if err := emit(api.TraceMessage{Stats: &s}); err != nil {
					return err
				}
			}
		}
		deadline := tick
		if !end.IsZero() && end.Before(deadline) {
			deadline = end
		}
		ev, err := tr.Next(deadline)
		if errors.Is(err, datapath.ErrTraceTimeout) {
			continue
		}
		if err != nil {
			return err
		}
		reported++
		if err := emit(api.TraceMessage{Event: names.event(d, ev)}); err != nil {
			return err
		}
		if req.Count > 0 && reported >= req.Count {
			return finish("count")
		}
	}
}

// traceNames names a trace's service and backend ids, refreshed when an
// id is unknown, at most once a second.
type traceNames struct {
	names flowNames
	at    time.Time
}

func (n *traceNames) refresh(d *Daemon, now time.Time) {
	n.names, n.at = namesOf(viewFlowServices(d.view.Load())), now
}

func (n *traceNames) event(d *Daemon, ev datapath.TraceEvent) *api.TraceEvent {
	_, svcOK := n.names.services[ev.Service]
	if (ev.Service != 0 && !svcOK) && time.Since(n.at) > time.Second {
		n.refresh(d, time.Now())
	}
	out := traceEvent(ev)
	out.Service = n.names.services[ev.Service]
	return out
}

// traceEvent is ev in the API's terms, without the service's name.
func traceEvent(ev datapath.TraceEvent) *api.TraceEvent {
	out := &api.TraceEvent{
		Time:      ev.Time,
		Hook:      ev.Hook,
		Interface: ev.Interface,
		Proto:     ev.Frontend.Proto.String(),
		Client:    ev.Client.String(),
		VIP:       netip.AddrPortFrom(ev.Frontend.Addr, ev.Frontend.Port).String(),
		Direction: "client",
		Length:    ev.Length,
		Verdict:   ev.Verdict,
		Reason:    ev.Reason,
		Mode:      ev.Mode.String(),
		Dispatch:  ev.Dispatch.String(),
		Conntrack: ev.Conntrack,
		Sent:      traceSent(ev),
	}
	if ev.Reply {
		out.Direction = "reply"
	}
	if ev.Frontend.Proto == lb.TCP {
		out.TCPFlags = tcpFlags(ev.TCPFlags)
	}
	if ev.Backend.IsValid() {
		out.Backend = ev.Backend.String()
	}
	if ev.SNAT.IsValid() {
		out.SNAT = ev.SNAT.String()
	}
	return out
}

// traceSent says what left the box for ev: empty when the packet was
// passed to the stack or dropped without an answer.
func traceSent(ev datapath.TraceEvent) string {
	if ev.Verdict != "tx" && ev.Verdict != "redirect" {
		return ""
	}
	switch {
	case ev.TooBig:
		to := ev.Client.Addr().String()
		if ev.Reply {
			to = ev.Backend.Addr().String()
		}
		return "ICMP too big (fragmentation needed / packet too big) to " + to
	case ev.ICMPError:
		return "ICMP error passed on along the flow"
	case ev.Reply:
		return fmt.Sprintf("SNAT reply rewritten to %s -> %s", netip.AddrPortFrom(ev.Frontend.Addr, ev.Frontend.Port), ev.Client)
	case ev.Mode == lb.ModeSNAT:
		return fmt.Sprintf("SNAT rewritten to %s -> %s", ev.SNAT, ev.Backend)
	case ev.Dispatch == lb.DispatchIPIP:
		return "IPIP encapsulated to " + ev.Backend.Addr().String()
	case ev.Dispatch == lb.DispatchGeneve:
		return "Geneve encapsulated to " + ev.Backend.Addr().String()
	case ev.Dispatch == lb.DispatchOpt:
		return "destination rewritten to " + ev.Backend.String() + ", VIP in an IP option"
	}
	return "sent on"
}

// tcpFlags names the flags of a TCP header's byte 13: "SYN,ACK".
func tcpFlags(b uint8) string {
	var out []string
	for i, n := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"} {
		if b&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return strings.Join(out, ",")
}
