// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

// v4opts is a TCP packet to dst4 whose IPv4 options are raw (a multiple of
// 4 bytes), with a right header checksum.
func v4opts(t *testing.T, raw ...byte) []byte {
	t.Helper()
	p := Packet{Src: src4, Dst: dst4, ACK: true, Payload: []byte("x")}
	for range raw {
		p.IPv4Options = append(p.IPv4Options, layers.IPv4Option{OptionType: 1})
	}
	b := Build(t, p)
	copy(b[14+20:], raw)
	FixIPv4Checksum(b, MustLayout(t, b))
	return b
}

// v6ext is a UDP packet to dst6 carrying ext.
func v6ext(t *testing.T, ext ...Ext) []byte {
	t.Helper()
	return Build(t, Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP, IPv6Ext: ext, Payload: []byte("x")})
}

// edit returns a copy of b changed by fn, the IPv4 header checksum fixed.
func edit(t *testing.T, b []byte, fn func(b []byte, l Layout)) []byte {
	t.Helper()
	b = bytes.Clone(b)
	l := MustLayout(t, b)
	fn(b, l)
	if l.Family == 4 {
		FixIPv4Checksum(b, l)
	}
	return b
}

// TestCheckStrict checks the checker against frames a receiver accepts and
// frames it refuses, each with the rule it breaks.
func TestCheckStrict(t *testing.T) {
	const hbh, dst, rt = layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Routing
	tcp4 := Build(t, Packet{Src: src4, Dst: dst4, SYN: true, Payload: []byte("hello")})
	udp6 := Build(t, Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP, Payload: []byte("hello")})
	quote := IPPacket(t, Build(t, Packet{Src: dst4, Dst: src4}))
	icmp := BuildICMPError(t, ICMPError{Src: netip.MustParseAddr("203.0.113.1"), Dst: dst4.Addr(), Type: ICMPv4DestUnreachable, Code: ICMPv4FragNeeded, Info: 1400, Quote: quote})
	rh := func(left byte, typ byte) Ext {
		return Ext{Type: rt, Body: append([]byte{typ, left, 0, 0, 0, 0}, dst6.Addr().AsSlice()...)}
	}
	tests := []struct {
		name  string
		frame []byte
		mode  StrictMode
		rule  string // "" accepted
	}{
		{"TCP over IPv4", tcp4, StrictMode{}, ""},
		{"UDP over IPv6", udp6, StrictMode{}, ""},
		{"ICMP error", icmp, StrictMode{}, ""},
		{"trailing bytes", append(bytes.Clone(tcp4), 0, 0), StrictMode{}, ""},
		{"trailing bytes, refused", append(bytes.Clone(tcp4), 0, 0), StrictMode{NoTrailing: true}, "trailing"},
		{"ARP", BuildARP(t, ClientMAC, src4.Addr(), dst4.Addr()), StrictMode{}, "not-ip"},
		{"IHL 4", SetIHL(t, tcp4, 4), StrictMode{}, "ipv4-header"},
		{"IPv4 from loopback", Build(t, Packet{Src: netip.MustParseAddrPort("127.0.0.1:1"), Dst: dst4}), StrictMode{}, "martian-source"},
		{"IPv4 from 0.0.0.0", Build(t, Packet{Src: netip.MustParseAddrPort("0.0.0.0:1"), Dst: dst4}), StrictMode{}, "martian-source"},
		{"IPv6 from multicast", Build(t, Packet{Src: netip.MustParseAddrPort("[ff02::1]:1"), Dst: dst6}), StrictMode{}, "martian-source"},
		{"total length past the frame", edit(t, tcp4, func(b []byte, l Layout) { binary.BigEndian.PutUint16(b[l.L3+2:], uint16(len(b))) }), StrictMode{}, "ipv4-header"},
		{"header checksum", func() []byte { b := bytes.Clone(tcp4); b[14+10] ^= 1; return b }(), StrictMode{}, "ipv4-checksum"},
		{"fragment", edit(t, tcp4, func(b []byte, l Layout) { b[l.L3+6] |= 0x20 }), StrictMode{}, "fragment"},
		{"record route", v4opts(t, 7, 7, 4, 0, 0, 0, 0, 1), StrictMode{}, ""},
		{"record route full", v4opts(t, 7, 7, 8, 1, 2, 3, 4, 1), StrictMode{}, ""},
		{"record route claiming 40 bytes", v4opts(t, 7, 0x28, 0, 0), StrictMode{}, "ipv4-options"},
		{"record route pointer 3", v4opts(t, 7, 7, 3, 0, 0, 0, 0, 1), StrictMode{}, "ipv4-options"},
		{"timestamp", v4opts(t, 0x44, 8, 5, 0, 0, 0, 0, 0), StrictMode{}, ""},
		{"timestamp full", v4opts(t, 0x44, 8, 9, 0x10, 0, 0, 0, 0), StrictMode{}, ""},
		{"timestamp full, overflow 15", v4opts(t, 0x44, 8, 9, 0xf0, 0, 0, 0, 0), StrictMode{}, "ipv4-ts-overflow"},
		{"loose source route", v4opts(t, 0x83, 7, 4, 10, 0, 0, 1, 1), StrictMode{}, "ipv4-source-route"},
		{"option length past the header", v4opts(t, 1, 1, 0x82, 8), StrictMode{}, "ipv4-options"},
		{"end of options, then garbage", v4opts(t, 1, 0, 0xff, 0xff), StrictMode{}, ""},
		{"hop-by-hop router alert, destination options", v6ext(t, Ext{Type: hbh, Body: []byte{5, 2, 0, 0, 1, 0}}, Ext{Type: dst, Body: []byte{0x1e, 2, 0, 0, 1, 0}}), StrictMode{}, ""},
		{"hop-by-hop second", v6ext(t, Ext{Type: dst, Body: PadN(0)}, Ext{Type: hbh, Body: PadN(0)}), StrictMode{}, "ipv6-ext-order"},
		{"14 bytes of padding", v6ext(t, Ext{Type: dst, Body: append([]byte{1, 12}, make([]byte, 12)...)}), StrictMode{}, "ipv6-padding"},
		{"options and padding the kernel accepts", v6ext(t, Ext{Type: dst, Body: PadN(1)}), StrictMode{}, ""},
		{"non-zero PadN", v6ext(t, Ext{Type: dst, Body: []byte{1, 4, 0, 0, 0, 1}}), StrictMode{}, "ipv6-padding"},
		{"nine options", v6ext(t, Ext{Type: dst, Body: []byte{0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0x1e, 0, 0, 0, 0, 0}}), StrictMode{}, "ipv6-tlv-count"},
		{"option to discard", v6ext(t, Ext{Type: dst, Body: []byte{0x9f, 2, 0, 0, 1, 0}}), StrictMode{}, "ipv6-tlv"},
		{"option past its header", v6ext(t, Ext{Type: dst, Body: []byte{0x1e, 9, 0, 0, 0, 0}}), StrictMode{}, "ipv6-tlv"},
		{"IOAM misaligned", v6ext(t, Ext{Type: hbh, Body: []byte{0x31, 2, 0, 0, 1, 0}}), StrictMode{}, "ipv6-tlv-known"},
		{"IOAM aligned", v6ext(t, Ext{Type: hbh, Body: []byte{1, 0, 0x31, 2, 0, 0}}), StrictMode{}, ""},
		{"router alert of length 4", v6ext(t, Ext{Type: hbh, Body: []byte{5, 4, 0, 0, 0, 0}}), StrictMode{}, "ipv6-tlv-known"},
		{"routing header, none left", v6ext(t, rh(0, 0)), StrictMode{}, ""},
		{"routing header, one left", v6ext(t, rh(1, 0)), StrictMode{}, "ipv6-routing"},
		{"segment routing header", v6ext(t, rh(0, 4)), StrictMode{}, "ipv6-routing-type"},
		{"AH", v6ext(t, Ext{Type: 51, Body: []byte{0, 0, 0, 0, 0, 1, 0, 0, 0, 1}}), StrictMode{}, ""},
		{"AH of 8 bytes", v6ext(t, Ext{Type: 51, Body: []byte{0, 0, 0, 0, 0, 1}}), StrictMode{}, "ipv6-ah-short"},
		{"Mobile IPv6 routing header", v6ext(t, rh(0, 2)), StrictMode{}, "ipv6-routing-type"},
		{"IPv6 from fe80::1", Build(t, Packet{Src: netip.MustParseAddrPort("[fe80::1]:1"), Dst: dst6}), StrictMode{}, "martian-source"},
		{"IPv6 from ::", Build(t, Packet{Src: netip.MustParseAddrPort("[::]:1"), Dst: dst6}), StrictMode{}, "martian-source"},
		{"IPv6 from ::ffff:10.0.0.1", Build(t, Packet{Src: netip.MustParseAddrPort("[::ffff:10.0.0.1]:1"), Dst: dst6}), StrictMode{}, "martian-source"},
		{"IPv6 from fec0::1", Build(t, Packet{Src: netip.MustParseAddrPort("[fec0::1]:1"), Dst: dst6}), StrictMode{}, ""},
		{"payload length 0", edit(t, udp6, func(b []byte, l Layout) { binary.BigEndian.PutUint16(b[l.L3+4:], 0) }), StrictMode{}, "ipv6-header"},
		{"TCP data offset 4", edit(t, tcp4, func(b []byte, l Layout) { b[l.L4+12] = 4 << 4 }), StrictMode{}, "tcp-header"},
		{"TCP data offset past the packet", edit(t, tcp4, func(b []byte, l Layout) { b[l.L4+12] = 15 << 4 }), StrictMode{}, "tcp-header"},
		{"UDP length short", edit(t, udp6, func(b []byte, l Layout) { binary.BigEndian.PutUint16(b[l.L4+4:], 8) }), StrictMode{}, "udp-length"},
		{"ICMP checksum", func() []byte { b := bytes.Clone(icmp); b[len(b)-1] ^= 1; return b }(), StrictMode{}, "icmp-checksum"},
		{"tunnel, inner checked", BuildTunnel(t, Tunnel{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Inner: IPPacket(t, tcp4)}), StrictMode{Decap: true}, ""},
		{"tunnel with a broken inner packet", BuildTunnel(t, Tunnel{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Inner: IPPacket(t, SetIHL(t, tcp4, 4))}), StrictMode{Decap: true}, "ipv4-header"},
		{"Geneve", BuildGeneve(t, Geneve{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 5000, VIP: dst6, Inner: IPPacket(t, udp6)}), StrictMode{Decap: true}, ""},
		{"Geneve naming the wrong protocol", BuildGeneve(t, Geneve{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 5000, VIP: dst4, Inner: IPPacket(t, udp6)}), StrictMode{Decap: true}, "ipv4-header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := CheckStrict(tt.frame, tt.mode)
			if got := StrictRule(err); got != tt.rule {
				t.Fatalf("rule %q (%v), want %q", got, err, tt.rule)
			}
			if err == nil && s.L3+s.IPLen+s.Trailing != len(tt.frame) {
				t.Errorf("IP packet at %d of %d bytes and %d trailing: not the %d-byte frame", s.L3, s.IPLen, s.Trailing, len(tt.frame))
			}
		})
	}
}

