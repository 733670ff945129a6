// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// backendIDs maps the backend addresses of a programmed service to ids.
func (e *env) backendIDs(t testing.TB, fe lb.Frontend) (reconciler.ServiceID, map[netip.Addr]reconciler.BackendID) {
	t.Helper()
	st := e.state(t, fe)
	ids := map[netip.Addr]reconciler.BackendID{}
	for _, b := range st.Backends {
		ids[b.Addr.Addr()] = b.ID
	}
	return st.ID, ids
}

// flows lists the connection table's entries f matches, by client.
func (e *env) flows(t testing.TB, f datapath.FlowFilter) map[netip.AddrPort]datapath.Flow {
	t.Helper()
	out := map[netip.AddrPort]datapath.Flow{}
	if err := e.lb.Flows(f, func(fl datapath.Flow) bool {
		if _, dup := out[fl.Client]; dup {
			t.Errorf("flow of %s listed twice", fl.Client)
		}
		out[fl.Client] = fl
		return true
	}); err != nil {
		t.Fatalf("list flows: %v", err)
	}
	return out
}

func (e *env) flowCounts(t testing.TB) map[datapath.FlowOwner]datapath.FlowCount {
	t.Helper()
	c, err := e.lb.FlowCounts(0)
	if err != nil {
		t.Fatalf("count flows: %v", err)
	}
	return c
}

func clientOf(f maglev.Flow) netip.AddrPort { return netip.AddrPortFrom(f.Src, f.SrcPort) }

