// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// The datapath fuzzer. FuzzDatapath runs raw frames through both entry
// points (XDP and tc, BPF_PROG_TEST_RUN) of one datapath loaded per fuzz
// process, with services of every mode and dispatch on both families and
// live connection entries and SNAT bindings, and holds every run to an
// oracle that shares nothing with the C parser: pkttest.CheckStrict (the
// kernel's receive rules, written in Go) and gopacket's decoders.
//
//   - Never XDP_ABORTED, nor a verdict the hook does not use.
//   - Forwarded (XDP_TX / XDP_REDIRECT / TC_ACT_REDIRECT, or handed to the
//     stack already rewritten: pass_no_neigh, pass_no_tx_port) implies the
//     input was well-formed and a TCP/UDP packet or an ICMP error, and the
//     output is well-formed: outer and inner headers parse (strictly, and
//     for gopacket), checksums right, lengths exact, no trailing bytes; an
//     encapsulated packet is the input's IP packet byte for byte; a
//     rewritten one keeps its payload and a right L4 checksum stays right.
//   - Not forwarded implies exactly one reason counter moved, by one;
//     forwarded moves none, or icmp_error_forwarded / icmp_frag_needed_sent.
//   - Passed untouched (every other pass reason) means byte for byte.
//
// An input is a selector byte and a frame. The selector picks the hook and
// lets the fuzzer reach deep paths without solving checksums: see the sel*
// bits. The seed corpus (f.Add) has a packet of every class the packet
// tests build, through both hooks, and runs in plain `go test`.
//
// Run it with `make fuzz` (FUZZTIME, default 10m). L4LB_FUZZ_TOLERATE, a
// comma-separated list of rules (pkttest.StrictError's, e.g. ipv6-padding,
// and the fuzzer's own ttl-zero), turns findings of those rules into counts
// logged at the end, so that a run can go on past a gap already reported;
// never set it in CI.

// Selector bits. The high nibble picks a target (fuzzEnv.targets) whose
// addresses and ports are written into the frame.
const (
	selTC      = 1 << 0 // the tc program, else XDP
	selMAC     = 1 << 1 // Ethernet destination := lb0's MAC
	selLengths = 1 << 2 // IP and UDP lengths := what the frame holds
	selSums    = 1 << 3 // IPv4 header, TCP/UDP and ICMP checksums recomputed
)

// fuzzMaxFrame bounds an input: past an Ethernet MTU plus any encapsulation
// nothing new happens, and BPF_PROG_TEST_RUN refuses frames beyond a page.
const fuzzMaxFrame = 2048

// fuzzRefreshEvery is how many inputs run between two refreshes of the live
// state: fuzzed RSTs, FINs and floods close or evict the established
// entries the targets name.
const fuzzRefreshEvery = 256

// fuzzClientPort and fuzzNewPort are the client ports of the established
// flows and of the seeds' new flows.
const (
	fuzzClientPort = 40000
	fuzzNewPort    = 41000
)

// fuzzTarget is a 5-tuple the selector can write into a frame: an
// established flow, a SNAT binding's reply, or a frontend.
type fuzzTarget struct {
	name     string
	src, dst netip.AddrPort
	setSrc   bool
}

// fuzzFlow is one live flow of a service: the client's, and for SNAT the
// binding's backend and SNAT source.
type fuzzFlow struct {
	svc      lb.Service
	f        maglev.Flow
	snat, be netip.AddrPort // SNAT only
}

func (ff fuzzFlow) isSNAT() bool { return ff.be.IsValid() }

// fuzzEnv is one fuzz process's datapath and what the fuzzer knows of it.
type fuzzEnv struct {
	e     *env
	svcs  []lb.Service
	flows map[int][]fuzzFlow // by family (4, 6), in fuzzServices order
	// targets are by family: index i is selector target i+1.
	targets  map[int][]fuzzTarget
	tolerate map[string]bool
	execs    int
	// tolerated counts the findings of tolerated rules, by rule.
	tolerated map[string]int
	// seedNames names the seed corpus's inputs, for failure messages.
	seedNames map[string]string
	// reasonNames are the datapath's reasons, by index.
	reasonNames []string
	// lbMAC is lb0's MAC, and neighMACs the neighbours' (backends, the
	// router): what a frame the LB sends carries as source and destination.
	lbMAC     []byte
	neighMACs map[string]bool
	// local are the box's own addresses (lb0's, the SNAT addresses, the
	// VIPs), by their bytes as the IP header carries them: no packet
	// from one may be forwarded.
	local map[string]bool
	// exits counts inputs by (hook, verdict class, reason), logged at the
	// end: which of the datapath's exits the inputs reached.
	exits map[string]int
}

// isSNATService says whether svc's packets of its protocol are SNATed.
func isSNATService(svc lb.Service) bool {
	return svc.Mode == lb.ModeSNAT || svc.Mode == lb.ModeHybrid && svc.Frontend.Proto == lb.UDP
}

// fuzzServices are, per family on its VIP: DSR over ipip, geneve and opt,
// SNAT, hybrid (TCP DSR, UDP SNAT), each for TCP and UDP; a TCP frontend
// with a source range and a backend without a neighbour entry, and one
// without backends.
func fuzzServices() []lb.Service {
	var out []lb.Service
	for _, fam := range families {
		for i, d := range []lb.Dispatch{lb.DispatchIPIP, lb.DispatchGeneve, lb.DispatchOpt} {
			tcpBE, udpBE := dispatchBackendPorts(d)
			for _, s := range dispatchServices(d, tcpBE, udpBE) {
				if s.Frontend.Addr != fam.vip {
					continue
				}
				s.Name = fmt.Sprintf("%s-%s-%s", d, s.Frontend.Proto, fam.name)
				s.Frontend.Port += uint16(i)
				out = append(out, s)
			}
		}
		out = append(out,
			snatService("snat-tcp-"+fam.name, fam.vip, 83, lb.TCP, fam.backends[:3]...),
			snatService("snat-udp-"+fam.name, fam.vip, 56, lb.UDP, fam.backends[:3]...))
		htcp := dsrService("hybrid-tcp-"+fam.name, fam.vip, 84, lb.TCP, fam.backends[:3]...)
		htcp.Mode = lb.ModeHybrid
		hudp := snatService("hybrid-udp-"+fam.name, fam.vip, 57, lb.UDP, fam.backends[:3]...)
		hudp.Mode = lb.ModeHybrid
		// Its only backend has no neighbour entry: the stack forwards
		// what the LB encapsulated (pass_no_neigh); only the client may
		// connect (drop_source_range for the rest).
		ranged := dsrService("ranged-noneigh-tcp-"+fam.name, fam.vip, 86, lb.TCP, fam.noNeigh)
		ranged.SourceRanges = []netip.Prefix{netip.PrefixFrom(fam.client, fam.client.BitLen())}
		out = append(out, htcp, hudp, ranged,
			lb.Service{Name: "empty-" + fam.name, Frontend: lb.Frontend{Addr: fam.vip, Port: 85, Proto: lb.TCP}})
	}
	return out
}

// fuzzEstablished says whether fuzz setup makes a live flow for svc: every
// service whose packets can be forwarded.
func fuzzEstablished(svc lb.Service) bool {
	return len(svc.Backends) > 0 && svc.SourceRanges == nil
}

