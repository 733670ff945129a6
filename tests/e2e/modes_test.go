// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/tests/topo"
)

// modeRow is one row of the forwarding matrix: a mode and DSR dispatch,
// served on VIPs of its own (10.200.1.N and 2001:db8:201::N) so that every
// row lives in one topology and one config, each service with its mode and
// dispatch set per service.
type modeRow struct {
	name     string
	mode     lb.Mode
	dispatch lb.Dispatch
	n        int
	// Backend ports of the TCP (service port 80) and UDP (service port
	// 53) services. ipip and geneve deliver the client's packet unchanged,
	// so their backends listen on VIP:80 / VIP:53; opt and SNAT rewrite
	// the destination to the backend's own address, so theirs listen
	// there, on another port, which proves the port is translated too.
	tcpPort, udpPort uint16
	// inherit leaves mode and dispatch out of the row's services, so they
	// take the daemon-wide defaults (which the config sets to this row's).
	inherit bool
}

var modeRows = []modeRow{
	{name: "dsr-ipip", mode: lb.ModeDSR, dispatch: lb.DispatchIPIP, n: 1, tcpPort: 80, udpPort: 53},
	{name: "dsr-geneve", mode: lb.ModeDSR, dispatch: lb.DispatchGeneve, n: 2, tcpPort: 80, udpPort: 53},
	{name: "dsr-opt", mode: lb.ModeDSR, dispatch: lb.DispatchOpt, n: 3, tcpPort: 8080, udpPort: 5353},
	{name: "snat", mode: lb.ModeSNAT, n: 4, tcpPort: 8081, udpPort: 5354},
	{name: "hybrid-geneve", mode: lb.ModeHybrid, dispatch: lb.DispatchGeneve, n: 5, tcpPort: 80, udpPort: 5355, inherit: true},
	{name: "hybrid-opt", mode: lb.ModeHybrid, dispatch: lb.DispatchOpt, n: 6, tcpPort: 8082, udpPort: 5356},
}

// The default snat_port_range: SNAT peers must come from it.
const snatPortMin, snatPortMax = 16384, 32767

func (r modeRow) vip(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("2001:db8:201::%d", r.n))
	}
	return netip.MustParseAddr(fmt.Sprintf("10.200.1.%d", r.n))
}

// modeFor is how the row forwards protocol p.
func (r modeRow) modeFor(p lb.Protocol) lb.Mode {
	return lb.Service{Mode: r.mode}.ModeFor(p)
}

// onVIP reports whether p's backends receive the client's packet unchanged
// (to the VIP on lo) rather than rewritten to their own address.
func (r modeRow) onVIP(p lb.Protocol) bool {
	return r.modeFor(p) == lb.ModeDSR && r.dispatch != lb.DispatchOpt
}

func (r modeRow) servicePort(p lb.Protocol) uint16 {
	if p == lb.TCP {
		return 80
	}
	return 53
}

func (r modeRow) backendPort(p lb.Protocol) uint16 {
	if p == lb.TCP {
		return r.tcpPort
	}
	return r.udpPort
}

func (r modeRow) serviceName(p lb.Protocol, v6 bool) string {
	if v6 {
		return fmt.Sprintf("%s-%s6", r.name, p)
	}
	return fmt.Sprintf("%s-%s4", r.name, p)
}

// service is the row's service for protocol p and a family, to the
// topology's backends.
func (r modeRow) service(tp *topo.Topology, p lb.Protocol, v6 bool) lb.Service {
	s := lb.Service{
		Name:     r.serviceName(p, v6),
		Frontend: lb.Frontend{Addr: r.vip(v6), Port: r.servicePort(p), Proto: p},
	}
	if !r.inherit {
		s.Mode, s.Dispatch = r.mode, r.dispatch
	}
	for _, be := range tp.Backends {
		a := be.Addr4
		if v6 {
			a = be.Addr6
		}
		s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(a, r.backendPort(p)), Weight: 1})
	}
	return s
}

// listen is where a backend's server for p listens.
func (r modeRow) listen(be *topo.Host, p lb.Protocol, v6 bool) netip.AddrPort {
	if r.onVIP(p) {
		return netip.AddrPortFrom(r.vip(v6), r.servicePort(p))
	}
	a := be.Addr4
	if v6 {
		a = be.Addr6
	}
	return netip.AddrPortFrom(a, r.backendPort(p))
}

var protocols = []lb.Protocol{lb.TCP, lb.UDP}