// TestFlowsDSR opens TCP flows and sends UDP ones through a DSR service
// pair, then checks what the connection table says about them: per-backend
// counts (TCP active, UDP inactive; an entry aged past its state's timeout
// in neither: inactive counts decay), the listing with filters, and a
// flush of a draining backend, after which its flows go by the Maglev
// table again.
func TestFlowsDSR(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			// An established timeout the kernel's clock can age an
			// entry past, at any uptime.
			window := bpftest.AgeableTimeout(2*time.Second, time.Hour)
			e := newEnvWith(t, envOptions{snatTimeouts: datapath.SNATTimeouts{TCP: window, TCPClosing: window, UDP: window}})
			b := fam.backends
			web := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1])
			dns := dsrService("dns", fam.vip, 53, lb.UDP, b[0], b[1])
			e.reconcile(t, web, dns)
			webID, webBE := e.backendIDs(t, web.Frontend)
			dnsID, dnsBE := e.backendIDs(t, dns.Frontend)

			tcp := e.open(t, web, randomFlows(web.Frontend, 40, 7))
			udp := e.send(t, dns, randomFlows(dns.Frontend, 10, 8))
			want := map[datapath.FlowOwner]datapath.FlowCount{}
			// count moves the expected counts of a service's backend.
			count := func(svc reconciler.ServiceID, be reconciler.BackendID, active, inactive int) {
				o := datapath.FlowOwner{Service: svc, Backend: be}
				n := want[o]
				n.Active = uint64(int64(n.Active) + int64(active))
				n.Inactive = uint64(int64(n.Inactive) + int64(inactive))
				want[o] = n
			}
			for _, c := range tcp {
				count(webID, webBE[c.backend], 1, 0)
			}
			for _, c := range udp {
				count(dnsID, dnsBE[c.backend], 0, 1)
			}
			if len(want) != 4 {
				t.Fatalf("flows reached %d (service, backend) pairs, want all 4: pick other seeds", len(want))
			}
			expectCounts(t, e.flowCounts(t), want)

			// The listing: every flow with its backend and state.
			all := e.flows(t, datapath.FlowFilter{})
			if len(all) != len(tcp)+len(udp) {
				t.Fatalf("listed %d flows, want %d", len(all), len(tcp)+len(udp))
			}
			for _, c := range append(append([]established{}, tcp...), udp...) {
				fl, ok := all[clientOf(c.flow)]
				svcID, ids, st := webID, webBE, datapath.FlowEstablished
				fe := web.Frontend
				if c.flow.Proto == uint8(lb.UDP) {
					svcID, ids, st, fe = dnsID, dnsBE, datapath.FlowUDP, dns.Frontend
				}
				if !ok || fl.Frontend != fe || fl.Service != svcID || fl.Backend != ids[c.backend] || fl.State != st || fl.SNAT.IsValid() {
					t.Errorf("flow %v on %s listed as %+v (found %v)", c.flow, c.backend, fl, ok)
				}
				// Idle once its state's timeout has passed since
				// its latest packet.
				timeout := window
				if fl.Expires+fl.Age != timeout || fl.Expires <= 0 {
					t.Errorf("flow %v: expires in %s at age %s, want the rest of its %s timeout", c.flow, fl.Expires, fl.Age, timeout)
				}
			}
			// Filters: one backend of one service.
			x := tcp[0].backend
			only := e.flows(t, datapath.FlowFilter{Backends: map[reconciler.BackendID]bool{webBE[x]: true}})
			for _, c := range tcp {
				if _, ok := only[clientOf(c.flow)]; ok != (c.backend == x) {
					t.Errorf("backend filter %s: flow on %s listed %v", x, c.backend, ok)
				}
			}
			if n := len(e.flows(t, datapath.FlowFilter{Services: map[reconciler.ServiceID]bool{dnsID: true}})); n != len(udp) {
				t.Errorf("service filter dns listed %d flows, want %d", n, len(udp))
			}

			// A TCP entry not seen within the established timeout is
			// idle, and no longer counted: the entry stays, the
			// connection is gone.
			aged := tcp[0]
			e.ageFlow(t, aged.flow, 2*window)
			if fl := e.flows(t, datapath.FlowFilter{})[clientOf(aged.flow)]; fl.State != datapath.FlowIdle || fl.Age < 2*window {
				t.Errorf("entry aged %s past a %s window: %+v, want idle", 2*window, window, fl)
			} else if fl.Expires != 0 {
				t.Errorf("idle entry expires in %s, want 0", fl.Expires)
			}
			count(webID, webBE[aged.backend], -1, 0)
			// A UDP entry past the UDP timeout decays likewise.
			e.ageFlow(t, udp[0].flow, 2*window)
			count(dnsID, dnsBE[udp[0].backend], 0, -1)
			expectCounts(t, e.flowCounts(t), want)

			// A client's FIN or RST ends a DSR connection: closing,
			// inactive, still on its backend; a SYN reusing the tuple
			// starts a new one.
			for i, c := range tcp[1:3] {
				p := packet(c.flow, false, true, nil)
				p.FIN, p.RST = i == 0, i == 1
				in := e.frame(t, p)
				if got := e.checkTX(t, in, e.run(t, in)); got != c.backend {
					t.Errorf("%s of flow %v went to %s, want its backend %s", map[int]string{0: "FIN", 1: "RST"}[i], c.flow, got, c.backend)
				}
				count(webID, webBE[c.backend], -1, 1)
			}
			listed := e.flows(t, datapath.FlowFilter{})
			for _, c := range tcp[1:3] {
				if fl := listed[clientOf(c.flow)]; fl.State != datapath.FlowClosing || fl.Backend != webBE[c.backend] {
					t.Errorf("flow %v after its client's FIN/RST: %+v, want closing on %s", c.flow, fl, c.backend)
				}
			}
			expectCounts(t, e.flowCounts(t), want)
			// The FIN's ACK keeps it closing; the tuple's next SYN and
			// ACK make it established again.
			e.expectSticky(t, web, tcp[1:2])
			if fl := e.flows(t, datapath.FlowFilter{})[clientOf(tcp[1].flow)]; fl.State != datapath.FlowClosing {
				t.Errorf("flow %v after the ACK of its FIN: %s, want closing", tcp[1].flow, fl.State)
			}
			reopened := tcp[2]
			in := e.frame(t, packet(reopened.flow, true, false, nil))
			if got := e.checkTX(t, in, e.run(t, in)); got != reopened.backend {
				t.Errorf("SYN reusing flow %v went to %s, want its entry's %s", reopened.flow, got, reopened.backend)
			}
			e.expectSticky(t, web, []established{reopened})
			if fl := e.flows(t, datapath.FlowFilter{})[clientOf(reopened.flow)]; fl.State != datapath.FlowEstablished {
				t.Errorf("flow %v reopened by a SYN: %s, want established", reopened.flow, fl.State)
			}
			count(webID, webBE[reopened.backend], 1, -1)
			expectCounts(t, e.flowCounts(t), want)
			// A closed DSR flow quiet past tcp_closing decays (IPVS's
			// TIME_WAIT running out).
			e.ageFlow(t, tcp[1].flow, 2*window)
			count(webID, webBE[tcp[1].backend], 0, -1)
			expectCounts(t, e.flowCounts(t), want)

			// Drain x: its flows stay on it through their entries. A
			// flush of x deletes exactly those; their next packets go
			// by the table, to the other backend.
			drained := web
			drained.Backends = append([]lb.Backend(nil), web.Backends...)
			var onX []established
			for i := range drained.Backends {
				if drained.Backends[i].Addr.Addr() == x {
					drained.Backends[i].State = lb.Draining
				}
			}
			for _, c := range tcp {
				if c.backend == x {
					onX = append(onX, c)
				}
			}
			e.reconcile(t, drained, dns)
			e.expectSticky(t, drained, onX)
			n0 := e.conntrackEntries(t)
			res, err := e.lb.FlushFlows(datapath.FlowFilter{Backends: map[reconciler.BackendID]bool{webBE[x]: true}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Flows != len(onX) || res.Bindings != 0 {
				t.Errorf("flush of %s deleted %+v, want %d flows and no bindings (DSR)", x, res, len(onX))
			}
			if n := e.conntrackEntries(t); n != n0-len(onX) {
				t.Errorf("connection table holds %d entries after the flush, want %d", n, n0-len(onX))
			}
			for _, got := range e.send(t, drained, flowsOf(onX)) {
				if got.backend == x {
					t.Errorf("flow %v still went to the drained, flushed backend %s", got.flow, x)
				}
			}
			if c := e.flowCounts(t)[datapath.FlowOwner{Service: webID, Backend: webBE[x]}]; c != (datapath.FlowCount{}) {
				t.Errorf("flushed backend still counts %+v", c)
			}
		})
	}
}

