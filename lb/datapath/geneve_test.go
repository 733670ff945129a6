// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// geneveOverhead is what DSR over Geneve adds to a packet: outer IP, UDP (8)
// and the Geneve header with the l4lb option (32).
func geneveOverhead(v4 bool) int {
	if v4 {
		return 20 + 8 + 32
	}
	return 40 + 8 + 32
}

// checkGeneve checks, field by field, that out is in's IP packet (without
// Ethernet padding, byte for byte) behind the outer IP, UDP and Geneve
// headers the LB builds for a flow to fe, and returns the outer
// destination: the backend.
func checkGeneve(t testing.TB, in, out []byte, fe lb.Frontend) netip.Addr {
	t.Helper()
	return checkGeneveHash(t, in, out, fe, maglev.FlowHash(testSeed, flowOf(t, in)))
}

// checkGeneveHash is checkGeneve for a packet that belongs to a flow with
// hash, such as an ICMP error about the flow.
func checkGeneveHash(t testing.TB, in, out []byte, fe lb.Frontend, hash uint64) netip.Addr {
	t.Helper()
	inner := pkttest.IPPacket(t, in)
	v4 := pkttest.MustLayout(t, in).Family == 4
	ipLen, etype, over := 40, uint16(0x86dd), geneveOverhead(v4)
	if v4 {
		ipLen, etype = 20, 0x0800
	}
	if len(out) != 14+over+len(inner) {
		t.Fatalf("output frame is %d bytes, want 14 + %d + %d (Ethernet, outer headers, inner packet without padding):\n%s",
			len(out), over, len(inner), pkttest.Decode(out).Dump())
	}
	if got := binary.BigEndian.Uint16(out[12:]); got != etype {
		t.Errorf("ethertype %#04x, want %#04x", got, etype)
	}

	o := out[14 : 14+ipLen]
	var backend netip.Addr
	if v4 {
		checkFields(t, "outer IPv4", []fieldCheck{
			{"version", int(o[0] >> 4), 4},
			{"IHL", int(o[0] & 0x0f), 5},
			{"TOS", int(o[1]), int(inner[1])},
			{"total length", int(binary.BigEndian.Uint16(o[2:])), len(inner) + over},
			{"identification", int(binary.BigEndian.Uint16(o[4:])), int(binary.BigEndian.Uint16(inner[4:]))},
			{"flags and fragment offset (DF copied, nothing else)", int(binary.BigEndian.Uint16(o[6:])), int(binary.BigEndian.Uint16(inner[6:]) & 0x4000)},
			{"TTL", int(o[8]), 64},
			{"protocol", int(o[9]), 17},
		})
		if !pkttest.IPv4ChecksumValid(o) {
			t.Errorf("outer IPv4 header checksum %#04x, want %#04x", binary.BigEndian.Uint16(o[10:]), pkttest.IPv4Checksum(o))
		}
		src := netip.AddrFrom4([4]byte(o[12:16]))
		if !datapath.DefaultEncapSource4.Contains(src) {
			t.Errorf("outer source %s is outside %s", src, datapath.DefaultEncapSource4)
		}
		if got, want := binary.BigEndian.Uint16(o[14:16]), uint16(hash); got != want {
			t.Errorf("outer source %s: host bits %#04x, want the flow hash's low 16 bits %#04x", src, got, want)
		}
		backend = netip.AddrFrom4([4]byte(o[16:20]))
	} else {
		tc := o[0]<<4 | o[1]>>4
		label := uint32(o[1]&0x0f)<<16 | uint32(o[2])<<8 | uint32(o[3])
		checkFields(t, "outer IPv6", []fieldCheck{
			{"version", int(o[0] >> 4), 6},
			{"traffic class", int(tc), int(inner[0]<<4 | inner[1]>>4)},
			{"flow label", int(label), int(hash & 0xfffff)},
			{"payload length", int(binary.BigEndian.Uint16(o[4:])), len(inner) + 8 + 32},
			{"next header", int(o[6]), 17},
			{"hop limit", int(o[7]), 64},
		})
		src := netip.AddrFrom16([16]byte(o[8:24]))
		if !datapath.DefaultEncapSource6.Contains(src) {
			t.Errorf("outer source %s is outside %s", src, datapath.DefaultEncapSource6)
		}
		if got, want := binary.BigEndian.Uint32(o[20:24]), uint32(hash); got != want {
			t.Errorf("outer source %s: low 32 bits %#08x, want the flow hash's %#08x", src, got, want)
		}
		backend = netip.AddrFrom16([16]byte(o[24:40]))
	}

	u := out[14+ipLen : 14+ipLen+8]
	checkFields(t, "outer UDP", []fieldCheck{
		// 49152-65535, from bits 16-29 of the flow hash.
		{"source port", int(binary.BigEndian.Uint16(u[0:])), 49152 + int(hash>>16&0x3fff)},
		{"destination port", int(binary.BigEndian.Uint16(u[2:])), 6081},
		{"length", int(binary.BigEndian.Uint16(u[4:])), 8 + 32 + len(inner)},
		{"checksum (none)", int(binary.BigEndian.Uint16(u[6:])), 0},
	})

	g := out[14+ipLen+8 : 14+over]
	vip := fe.Addr.As16()
	checkFields(t, "Geneve", []fieldCheck{
		{"version", int(g[0] >> 6), 0},
		{"options length (4-byte words)", int(g[0] & 0x3f), 6},
		{"O and C flags", int(g[1] & 0xc0), 0},
		{"reserved bits", int(g[1] & 0x3f), 0},
		{"protocol type", int(binary.BigEndian.Uint16(g[2:])), int(etype)},
		{"VNI", int(binary.BigEndian.Uint32(g[4:]) >> 8), 0},
		{"reserved byte", int(g[7]), 0},
		{"option class", int(binary.BigEndian.Uint16(g[8:])), 0xff4c},
		{"option type", int(g[10]), 0x01},
		{"option reserved bits", int(g[11] >> 5), 0},
		{"option length (4-byte words)", int(g[11] & 0x1f), 5},
		{"option port", int(binary.BigEndian.Uint16(g[28:])), int(fe.Port)},
		{"option reserved bytes", int(binary.BigEndian.Uint16(g[30:])), 0},
	})
	if !bytes.Equal(g[12:28], vip[:]) {
		t.Errorf("option VIP %x, want %x (%s as 16 bytes)", g[12:28], vip, fe.Addr)
	}
	// The same bytes as the independent builder the companion tests use.
	if want := pkttest.GeneveHeader(netip.AddrPortFrom(fe.Addr, fe.Port)); !bytes.Equal(g, want) {
		t.Errorf("Geneve header %x, want %x", g, want)
	}
	if got := out[14+over:]; !bytes.Equal(got, inner) {
		t.Errorf("inner packet differs from the client's:\n got %x\nwant %x", got, inner)
	}
	return backend
}

