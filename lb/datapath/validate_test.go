// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
)

// v4opts is a TCP packet to the VIP whose IPv4 options are exactly the
// bytes raw (a multiple of 4), written over NOPs so that no serializer
// second-guesses them; the header checksum is right.
func (e *env) v4opts(t testing.TB, raw ...byte) []byte {
	t.Helper()
	if len(raw)%4 != 0 {
		t.Fatalf("%d option bytes: not a multiple of 4", len(raw))
	}
	p := vipPacket(families[0], layers.IPProtocolTCP)
	for range raw {
		p.IPv4Options = append(p.IPv4Options, layers.IPv4Option{OptionType: 1})
	}
	return patch(t, e.frame(t, p), func(b []byte, l pkttest.Layout) { copy(b[l.L3+20:], raw) })
}

// v6ext is a TCP packet to the VIP carrying ext.
func (e *env) v6ext(t testing.TB, ext ...pkttest.Ext) []byte {
	p := vipPacket(families[1], layers.IPProtocolTCP)
	p.IPv6Ext = ext
	return e.frame(t, p)
}

// tlvs pads IPv6 option TLVs with PadN to a header body (6 + n*8 bytes).
func tlvs(b ...byte) []byte {
	for (len(b)+2)%8 != 0 {
		if (len(b)+2)%8 == 7 {
			b = append(b, 0) // Pad1
			continue
		}
		n := 8 - (len(b)+2)%8
		b = append(b, 1, byte(n-2))
		b = append(b, make([]byte, n-2)...)
	}
	return b
}