// newFuzzEnv loads the datapath, programs fuzzServices and sets up one
// established flow per service.
func newFuzzEnv(t testing.TB) *fuzzEnv {
	t.Helper()
	fz := &fuzzEnv{
		// Anonymous namespaces: the engine kills a worker that does
		// not stop within two seconds, one still loading its datapath
		// included, and a killed process runs no cleanups.
		e:         newSNATEnv(t, envOptions{icmpRate: 1000, anonNS: true}),
		svcs:      fuzzServices(),
		tolerate:  map[string]bool{},
		tolerated: map[string]int{},
		exits:     map[string]int{},
	}
	fz.reasonNames = fz.e.lb.ReasonNames()
	fz.lbMAC = fz.e.lbMAC
	fz.neighMACs = map[string]bool{string(routerMAC): true}
	for _, b := range append(append([]netip.Addr{}, backends4...), backends6...) {
		fz.neighMACs[string(backendMAC(b))] = true
	}
	for _, r := range strings.Split(os.Getenv("L4LB_FUZZ_TOLERATE"), ",") {
		if r = strings.TrimSpace(r); r != "" {
			fz.tolerate[r] = true
		}
	}
	fz.local = map[string]bool{}
	// lb0's addresses are the SNAT addresses.
	for _, a := range []netip.Addr{lbAddr4, lbAddr6} {
		fz.local[string(a.AsSlice())] = true
	}
	for _, s := range fz.svcs {
		fz.local[string(s.Frontend.Addr.AsSlice())] = true
	}
	fz.e.reconcile(t, fz.svcs...)
	fz.establish(t, true)
	t.Cleanup(func() {
		var exits []string
		for exit, n := range fz.exits {
			exits = append(exits, fmt.Sprintf("%7d %s", n, exit))
		}
		slices.Sort(exits)
		t.Logf("inputs by hook, verdict and reason:\n%s", strings.Join(exits, "\n"))
		if len(fz.tolerated) > 0 {
			t.Logf("findings of tolerated rules (L4LB_FUZZ_TOLERATE): %v", fz.tolerated)
		}
	})
	return fz
}

// establish sets up (or refreshes) one established flow per service with
// backends: a TCP handshake or a UDP datagram, and for SNAT the backend's
// reply, then records the targets. strict fails the test when a step is
// not forwarded (the first setup); a refresh keeps what it cannot redo.
func (fz *fuzzEnv) establish(t testing.TB, strict bool) {
	t.Helper()
	e := fz.e
	send := func(what string, frame []byte) (result, bool) {
		r := e.runOn(t, hookXDP, frame)
		if r.verdict != xdpTX {
			if strict {
				t.Fatalf("fuzz setup: %s: verdict %s", what, verdictName(r.verdict))
			}
			return r, false
		}
		return r, true
	}
	old := fz.flows
	fz.flows = map[int][]fuzzFlow{}
	for _, svc := range fz.svcs {
		if !fuzzEstablished(svc) {
			continue
		}
		fam := 4
		if svc.Frontend.Addr.Is6() {
			fam = 6
		}
		f := flowTo(svc.Frontend, familyOf(svc.Frontend.Addr).client, fuzzClientPort)
		tcp := svc.Frontend.Proto == lb.TCP
		ff := fuzzFlow{svc: svc, f: f}
		if !isSNATService(svc) {
			if tcp {
				send(svc.Name+" SYN", e.frame(t, packet(f, true, false, nil)))
			}
			send(svc.Name+" packet", e.frame(t, packet(f, false, true, []byte("established"))))
			fz.flows[fam] = append(fz.flows[fam], ff)
			continue
		}
		r, ok := send(svc.Name+" first packet", e.frame(t, clientPacket(f, tcp, false)))
		if !ok {
			fz.flows[fam] = append(fz.flows[fam], previous(old[fam], svc, ff))
			continue
		}
		ff.snat = source(t, r.out)
		ff.be = netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
		send(svc.Name+" reply", e.frame(t, replyPacket(ff.be, ff.snat, svc.Frontend.Proto, false, false)))
		if tcp {
			send(svc.Name+" ACK", e.frame(t, clientPacket(f, false, true)))
		}
		fz.flows[fam] = append(fz.flows[fam], ff)
	}
	fz.targets = map[int][]fuzzTarget{}
	for fam, flows := range fz.flows {
		var ts, replies []fuzzTarget
		for _, ff := range flows {
			ts = append(ts, fuzzTarget{name: ff.svc.Name, src: netip.AddrPortFrom(ff.f.Src, ff.f.SrcPort), dst: netip.AddrPortFrom(ff.f.Dst, ff.f.DstPort), setSrc: true})
			if ff.isSNAT() {
				replies = append(replies, fuzzTarget{name: ff.svc.Name + " reply", src: ff.be, dst: ff.snat, setSrc: true})
			}
		}
		ts = append(ts, replies...)
		for _, svc := range fz.svcs {
			if fuzzEstablished(svc) || svc.Frontend.Addr.Is4() != (fam == 4) {
				continue
			}
			client := familyOf(svc.Frontend.Addr).client
			ts = append(ts, fuzzTarget{name: svc.Name, src: netip.AddrPortFrom(client, fuzzClientPort), dst: netip.AddrPortFrom(svc.Frontend.Addr, svc.Frontend.Port), setSrc: true})
		}
		if len(ts) > 15 {
			t.Fatalf("fuzz setup: %d targets of IPv%d, the selector has room for 15", len(ts), fam)
		}
		fz.targets[fam] = ts
	}
}

// previous is svc's flow in old, or ff when there is none.
func previous(old []fuzzFlow, svc lb.Service, ff fuzzFlow) fuzzFlow {
	for _, o := range old {
		if o.svc.Name == svc.Name {
			return o
		}
	}
	return ff
}

// fuzzSeed is one entry of the seed corpus.
type fuzzSeed struct {
	name  string
	sel   byte
	frame []byte
}