// modesConfig is the config of every row; lb1 and lb2 differ only in
// where the program attaches.
func modesConfig(tp *topo.Topology, attach string) topo.LBConfig {
	c := topo.LBConfig{Attach: attach, Seed: e2eSeed, TableSize: 1021, Mode: lb.ModeDSR, Dispatch: lb.DispatchIPIP}
	for _, r := range modeRows {
		if r.inherit {
			c.Mode, c.Dispatch = r.mode, r.dispatch
		}
		for _, v6 := range []bool{false, true} {
			for _, p := range protocols {
				c.Services = append(c.Services, r.service(tp, p, v6))
			}
		}
	}
	return c
}

type modesRig struct {
	tp  *topo.Topology
	lbs []*topo.L4LBD
}

// newModesRig builds a client, lb1 (XDP), lb2 (tc) and three backends. Every
// backend holds the VIPs of the unchanged-packet dispatches on lo, runs the
// companion for every VIP (DSR rows need it; SNAT rows must not mind it),
// and serves every row.
func newModesRig(t *testing.T) *modesRig {
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 3})
	var vips, onLo []netip.Addr
	for _, r := range modeRows {
		for _, v6 := range []bool{false, true} {
			vips = append(vips, r.vip(v6))
			if r.onVIP(lb.TCP) || r.onVIP(lb.UDP) {
				onLo = append(onLo, r.vip(v6))
			}
		}
	}
	var vipArgs []string
	for _, v := range vips {
		vipArgs = append(vipArgs, v.String())
	}
	for _, be := range tp.Backends {
		be.HoldVIPs(onLo...)
		be.StartCompanion(l4lbd(), vipArgs...)
		seen := map[netip.AddrPort]bool{}
		var addrs []netip.AddrPort
		for _, r := range modeRows {
			for _, v6 := range []bool{false, true} {
				for _, p := range protocols {
					if a := r.listen(be, p, v6); !seen[a] {
						seen[a] = true
						addrs = append(addrs, a)
					}
				}
			}
		}
		be.Serve(addrs...)
	}
	rig := &modesRig{tp: tp}
	for i, h := range tp.LBs {
		attach := "xdp"
		if i == 1 {
			attach = "tc"
		}
		rig.lbs = append(rig.lbs, h.StartL4LBD(l4lbd(), modesConfig(tp, attach).TOML()))
	}
	tp.RouteVIPs(tp.LBs[0], vips...)
	return rig
}

// flowResult is what one flow's server reported.
type flowResult struct {
	backend string
	peer    netip.AddrPort
}

// lbCounters is what an LB box counted, read between rounds.
type lbCounters struct {
	forwarded  uint64 // packets of one service forwarded to backends
	notService uint64 // packets that matched no frontend nor SNAT binding
	rx         uint64 // packets received on the segment interface
	reasons    map[string]uint64
}

func (rig *modesRig) counters(t *testing.T, i int, service string) lbCounters {
	t.Helper()
	ctx := context.Background()
	d := rig.lbs[i]
	st, err := d.API().Status(ctx)
	if err != nil {
		t.Fatalf("lb%d: status: %v", i+1, err)
	}
	s, err := d.API().Service(ctx, service)
	if err != nil {
		t.Fatalf("lb%d: service %s: %v", i+1, service, err)
	}
	c := lbCounters{
		forwarded:  s.Counters.Packets,
		notService: reasonPackets(st, "pass_not_service"),
		rx:         d.Host.RxPackets(),
		reasons:    map[string]uint64{},
	}
	for _, r := range st.Reasons {
		c.reasons[r.Name] = r.Packets
	}
	return c
}

const modeFlows = 40

// maxFailures ends a round early: a broken path costs every flow its
// timeouts (3 s), which would stretch a failing run past anything useful.
const maxFailures = 3

// round runs n flows of protocol p from fixed client ports to dst and
// returns what each flow's server reported, by client port.
func (rig *modesRig) round(t *testing.T, via string, p lb.Protocol, dst netip.AddrPort, n int) map[uint16]flowResult {
	t.Helper()
	got := map[uint16]flowResult{}
	failures := 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		if failures++; failures == maxFailures {
			t.Errorf("via %s: %s to %s: giving up the round after %d failed flows", via, p, dst, failures)
		}
	}
	for i := range n {
		if failures >= maxFailures {
			break
		}
		if p == lb.TCP {
			sport := uint16(20000 + i)
			c, err := rig.tp.Client.DialTCP(sport, dst)
			if err != nil {
				fail("via %s: TCP flow from port %d to %s: %v", via, sport, dst, err)
				continue
			}
			if err := c.Echo(fmt.Sprintf("hello %d", i)); err != nil {
				fail("via %s: TCP flow from port %d to %s on %s: %v", via, sport, dst, c.Backend, err)
			}
			got[sport] = flowResult{c.Backend, c.Peer}
			// A reset leaves no TIME_WAIT: the same 4-tuple goes again
			// through the other box.
			c.Abort()
			continue
		}
		sport := uint16(30000 + i)
		u, err := rig.tp.Client.DialUDP(sport, dst)
		if err != nil {
			t.Fatalf("UDP socket on port %d: %v", sport, err)
		}
		name, peer, err := u.AskPeer(fmt.Sprintf("q%d", i))
		u.Close()
		if err != nil {
			fail("via %s: UDP flow from port %d to %s: %v", via, sport, dst, err)
			continue
		}
		got[sport] = flowResult{name, peer}
	}
	return got
}

