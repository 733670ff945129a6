// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// traceWait bounds how long a test waits for an event the datapath has
// already written: a guard against a hang, never a measurement.
const traceWait = 5 * time.Second

// startTrace starts a trace on e, stopped when the test ends.
func (e *env) startTrace(t testing.TB, f datapath.TraceFilter) *datapath.Trace {
	t.Helper()
	tr, err := e.lb.StartTrace(f)
	if err != nil {
		t.Fatalf("start trace %+v: %v", f, err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// nextEvent is the trace's next event; the test fails when none is there.
func nextEvent(t testing.TB, tr *datapath.Trace, what string) datapath.TraceEvent {
	t.Helper()
	ev, err := tr.Next(time.Now().Add(traceWait))
	if err != nil {
		t.Fatalf("%s: no trace event: %v", what, err)
	}
	return ev
}

// traceWant is what a test checks of an event; Time and Interface are
// checked apart.
type traceWant struct {
	hook      string
	verdict   string
	reason    string
	client    netip.AddrPort
	frontend  lb.Frontend
	backend   netip.AddrPort
	forwarded bool
	conntrack string
	mode      lb.Mode
	dispatch  lb.Dispatch
	snat      netip.AddrPort
	reply     bool
}

func checkEvent(t testing.TB, what string, ev datapath.TraceEvent, w traceWant) {
	t.Helper()
	got := traceWant{ev.Hook, ev.Verdict, ev.Reason, ev.Client, ev.Frontend, ev.Backend, ev.Forwarded, ev.Conntrack, ev.Mode, ev.Dispatch, ev.SNAT, ev.Reply}
	if got != w {
		t.Errorf("%s: event\n got %+v\nwant %+v", what, got, w)
	}
	if ev.Interface != "lb0" {
		t.Errorf("%s: interface %q, want lb0 (the packet's ingress)", what, ev.Interface)
	}
	if d := time.Since(ev.Time); d < 0 || d > time.Hour {
		t.Errorf("%s: event time %s is not the packet's (now %s)", what, ev.Time, time.Now())
	}
}

func checkTraceStats(t testing.TB, tr *datapath.Trace, want datapath.TraceStats) {
	t.Helper()
	got, err := tr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("trace counts %+v, want %+v", got, want)
	}
}

// TestTraceDSR traces a DSR flow by client, VIP, port and protocol: its SYN
// (balanced, no entry), its first ACK (entry created) and the next (entry
// hit), on both hooks and families; a packet of another client sent first
// is not reported.
func TestTraceDSR(t *testing.T) {
	e := newEnv(t)
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[:3]...)
				e.reconcile(t, svc)
				f := flowTo(svc.Frontend, fam.client, 40100+uint16(k))
				tr := e.startTrace(t, datapath.TraceFilter{
					Client: netip.PrefixFrom(fam.client, fam.client.BitLen()),
					VIP:    fam.vip, Port: 80, Proto: lb.TCP,
				})

				other := flowTo(svc.Frontend, fam.client.Next(), 40100)
				if r := e.runOn(t, k, e.frame(t, packet(other, true, false, nil))); r.verdict != k.tx() {
					t.Fatalf("other client's SYN: verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
				}
				want := traceWant{
					hook: k.String(), verdict: map[hook]string{hookXDP: "tx", hookTC: "redirect"}[k],
					client: netip.AddrPortFrom(f.Src, f.SrcPort), frontend: svc.Frontend,
					backend:   netip.AddrPortFrom(mustPick(t, svc, f), 80),
					forwarded: true, mode: lb.ModeDSR, dispatch: lb.DispatchIPIP,
				}
				for i, step := range []struct {
					syn, ack bool
					ct       string
				}{{true, false, "miss"}, {false, true, "created"}, {false, true, "hit"}} {
					if r := e.runOn(t, k, e.frame(t, packet(f, step.syn, step.ack, nil))); r.verdict != k.tx() {
						t.Fatalf("packet %d: verdict %s, want %s", i, k.verdictName(r.verdict), k.verdictName(k.tx()))
					}
					ev := nextEvent(t, tr, step.ct)
					want.conntrack = step.ct
					checkEvent(t, step.ct, ev, want)
					if ev.Service != e.state(t, svc.Frontend).ID {
						t.Errorf("%s: service id %d, want %d", step.ct, ev.Service, e.state(t, svc.Frontend).ID)
					}
				}
				checkTraceStats(t, tr, datapath.TraceStats{Matched: 3, Sent: 3})
			})
		}
	}
}