// TestValidate sends packets that parse but that the kernel would refuse
// (or that the LB does not forward by choice) to a frontend through both
// hooks: each goes to the stack untouched with its own reason; the valid
// neighbours of each class are forwarded.
func TestValidate(t *testing.T) {
	e := malformedEnv(t)
	const hbh, dst, rt = layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Routing
	good4 := e.frame(t, vipPacket(families[0], layers.IPProtocolTCP))
	tests := []malformedCase{
		// The IPv4 header checksum.
		{name: "IPv4 checksum wrong", reason: "pass_ip_csum", frame: func() []byte {
			b := bytes.Clone(good4)
			b[14+10] ^= 0x40
			return b
		}()},
		{name: "IPv4 checksum wrong, with options", reason: "pass_ip_csum", frame: func() []byte {
			b := e.v4opts(t, 1, 1, 1, 1)
			b[14+10] ^= 0x40
			return b
		}()},
		// IPv4 options.
		{name: "record route claiming 40 bytes in 4", reason: "pass_ip_options", frame: e.v4opts(t, 7, 0x28, 0, 0)},
		{name: "option length 1", reason: "pass_ip_options", frame: e.v4opts(t, 0x82, 1, 1, 1)},
		{name: "option past the header", reason: "pass_ip_options", frame: e.v4opts(t, 1, 1, 0x82, 8, 0, 0, 0, 0)},
		{name: "loose source route", reason: "pass_ip_options", frame: e.v4opts(t, 0x83, 7, 4, 10, 0, 0, 1, 1)},
		{name: "strict source route", reason: "pass_ip_options", frame: e.v4opts(t, 0x89, 7, 4, 10, 0, 0, 1, 1)},
		{name: "CIPSO", reason: "pass_ip_options", frame: e.v4opts(t, 0x86, 6, 0, 0, 0, 1, 1, 1)},
		{name: "record route pointer 3", reason: "pass_ip_options", frame: e.v4opts(t, 7, 7, 3, 0, 0, 0, 0, 1)},
		{name: "record route slot past the option", reason: "pass_ip_options", frame: e.v4opts(t, 7, 6, 4, 0, 0, 0, 1, 1)},
		{name: "record route twice", reason: "pass_ip_options", frame: e.v4opts(t, 7, 7, 4, 0, 0, 0, 0, 7, 7, 4, 0, 0, 0, 0, 1, 1)},
		{name: "timestamp flags 2", reason: "pass_ip_options", frame: e.v4opts(t, 0x44, 8, 5, 2, 0, 0, 0, 0)},
		{name: "timestamp pointer 4", reason: "pass_ip_options", frame: e.v4opts(t, 0x44, 8, 4, 0, 0, 0, 0, 0)},
		{name: "router alert of length 6", reason: "pass_ip_options", frame: e.v4opts(t, 0x94, 6, 0, 0, 0, 0, 1, 1)},
		{name: "record route with a free slot", frame: e.v4opts(t, 7, 7, 4, 0, 0, 0, 0, 1)},
		{name: "record route full", frame: e.v4opts(t, 7, 7, 8, 1, 2, 3, 4, 1)},
		{name: "timestamp with a free slot", frame: e.v4opts(t, 0x44, 8, 5, 0, 0, 0, 0, 0)},
		{name: "timestamp and address, one slot", frame: e.v4opts(t, 0x44, 12, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0)},
		{name: "router alert, a security option, NOPs", frame: e.v4opts(t, 0x94, 4, 0, 0, 0x82, 3, 0, 1)},
		{name: "end of options, then bytes that are not read", frame: e.v4opts(t, 1, 0, 0xff, 0xff)},
		// IPv6 extension headers.
		{name: "hop-by-hop after destination options", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs()}, pkttest.Ext{Type: hbh, Body: tlvs()})},
		{name: "destination option past its header", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: []byte{0x1e, 9, 0, 0, 0, 0}})},
		{name: "destination option to discard when unknown", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs(0x9f, 2, 0, 0)})},
		{name: "hop-by-hop jumbo payload", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(0xc2, 4, 0, 1, 0, 0)})},
		{name: "routing header with a segment left", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{0, 1, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)})},
		{name: "destination options longer than checked", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: tlvs(append([]byte{1, 64}, make([]byte, 64)...)...)})},
		{name: "hop-by-hop router alert, then destination options to skip", frame: e.v6ext(t,
			pkttest.Ext{Type: hbh, Body: tlvs(5, 2, 0, 0)}, pkttest.Ext{Type: dst, Body: tlvs(0x1e, 2, 0, 0)})},
		{name: "routing header, no segments left", frame: e.v6ext(t,
			pkttest.Ext{Type: rt, Body: append([]byte{0, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)})},
		{name: "destination options of Pad1s", frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: []byte{0, 0, 0, 0, 0, 0}})},
		// ip6_parse_tlv's rules beyond the bounds, found by FuzzDatapath.
		{name: "destination options of 14 Pad1s", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: make([]byte, 14)})},
		{name: "destination option PadN of 8 bytes", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: []byte{0x1e, 4, 0, 0, 0, 0, 1, 6, 0, 0, 0, 0, 0, 0}})},
		{name: "destination option PadN with a non-zero byte", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: []byte{1, 4, 0, 0, 1, 0}})},
		{name: "nine destination options", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: dst, Body: append(bytes.Repeat([]byte{0x1e, 0}, 9), 1, 2, 0, 0)})},
		{name: "hop-by-hop router alert of length 4", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(5, 4, 0, 0, 0, 0)})},
		{name: "hop-by-hop CALIPSO", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(7, 8, 0, 0, 0, 1, 0, 0, 0, 0)})},
		{name: "hop-by-hop IOAM", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: hbh, Body: tlvs(0x31, 2, 0, 0)})},
		{name: "segment routing header, none left", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{4, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)})},
		{name: "RPL routing header, none left", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{3, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)})},
		{name: "eight destination options", frame: e.v6ext(t,
			pkttest.Ext{Type: dst, Body: append(bytes.Repeat([]byte{0x1e, 0}, 8), 1, 4, 0, 0, 0, 0)})},
		{name: "destination option between 4 and 6 bytes of padding", frame: e.v6ext(t,
			pkttest.Ext{Type: dst, Body: []byte{1, 2, 0, 0, 0x1e, 2, 0, 0, 1, 4, 0, 0, 0, 0}})},
		{name: "destination options of an experimental option and a PadN", frame: e.v6ext(t,
			pkttest.Ext{Type: dst, Body: pkttest.PadN(2)})},
		{name: "Mobile IPv6 routing header (type 2), none left", reason: "pass_ipv6_ext",
			frame: e.v6ext(t, pkttest.Ext{Type: rt, Body: append([]byte{2, 0, 0, 0, 0, 0}, netip.MustParseAddr("2001:db8::99").AsSlice()...)})},
		{name: "timestamp full, overflow 15", reason: "pass_ip_options", frame: e.v4opts(t, 0x44, 8, 9, 0xf0, 1, 2, 3, 4)},
		{name: "timestamp full, overflow 14", frame: e.v4opts(t, 0x44, 8, 9, 0xe0, 1, 2, 3, 4)},
	}
	// Sources no host accepts, or no router forwards.
	for _, src := range []string{"0.1.8.0", "127.0.0.1", "224.0.0.1", "255.255.255.255", "::1", "ff02::1", "ff00:db8:1::7",
		"::", "fe80::1", "febf:ffff::1", "::ffff:10.9.8.7"} {
		a := netip.MustParseAddr(src)
		fam := families[0]
		if a.Is6() {
			fam = families[1]
		}
		good := e.frame(t, vipPacket(fam, layers.IPProtocolTCP))
		tests = append(tests, malformedCase{name: "source " + src, reason: "pass_martian_source",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) {
				if l.Family == 4 {
					copy(b[l.L3+12:], a.AsSlice())
					pkttest.FixIPv4Checksum(b, l)
				} else {
					copy(b[l.L3+8:], a.AsSlice())
				}
			})})
	}
	// TTL / hop limit 0: the opt dispatch would send it on with 0.
	for _, fam := range families {
		good := e.frame(t, vipPacket(fam, layers.IPProtocolTCP))
		tests = append(tests, malformedCase{name: fam.name + " TTL 0", reason: "pass_ttl_exceeded",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) {
				if l.Family == 4 {
					b[l.L3+8] = 0
					pkttest.FixIPv4Checksum(b, l)
				} else {
					b[l.L3+7] = 0
				}
			})})
	}
	// UDP length.
	for _, fam := range families {
		good := e.frame(t, vipPacket(fam, layers.IPProtocolUDP))
		tests = append(tests, malformedCase{name: fam.name + " UDP length 4 short of the payload", reason: "pass_udp_length",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L4+4, uint16(l.L3Len-(l.L4-l.L3)-4)) })})
	}
	for _, k := range hooks {
		for _, c := range tests {
			t.Run(k.String()+"/"+c.name, func(t *testing.T) {
				in := bytes.Clone(c.frame)
				before := e.reasons(t)
				r := e.runOn(t, k, in)
				if c.reason == "" {
					if r.verdict != k.tx() {
						t.Fatalf("valid packet: verdict %s, want %s; output:\n%s", k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
					}
					checkEncap(t, in, r.out)
					e.expectReasons(t, before, nil)
					return
				}
				if r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
					t.Fatalf("verdict %s (changed %v), want %s untouched", k.verdictName(r.verdict), !bytes.Equal(r.out[:len(in)], in), k.verdictName(k.pass()))
				}
				e.expectReasons(t, before, map[string]uint64{c.reason: 1})
			})
		}
	}
}