// maglevPick is the index in s.Backends of the backend Go's Maglev gives a
// flow of s: what every box must pick.
func maglevPick(t *testing.T, s lb.Service, client netip.AddrPort) int {
	t.Helper()
	seed, err := maglev.ParseSeed(e2eSeed)
	if err != nil {
		t.Fatal(err)
	}
	bs := maglev.FromLB(nil, s.Backends)
	table, err := maglev.Build(seed, 1021, bs)
	if err != nil {
		t.Fatal(err)
	}
	return int(maglev.Lookup(seed, table, maglev.Flow{
		Src: client.Addr(), Dst: s.Frontend.Addr, SrcPort: client.Port(), DstPort: s.Frontend.Port, Proto: uint8(s.Frontend.Proto),
	}))
}

// TestModes runs real TCP and UDP through every forwarding mode and DSR
// dispatch, IPv4 and IPv6, through lb1 (XDP) and then lb2 (tc): every flow
// gets through, every backend gets a share, the backend sees the client
// (DSR) or the box's SNAT address (SNAT) as the peer, DSR replies bypass
// the box while SNAT replies cross it, and the same flow lands on the same
// backend through either box.
func TestModes(t *testing.T) {
	rig := newModesRig(t)
	for _, r := range modeRows {
		for _, fam := range []struct {
			name string
			v6   bool
		}{{"ipv4", false}, {"ipv6", true}} {
			t.Run(r.name+"/"+fam.name, func(t *testing.T) { rig.check(t, r, fam.v6) })
		}
	}
}