// ageFlow sets back the latest packet of f's connection-table entry by d.
func (e *env) ageFlow(t testing.TB, f maglev.Flow, d time.Duration) {
	t.Helper()
	key := maglev.FlowKey(f)
	ct := e.lb.Maps()[bpf.LbMapConntrack]
	var v bpf.LbCtValue
	if err := ct.Lookup(key[:], &v); err != nil {
		t.Fatalf("look up the entry of %v: %v", f, err)
	}
	v.LastSeen = uint64(bpftest.KernelNow() - d)
	if err := ct.Put(key[:], &v); err != nil {
		t.Fatalf("age the entry of %v: %v", f, err)
	}
}

func expectCounts(t testing.TB, got, want map[datapath.FlowOwner]datapath.FlowCount) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("counts for %d (service, backend) pairs, want %d: %v", len(got), len(want), got)
	}
	for o, w := range want {
		if got[o] != w {
			t.Errorf("service %d backend %d: %+v, want %+v", o.Service, o.Backend, got[o], w)
		}
	}
}

// TestFlowsSNAT checks the states a SNAT flow's binding gives it (a FIN
// makes it inactive), the SNAT source in the listing, and that a flush of a
// backend deletes its flows' entries and bindings, and only those; a
// flushed flow whose backend is still the table's choice gets the same
// backend and source port back.
func TestFlowsSNAT(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := newSNATEnv(t, envOptions{})
			svc := snatService("svc", fam.vip, 80, lb.TCP, fam.backends[:2]...)
			e.reconcile(t, svc)
			svcID, ids := e.backendIDs(t, svc.Frontend)

			flows := randomFlows(svc.Frontend, 24, 3)
			snats := map[netip.AddrPort]netip.AddrPort{}
			byBackend := map[netip.Addr][]maglev.Flow{}
			for _, f := range flows {
				snats[clientOf(f)] = e.sendSNAT(t, hookXDP, svc, f, clientPacket(f, true, false))
				be := mustPick(t, svc, f)
				synAck(t, e, hookXDP, netip.AddrPortFrom(be, snatBackendPort), snats[clientOf(f)], "handshake")
				e.sendSNAT(t, hookXDP, svc, f, clientPacket(f, false, true))
				byBackend[be] = append(byBackend[be], f)
			}
			if len(byBackend) != 2 {
				t.Fatalf("flows reached %d backends, want 2: pick another seed", len(byBackend))
			}
			x, y := fam.backends[0], fam.backends[1]
			closed := byBackend[x][0]
			p := clientPacket(closed, false, true)
			p.FIN = true
			if r := e.run(t, e.frame(t, p)); r.verdict != hookXDP.tx() {
				t.Fatalf("client FIN: verdict %s", hookXDP.verdictName(r.verdict))
			}
			expectCounts(t, e.flowCounts(t), map[datapath.FlowOwner]datapath.FlowCount{
				{Service: svcID, Backend: ids[x]}: {Active: uint64(len(byBackend[x]) - 1), Inactive: 1},
				{Service: svcID, Backend: ids[y]}: {Active: uint64(len(byBackend[y]))},
			})
			listed := e.flows(t, datapath.FlowFilter{})
			for _, f := range flows {
				fl := listed[clientOf(f)]
				st := datapath.FlowEstablished
				if f == closed {
					st = datapath.FlowClosing
				}
				if fl.State != st || fl.SNAT != snats[clientOf(f)] || fl.Backend != ids[mustPick(t, svc, f)] {
					t.Errorf("flow %v: listed %+v, want state %s, SNAT source %s", f, fl, st, snats[clientOf(f)])
				}
			}

			// Flush x: its entries and bindings go, y's stay.
			fwd0, rev0 := e.snatEntries(t)
			res, err := e.lb.FlushFlows(datapath.FlowFilter{Backends: map[reconciler.BackendID]bool{ids[x]: true}})
			if err != nil {
				t.Fatal(err)
			}
			nx := len(byBackend[x])
			if res.Flows != nx || res.Bindings != nx {
				t.Errorf("flush of %s deleted %+v, want %d flows and %d bindings", x, res, nx, nx)
			}
			if fwd, rev := e.snatEntries(t); fwd != fwd0-nx || rev != rev0-nx {
				t.Errorf("SNAT tables hold %d / %d entries after the flush, want %d / %d", fwd, rev, fwd0-nx, rev0-nx)
			}
			for _, f := range flows {
				_, bound := e.binding(t, f)
				_, listed := e.flows(t, datapath.FlowFilter{})[clientOf(f)]
				if on := mustPick(t, svc, f) == x; bound == on || listed == on {
					t.Errorf("flow %v (on x: %v) after the flush: binding %v, entry %v", f, on, bound, listed)
				}
			}
			// x is still the table's choice: the flow's next packet
			// gets x again, from the same source port.
			f := byBackend[x][1]
			if got := e.sendSNAT(t, hookXDP, svc, f, clientPacket(f, false, true)); got != snats[clientOf(f)] {
				t.Errorf("flushed flow came back from %s, want its old source %s", got, snats[clientOf(f)])
			}
		})
	}
}