// seeds builds the seed corpus: for each family, every service's
// established and new flows, SNAT replies, ICMP errors about DSR and SNAT
// flows (both directions), a packet too big for the path, the malformed and
// borderline frames of the packet tests, IPv4 options and IPv6 extension
// headers the kernel accepts or refuses, VLAN tags, other protocols, and
// frames of each kind through the selector's targets and fix-ups. Each goes
// through both hooks.
func (fz *fuzzEnv) seeds(t testing.TB) []fuzzSeed {
	t.Helper()
	e := fz.e
	var out []fuzzSeed
	add := func(name string, sel byte, frame []byte) {
		out = append(out, fuzzSeed{name, sel | selMAC, frame}, fuzzSeed{name + " (tc)", sel | selMAC | selTC, frame})
	}
	for fi, fam := range families {
		famNum := 4 + 2*fi
		for _, ff := range fz.flows[famNum] {
			name := fam.name + " " + ff.svc.Name
			tcp := ff.f.Proto == uint8(lb.TCP)
			add(name+" established", 0, e.frame(t, packet(ff.f, false, true, []byte("established data"))))
			nf := ff.f
			nf.SrcPort = fuzzNewPort
			add(name+" new flow", 0, e.frame(t, packet(nf, tcp, false, []byte("first"))))
			if tcp {
				add(name+" FIN", 0, e.frame(t, pkttest.Packet{Src: netip.AddrPortFrom(nf.Src, nf.SrcPort), Dst: netip.AddrPortFrom(nf.Dst, nf.DstPort), ACK: true, FIN: true}))
			}
			vip := netip.AddrPortFrom(ff.f.Dst, ff.f.DstPort)
			for _, kind := range errKinds(fam) {
				add(name+" ICMP "+kind.name+" about a reply", 0, e.icmpErr(t, routerOf(fam), ff.f.Dst, kind, quoteOf(t, replyPkt(ff.f, vip), kind)))
			}
			if !ff.isSNAT() {
				continue
			}
			add(name+" reply", 0, e.frame(t, replyPacket(ff.be, ff.snat, lb.Protocol(ff.f.Proto), false, false)))
			sent := clientPacket(ff.f, false, true)
			sent.Src, sent.Dst, sent.TTL = ff.snat, ff.be, sent.TTL-1
			unreach := errKind{name: "port-unreachable", typ: pkttest.ICMPv4DestUnreachable, code: pkttest.ICMPv4PortUnreachable}
			if fam.vip.Is6() {
				unreach.typ, unreach.code = pkttest.ICMPv6DestUnreachable, 4
			}
			add(name+" ICMP from the backend", 0, pkttest.BuildICMPError(t, pkttest.ICMPError{
				SrcMAC: backendMAC(ff.be.Addr()), DstMAC: e.lbMAC, Src: ff.be.Addr(), Dst: ff.snat.Addr(),
				Type: unreach.typ, Code: unreach.code, Quote: quoteOf(t, sent, unreach),
			}))
		}
		for i, tg := range fz.targets[famNum] {
			// Any TCP packet becomes one of the target's.
			add(fmt.Sprintf("%s target %d (%s)", fam.name, i+1, tg.name), byte(i+1)<<4,
				e.frame(t, vipPacket(fam, layers.IPProtocolTCP)))
		}
		flow := func(prefix string) fuzzFlow {
			for _, ff := range fz.flows[famNum] {
				if strings.HasPrefix(ff.svc.Name, prefix) {
					return ff
				}
			}
			t.Fatalf("fuzz seeds: no %s flow of %s", prefix, fam.name)
			return fuzzFlow{}
		}
		nat := flow("snat-tcp")
		p := clientPacket(nat.f, false, true)
		p.TTL = 1
		add(fam.name+" SNAT packet with TTL 1", 0, e.frame(t, p))
		p = replyPacket(nat.be, nat.snat, lb.TCP, false, false)
		p.TTL = 1
		add(fam.name+" SNAT reply with TTL 1", 0, e.frame(t, p))
		udp := e.frame(t, vipPacket(fam, layers.IPProtocolUDP))
		add(fam.name+" UDP length 4 short of the payload", 0, patch(t, udp, func(b []byte, l pkttest.Layout) {
			put16(b, l.L4+4, uint16(l.L3Len-(l.L4-l.L3)-4))
		}))
		dsr := flow("ipip-tcp")
		kind := errKinds(fam)[0]
		icmp := e.icmpErr(t, routerOf(fam), dsr.f.Dst, kind, quoteOf(t, replyPkt(dsr.f, netip.AddrPortFrom(dsr.f.Dst, dsr.f.DstPort)), kind))
		il := pkttest.MustLayout(t, icmp)
		badSum := bytes.Clone(icmp)
		badSum[il.L4+2] ^= 0x01
		add(fam.name+" ICMP error with a wrong checksum", 0, badSum)
		short := kind
		short.quoteWhole = false
		quote := quoteOf(t, replyPkt(dsr.f, netip.AddrPortFrom(dsr.f.Dst, dsr.f.DstPort)), short)
		add(fam.name+" ICMP error quoting no ports", 0, e.icmpErr(t, routerOf(fam), dsr.f.Dst, kind, quote[:len(quote)-8]))
		opt := flow("opt-tcp")
		p = packet(opt.f, true, false, nil)
		if fam.vip.Is4() {
			for range 40 {
				p.IPv4Options = append(p.IPv4Options, layers.IPv4Option{OptionType: 1})
			}
		} else {
			p.IPv6Ext = []pkttest.Ext{{Type: layers.IPProtocolIPv6HopByHop, Body: tlvs()}}
		}
		add(fam.name+" opt SYN without room for the option", 0, e.frame(t, p))
		ttl0 := e.frame(t, packet(flow("opt-udp").f, false, false, []byte("ttl 0")))
		add(fam.name+" opt datagram with TTL 0", 0, patch(t, ttl0, func(b []byte, l pkttest.Layout) {
			if l.Family == 4 {
				b[l.L3+8] = 0
			} else {
				b[l.L3+7] = 0
			}
		}))
		rangedFlow := flowTo(lb.Frontend{Addr: fam.vip, Port: 86, Proto: lb.TCP}, fam.client, fuzzClientPort)
		add(fam.name+" ICMP error about a flow whose backend has no neighbour entry", 0, e.icmpErr(t, routerOf(fam), fam.vip, kind,
			quoteOf(t, replyPkt(rangedFlow, netip.AddrPortFrom(fam.vip, 86)), kind)))
		martian := netip.MustParseAddr("127.0.0.1")
		if fam.vip.Is6() {
			martian = netip.MustParseAddr("ff02::1")
		}
		add(fam.name+" SYN from a martian source", 0, e.frame(t, packet(flowTo(dsr.svc.Frontend, martian, fuzzNewPort), true, false, nil)))
		add(fam.name+" SYN from outside the source range", 0, e.frame(t, packet(flowTo(lb.Frontend{Addr: fam.vip, Port: 86, Proto: lb.TCP}, fam.client.Next(), fuzzNewPort), true, false, nil)))

		// Too big for lb0's MTU once encapsulated: answered with ICMP.
		big := packet(flow("geneve-tcp").f, false, true, make([]byte, 1440))
		big.DF = true
		add(fam.name+" too big for geneve", 0, e.frame(t, big))
		// The fix-up bits on a packet broken in its lengths and sums.
		broken := e.frame(t, vipPacket(fam, layers.IPProtocolUDP))
		broken = append(broken, 0xaa, 0xbb)
		l := pkttest.MustLayout(t, broken)
		broken[l.L4+6] ^= 0xff
		add(fam.name+" lengths and sums fixed", selLengths|selSums, broken)

		for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			good := e.frame(t, vipPacket(fam, proto))
			prefix := fmt.Sprintf("%s %s ", fam.name, proto)
			for _, c := range append(l3Cases(t, e, fam, proto, good), l4Cases(t, proto, good)...) {
				add(prefix+c.name, 0, c.frame)
			}
			for _, n := range []int{14, 20, 34, 54, len(good) - 1} {
				add(fmt.Sprintf("%scut to %d bytes", prefix, n), 0, good[:n])
			}
			vlan := vipPacket(fam, proto)
			vlan.VLAN = 100
			add(prefix+"802.1Q tag", 0, e.frame(t, vlan))
			other := vipPacket(fam, proto)
			other.Dst = netip.AddrPortFrom(fam.vip, 9999)
			add(prefix+"to a port without a frontend", 0, e.frame(t, other))
		}
		echo := vipPacket(fam, fam.icmp)
		add(fam.name+" ICMP echo to the VIP", 0, e.frame(t, echo))
	}
	const hbh, dst, rt = layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Routing
	for name, frame := range map[string][]byte{
		"IPv4 record route":                     e.v4opts(t, 7, 7, 4, 0, 0, 0, 0, 1),
		"IPv4 record route full":                e.v4opts(t, 7, 7, 8, 1, 2, 3, 4, 1),
		"IPv4 record route claiming 40":         e.v4opts(t, 7, 0x28, 0, 0),
		"IPv4 timestamp":                        e.v4opts(t, 0x44, 8, 5, 0, 0, 0, 0, 0),
		"IPv4 timestamp full":                   e.v4opts(t, 0x44, 8, 9, 0x10, 0, 0, 0, 0),
		"IPv4 router alert and security":        e.v4opts(t, 0x94, 4, 0, 0, 0x82, 3, 0, 1),
		"IPv4 loose source route":               e.v4opts(t, 0x83, 7, 4, 10, 0, 0, 1, 1),
		"IPv4 end of options":                   e.v4opts(t, 1, 0, 0xff, 0xff),
		"IPv6 hop-by-hop router alert, dstopts": e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(5, 2, 0, 0)}, pkttest.Ext{Type: dst, Body: tlvs(0x1e, 2, 0, 0)}),
		"IPv6 hop-by-hop after dstopts":         e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs()}, pkttest.Ext{Type: hbh, Body: tlvs()}),
		"IPv6 dstopt to discard":                e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs(0x9f, 2, 0, 0)}),
		"IPv6 dstopts of Pad1s":                 e.v6ext(t, pkttest.Ext{Type: dst, Body: []byte{0, 0, 0, 0, 0, 0}}),
		"IPv6 routing header, none left":        e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{0, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)}),
		"IPv6 routing header, one left":         e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{0, 1, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)}),
		"IPv6 eight dstopts":                    e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs(0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0)}),
		"ARP":                                   pkttest.BuildARP(t, pkttest.ClientMAC, client4, lbAddr4),
		// Borderline cases of the kernel's rules (pkttest.CheckStrict).
		"IPv4 timestamp full, overflow 15":          e.v4opts(t, 0x44, 8, 9, 0xf0, 0, 0, 0, 0),
		"IPv4 timestamp flags 3, full, overflow 15": e.v4opts(t, 0x44, 12, 13, 0xf3, 0, 0, 0, 0, 0, 0, 0, 0),
		"IPv6 dstopts PadN with a non-zero byte":    e.v6ext(t, pkttest.Ext{Type: dst, Body: []byte{1, 4, 0, 0, 0, 1}}),
		"IPv6 dstopts of 14 Pad1s":                  e.v6ext(t, pkttest.Ext{Type: dst, Body: make([]byte, 14)}),
		"IPv6 nine dstopts":                         e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs(0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0)}),
		"IPv6 hop-by-hop router alert of length 4":  e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(5, 4, 0, 0, 0, 0)}),
		"IPv6 hop-by-hop CALIPSO of length 2":       e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(7, 2, 0, 0)}),
		"IPv6 hop-by-hop IOAM misaligned":           e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(0x31, 2, 0, 0)}),
		"IPv6 segment routing header, none left":    e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{4, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)}),
		"IPv6 RPL routing header, none left":        e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{3, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)}),
		"IPv6 AH":                                   e.v6ext(t, pkttest.Ext{Type: 51, Body: []byte{0, 0, 0, 0, 0, 1}}),
		"IPv6 atomic fragment":                      e.v6ext(t, pkttest.Ext{Type: layers.IPProtocolIPv6Fragment, Body: []byte{0, 0, 0, 0, 0, 7}}),
	} {
		add(name, 0, frame)
	}
	slices.SortFunc(out, func(a, b fuzzSeed) int { return strings.Compare(a.name, b.name) })
	return out
}

