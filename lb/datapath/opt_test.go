// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
)

// Backend ports of the opt tests: opt rewrites the destination port, so
// they differ from the service ports (NodePort-style).
const (
	optTCPBackendPort = 30080
	optUDPBackendPort = 30053
)

// optLen is what the opt dispatch inserts into p: the IPv4 option (8) or
// the IPv6 destination-options header (24) on a TCP SYN or a UDP datagram.
func optLen(p pkttest.Packet) int {
	if p.Proto != layers.IPProtocolUDP && !(p.SYN && !p.ACK) {
		return 0
	}
	if p.Src.Addr().Is4() {
		return 8
	}
	return 24
}

// optWant is the frame the LB must send for client packet p to backend
// be:port, built independently by gopacket (checksums computed from
// scratch): p with the destination replaced and, on a SYN or datagram, the
// l4lb option placed first.
func (e *env) optWant(t testing.TB, p pkttest.Packet, be netip.AddrPort) []byte {
	t.Helper()
	fe := p.Dst
	p.Dst = be
	p.SrcMAC, p.DstMAC = e.lbMAC, backendMAC(be.Addr())
	if optLen(p) > 0 {
		if fe.Addr().Is4() {
			p.IPv4Options = append([]layers.IPv4Option{pkttest.IPv4Opt(fe)}, p.IPv4Options...)
		} else {
			p.IPv6Ext = append([]pkttest.Ext{pkttest.IPv6DstOpt(fe)}, p.IPv6Ext...)
		}
	}
	return pkttest.Build(t, p)
}

// checkOpt checks what the LB sent for p (frame in) to backend be: the
// rewritten headers field by field, the option bytes, both checksums by
// recomputing them, and every byte against optWant. It returns nothing: the
// caller picked be from the table.
func (e *env) checkOpt(t testing.TB, p pkttest.Packet, in, out []byte, be netip.AddrPort) {
	t.Helper()
	grow := optLen(p)
	orig := pkttest.IPPacket(t, in)
	// Exactly the IP packet after the Ethernet header: padding the input
	// carried is not forwarded (validate.h).
	if want := len(in) - len(pkttest.ExtraBytes(t, in)) + grow; len(out) != want {
		t.Fatalf("output frame is %d bytes, want %d (the input without its padding, + %d):\n%s", len(out), want, grow, pkttest.Decode(out).Dump())
	}
	l := pkttest.MustLayout(t, out)
	ip := out[l.L3 : l.L3+l.L3Len]
	if len(ip) != len(orig)+grow {
		t.Fatalf("IP packet is %d bytes, want %d + %d", len(ip), len(orig), grow)
	}
	fe := p.Dst
	if l.Family == 4 {
		checkFields(t, "IPv4", []fieldCheck{
			{"IHL", int(ip[0] & 0x0f), int(orig[0]&0x0f) + grow/4},
			{"total length", int(binary.BigEndian.Uint16(ip[2:])), len(orig) + grow},
			{"TTL (the LB is no hop)", int(ip[8]), int(orig[8])},
		})
		if got := netip.AddrFrom4([4]byte(ip[12:16])); got != p.Src.Addr() {
			t.Errorf("source %s, want the client's %s", got, p.Src.Addr())
		}
		if got := netip.AddrFrom4([4]byte(ip[16:20])); got != be.Addr() {
			t.Errorf("destination %s, want backend %s", got, be.Addr())
		}
		if grow > 0 {
			vip := fe.Addr().As4()
			want := []byte{0x9e, 8, byte(fe.Port() >> 8), byte(fe.Port()), vip[0], vip[1], vip[2], vip[3]}
			if !bytes.Equal(ip[20:28], want) {
				t.Errorf("IPv4 option %x, want %x (type 0x9e, length 8, port, VIP) right after the base header", ip[20:28], want)
			}
		}
		if !pkttest.IPv4ChecksumValid(ip) {
			t.Errorf("IPv4 header checksum %#04x, recomputed %#04x", binary.BigEndian.Uint16(ip[10:]), pkttest.IPv4Checksum(ip[:l.L4-l.L3]))
		}
	} else {
		checkFields(t, "IPv6", []fieldCheck{
			{"payload length", int(binary.BigEndian.Uint16(ip[4:])), len(orig) - 40 + grow},
			{"hop limit (the LB is no hop)", int(ip[7]), int(orig[7])},
			{"flow label", int(binary.BigEndian.Uint32(ip[0:]) & 0xfffff), int(binary.BigEndian.Uint32(orig[0:]) & 0xfffff)},
		})
		if got := netip.AddrFrom16([16]byte(ip[8:24])); got != p.Src.Addr() {
			t.Errorf("source %s, want the client's %s", got, p.Src.Addr())
		}
		if got := netip.AddrFrom16([16]byte(ip[24:40])); got != be.Addr() {
			t.Errorf("destination %s, want backend %s", got, be.Addr())
		}
		if grow > 0 {
			vip := fe.Addr().As16()
			want := append([]byte{orig[6], 2, 1, 0, 0x1e, 18, byte(fe.Port() >> 8), byte(fe.Port())}, vip[:]...)
			if ip[6] != 60 {
				t.Errorf("next header %d, want 60 (destination options)", ip[6])
			}
			if !bytes.Equal(ip[40:64], want) {
				t.Errorf("destination options %x, want %x (next header, length 2, PadN, type 0x1e, length 18, port, VIP)", ip[40:64], want)
			}
		} else if ip[6] != orig[6] {
			t.Errorf("next header %d, want %d unchanged", ip[6], orig[6])
		}
	}
	if got := binary.BigEndian.Uint16(out[l.L4+2:]); got != be.Port() {
		t.Errorf("destination port %d, want backend port %d", got, be.Port())
	}
	if got := binary.BigEndian.Uint16(out[l.L4:]); got != p.Src.Port() {
		t.Errorf("source port %d, want the client's %d", got, p.Src.Port())
	}
	if ok, carried, computed, err := pkttest.L4ChecksumValid(out); err != nil || !ok {
		t.Errorf("%s checksum %#04x, recomputed %#04x (err %v)", l.Proto, carried, computed, err)
	}
	want := e.optWant(t, p, be)
	if wantIP := pkttest.IPPacket(t, want); !bytes.Equal(ip, wantIP) {
		t.Errorf("IP packet differs from the one built independently:\n got %x\nwant %x", ip, wantIP)
	}
	if !bytes.Equal(out[l.L3+l.L3Len:], in[len(in)-(len(out)-l.L3-l.L3Len):]) {
		t.Errorf("bytes after the IP packet (Ethernet padding) changed")
	}
	e.checkMACs(t, out, be.Addr())
}