// TestCheckStrictFields checks what the checker reports of accepted frames.
func TestCheckStrictFields(t *testing.T) {
	frame := Build(t, Packet{Src: src4, Dst: dst4, ACK: true, Payload: []byte("hello")})
	s, err := CheckStrict(frame, StrictMode{})
	if err != nil {
		t.Fatal(err)
	}
	if s.L3 != 14 || s.L4 != 34 || s.L4HLen != 20 || s.Proto != 6 || s.TTL != 64 || !s.L4SumOK {
		t.Errorf("TCP over IPv4: %+v", s)
	}
	frame[s.L4+s.L4HLen] ^= 1
	if s, _ := CheckStrict(frame, StrictMode{}); s.L4SumOK {
		t.Error("a flipped payload bit leaves the TCP checksum right")
	}
	inner := IPPacket(t, Build(t, Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP, Payload: []byte("x")}))
	g := BuildGeneve(t, Geneve{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 5000, VIP: dst6, Inner: inner})
	s, err = CheckStrict(g, StrictMode{Decap: true, NoTrailing: true})
	if err != nil {
		t.Fatal(err)
	}
	in := s.Innermost()
	if !s.Geneve || in == s || in.Family != 6 || !bytes.Equal(g[in.L3:in.L3+in.IPLen], inner) {
		t.Errorf("Geneve: %+v, inner %+v", s, in)
	}
}