// awaitingFix is the rule s is listed under in fuzzSeedsAwaitingFix, or "".
func (s fuzzSeed) awaitingFix() string {
	return fuzzSeedsAwaitingFix[strings.TrimSuffix(s.name, " (tc)")]
}

// fuzzSeedsAwaitingFix are seeds the datapath fails today, kept out of the
// corpus (so that `make test` passes) until the C is fixed, each with the
// rule it breaks. FuzzDatapath checks that each still fails by that rule:
// delete an entry with its fix, and the seed runs like the others.
var fuzzSeedsAwaitingFix = map[string]string{}

// FuzzDatapath: see the top of this file.
func FuzzDatapath(f *testing.F) {
	fz := newFuzzEnv(f)
	fz.seedNames = map[string]string{}
	// The seeds awaiting a fix are held to every rule, tolerated or not.
	tolerate := fz.tolerate
	fz.tolerate = map[string]bool{}
	for _, s := range fz.seeds(f) {
		if rule := s.awaitingFix(); rule != "" {
			r := fz.try(f, s.sel, s.frame)
			if r.ran && !slices.ContainsFunc(r.problems, func(p string) bool { return strings.HasSuffix(p, "[rule "+rule+"]") }) {
				f.Errorf("seed %q no longer fails by rule %s (problems: %q): delete its entry in fuzzSeedsAwaitingFix", s.name, rule, r.problems)
			}
			continue
		}
		f.Add(s.sel, s.frame)
		fz.seedNames[string(append([]byte{s.sel}, s.frame...))] = s.name
	}
	fz.tolerate = tolerate
	f.Fuzz(func(t *testing.T, sel byte, frame []byte) {
		if len(frame) < 14 || len(frame) > fuzzMaxFrame {
			return
		}
		fz.one(t, sel, frame)
		if fz.execs++; fz.execs%fuzzRefreshEvery == 0 {
			fz.establish(t, false)
		}
	})
}

// one runs one input and checks it.
func (fz *fuzzEnv) one(t *testing.T, sel byte, frame []byte) {
	r := fz.try(t, sel, frame)
	if len(r.problems) == 0 {
		return
	}
	var b strings.Builder
	for _, p := range r.problems {
		fmt.Fprintf(&b, "  - %s\n", p)
	}
	if name, ok := fz.seedNames[string(append([]byte{sel}, frame...))]; ok {
		t.Logf("seed %q", name)
	}
	t.Errorf("%s, selector %#02x: verdict %s, reasons moved %v:\n%sinput  %x\n       %s\noutput %x\n       %s",
		r.k, sel, r.k.verdictName(r.verdict), r.moved, b.String(), r.in, layerSummary(r.in), r.out, layerSummary(r.out))
}

// fuzzRun is one input's run: the frame run (after the selector's
// fix-ups), the hook, what it returned, the reasons that moved, and what
// the oracle found wrong. ran is false for a frame the hook cannot be run on.
type fuzzRun struct {
	result
	ran      bool
	k        hook
	in       []byte
	moved    map[string]uint64
	problems []string
}

