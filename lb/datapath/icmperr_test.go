// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// routerOf is a router on the client's side of the LB that reports errors
// about the replies it forwards.
func routerOf(fam family) netip.Addr {
	if fam.vip.Is4() {
		return netip.MustParseAddr("203.0.113.1")
	}
	return netip.MustParseAddr("2001:db8:ffff::1")
}

// errKind is an ICMP error a router sends about a reply.
type errKind struct {
	name       string
	typ, code  uint8
	info       uint32
	quoteWhole bool // quote the whole reply, not only its IP header and ports
}

// errKinds returns, per family, an MTU error quoting the whole reply and a
// time-exceeded quoting only the IP header and 8 bytes (RFC 792's least).
func errKinds(fam family) []errKind {
	if fam.vip.Is4() {
		return []errKind{
			{"frag-needed", pkttest.ICMPv4DestUnreachable, pkttest.ICMPv4FragNeeded, 1300, true},
			{"time-exceeded", pkttest.ICMPv4TimeExceeded, 0, 0, false},
		}
	}
	return []errKind{
		{"packet-too-big", pkttest.ICMPv6PacketTooBig, 0, 1300, true},
		{"time-exceeded", pkttest.ICMPv6TimeExceeded, 0, 0, false},
	}
}

// replyPkt is a reply of flow f sent from src (VIP:port for DSR, or what
// the backend's socket sent) to the client.
func replyPkt(f maglev.Flow, src netip.AddrPort) pkttest.Packet {
	return pkttest.Packet{
		Src: src, Dst: netip.AddrPortFrom(f.Src, f.SrcPort),
		Proto: layers.IPProtocol(f.Proto), ACK: f.Proto == uint8(lb.TCP),
		Payload: []byte("a reply that did not make it"),
		TTL:     52, TOS: 0x10, ID: 0x3131, DF: true, FlowLabel: 0x54321,
	}
}

// quoteOf is the start of p's IP packet an error of kind quotes.
func quoteOf(t testing.TB, p pkttest.Packet, kind errKind) []byte {
	t.Helper()
	ip := pkttest.IPPacket(t, pkttest.Build(t, p))
	if kind.quoteWhole {
		return ip
	}
	n := 20 + 8
	if p.Src.Addr().Is6() {
		n = 40 + 8
	}
	return ip[:n]
}

// icmpErr is an error of kind from src to dst quoting quote, as it reaches lb0.
func (e *env) icmpErr(t testing.TB, src, dst netip.Addr, kind errKind, quote []byte) []byte {
	t.Helper()
	return pkttest.BuildICMPError(t, pkttest.ICMPError{
		SrcMAC: routerMAC, DstMAC: e.lbMAC, Src: src, Dst: dst,
		Type: kind.typ, Code: kind.code, Info: kind.info, Quote: quote,
	})
}