// TestDSROpt runs the matrix {hook} x {family} x {TCP SYN, TCP ACK, UDP}
// through the opt dispatch to backends on other ports than the service's.
func TestDSROpt(t *testing.T) {
	e := newEnv(t)
	svcs := dispatchServices(lb.DispatchOpt, optTCPBackendPort, optUDPBackendPort)
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			for i, kind := range pktKinds {
				t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, kind.name), func(t *testing.T) {
					svc := serviceOf(t, svcs, fam, kind.proto)
					f := flowTo(svc.Frontend, fam.client, uint16(43000+i))
					p := kindPacket(f, kind)
					in := e.frame(t, p)
					before := e.reasons(t)

					r := e.runOn(t, k, in)
					if r.verdict != k.tx() {
						t.Fatalf("verdict %s, want %s:\n%s", k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
					}
					be := mustPick(t, svc, f)
					e.checkOpt(t, p, in, r.out, netip.AddrPortFrom(be, backendPort(t, svc, be)))
					e.expectReasons(t, before, nil)
				})
			}
		}
	}
}

// TestDSROptPadding checks a minimum-size IPv4 frame: the IP packet grows
// by the option, and the Ethernet padding after it is not forwarded (what
// leaves is exactly what its IP header says).
func TestDSROptPadding(t *testing.T) {
	e := newEnv(t)
	svcs := dispatchServices(lb.DispatchOpt, optTCPBackendPort, optUDPBackendPort)
	e.reconcile(t, svcs...)
	svc := serviceOf(t, svcs, families[0], lb.TCP)
	for _, k := range hooks {
		f := flowTo(svc.Frontend, client4, 43100)
		p := packet(f, true, false, nil)
		in := e.frame(t, p)
		if len(in) != 60 || len(pkttest.IPPacket(t, in)) != 40 {
			t.Fatalf("IPv4 SYN: %d-byte frame, want a 40-byte packet padded to 60", len(in))
		}
		r := e.runOn(t, k, in)
		if r.verdict != k.tx() {
			t.Fatalf("%s: verdict %s, want %s", k, k.verdictName(r.verdict), k.verdictName(k.tx()))
		}
		be := mustPick(t, svc, f)
		e.checkOpt(t, p, in, r.out, netip.AddrPortFrom(be, optTCPBackendPort))
	}
}