// try runs one input and checks it.
func (fz *fuzzEnv) try(t testing.TB, sel byte, frame []byte) fuzzRun {
	e := fz.e
	r := fuzzRun{in: fz.prepare(sel, frame), k: hookXDP}
	if sel&selTC != 0 {
		r.k = hookTC
		if !tcRunnable(r.in) {
			return r
		}
	}
	before := e.reasons(t)
	r.result = e.runOn(t, r.k, bytes.Clone(r.in))
	after := e.reasons(t)
	r.ran = true
	r.moved = map[string]uint64{}
	for name, n := range after {
		if d := n - before[name]; d != 0 && name != "event_ct_insert_failed" {
			r.moved[name] = d
		}
	}
	r.problems = fz.check(r.k, r.in, r.result, r.moved)
	return r
}

// tcRunnable says whether BPF_PROG_TEST_RUN takes frame for a tc program:
// it refuses an IPv4 or IPv6 ethertype without room for the IP header
// behind it (measured on Linux 6.18; XDP takes any frame of 14 bytes on).
func tcRunnable(frame []byte) bool {
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		return len(frame) >= 14+20
	case 0x86dd:
		return len(frame) >= 14+40
	}
	return true
}

// prepare applies the selector's fix-ups to a copy of frame. They are
// best-effort: a frame too broken to locate a header in is left alone
// there.
func (fz *fuzzEnv) prepare(sel byte, frame []byte) []byte {
	b := bytes.Clone(frame)
	if sel&selMAC != 0 {
		copy(b[0:6], fz.e.lbMAC)
	}
	l, err := pkttest.LayoutOf(b)
	if err != nil {
		return b
	}
	tcpudp := l.Proto == layers.IPProtocolTCP || l.Proto == layers.IPProtocolUDP
	if i := int(sel>>4) - 1; i >= 0 && i < len(fz.targets[l.Family]) {
		tg := fz.targets[l.Family][i]
		ip := b[l.L3:]
		if l.Family == 4 && len(ip) >= 20 {
			copy(ip[16:20], tg.dst.Addr().AsSlice())
			if tg.setSrc {
				copy(ip[12:16], tg.src.Addr().AsSlice())
			}
		} else if l.Family == 6 && len(ip) >= 40 {
			copy(ip[24:40], tg.dst.Addr().AsSlice())
			if tg.setSrc {
				copy(ip[8:24], tg.src.Addr().AsSlice())
			}
		}
		if tcpudp && l.L4+4 <= len(b) {
			binary.BigEndian.PutUint16(b[l.L4+2:], tg.dst.Port())
			if tg.setSrc {
				binary.BigEndian.PutUint16(b[l.L4:], tg.src.Port())
			}
		}
	}
	if sel&selLengths != 0 {
		n := len(b) - l.L3
		if l.Family == 4 && n >= 20 && n <= 0xffff {
			put16(b, l.L3+2, uint16(n))
		} else if l.Family == 6 && n >= 40 && n-40 <= 0xffff {
			put16(b, l.L3+4, uint16(n-40))
		}
		if l.Proto == layers.IPProtocolUDP && l.L4+6 <= len(b) {
			put16(b, l.L4+4, uint16(len(b)-l.L4))
		}
		if l, err = pkttest.LayoutOf(b); err != nil {
			return b
		}
	}
	if sel&selSums != 0 {
		if l.Family == 4 && l.L3+20 <= len(b) {
			pkttest.FixIPv4Checksum(b, l)
		}
		switch {
		case tcpudp:
			if c, err := pkttest.L4Checksum(b); err == nil {
				at := l.L4 + 16
				if l.Proto == layers.IPProtocolUDP {
					at = l.L4 + 6
				}
				put16(b, at, c)
			}
		case l.Proto == layers.IPProtocolICMPv4 || l.Proto == layers.IPProtocolICMPv6:
			if c, err := pkttest.ICMPChecksum(b); err == nil {
				put16(b, l.L4+2, c)
			}
		}
	}
	return b
}

// Reasons a forwarded packet may count (besides none), and the pass
// reasons of packets the stack forwards after the LB rewrote them. An ICMP
// error relayed that way counts icmp_error_forwarded (icmp_error in lb.c
// counts every error it sends on, whichever way it leaves).
var (
	fuzzForwardReasons = map[string]bool{"icmp_error_forwarded": true, "icmp_frag_needed_sent": true}
	fuzzStackForwarded = map[string]bool{"pass_no_neigh": true, "pass_no_tx_port": true, "icmp_error_forwarded": true}
)

// check holds one run to the oracle and returns what is wrong with it.
func (fz *fuzzEnv) check(k hook, in []byte, r result, moved map[string]uint64) []string {
	// Every input, forwarded or not, so that the engine's coverage sees
	// its structure through the checker's branches.
	inS, inErr := pkttest.CheckStrict(in, pkttest.StrictMode{})
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var names []string
	for name, n := range moved {
		names = append(names, name)
		if n != 1 {
			fail("reason %s counted %d times for one packet", name, n)
		}
	}
	slices.Sort(names)
	reason := ""
	if len(names) == 1 {
		reason = names[0]
	}
	forwarded, passed := false, false
	switch {
	case k == hookXDP && (r.verdict == xdpTX || r.verdict == xdpRedirect), k == hookTC && r.verdict == tcActRedirect:
		forwarded = true
	case r.verdict == k.pass():
		passed = true
	case r.verdict == k.drop():
	default:
		fail("verdict %s is not one the datapath returns", k.verdictName(r.verdict))
		return problems
	}

	switch {
	case forwarded && len(names) > 1, forwarded && len(names) == 1 && !fuzzForwardReasons[reason]:
		fail("forwarded, and reasons %v counted (want none, or one of icmp_error_forwarded, icmp_frag_needed_sent)", names)
	case !forwarded && len(names) != 1:
		fail("not forwarded, and %d reason counters moved (%v), want exactly one", len(names), names)
	}
	class, kind := "dropped", ""
	switch {
	case forwarded || passed && fuzzStackForwarded[reason]:
		var more []string
		kind, more = fz.checkForwarded(in, inS, inErr, r.out, reason)
		problems = append(problems, more...)
		// The stack forwards what it is handed with the MACs it
		// arrived with; what leaves directly has the next hop's.
		if forwarded && fz.lbMAC != nil && len(r.out) >= 14 {
			if !bytes.Equal(r.out[6:12], fz.lbMAC) {
				fail("sent from MAC %x, not lb0's %x", r.out[6:12], fz.lbMAC)
			}
			if !fz.neighMACs[string(r.out[0:6])] {
				fail("sent to MAC %x, no neighbour's", r.out[0:6])
			}
		}
	case passed:
		out := r.out
		if k == hookTC && len(out) > len(in) {
			out = out[:len(in)]
		}
		if !bytes.Equal(out, in) {
			fail("passed (%s), but changed", reason)
		}
		if len(r.out) != len(in) {
			kind = fmt.Sprintf("(%d bytes longer)", len(r.out)-len(in))
		}
	}
	if forwarded {
		class = "forwarded"
	} else if passed {
		class = "passed"
	}
	fz.exits[strings.TrimSpace(fmt.Sprintf("%s %s %s %s", k, class, reason, kind))]++
	fuzzFeedback(k, forwarded, passed, reason, kind, fz.reasonNames)
	return problems
}