// sendICMPToFlow sends hook k an error of kind about the reply of flow f of
// DSR service svc, checks that it reaches a backend as the dispatch says,
// and returns that backend.
func (e *env) sendICMPToFlow(t testing.TB, k hook, svc lb.Service, f maglev.Flow, kind errKind) netip.Addr {
	t.Helper()
	fam := familyOf(f.Dst)
	vip := netip.AddrPortFrom(f.Dst, f.DstPort)
	in := e.icmpErr(t, routerOf(fam), f.Dst, kind, quoteOf(t, replyPkt(f, vip), kind))
	before := e.reasons(t)
	r := e.runOn(t, k, in)
	if r.verdict != k.tx() {
		t.Fatalf("ICMP error about %v: verdict %s, want %s; output:\n%s", f, k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	e.expectReasons(t, before, map[string]uint64{"icmp_error_forwarded": 1})
	hash := maglev.FlowHash(testSeed, f)
	var be netip.Addr
	switch withDefaults(svc).Dispatch {
	case lb.DispatchGeneve:
		be = checkGeneveHash(t, in, r.out, svc.Frontend, hash)
	case lb.DispatchOpt:
		l := pkttest.MustLayout(t, r.out)
		if l.Family == 4 {
			be = netip.AddrFrom4([4]byte(r.out[l.L3+16 : l.L3+20]))
		} else {
			be = netip.AddrFrom16([16]byte(r.out[l.L3+24 : l.L3+40]))
		}
		port := backendPort(t, svc, be)
		want := pkttest.BuildICMPError(t, pkttest.ICMPError{
			SrcMAC: e.lbMAC, DstMAC: backendMAC(be), Src: routerOf(fam), Dst: be,
			Type: kind.typ, Code: kind.code, Info: kind.info,
			// What the backend's socket sent, before its companion put
			// the VIP:port on it.
			Quote: quoteOf(t, replyPkt(f, netip.AddrPortFrom(be, port)), kind),
		})
		if ok, carried, computed, err := pkttest.ICMPChecksumValid(r.out); !ok {
			t.Errorf("ICMP checksum %#04x, recomputed %#04x (err %v)", carried, computed, err)
		}
		expectBytes(t, "ICMP error for the opt backend", r.out, want)
	default:
		be = checkEncapHash(t, in, r.out, hash)
	}
	e.checkMACs(t, r.out, be)
	return be
}

// TestICMPErrorToFlowBackend sends ICMP errors about DSR replies, for every
// hook, family, dispatch, protocol and error kind: each reaches the backend
// the flow's packets reach. Without a connection entry that is the table's
// choice, and the error creates no entry; with one, the entry's backend
// wins even after a table change moved the flow's slot elsewhere.
func TestICMPErrorToFlowBackend(t *testing.T) {
	for _, d := range []lb.Dispatch{lb.DispatchIPIP, lb.DispatchGeneve, lb.DispatchOpt} {
		t.Run(d.String(), func(t *testing.T) {
			e := newEnv(t)
			tcp, udp := dispatchBackendPorts(d)
			svcs := dispatchServices(d, tcp, udp)
			e.reconcile(t, svcs...)
			for _, k := range hooks {
				for _, fam := range families {
					for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
						for _, kind := range errKinds(fam) {
							t.Run(fmt.Sprintf("%s/%s/%s/%s", k, fam.name, proto, kind.name), func(t *testing.T) {
								svc := serviceOf(t, svcs, fam, proto)
								n0 := e.conntrackEntries(t)
								for _, f := range randomFlows(svc.Frontend, 8, uint64(k)<<8|uint64(len(kind.name))) {
									if got, want := e.sendICMPToFlow(t, k, svc, f, kind), mustPick(t, svc, f); got != want {
										t.Errorf("error about %v went to %s, want the table's %s", f, got, want)
									}
								}
								if n := e.conntrackEntries(t); n != n0 {
									t.Errorf("ICMP errors changed the connection table from %d to %d entries, want no change", n0, n)
								}
							})
						}
					}
				}
			}
		})
	}

	// Established flows keep their backend through a table change, and so
	// do the errors about them.
	for _, d := range []lb.Dispatch{lb.DispatchIPIP, lb.DispatchOpt} {
		for _, k := range hooks {
			for _, fam := range families {
				t.Run(fmt.Sprintf("established/%s/%s/%s", d, k, fam.name), func(t *testing.T) {
					e := newEnv(t)
					tcp, udp := dispatchBackendPorts(d)
					svc := serviceOf(t, dispatchServices(d, tcp, udp), fam, lb.UDP)
					svc.Backends = svc.Backends[:2]
					e.reconcile(t, svc)
					flows := randomFlows(svc.Frontend, 64, 7)
					on := map[maglev.Flow]netip.Addr{}
					for _, f := range flows {
						r := e.runOn(t, k, e.frame(t, packet(f, false, true, []byte("data"))))
						if r.verdict != k.tx() {
							t.Fatalf("client packet of %v: verdict %s", f, k.verdictName(r.verdict))
						}
						on[f] = mustPick(t, svc, f)
					}
					grown := svc
					grown.Backends = append(append([]lb.Backend{}, svc.Backends...), lb.Backend{Addr: netip.AddrPortFrom(fam.backends[3], svc.Backends[0].Addr.Port()), Weight: 1})
					e.reconcile(t, grown)
					movedN := 0
					for _, f := range flows {
						if mustPick(t, grown, f) == on[f] {
							continue
						}
						movedN++
						if got := e.sendICMPToFlow(t, k, grown, f, errKinds(fam)[0]); got != on[f] {
							t.Errorf("error about established %v went to %s, want its backend %s (the table now says %s)", f, got, on[f], mustPick(t, grown, f))
						}
					}
					if movedN == 0 {
						t.Fatal("no flow's slot moved to the new backend: the test proves nothing")
					}
				})
			}
		}
	}
}

// TestICMPErrorMalformed sends ICMP packets that must not be forwarded:
// quotes cut short or not of a TCP/UDP first fragment (pass_icmp_quote),
// and ICMP that is not an error about a frontend's flow. Each is passed to
// the stack unchanged.
func TestICMPErrorMalformed(t *testing.T) {
	e := newEnv(t)
	svcs := dispatchServices(lb.DispatchIPIP, 0, 0)
	e.reconcile(t, svcs...)
	for _, fam := range families {
		svc := serviceOf(t, svcs, fam, lb.TCP)
		f := flowTo(svc.Frontend, fam.client, 47000)
		vip := netip.AddrPortFrom(f.Dst, f.DstPort)
		kind := errKinds(fam)[1]
		reply := replyPkt(f, vip)
		whole := pkttest.IPPacket(t, pkttest.Build(t, reply))
		ipLen := 20
		if fam.vip.Is6() {
			ipLen = 40
		}
		patched := func(fn func(p *pkttest.Packet)) []byte {
			p := reply
			fn(&p)
			return pkttest.IPPacket(t, pkttest.Build(t, p))
		}
		type tc struct {
			name   string
			frame  []byte
			reason string
		}
		tests := []tc{
			{"quote cut inside the IP header", e.icmpErr(t, routerOf(fam), f.Dst, kind, whole[:ipLen-8]), "pass_icmp_quote"},
			{"quote without the ports", e.icmpErr(t, routerOf(fam), f.Dst, kind, whole[:ipLen+2]), "pass_icmp_quote"},
			{"quote of 7 bytes past the IP header", e.icmpErr(t, routerOf(fam), f.Dst, kind, whole[:ipLen+7]), "pass_icmp_quote"},
			{"quoted ICMP", e.icmpErr(t, routerOf(fam), f.Dst, kind, patched(func(p *pkttest.Packet) { p.Proto = fam.icmp })), "pass_icmp_quote"},
			{"error about another source", e.icmpErr(t, routerOf(fam), f.Dst, kind,
				patched(func(p *pkttest.Packet) { p.Src = netip.AddrPortFrom(fam.backends[0], vip.Port()) })), "pass_not_service"},
			{"error about a port without a service", e.icmpErr(t, routerOf(fam), f.Dst, kind,
				patched(func(p *pkttest.Packet) { p.Src = netip.AddrPortFrom(vip.Addr(), 81) })), "pass_not_service"},
			{"echo request to the VIP", e.frame(t, pkttest.Packet{Src: netip.AddrPortFrom(fam.client, 0), Dst: vip, Proto: fam.icmp}), "pass_not_service"},
		}
		if fam.vip.Is4() {
			short := whole[:ipLen+8]
			ihl4 := bytes.Clone(short)
			ihl4[0] = 0x44
			tests = append(tests,
				tc{"quoted IHL 4", e.icmpErr(t, routerOf(fam), f.Dst, kind, ihl4), "pass_icmp_quote"},
				tc{"quoted later fragment", e.icmpErr(t, routerOf(fam), f.Dst, kind,
					patched(func(p *pkttest.Packet) { p.FragOffset = 10 })), "pass_icmp_quote"},
				tc{"quoted IPv6", e.icmpErr(t, routerOf(fam), f.Dst, kind, whole6(t)), "pass_icmp_quote"},
			)
		} else {
			tests = append(tests, tc{"quoted extension header", e.icmpErr(t, routerOf(fam), f.Dst, kind,
				patched(func(p *pkttest.Packet) {
					p.IPv6Ext = []pkttest.Ext{{Type: layers.IPProtocolIPv6Destination, Body: pkttest.PadN(0)}}
				})), "pass_icmp_quote"})
		}
		tests = append(tests, tc{"ICMP header cut short", cutICMP(t, e.icmpErr(t, routerOf(fam), f.Dst, kind, nil)), "pass_malformed_l4"})
		for _, tt := range tests {
			for _, k := range hooks {
				t.Run(fmt.Sprintf("%s/%s/%s", fam.name, tt.name, k), func(t *testing.T) {
					before := e.reasons(t)
					r := e.runOn(t, k, tt.frame)
					if r.verdict != k.pass() {
						t.Errorf("verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.pass()))
					}
					if !bytes.Equal(r.out, tt.frame) {
						t.Errorf("frame changed:\n got %x\nwant %x", head(r.out), head(tt.frame))
					}
					e.expectReasons(t, before, map[string]uint64{tt.reason: 1})
				})
			}
		}
	}
}

// whole6 is an IPv6 packet, quoted in an IPv4 error it does not belong in.
func whole6(t testing.TB) []byte {
	t.Helper()
	return pkttest.IPPacket(t, pkttest.Build(t, pkttest.Packet{Src: netip.AddrPortFrom(vip6, 80), Dst: netip.AddrPortFrom(client6, 1)}))[:48]
}

// cutICMP cuts an ICMP message (with nothing quoted) to 4 bytes, with
// consistent IP lengths: the ICMP header itself is cut short.
func cutICMP(t testing.TB, frame []byte) []byte {
	t.Helper()
	l := pkttest.MustLayout(t, frame)
	out := bytes.Clone(frame[:l.L4+4])
	if l.Family == 4 {
		binary.BigEndian.PutUint16(out[l.L3+2:], uint16(len(out)-l.L3))
		pkttest.FixIPv4Checksum(out, l)
	} else {
		binary.BigEndian.PutUint16(out[l.L3+4:], 4)
	}
	return out
}

// TestICMPErrorSNAT covers both directions of a SNAT flow: an error from
// the network about a reply reaches the backend through the binding, and an
// error from the backend side about a forwarded packet reaches the client,
// each with outer and quoted headers translated (checked byte for byte
// against the packets the other side actually sent).
func TestICMPErrorSNAT(t *testing.T) {
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[:3]...)
			e.reconcile(t, svc)
			for i, kind := range errKinds(c.fam) {
				f := flowTo(svc.Frontend, c.fam.client, uint16(48000+i))
				be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
				client := netip.AddrPortFrom(f.Src, f.SrcPort)
				vip := netip.AddrPortFrom(f.Dst, f.DstPort)
				snat := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true))

				// From the network, about the reply VIP:port -> client.
				reply := replyPkt(f, vip)
				in := e.icmpErr(t, routerOf(c.fam), vip.Addr(), kind, quoteOf(t, reply, kind))
				before := e.reasons(t)
				r := e.runOn(t, c.hook, in)
				if r.verdict != c.hook.tx() {
					t.Fatalf("%s about the reply: verdict %s, want %s", kind.name, c.hook.verdictName(r.verdict), c.hook.verdictName(c.hook.tx()))
				}
				e.expectReasons(t, before, map[string]uint64{"icmp_error_forwarded": 1})
				backendSent := reply
				backendSent.Src, backendSent.Dst = be, snat
				expectBytes(t, "error to the backend", r.out, pkttest.BuildICMPError(t, pkttest.ICMPError{
					SrcMAC: e.lbMAC, DstMAC: backendMAC(be.Addr()), Src: snat.Addr(), Dst: be.Addr(), TTL: 63,
					Type: kind.typ, Code: kind.code, Info: kind.info, Quote: quoteOf(t, backendSent, kind),
				}))

				// From the backend side, about the packet the LB sent it.
				sent := clientPacket(f, false, true)
				sent.Src, sent.Dst, sent.TTL = snat, be, sent.TTL-1
				unreach := errKind{name: "port-unreachable", typ: pkttest.ICMPv4DestUnreachable, code: pkttest.ICMPv4PortUnreachable, quoteWhole: kind.quoteWhole}
				if c.fam.vip.Is6() {
					unreach.typ, unreach.code = pkttest.ICMPv6DestUnreachable, 4
				}
				in = pkttest.BuildICMPError(t, pkttest.ICMPError{
					SrcMAC: backendMAC(be.Addr()), DstMAC: e.lbMAC, Src: be.Addr(), Dst: snat.Addr(),
					Type: unreach.typ, Code: unreach.code, Quote: quoteOf(t, sent, unreach),
				})
				before = e.reasons(t)
				r = e.runOn(t, c.hook, in)
				if r.verdict != c.hook.tx() {
					t.Fatalf("error from the backend: verdict %s, want %s", c.hook.verdictName(r.verdict), c.hook.verdictName(c.hook.tx()))
				}
				e.expectReasons(t, before, map[string]uint64{"icmp_error_forwarded": 1})
				clientSent := sent
				clientSent.Src, clientSent.Dst = client, vip
				expectBytes(t, "error to the client", r.out, pkttest.BuildICMPError(t, pkttest.ICMPError{
					SrcMAC: e.lbMAC, DstMAC: routerMAC, Src: vip.Addr(), Dst: client.Addr(), TTL: 63,
					Type: unreach.typ, Code: unreach.code, Quote: quoteOf(t, clientSent, unreach),
				}))
			}

			// An error about a flow without a binding is not ours.
			f := flowTo(svc.Frontend, c.fam.client, 48999)
			in := e.icmpErr(t, routerOf(c.fam), f.Dst, errKinds(c.fam)[0], quoteOf(t, replyPkt(f, netip.AddrPortFrom(f.Dst, f.DstPort)), errKinds(c.fam)[0]))
			before := e.reasons(t)
			if r := e.runOn(t, c.hook, in); r.verdict != c.hook.pass() {
				t.Errorf("error about a flow without a binding: verdict %s, want %s", c.hook.verdictName(r.verdict), c.hook.verdictName(c.hook.pass()))
			}
			e.expectReasons(t, before, map[string]uint64{"pass_not_service": 1})
		})
	}
}