// TestTraceSNAT traces by backend: a SNAT client packet (its binding in the
// event) and the backend's reply, reported as the client's flow; a flow to
// another backend is not reported.
func TestTraceSNAT(t *testing.T) {
	for _, k := range hooks {
		t.Run(k.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{})
			svc := snatService("svc", vip4, 53, lb.UDP, backends4[:3]...)
			e.reconcile(t, svc)
			f := flowTo(svc.Frontend, client4, 41000)
			be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
			other := f
			for mustPick(t, svc, other) == be.Addr() {
				other.SrcPort++
			}
			tr := e.startTrace(t, datapath.TraceFilter{Backend: netip.AddrPortFrom(be.Addr(), 0)})

			e.sendSNAT(t, k, svc, other, clientPacket(other, false, false))
			snat := e.sendSNAT(t, k, svc, f, clientPacket(f, false, false))
			want := traceWant{
				hook: k.String(), verdict: map[hook]string{hookXDP: "tx", hookTC: "redirect"}[k],
				client: netip.AddrPortFrom(f.Src, f.SrcPort), frontend: svc.Frontend, backend: be,
				forwarded: true, conntrack: "created", mode: lb.ModeSNAT, snat: snat,
			}
			checkEvent(t, "client packet", nextEvent(t, tr, "client packet"), want)

			e.replySNAT(t, k, f, be, snat, false, false)
			want.forwarded, want.conntrack, want.reply = false, "", true
			checkEvent(t, "reply", nextEvent(t, tr, "reply"), want)
			checkTraceStats(t, tr, datapath.TraceStats{Matched: 2, Sent: 2})
		})
	}
}

// TestTraceDropAndRate traces packets dropped without a backend: the
// reason and verdict, no backend, and a rate of one event per second and
// CPU that samples the rest of a burst run on one CPU. After the trace
// stops, the datapath reports nothing; a later trace sees only its own
// packets.
func TestTraceDropAndRate(t *testing.T) {
	e := newEnv(t)
	svc := dsrService("empty", vip4, 80, lb.TCP)
	e.reconcile(t, svc)
	f := flowTo(svc.Frontend, client4, 42000)
	tr := e.startTrace(t, datapath.TraceFilter{VIP: vip4, Rate: 1})
	if _, err := e.lb.StartTrace(datapath.TraceFilter{}); !errors.Is(err, datapath.ErrTraceBusy) {
		t.Errorf("second trace: %v, want ErrTraceBusy", err)
	}

	const burst = 5
	err := e.ns.Do(func() error {
		frame := e.frame(t, packet(f, false, true, nil))
		v, err := e.lb.Program().Run(&ebpf.RunOptions{
			Data: frame, Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(e.ifindex)}, Repeat: burst,
		})
		if err == nil && v != xdpDrop {
			t.Errorf("verdict %s, want XDP_DROP", verdictName(v))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkEvent(t, "drop", nextEvent(t, tr, "drop"), traceWant{
		hook: "xdp", verdict: "drop", reason: "drop_no_backend",
		client: netip.AddrPortFrom(f.Src, f.SrcPort), frontend: svc.Frontend,
		mode: lb.ModeDSR, dispatch: lb.DispatchIPIP,
	})
	st, err := tr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// One event a second: a burst that crosses a second's edge sends two.
	if st.Matched != burst || st.Sent < 1 || st.Sent > 2 || st.Sent+st.Sampled != burst || st.Lost != 0 {
		t.Errorf("trace counts %+v: want %d matched, 1 or 2 sent and the rest sampled", st, burst)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	// Disarmed: this packet is nobody's event.
	e.run(t, e.frame(t, packet(f, false, true, nil)))
	tr2 := e.startTrace(t, datapath.TraceFilter{})
	g := flowTo(svc.Frontend, client4, 42001)
	e.run(t, e.frame(t, packet(g, false, true, nil)))
	if ev := nextEvent(t, tr2, "second trace"); ev.Client.Port() != g.SrcPort {
		t.Errorf("second trace's first event is of client port %d, want %d (the packet sent after it started)", ev.Client.Port(), g.SrcPort)
	}
	checkTraceStats(t, tr2, datapath.TraceStats{Matched: 1, Sent: 1})
}

// TestTraceFilterMatch checks the filter's prefixes, ports and protocol
// against packets of several clients: only those selected are reported.
func TestTraceFilterMatch(t *testing.T) {
	e := newEnv(t)
	web := dsrService("web", vip4, 80, lb.TCP, backends4[:2]...)
	dns := dsrService("dns", vip4, 53, lb.UDP, backends4[:2]...)
	dns.Backends[0].Addr = netip.AddrPortFrom(backends4[0], 53)
	dns.Backends[1].Addr = netip.AddrPortFrom(backends4[1], 53)
	e.reconcile(t, web, dns)
	in := netip.MustParseAddr("198.51.100.200")  // inside 198.51.100.128/25
	out := netip.MustParseAddr("198.51.100.100") // outside
	flows := []struct {
		f    maglev.Flow
		want bool
	}{
		{flowTo(web.Frontend, out, 43000), false},
		{flowTo(dns.Frontend, in, 43001), false},
		{flowTo(web.Frontend, in, 43002), true},
		{flowTo(web.Frontend, in, 43003), true},
	}
	tr := e.startTrace(t, datapath.TraceFilter{Client: netip.MustParsePrefix("198.51.100.128/25"), Port: 80, Proto: lb.TCP})
	for _, fl := range flows {
		e.run(t, e.frame(t, packet(fl.f, true, false, nil)))
	}
	for _, fl := range flows {
		if !fl.want {
			continue
		}
		if ev := nextEvent(t, tr, "selected flow"); ev.Client != netip.AddrPortFrom(fl.f.Src, fl.f.SrcPort) {
			t.Errorf("event of %s, want %s:%d", ev.Client, fl.f.Src, fl.f.SrcPort)
		}
	}
	checkTraceStats(t, tr, datapath.TraceStats{Matched: 2, Sent: 2})
}