// checkForwarded checks a frame the LB sent (out) for in, and returns what
// kind of frame it is (ipip, geneve, rewritten) with the problems.
func (fz *fuzzEnv) checkForwarded(in []byte, inS *pkttest.Strict, inErr error, out []byte, reason string) (kind string, problems []string) {
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	// A finding of a rule (a StrictError's, or one of the fuzzer's own)
	// that L4LB_FUZZ_TOLERATE names is counted instead.
	finding := func(rule, format string, args ...any) {
		if fz.tolerate[rule] {
			fz.tolerated[rule]++
			return
		}
		fail(format+" [rule %s]", append(args, rule)...)
	}
	strict := func(what string, err error) { finding(pkttest.StrictRule(err), "%s: %v", what, err) }
	if inErr != nil {
		strict("forwarded a frame a receiver refuses", inErr)
	} else {
		// ip_rcv_core / ip_forward: only frames to the box's MAC are
		// routed (tc: PACKET_HOST; XDP: lb0's MAC, the one learnt).
		if fz.lbMAC != nil && !bytes.Equal(in[0:6], fz.lbMAC) {
			finding("not-for-host", "forwarded a frame to MAC %x, not lb0's %x", in[0:6], fz.lbMAC)
		}
		// fib_validate_source: the box's own address as a source.
		if src := ipSource(in, inS); fz.local[string(src)] {
			finding("local-source", "forwarded a packet from the box's own address %x", src)
		}
		if inS.VLANs > 0 {
			fail("forwarded a frame with %d VLAN tags", inS.VLANs)
		}
		if inS.Proto != uint8(lb.TCP) && inS.Proto != uint8(lb.UDP) && !inS.ICMPError {
			fail("forwarded a protocol %d packet that is not an ICMP error", inS.Proto)
		}
		if ips := gopacketIPs(in); ips == 0 {
			fail("forwarded a frame in which gopacket finds no IP header")
		}
	}
	outS, err := pkttest.CheckStrict(out, pkttest.StrictMode{Decap: true, NoTrailing: true})
	if err != nil {
		strict("sent a malformed frame", err)
		return kind, problems
	}
	kind = "rewritten"
	switch {
	case outS.Geneve:
		kind = "geneve"
	case outS.Inner != nil:
		kind = "ipip"
	case outS.ICMPError:
		kind = "icmp"
	}
	// RFC 791 / 8200: a packet whose TTL or hop limit is 0 is not
	// forwarded; a router between the LB and the backend drops it.
	if outS.TTL == 0 {
		finding("ttl-zero", "sent a packet with TTL / hop limit 0")
	}
	want := 1
	if outS.Inner != nil {
		want = 2
	}
	if ips := gopacketIPs(out); ips < want {
		fail("gopacket decodes %d IP headers in the output, want %d", ips, want)
	}
	if inS == nil {
		return kind, problems
	}
	inIP := in[inS.L3 : inS.L3+inS.IPLen]
	switch {
	case reason == "icmp_frag_needed_sent":
		// An answer to the client, quoting the start of its packet.
		quote := out[outS.L4+8 : outS.L3+outS.IPLen]
		switch {
		case !outS.ICMPError:
			fail("answered a packet too big with something that is not an ICMP error")
		case !quotes(quote, inIP, inS):
			fail("the answer to a packet too big quotes something else:\n got %x\nwant a prefix of %x", quote, inIP)
		case !bytes.Equal(ipSource(in, inS), ipDestination(out, outS)):
			fail("the answer to a packet too big goes to %x, not to its source %x", ipDestination(out, outS), ipSource(in, inS))
		case !unicastDest(ipDestination(out, outS)):
			// RFC 4443 2.4(e), RFC 1812 4.3.2.7.
			finding("icmp-to-non-unicast", "sent an ICMP answer to %x, not a unicast address", ipDestination(out, outS))
		}
	case outS.Inner != nil:
		inner := outS.Inner
		if got := out[inner.L3 : inner.L3+inner.IPLen]; !bytes.Equal(got, inIP) {
			fail("encapsulated packet differs from the input's IP packet:\n got %x\nwant %x", got, inIP)
		}
	default:
		if outS.Proto != inS.Proto || outS.Family != inS.Family {
			fail("rewritten packet is IPv%d protocol %d, the input IPv%d protocol %d", outS.Family, outS.Proto, inS.Family, inS.Proto)
			break
		}
		if inS.ICMPError {
			break
		}
		gotPay, wantPay := out[outS.L4+outS.L4HLen:outS.L3+outS.IPLen], in[inS.L4+inS.L4HLen:inS.L3+inS.IPLen]
		if !bytes.Equal(gotPay, wantPay) {
			fail("rewritten packet's payload differs:\n got %x\nwant %x", gotPay, wantPay)
		}
		if inS.L4SumOK && !outS.L4SumOK {
			fail("the input's L4 checksum was right, the rewritten packet's is wrong")
		}
	}
	return kind, problems
}

// quotes says whether quote is the start of ip (the packet s describes) but
// for the quoted TCP/UDP checksum, which the LB's answer sets to a value a
// checksum completion leaves alone (icmp.h: "Checksum completion").
func quotes(quote, ip []byte, s *pkttest.Strict) bool {
	if len(quote) > len(ip) {
		return false
	}
	field := s.L4 - s.L3 + 16
	if s.Proto == uint8(lb.UDP) {
		field = s.L4 - s.L3 + 6
	}
	want := bytes.Clone(ip[:len(quote)])
	got := bytes.Clone(quote)
	if field+2 <= len(quote) {
		copy(want[field:], []byte{0, 0})
		copy(got[field:], []byte{0, 0})
	}
	return bytes.Equal(got, want)
}

// ipSource and ipDestination are the addresses of the packet s describes.
func ipSource(frame []byte, s *pkttest.Strict) []byte {
	if s.Family == 4 {
		return frame[s.L3+12 : s.L3+16]
	}
	return frame[s.L3+8 : s.L3+24]
}

func ipDestination(frame []byte, s *pkttest.Strict) []byte {
	if s.Family == 4 {
		return frame[s.L3+16 : s.L3+20]
	}
	return frame[s.L3+24 : s.L3+40]
}

// unicastDest says whether an ICMP message may be sent to addr (4 or 16
// bytes): not the unspecified address, multicast or broadcast (0/8 and
// 240/4 with them for IPv4, which no host owns).
func unicastDest(addr []byte) bool {
	a, ok := netip.AddrFromSlice(addr)
	if !ok {
		return false
	}
	if a.Is4() {
		return a.As4()[0] != 0 && a.As4()[0] < 224
	}
	return !a.IsUnspecified() && !a.IsMulticast()
}

// layerSummary names the layers gopacket decodes in frame, for failure
// messages.
func layerSummary(frame []byte) string {
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	var names []string
	for _, l := range pkt.Layers() {
		names = append(names, l.LayerType().String())
	}
	if el := pkt.ErrorLayer(); el != nil {
		names = append(names, fmt.Sprintf("(%v)", el.Error()))
	}
	return strings.Join(names, " / ")
}