// TestDSRGeneve runs the matrix {hook} x {family} x {TCP SYN, TCP ACK, UDP}
// through DSR over Geneve and checks every outer field and the inner packet.
func TestDSRGeneve(t *testing.T) {
	e := newEnv(t)
	svcs := dispatchServices(lb.DispatchGeneve, 0, 0)
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			for i, kind := range pktKinds {
				t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, kind.name), func(t *testing.T) {
					svc := serviceOf(t, svcs, fam, kind.proto)
					f := flowTo(svc.Frontend, fam.client, uint16(42000+i))
					in := e.frame(t, kindPacket(f, kind))
					before := e.reasons(t)

					r := e.runOn(t, k, in)
					if r.verdict != k.tx() {
						t.Fatalf("verdict %s, want %s:\n%s", k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
					}
					be := checkGeneve(t, in, r.out, svc.Frontend)
					if want := mustPick(t, svc, f); be != want {
						t.Errorf("sent to backend %s, want %s (table[FlowHash %% %d] in Go)", be, want, testTableSize)
					}
					e.checkMACs(t, r.out, be)
					e.expectReasons(t, before, nil)
				})
			}
		}
	}
}

// TestDSRGenevePadding checks that Ethernet padding after a minimum-size
// IPv4 frame stays out of the tunnel, at both hooks.
func TestDSRGenevePadding(t *testing.T) {
	e := newEnv(t)
	svcs := dispatchServices(lb.DispatchGeneve, 0, 0)
	e.reconcile(t, svcs...)
	svc := serviceOf(t, svcs, families[0], lb.TCP)
	for _, k := range hooks {
		in := e.frame(t, packet(flowTo(svc.Frontend, client4, 42100), true, false, nil))
		if len(in) != 60 || len(pkttest.IPPacket(t, in)) != 40 {
			t.Fatalf("IPv4 SYN: %d-byte frame, want a 40-byte packet padded to 60", len(in))
		}
		for i := 54; i < 60; i++ {
			in[i] = 0xee
		}
		r := e.runOn(t, k, in)
		if r.verdict != k.tx() {
			t.Fatalf("%s: verdict %s, want %s", k, k.verdictName(r.verdict), k.verdictName(k.tx()))
		}
		checkGeneve(t, in, r.out, svc.Frontend)
	}
}