// TestValidateSNATReply sends a SNAT binding's reply with a wrong IPv4
// header checksum: not rewritten, passed and counted.
func TestValidateSNATReply(t *testing.T) {
	for _, k := range hooks {
		e := newSNATEnv(t, envOptions{})
		svc := snatService("svc", vip4, 80, lb.TCP, backends4[0])
		e.reconcile(t, svc)
		f := flowTo(svc.Frontend, client4, 1000)
		snat := e.sendSNAT(t, k, svc, f, clientPacket(f, false, true))
		be := netip.AddrPortFrom(backends4[0], snatBackendPort)
		in := e.frame(t, replyPacket(be, snat, lb.TCP, false, false))
		in[14+10] ^= 0x01
		before := e.reasons(t)
		r := e.runOn(t, k, in)
		if r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
			t.Fatalf("%s: reply with a wrong checksum: verdict %s, want it passed untouched", k, k.verdictName(r.verdict))
		}
		e.expectReasons(t, before, map[string]uint64{"pass_ip_csum": 1})
		in[14+10] ^= 0x01
		e.replySNAT(t, k, f, be, snat, false, false)
	}
}

// TestTrailingBytesNotForwarded sends packets with bytes after the IP
// packet through every rewriting path: what leaves is exactly the IP
// packet, rewritten.
func TestTrailingBytesNotForwarded(t *testing.T) {
	junk := []byte{0xde, 0xad, 0xbe, 0xef, 0x01, 0x02}
	for _, k := range hooks {
		// SNAT, both ways.
		e := newSNATEnv(t, envOptions{})
		svc := snatService("svc", vip4, 80, lb.TCP, backends4[0])
		e.reconcile(t, svc)
		f := flowTo(svc.Frontend, client4, 1000)
		in := append(e.frame(t, clientPacket(f, false, true)), junk...)
		r := e.runOn(t, k, in)
		if r.verdict != k.tx() {
			t.Fatalf("%s: SNAT forward: verdict %s", k, k.verdictName(r.verdict))
		}
		if extra := pkttest.ExtraBytes(t, r.out); len(extra) != 0 {
			t.Errorf("%s: SNAT forward carried %d bytes after the IP packet: %x", k, len(extra), extra)
		}
		snat := source(t, r.out)
		be := netip.AddrPortFrom(backends4[0], snatBackendPort)
		in = append(e.frame(t, replyPacket(be, snat, lb.TCP, false, false)), junk...)
		r = e.runOn(t, k, in)
		if r.verdict != k.tx() {
			t.Fatalf("%s: SNAT reply: verdict %s", k, k.verdictName(r.verdict))
		}
		if extra := pkttest.ExtraBytes(t, r.out); len(extra) != 0 {
			t.Errorf("%s: SNAT reply carried %d bytes after the IP packet: %x", k, len(extra), extra)
		}

		// DSR opt, and an ICMP error to an opt backend.
		e = newEnv(t)
		svcs := dispatchServices(lb.DispatchOpt, optTCPBackendPort, optUDPBackendPort)
		e.reconcile(t, svcs...)
		for _, fam := range families {
			svc := serviceOf(t, svcs, fam, lb.TCP)
			f := flowTo(svc.Frontend, fam.client, 1001)
			for _, syn := range []bool{true, false} {
				in := append(e.frame(t, packet(f, syn, !syn, []byte("x"))), junk...)
				r := e.runOn(t, k, in)
				if r.verdict != k.tx() {
					t.Fatalf("%s %s opt: verdict %s", k, fam.name, k.verdictName(r.verdict))
				}
				if extra := pkttest.ExtraBytes(t, r.out); len(extra) != 0 {
					t.Errorf("%s %s opt (SYN %v): carried %d bytes after the IP packet: %x", k, fam.name, syn, len(extra), extra)
				}
			}
			kind := errKinds(fam)[1]
			in := append(e.icmpErr(t, routerOf(fam), f.Dst, kind, quoteOf(t, replyPkt(f, netip.AddrPortFrom(f.Dst, f.DstPort)), kind)), junk...)
			r := e.runOn(t, k, in)
			if r.verdict != k.tx() {
				t.Fatalf("%s %s ICMP error to an opt backend: verdict %s", k, fam.name, k.verdictName(r.verdict))
			}
			if extra := pkttest.ExtraBytes(t, r.out); len(extra) != 0 {
				t.Errorf("%s %s ICMP error: carried %d bytes after the IP packet: %x", k, fam.name, len(extra), extra)
			}
		}
	}
}