// gopacketIPs counts the IP headers gopacket decodes in frame.
func gopacketIPs(frame []byte) int {
	n := 0
	for _, l := range gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default).Layers() {
		switch l.(type) {
		case *layers.IPv4, *layers.IPv6:
			n++
		}
	}
	return n
}

// fuzzFeedback turns what the datapath did with an input into Go coverage,
// the only coverage the fuzzing engine sees (the BPF program is not
// instrumented): each reason, each (hook, verdict class) and each kind of
// output has a switch case of its own, so an input that makes the datapath take a new exit is
// kept as interesting even when the Go code it ran is not new.
func fuzzFeedback(k hook, forwarded, passed bool, reason, kind string, names []string) {
	switch kind {
	case "ipip":
		fuzzFeedbackHits[46]++
	case "geneve":
		fuzzFeedbackHits[47]++
	case "rewritten":
		fuzzFeedbackHits[48]++
	case "icmp":
		fuzzFeedbackHits[49]++
	}
	class := int(k) * 3
	if forwarded {
		class++
	} else if passed {
		class += 2
	}
	switch class {
	case 0:
		fuzzFeedbackHits[40]++
	case 1:
		fuzzFeedbackHits[41]++
	case 2:
		fuzzFeedbackHits[42]++
	case 3:
		fuzzFeedbackHits[43]++
	case 4:
		fuzzFeedbackHits[44]++
	case 5:
		fuzzFeedbackHits[45]++
	}
	// 0: no reason; past the cases: a reason added since.
	switch slices.Index(names, reason) + 1 {
	case 0:
		fuzzFeedbackHits[0]++
	case 1:
		fuzzFeedbackHits[1]++
	case 2:
		fuzzFeedbackHits[2]++
	case 3:
		fuzzFeedbackHits[3]++
	case 4:
		fuzzFeedbackHits[4]++
	case 5:
		fuzzFeedbackHits[5]++
	case 6:
		fuzzFeedbackHits[6]++
	case 7:
		fuzzFeedbackHits[7]++
	case 8:
		fuzzFeedbackHits[8]++
	case 9:
		fuzzFeedbackHits[9]++
	case 10:
		fuzzFeedbackHits[10]++
	case 11:
		fuzzFeedbackHits[11]++
	case 12:
		fuzzFeedbackHits[12]++
	case 13:
		fuzzFeedbackHits[13]++
	case 14:
		fuzzFeedbackHits[14]++
	case 15:
		fuzzFeedbackHits[15]++
	case 16:
		fuzzFeedbackHits[16]++
	case 17:
		fuzzFeedbackHits[17]++
	case 18:
		fuzzFeedbackHits[18]++
	case 19:
		fuzzFeedbackHits[19]++
	case 20:
		fuzzFeedbackHits[20]++
	case 21:
		fuzzFeedbackHits[21]++
	case 22:
		fuzzFeedbackHits[22]++
	case 23:
		fuzzFeedbackHits[23]++
	case 24:
		fuzzFeedbackHits[24]++
	case 25:
		fuzzFeedbackHits[25]++
	case 26:
		fuzzFeedbackHits[26]++
	case 27:
		fuzzFeedbackHits[27]++
	case 28:
		fuzzFeedbackHits[28]++
	case 29:
		fuzzFeedbackHits[29]++
	case 30:
		fuzzFeedbackHits[30]++
	case 31:
		fuzzFeedbackHits[31]++
	case 32:
		fuzzFeedbackHits[32]++
	case 33:
		fuzzFeedbackHits[33]++
	case 34:
		fuzzFeedbackHits[34]++
	case 35:
		fuzzFeedbackHits[35]++
	case 36:
		fuzzFeedbackHits[36]++
	case 37:
		fuzzFeedbackHits[37]++
	case 38:
		fuzzFeedbackHits[38]++
	case 39:
		fuzzFeedbackHits[39]++
	default:
		fuzzFeedbackHits[39]++
	}
}

var fuzzFeedbackHits [50]int