// TestDSRGeneveMTU checks the MTU each family needs for Geneve: a packet
// that fits the egress MTU once encapsulated leaves, one byte more is
// dropped as drop_frag_needed, at both hooks.
func TestDSRGeneveMTU(t *testing.T) {
	const mtu = 1400
	e := newEnv(t)
	if err := e.ns.Netlink().LinkSetMTU(e.ns.Link(t, "lb0"), mtu); err != nil {
		t.Fatalf("set lb0's MTU to %d: %v", mtu, err)
	}
	svcs := dispatchServices(lb.DispatchGeneve, 0, 0)
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			for _, kind := range pktKinds {
				over := geneveOverhead(fam.vip.Is4())
				svc := serviceOf(t, svcs, fam, kind.proto)
				for _, extra := range []int{0, 1, over} {
					l3 := mtu - over + extra
					name := fmt.Sprintf("%s/%s/%s/%d-byte packet", k, fam.name, kind.name, l3)
					f := flowTo(svc.Frontend, fam.client, 42200)
					hdrs := len(pkttest.IPPacket(t, e.frame(t, kindPacket(f, kind)))) - len("payload for the backend")
					p := kindPacket(f, kind)
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
							checkGeneve(t, in, r.out, svc.Frontend)
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

// TestGeneveThroughCompanion feeds what the LB sends to the backend
// companion: it must come out as the client's packet, byte for byte, behind
// the Ethernet header it arrived with.
func TestGeneveThroughCompanion(t *testing.T) {
	e := newEnv(t)
	c := newCompanion(t)
	svcs := dispatchServices(lb.DispatchGeneve, 0, 0)
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			for i, kind := range pktKinds {
				t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, kind.name), func(t *testing.T) {
					svc := serviceOf(t, svcs, fam, kind.proto)
					in := e.frame(t, kindPacket(flowTo(svc.Frontend, fam.client, uint16(42300+i)), kind))
					r := e.runOn(t, k, in)
					if r.verdict != k.tx() {
						t.Fatalf("LB verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
					}
					before := c.counters(t)
					got := c.run(t, bytes.Clone(r.out))
					if got.verdict != tcxNext {
						t.Errorf("companion verdict %d, want TCX_NEXT", int32(got.verdict))
					}
					want := append(bytes.Clone(r.out[:14]), pkttest.IPPacket(t, in)...)
					if !bytes.Equal(got.out, want) {
						t.Errorf("decapsulated frame:\n got %x\nwant %x", got.out, want)
					}
					c.expectCounters(t, before, map[string]uint64{"decap_geneve": 1})
				})
			}
		}
	}
}