// TestDSROptRoom covers packets that already carry IP options or IPv6
// extension headers: the l4lb option goes first and theirs follow, unless
// there is no room (IHL would exceed 15) or a hop-by-hop header must stay
// first; those SYNs are dropped and counted. Segments after the SYN get no
// option, so they pass whatever their headers.
func TestDSROptRoom(t *testing.T) {
	e := newEnv(t)
	svcs := dispatchServices(lb.DispatchOpt, optTCPBackendPort, optUDPBackendPort)
	e.reconcile(t, svcs...)
	type roomCase struct {
		name   string
		fam    family
		syn    bool
		v4opts int // IHL - 5 of the client's packet, in NOPs after a router alert
		ext    []pkttest.Ext
		noRoom bool
	}
	var tests []roomCase
	for ihl := 6; ihl <= 15; ihl++ {
		tests = append(tests,
			roomCase{name: fmt.Sprintf("ipv4/SYN with IHL %d", ihl), fam: families[0], syn: true, v4opts: ihl - 5, noRoom: ihl > 13},
			roomCase{name: fmt.Sprintf("ipv4/ACK with IHL %d", ihl), fam: families[0], v4opts: ihl - 5})
	}
	hbh := []pkttest.Ext{{Type: layers.IPProtocolIPv6HopByHop, Body: pkttest.PadN(0)}}
	dst := []pkttest.Ext{{Type: layers.IPProtocolIPv6Destination, Body: pkttest.PadN(1)}}
	tests = append(tests,
		roomCase{name: "ipv6/SYN after a hop-by-hop header", fam: families[1], syn: true, ext: hbh, noRoom: true},
		roomCase{name: "ipv6/ACK after a hop-by-hop header", fam: families[1], ext: hbh},
		roomCase{name: "ipv6/SYN with destination options", fam: families[1], syn: true, ext: dst},
	)
	for _, k := range hooks {
		for i, tt := range tests {
			t.Run(k.String()+"/"+tt.name, func(t *testing.T) {
				svc := serviceOf(t, svcs, tt.fam, lb.TCP)
				f := flowTo(svc.Frontend, tt.fam.client, uint16(43200+i))
				p := packet(f, tt.syn, !tt.syn, []byte("data"))
				if tt.v4opts > 0 {
					p.IPv4Options = []layers.IPv4Option{{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}}
					for range (tt.v4opts - 1) * 4 {
						p.IPv4Options = append(p.IPv4Options, layers.IPv4Option{OptionType: 1})
					}
				}
				p.IPv6Ext = tt.ext
				in := e.frame(t, p)
				if l := pkttest.MustLayout(t, in); l.Family == 4 && int(in[l.L3]&0x0f) != 5+tt.v4opts {
					t.Fatalf("built IHL %d, want %d", in[l.L3]&0x0f, 5+tt.v4opts)
				}
				before := e.reasons(t)
				r := e.runOn(t, k, in)
				if tt.noRoom {
					if r.verdict != k.drop() {
						t.Errorf("verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.drop()))
					}
					e.expectReasons(t, before, map[string]uint64{"drop_opt_no_room": 1})
					return
				}
				if r.verdict != k.tx() {
					t.Fatalf("verdict %s, want %s:\n%s", k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
				}
				be := mustPick(t, svc, f)
				e.checkOpt(t, p, in, r.out, netip.AddrPortFrom(be, optTCPBackendPort))
				e.expectReasons(t, before, nil)
			})
		}
	}
}

// TestDSROptMTU checks the MTU the opt dispatch needs: the option's bytes on
// a SYN or datagram, nothing on other TCP segments.
func TestDSROptMTU(t *testing.T) {
	const mtu = 1400
	e := newEnv(t)
	if err := e.ns.Netlink().LinkSetMTU(e.ns.Link(t, "lb0"), mtu); err != nil {
		t.Fatalf("set lb0's MTU to %d: %v", mtu, err)
	}
	svcs := dispatchServices(lb.DispatchOpt, optTCPBackendPort, optUDPBackendPort)
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			for _, kind := range pktKinds {
				svc := serviceOf(t, svcs, fam, kind.proto)
				f := flowTo(svc.Frontend, fam.client, 43300)
				grow := optLen(kindPacket(f, kind))
				for _, extra := range []int{0, 1} {
					l3 := mtu - grow + extra
					if grow == 0 && extra > 0 {
						continue // larger than the MTU on arrival: not the LB's to judge
					}
					name := fmt.Sprintf("%s/%s/%s/%d-byte packet", k, fam.name, kind.name, l3)
					p := kindPacket(f, kind)
					hdrs := len(pkttest.IPPacket(t, e.frame(t, p))) - len(p.Payload)
					p.Payload = make([]byte, l3-hdrs)
					in := e.frame(t, p)
					if got := len(pkttest.IPPacket(t, in)); got != l3 {
						t.Fatalf("%s: built a %d-byte IP packet", name, got)
					}
					before := e.reasons(t)
					r := e.runOn(t, k, in)
					want := map[string]uint64{}
					if extra == 0 {
						if r.verdict != k.tx() {
							t.Errorf("%s, MTU %d: verdict %s, want %s", name, mtu, k.verdictName(r.verdict), k.verdictName(k.tx()))
						} else {
							be := mustPick(t, svc, f)
							e.checkOpt(t, p, in, r.out, netip.AddrPortFrom(be, backendPort(t, svc, be)))
						}
					} else {
						if r.verdict != k.drop() {
							t.Errorf("%s, MTU %d: verdict %s, want %s", name, mtu, k.verdictName(r.verdict), k.verdictName(k.drop()))
						}
						want["drop_frag_needed"] = 1
					}
					e.expectReasons(t, before, want)
				}
			}
		}
	}
}