func (rig *modesRig) check(t *testing.T, r modeRow, v6 bool) {
	tp := rig.tp
	vip := r.vip(v6)
	client := tp.Client.Addr4
	if v6 {
		client = tp.Client.Addr6
	}
	// results[box][protocol]
	results := make([]map[lb.Protocol]map[uint16]flowResult, len(tp.LBs))
	for i, box := range tp.LBs {
		tp.RouteVIPs(box, vip)
		via := fmt.Sprintf("lb%d", i+1)
		boxAddr := box.Addr4
		if v6 {
			boxAddr = box.Addr6
		}
		results[i] = map[lb.Protocol]map[uint16]flowResult{}
		for _, p := range protocols {
			svc := r.service(tp, p, v6)
			dst := netip.AddrPortFrom(vip, svc.Frontend.Port)
			before := []lbCounters{rig.counters(t, 0, svc.Name), rig.counters(t, 1, svc.Name)}
			got := rig.round(t, via, p, dst, modeFlows)
			after := []lbCounters{rig.counters(t, 0, svc.Name), rig.counters(t, 1, svc.Name)}
			results[i][p] = got

			mode := r.modeFor(p)
			for sport, f := range got {
				from := netip.AddrPortFrom(client, sport)
				switch mode {
				case lb.ModeDSR:
					if f.peer != from {
						t.Errorf("via %s: %s flow from %s: %s saw the peer %s; DSR must deliver the client's own address", via, p, from, f.backend, f.peer)
					}
				case lb.ModeSNAT:
					if f.peer.Addr() != boxAddr || f.peer.Port() < snatPortMin || f.peer.Port() > snatPortMax {
						t.Errorf("via %s: %s flow from %s: %s saw the peer %s; SNAT must show %s with a port in %d-%d", via, p, from, f.backend, f.peer, boxAddr, snatPortMin, snatPortMax)
					}
				}
				// The service lists the topology's backends in order.
				if want := tp.Backends[maglevPick(t, svc, from)].Name; f.backend != want {
					t.Errorf("via %s: %s flow from %s went to %s; Maglev in Go says %s", via, p, from, f.backend, want)
				}
			}
			share := map[string]int{}
			for _, f := range got {
				share[f.backend]++
			}
			for _, be := range tp.Backends {
				if share[be.Name] == 0 {
					t.Errorf("via %s: %s: backend %s got none of %d flows (%v)", via, p, be.Name, modeFlows, share)
				}
			}

			// The counters of this round, on the box it went through.
			other := 1 - i
			if d := after[other].forwarded - before[other].forwarded; d != 0 {
				t.Errorf("via %s: %s: lb%d forwarded %d packets though the route points at %s", via, p, other+1, d, via)
			}
			fwd := after[i].forwarded - before[i].forwarded
			notSvc := after[i].notService - before[i].notService
			// What the box received beyond the client's packets to the VIP.
			extra := int64(after[i].rx-before[i].rx) - int64(fwd)
			var moved []string
			for name, n := range after[i].reasons {
				if d := n - before[i].reasons[name]; d != 0 {
					moved = append(moved, fmt.Sprintf("%s %d", name, d))
				}
			}
			t.Logf("via %s: %s (%s): flows %v; forwarded %d, received %d more, reasons %v", via, p, mode, share, fwd, extra, moved)
			if fwd == 0 {
				t.Errorf("via %s: %s: the box forwarded nothing", via, p)
				continue
			}
			// Each flow's server sends at least one packet back: a
			// datagram, or a SYN-ACK, the greeting and the echo. Had
			// they reached a DSR box they would show up as non-service
			// packets (and in what it received); a SNAT box must
			// translate every one of them (none left as non-service)
			// and so must have received them all. Half a packet per
			// flow leaves room for the neighbour discovery and
			// listener reports of the segment, never for the replies.
			replies := len(got)
			if p == lb.TCP {
				replies *= 3
			}
			if notSvc >= modeFlows/2 {
				t.Errorf("via %s: %s (%s): %d non-service packets for %d forwarded: replies reached the box untranslated", via, p, mode, notSvc, fwd)
			}
			switch mode {
			case lb.ModeDSR:
				if extra >= modeFlows/2 {
					t.Errorf("via %s: %s (DSR): the box received %d packets besides the %d it forwarded: replies seem to cross it", via, p, extra, fwd)
				}
			case lb.ModeSNAT:
				if extra < int64(replies) {
					t.Errorf("via %s: %s (SNAT): the box received %d packets besides the %d it forwarded, fewer than the %d replies the client got: they did not all come back through it", via, p, extra, fwd, replies)
				}
			}
		}
	}

	// The same 5-tuples through the other box: the same backends (for
	// SNAT too, though the box's address and port differ).
	for _, p := range protocols {
		for sport, f := range results[0][p] {
			if g, ok := results[1][p][sport]; ok && g.backend != f.backend {
				t.Errorf("%s flow from port %d: lb1 sent it to %s, lb2 to %s", p, sport, f.backend, g.backend)
			}
		}
	}
	tp.RouteVIPs(tp.LBs[0], vip)
}

// TestModesNeighbourMiss makes each box forget the MACs of the segment
// before every round, as a link going down and up does: every flow must
// still get through, in every row, family and attach point. l4lbd puts
// back the managed entries of the backends' next hops; the client's entry
// only comes back through the slow path: a reply of a SNAT flow finds no
// neighbour, goes to the box's stack (pass_no_neigh), which resolves the
// client and forwards it, for IPv6 as well as IPv4.
func TestModesNeighbourMiss(t *testing.T) {
	rig := newModesRig(t)
	const flows = 6
	for _, r := range modeRows {
		for _, fam := range []struct {
			name string
			v6   bool
		}{{"ipv4", false}, {"ipv6", true}} {
			t.Run(r.name+"/"+fam.name, func(t *testing.T) {
				vip := r.vip(fam.v6)
				for i, box := range rig.tp.LBs {
					rig.tp.RouteVIPs(box, vip)
					via := fmt.Sprintf("lb%d", i+1)
					for _, p := range protocols {
						svc := r.service(rig.tp, p, fam.v6)
						box.NS.Run(t, "ip", "neigh", "flush", "dev", box.Iface)
						before := rig.counters(t, i, svc.Name)
						got := rig.round(t, via, p, netip.AddrPortFrom(vip, svc.Frontend.Port), flows)
						after := rig.counters(t, i, svc.Name)
						slow := after.reasons["pass_no_neigh"] - before.reasons["pass_no_neigh"]
						t.Logf("via %s: %s: %d of %d flows; %d packets took the slow path", via, p, len(got), flows, slow)
						// Whether a backend's first packet beats the
						// reinstalled entry is a race; the client's
						// entry, which nothing else restores, is not.
						if r.modeFor(p) == lb.ModeSNAT && slow == 0 {
							t.Errorf("via %s: %s (SNAT): no reply found the client's neighbour missing: the test proves nothing", via, p)
						}
					}
				}
				rig.tp.RouteVIPs(rig.tp.LBs[0], vip)
			})
		}
	}
}