// affinityEntries counts the entries of the affinity table.
func (e *env) affinityEntries(t testing.TB) int {
	t.Helper()
	return mapEntries[bpf.LbAffinityKey, bpf.LbAffinityValue](t, e.lb.Maps()[bpf.LbMapAffinity])
}

// TestICMPErrorThroughCompanion feeds what the LB sends a backend for an
// ICMP error to the backend's companion: ipip and geneve come out as the
// router's ICMP packet, byte for byte, for the stack to match against the
// socket; opt's is the backend's own and left alone.
func TestICMPErrorThroughCompanion(t *testing.T) {
	e := newEnv(t)
	c := newCompanion(t)
	for _, d := range []lb.Dispatch{lb.DispatchIPIP, lb.DispatchGeneve, lb.DispatchOpt} {
		tcp, udp := dispatchBackendPorts(d)
		svcs := dispatchServices(d, tcp, udp)
		e.reconcile(t, svcs...)
		for _, k := range hooks {
			for _, fam := range families {
				t.Run(fmt.Sprintf("%s/%s/%s", d, k, fam.name), func(t *testing.T) {
					svc := serviceOf(t, svcs, fam, lb.UDP)
					f := flowTo(svc.Frontend, fam.client, 49000+uint16(k))
					kind := errKinds(fam)[0]
					in := e.icmpErr(t, routerOf(fam), f.Dst, kind, quoteOf(t, replyPkt(f, netip.AddrPortFrom(f.Dst, f.DstPort)), kind))
					r := e.runOn(t, k, in)
					if r.verdict != k.tx() {
						t.Fatalf("LB verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
					}
					before := c.counters(t)
					got := c.run(t, bytes.Clone(r.out))
					if got.verdict != tcxNext {
						t.Errorf("companion verdict %d, want TCX_NEXT", int32(got.verdict))
					}
					want, counter := append(bytes.Clone(r.out[:14]), pkttest.IPPacket(t, in)...), "decap_ipip"
					switch d {
					case lb.DispatchGeneve:
						counter = "decap_geneve"
					case lb.DispatchOpt:
						want, counter = r.out, "pass_other"
					}
					if !bytes.Equal(got.out, want) {
						t.Errorf("companion output:\n got %x\nwant %x", head(got.out), head(want))
					}
					c.expectCounters(t, before, map[string]uint64{counter: 1})
				})
			}
		}
	}
}