// TestOptThroughCompanion sends what the LB makes of a client's SYN or
// datagram to the backend companion, which records the flow, then a reply
// from the backend's socket through the companion's egress: it must leave
// from the VIP and the service port, checksums right.
func TestOptThroughCompanion(t *testing.T) {
	e := newEnv(t)
	c := newCompanion(t)
	svcs := dispatchServices(lb.DispatchOpt, optTCPBackendPort, optUDPBackendPort)
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			for i, kind := range pktKinds {
				t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, kind.name), func(t *testing.T) {
					svc := serviceOf(t, svcs, fam, kind.proto)
					// Ports of their own per hook: the companion keeps
					// what an earlier subtest recorded.
					f := flowTo(svc.Frontend, fam.client, uint16(43400+10*int(k)+i))
					p := kindPacket(f, kind)
					r := e.runOn(t, k, e.frame(t, p))
					if r.verdict != k.tx() {
						t.Fatalf("LB verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
					}
					be := mustPick(t, svc, f)
					bePort := backendPort(t, svc, be)

					before := c.counters(t)
					got := c.run(t, bytes.Clone(r.out))
					if got.verdict != tcxNext || !bytes.Equal(got.out, r.out) {
						t.Errorf("companion ingress: verdict %d, frame changed %v; want TCX_NEXT and the frame as it came",
							int32(got.verdict), !bytes.Equal(got.out, r.out))
					}
					reply := pkttest.Packet{
						Src: netip.AddrPortFrom(be, bePort), Dst: p.Src, Proto: p.Proto,
						SYN: kind.syn, ACK: kind.proto == lb.TCP, Payload: []byte("reply"),
					}
					if optLen(p) == 0 {
						// No option on a segment after the SYN: nothing
						// recorded, and the reply is not this test's.
						c.expectCounters(t, before, map[string]uint64{"pass_other": 1})
						c.expectFlow(t, p.Src, bePort, kind.proto, netip.AddrPort{})
						return
					}
					c.expectCounters(t, before, map[string]uint64{"opt_record": 1})
					c.expectFlow(t, p.Src, bePort, kind.proto, p.Dst)

					before = c.counters(t)
					out := c.runEgress(t, pkttest.Build(t, reply))
					if out.verdict != tcxNext {
						t.Errorf("companion egress verdict %d, want TCX_NEXT", int32(out.verdict))
					}
					reply.Src = p.Dst
					checkReply(t, out.out, pkttest.Build(t, reply))
					c.expectCounters(t, before, map[string]uint64{"opt_reply": 1})
				})
			}
		}
	}
}