// TestValidateICMPChecksum sends errors about a DSR flow with a wrong ICMP
// checksum: passed untouched and counted; the same with the checksum right
// is forwarded.
func TestValidateICMPChecksum(t *testing.T) {
	e := newEnv(t)
	var svcs []lb.Service
	for _, fam := range families {
		svcs = append(svcs, dsrService("web-"+fam.name, fam.vip, 80, lb.TCP, fam.backends[:3]...))
	}
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for i, fam := range families {
			for _, kind := range errKinds(fam) {
				f := flowTo(svcs[i].Frontend, fam.client, 1002)
				in := e.icmpErr(t, routerOf(fam), f.Dst, kind, quoteOf(t, replyPkt(f, netip.AddrPortFrom(f.Dst, f.DstPort)), kind))
				l := pkttest.MustLayout(t, in)
				bad := bytes.Clone(in)
				binary.BigEndian.PutUint16(bad[l.L4+2:], binary.BigEndian.Uint16(bad[l.L4+2:])^0x0100)
				before := e.reasons(t)
				r := e.runOn(t, k, bad)
				if r.verdict != k.pass() || !bytes.Equal(r.out[:len(bad)], bad) {
					t.Errorf("%s %s %s with a wrong checksum: verdict %s, want it passed untouched", k, fam.name, kind.name, k.verdictName(r.verdict))
				}
				e.expectReasons(t, before, map[string]uint64{"pass_icmp_csum": 1})
				e.sendICMPToFlow(t, k, svcs[i], f, kind)
			}
		}
	}
}