// BenchmarkFlowCounts measures counting a full connection table per
// backend (what status and a scrape cost, every 5 s at most) next to the
// plain entry count it extends (ConntrackEntries), in one run. The
// entries are written directly: only the walk is measured.
func BenchmarkFlowCounts(b *testing.B) {
	const n = 1 << 18
	e := newEnvWith(b, envOptions{conntrackMax: n, snatMax: 1024})
	ct := e.lb.Maps()[bpf.LbMapConntrack]
	keys := make([]bpf.LbFlowKey, 0, 4096)
	vals := make([]bpf.LbCtValue, 0, 4096)
	now := uint64(bpftest.KernelNow())
	for i := range n {
		k := bpf.LbFlowKey{Src: netip.AddrFrom4([4]byte{198, byte(i >> 16), byte(i >> 8), byte(i)}).As16(), Dst: vip4.As16(), Sport: htons(40000), Dport: htons(80), Proto: uint8(lb.TCP)}
		keys = append(keys, k)
		vals = append(vals, bpf.LbCtValue{BackendId: uint32(1 + i%8), SvcId: 1, LastSeen: now})
		if len(keys) == cap(keys) || i == n-1 {
			if _, err := ct.BatchUpdate(keys, vals, nil); err != nil {
				b.Fatal(err)
			}
			keys, vals = keys[:0], vals[:0]
		}
	}
	held := e.conntrackEntries(b)
	b.Logf("%d entries held (the LRU may keep fewer than %d)", held, n)
	b.Run("entries", func(b *testing.B) {
		for b.Loop() {
			e.conntrackEntries(b)
		}
	})
	b.Run("counts", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.lb.FlowCounts(0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("list", func(b *testing.B) {
		for b.Loop() {
			if err := e.lb.Flows(datapath.FlowFilter{}, func(datapath.Flow) bool { return true }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