// TestFuzzOracle feeds the fuzzer's checks runs made up in Go, so that it is
// known to fail for each kind of wrong result, and to pass a right one.
func TestFuzzOracle(t *testing.T) {
	in := pkttest.Build(t, pkttest.Packet{Src: netip.AddrPortFrom(client4, 40000), Dst: netip.AddrPortFrom(vip4, 80), ACK: true, Payload: []byte("some data for the backend")})
	ip := pkttest.IPPacket(t, in)
	tunnel := func(inner []byte) []byte {
		return pkttest.BuildTunnel(t, pkttest.Tunnel{Src: netip.MustParseAddr("100.64.0.1"), Dst: backends4[0], Inner: inner})
	}
	// A SNAT-like rewrite: new destination, checksums made right again,
	// or (broken) left as they were.
	rewrite := func(fix bool) []byte {
		b := bytes.Clone(in)
		l := pkttest.MustLayout(t, b)
		copy(b[l.L3+16:l.L3+20], backends4[0].AsSlice())
		put16(b, l.L4+2, 8080)
		pkttest.FixIPv4Checksum(b, l)
		if fix {
			c, err := pkttest.L4Checksum(b)
			if err != nil {
				t.Fatal(err)
			}
			put16(b, l.L4+16, c)
		}
		return b
	}
	// Frames that are not the box's to forward.
	otherHost := bytes.Clone(in)
	copy(otherHost[0:6], []byte{0x02, 0, 0, 0, 0, 0x99})
	broadcast := bytes.Clone(in)
	copy(broadcast[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	fromLocal := pkttest.Build(t, pkttest.Packet{Src: netip.AddrPortFrom(lbAddr4, 40000), Dst: netip.AddrPortFrom(vip4, 80), ACK: true, Payload: []byte("x")})
	// A packet too big and the LB's answer to src, quoting it.
	bigFrom := func(src netip.Addr) []byte {
		return pkttest.Build(t, pkttest.Packet{Src: netip.AddrPortFrom(src, 40000), Dst: netip.AddrPortFrom(vip4, 80), ACK: true, DF: true, Payload: make([]byte, 1400)})
	}
	big := bigFrom(client4)
	answer := func(to netip.Addr) []byte {
		q := pkttest.IPPacket(t, bigFrom(to))[:548]
		return pkttest.BuildICMPError(t, pkttest.ICMPError{SrcMAC: pkttest.LBMAC, DstMAC: routerMAC, Src: vip4, Dst: to,
			Type: pkttest.ICMPv4DestUnreachable, Code: pkttest.ICMPv4FragNeeded, Info: 1380, TOS: 0xc0, DF: true, Quote: q})
	}
	badInner := bytes.Clone(ip)
	badInner[len(badInner)-1] ^= 0xff
	badOuter := tunnel(ip)
	badOuter[14+10] ^= 1
	type oracleCase struct {
		name  string
		k     hook
		in    []byte
		r     result
		moved map[string]uint64
		ok    bool
	}
	// run checks each case with an oracle from env.
	run := func(cases []oracleCase, env func() *fuzzEnv) {
		for _, tt := range cases {
			t.Run(tt.name, func(t *testing.T) {
				problems := env().check(tt.k, tt.in, tt.r, tt.moved)
				if got := len(problems) == 0; got != tt.ok {
					t.Errorf("problems %q, want ok %v", problems, tt.ok)
				}
			})
		}
	}
	run([]oracleCase{
		{"encapsulated", hookXDP, in, result{xdpTX, tunnel(ip)}, nil, true},
		{"encapsulated at tc", hookTC, in, result{tcActRedirect, tunnel(ip)}, nil, true},
		{"rewritten", hookXDP, in, result{xdpTX, rewrite(true)}, nil, true},
		{"passed untouched", hookXDP, in, result{xdpPass, bytes.Clone(in)}, map[string]uint64{"pass_not_service": 1}, true},
		{"dropped", hookXDP, in, result{xdpDrop, nil}, map[string]uint64{"drop_no_backend": 1}, true},
		{"aborted", hookXDP, in, result{xdpAborted, nil}, map[string]uint64{"drop_no_backend": 1}, false},
		{"a verdict tc does not use", hookTC, in, result{xdpTX, tunnel(ip)}, nil, false},
		{"forwarded a malformed packet", hookXDP, pkttest.SetIHL(t, in, 4), result{xdpTX, tunnel(ip)}, nil, false},
		{"sent a bad outer checksum", hookXDP, in, result{xdpTX, badOuter}, nil, false},
		{"sent trailing bytes", hookXDP, in, result{xdpTX, append(tunnel(ip), 0)}, nil, false},
		{"encapsulated something else", hookXDP, in, result{xdpTX, tunnel(badInner)}, nil, false},
		{"rewrite broke the L4 checksum", hookXDP, in, result{xdpTX, rewrite(false)}, nil, false},
		{"forwarded and counted a pass reason", hookXDP, in, result{xdpTX, tunnel(ip)}, map[string]uint64{"pass_not_service": 1}, false},
		{"passed changed", hookXDP, in, result{xdpPass, tunnel(ip)}, map[string]uint64{"pass_not_service": 1}, false},
		{"passed without a reason", hookXDP, in, result{xdpPass, bytes.Clone(in)}, nil, false},
		{"dropped with two reasons", hookXDP, in, result{xdpDrop, nil}, map[string]uint64{"drop_no_backend": 1, "drop_no_route": 1}, false},
		{"a reason counted twice", hookXDP, in, result{xdpDrop, nil}, map[string]uint64{"drop_no_backend": 2}, false},
		{"handed to the stack malformed", hookXDP, in, result{xdpPass, badOuter}, map[string]uint64{"pass_no_neigh": 1}, false},
	}, func() *fuzzEnv {
		return &fuzzEnv{tolerate: map[string]bool{}, tolerated: map[string]int{}, exits: map[string]int{},
			reasonNames: []string{"pass_not_service", "pass_no_neigh", "drop_no_backend", "drop_no_route"}}
	})

	// The rules of what is the box's to forward, with lb0's MAC and
	// address known to the oracle (as newFuzzEnv sets them).
	run([]oracleCase{
		{"encapsulated a frame to lb0's MAC", hookXDP, in, result{xdpTX, tunnel(ip)}, nil, true},
		{"forwarded a frame to another host's MAC", hookXDP, otherHost, result{xdpTX, tunnel(ip)}, nil, false},
		{"forwarded a broadcast frame", hookTC, broadcast, result{tcActRedirect, tunnel(ip)}, nil, false},
		{"forwarded a packet from a local address", hookXDP, fromLocal, result{xdpTX, tunnel(pkttest.IPPacket(t, fromLocal))}, nil, false},
		{"answered a packet too big", hookXDP, big, result{xdpTX, answer(client4)}, map[string]uint64{"icmp_frag_needed_sent": 1}, true},
		{"answered a packet too big from a class E source", hookXDP, bigFrom(netip.MustParseAddr("240.0.0.1")),
			result{xdpTX, answer(netip.MustParseAddr("240.0.0.1"))}, map[string]uint64{"icmp_frag_needed_sent": 1}, false},
	}, func() *fuzzEnv {
		return &fuzzEnv{tolerate: map[string]bool{}, tolerated: map[string]int{}, exits: map[string]int{},
			reasonNames: []string{"icmp_frag_needed_sent"},
			lbMAC:       pkttest.LBMAC, neighMACs: map[string]bool{string(routerMAC): true, string(pkttest.ClientMAC): true},
			local: map[string]bool{string(lbAddr4.AsSlice()): true}}
	})

	// A tolerated rule is counted, not reported.
	fz := &fuzzEnv{tolerate: map[string]bool{"ipv4-header": true}, tolerated: map[string]int{}, exits: map[string]int{}}
	if problems := fz.check(hookXDP, pkttest.SetIHL(t, in, 4), result{xdpTX, tunnel(ip)}, nil); len(problems) != 0 || fz.tolerated["ipv4-header"] != 1 {
		t.Errorf("tolerated rule: problems %q, counted %v", problems, fz.tolerated)
	}
}

// TestFuzzPrepare checks the selector's fix-ups: a target's addresses and
// ports written in, and a frame whose lengths and checksums are broken made
// whole again.
func TestFuzzPrepare(t *testing.T) {
	mac := []byte{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	target := fuzzTarget{name: "t", src: netip.AddrPortFrom(client6, 1234), dst: netip.AddrPortFrom(vip6, 83), setSrc: true}
	fz := &fuzzEnv{e: &env{lbMAC: mac}, targets: map[int][]fuzzTarget{6: {target}}}
	in := pkttest.Build(t, pkttest.Packet{Src: netip.MustParseAddrPort("[2001:db8:9::1]:5"), Dst: netip.MustParseAddrPort("[2001:db8::99]:9"), Proto: layers.IPProtocolUDP, Payload: []byte("data")})
	broken := append(bytes.Clone(in), 1, 2, 3)
	l := pkttest.MustLayout(t, broken)
	put16(broken, l.L4+4, 3)
	broken[l.L4+6] ^= 0x55

	out := fz.prepare(1<<4|selMAC|selLengths|selSums, broken)
	s, err := pkttest.CheckStrict(out, pkttest.StrictMode{NoTrailing: true})
	if err != nil {
		t.Fatalf("fixed-up frame: %v", err)
	}
	if !s.L4SumOK {
		t.Error("fixed-up frame: UDP checksum wrong")
	}
	if f := flowOf(t, out); f.Src != target.src.Addr() || f.SrcPort != target.src.Port() || f.Dst != target.dst.Addr() || f.DstPort != target.dst.Port() {
		t.Errorf("fixed-up frame carries %v, want %s -> %s", f, target.src, target.dst)
	}
	if !bytes.Equal(out[0:6], mac) {
		t.Errorf("Ethernet destination %x, want %x", out[0:6], mac)
	}
	if got := fz.prepare(0, broken); !bytes.Equal(got, broken) {
		t.Error("selector 0 changed the frame")
	}
	if _, err := pkttest.CheckStrict(fz.prepare(0, broken), pkttest.StrictMode{}); err == nil {
		t.Error("the broken frame passes the checker: the test proves nothing")
	}
	// A frame too short to locate anything in is left as it is.
	if got := fz.prepare(0xff&^selMAC, in[:20]); !bytes.Equal(got, in[:20]) {
		t.Error("a 20-byte frame was changed")
	}
}
