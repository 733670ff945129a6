// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

var (
	src4 = netip.MustParseAddrPort("198.51.100.7:40000")
	dst4 = netip.MustParseAddrPort("192.0.2.10:80")
	src6 = netip.MustParseAddrPort("[2001:db8:1::7]:40000")
	dst6 = netip.MustParseAddrPort("[2001:db8::10]:80")
)

func TestLayoutOf(t *testing.T) {
	withOpts := Packet{Src: src4, Dst: dst4, IPv4Options: []layers.IPv4Option{{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}}}
	vlan := Packet{Src: src4, Dst: dst4, Proto: layers.IPProtocolUDP, VLAN: 7}
	exts := Packet{Src: src6, Dst: dst6, IPv6Ext: []Ext{
		{Type: layers.IPProtocolIPv6HopByHop, Body: PadN(1)},
		{Type: layers.IPProtocolIPv6Destination, Body: PadN(0)},
	}}
	tests := []struct {
		name string
		p    Packet
		want Layout
	}{
		{"IPv4 TCP", Packet{Src: src4, Dst: dst4}, Layout{L3: 14, L4: 34, Family: 4, L3Len: 40, Proto: layers.IPProtocolTCP}},
		{"IPv4 options", withOpts, Layout{L3: 14, L4: 38, Family: 4, L3Len: 44, Proto: layers.IPProtocolTCP}},
		{"802.1Q UDP", vlan, Layout{L3: 18, L4: 38, Family: 4, L3Len: 28, Proto: layers.IPProtocolUDP}},
		{"IPv6 TCP", Packet{Src: src6, Dst: dst6}, Layout{L3: 14, L4: 54, Family: 6, L3Len: 60, Proto: layers.IPProtocolTCP}},
		{"IPv6 extension chain", exts, Layout{L3: 14, L4: 14 + 40 + 16 + 8, Family: 6, L3Len: 60 + 24, Proto: layers.IPProtocolTCP}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LayoutOf(Build(t, tt.p))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("LayoutOf = %+v, want %+v", got, tt.want)
			}
		})
	}

	for name, frame := range map[string][]byte{
		"ARP":           BuildARP(t, ClientMAC, src4.Addr(), dst4.Addr()),
		"short":         make([]byte, 10),
		"cut IPv4":      Build(t, Packet{Src: src4, Dst: dst4})[:20],
		"cut ext chain": Build(t, exts)[:55],
	} {
		if l, err := LayoutOf(frame); err == nil {
			t.Errorf("%s: LayoutOf = %+v, want an error", name, l)
		}
	}
}

func TestIPv4Checksum(t *testing.T) {
	frame := Build(t, Packet{Src: src4, Dst: dst4, ID: 0x1234, DF: true})
	ip := frame[14:]
	if !IPv4ChecksumValid(ip) {
		t.Fatalf("checksum of a built packet reported invalid: %x", ip[:20])
	}
	ip[8]-- // TTL
	if IPv4ChecksumValid(ip) {
		t.Fatalf("checksum still valid after a TTL change")
	}
	FixIPv4Checksum(frame, MustLayout(t, frame))
	if !IPv4ChecksumValid(ip) {
		t.Errorf("FixIPv4Checksum left an invalid checksum")
	}
}

func TestSetIHL(t *testing.T) {
	frame := Build(t, Packet{Src: src4, Dst: dst4})
	for ihl := range uint8(16) {
		got := SetIHL(t, frame, ihl)
		if got[14]&0x0f != ihl || got[14]>>4 != 4 {
			t.Errorf("IHL %d: first header byte %#02x", ihl, got[14])
		}
		// Headers longer than the frame cannot carry a checkable sum.
		if ihl >= 5 && int(ihl)*4 <= len(got)-14 && !IPv4ChecksumValid(got[14:]) {
			t.Errorf("IHL %d: invalid checksum", ihl)
		}
		// Only the header byte and the checksum may change.
		diff := 0
		for i := range got {
			if got[i] != frame[i] && i != 14 && i != 24 && i != 25 {
				diff++
			}
		}
		if diff != 0 {
			t.Errorf("IHL %d: %d other bytes changed", ihl, diff)
		}
	}
}

func TestBuildTunnel(t *testing.T) {
	for _, fam := range []struct {
		src, dst    netip.Addr
		client, vip netip.AddrPort
	}{
		{netip.MustParseAddr("172.16.0.1"), netip.MustParseAddr("10.0.0.11"), src4, dst4},
		{netip.MustParseAddr("100::1"), netip.MustParseAddr("fd00::11"), src6, dst6},
	} {
		client := Build(t, Packet{Src: fam.client, Dst: fam.vip, Payload: []byte("x")})
		inner := client[14:]
		frame := BuildTunnel(t, Tunnel{Src: fam.src, Dst: fam.dst, Inner: inner})
		d := Decode(frame)
		switch {
		case fam.src.Is4() && (d.Outer4 == nil || d.Inner4 == nil):
			t.Fatalf("IPv4 tunnel does not decode as IPv4 in IPv4:\n%s", d.Dump())
		case fam.src.Is6() && (d.Outer6 == nil || d.Inner6 == nil):
			t.Fatalf("IPv6 tunnel does not decode as IPv6 in IPv6:\n%s", d.Dump())
		}
		l := MustLayout(t, frame)
		if !bytes.Equal(frame[l.L4:], inner) {
			t.Errorf("inner packet changed:\n got %x\nwant %x", frame[l.L4:], inner)
		}
		if fam.src.Is4() && !IPv4ChecksumValid(frame[14:]) {
			t.Errorf("outer IPv4 checksum invalid")
		}
	}
}

func TestICMPAndFragments(t *testing.T) {
	d := Decode(Build(t, Packet{Src: src4, Dst: dst4, Proto: layers.IPProtocolICMPv4}))
	if d.Layer(layers.LayerTypeICMPv4) == nil {
		t.Errorf("no ICMPv4 layer:\n%s", d.Dump())
	}
	d = Decode(Build(t, Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolICMPv6}))
	if d.Layer(layers.LayerTypeICMPv6) == nil {
		t.Errorf("no ICMPv6 layer:\n%s", d.Dump())
	}
	d = Decode(Build(t, Packet{Src: src4, Dst: dst4, MF: true, FragOffset: 3}))
	if d.Outer4 == nil || d.Outer4.Flags&layers.IPv4MoreFragments == 0 || d.Outer4.FragOffset != 3 {
		t.Errorf("fragment fields not set:\n%s", d.Dump())
	}
}

func TestL4Checksum(t *testing.T) {
	exts := []Ext{{Type: layers.IPProtocolIPv6Destination, Body: PadN(0)}}
	for _, tt := range []struct {
		name string
		p    Packet
	}{
		{"IPv4 TCP", Packet{Src: src4, Dst: dst4, ACK: true, Payload: []byte("odd")}},
		{"IPv4 UDP", Packet{Src: src4, Dst: dst4, Proto: layers.IPProtocolUDP, Payload: []byte("even")}},
		{"IPv4 TCP options", Packet{Src: src4, Dst: dst4, IPv4Options: []layers.IPv4Option{{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}}}},
		{"IPv6 TCP", Packet{Src: src6, Dst: dst6, SYN: true}},
		{"IPv6 UDP", Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP, Payload: []byte("x")}},
		{"IPv6 UDP after an extension", Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP, IPv6Ext: exts, Payload: []byte("y")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			frame := Build(t, tt.p)
			// gopacket computed the carried checksum: the two must agree.
			ok, got, want, err := L4ChecksumValid(frame)
			if err != nil || !ok {
				t.Fatalf("built packet: valid=%v carried %#04x computed %#04x err %v", ok, got, want, err)
			}
			l := MustLayout(t, frame)
			// Any changed byte the sum covers must show: a source port,
			// the last payload byte, an address (pseudo header).
			for _, at := range []int{l.L4, l.L3 + l.L3Len - 1, l.L3 + 13 + 4*(l.Family/6)} {
				bad := bytes.Clone(frame)
				bad[at] ^= 0x40
				if ok, got, want, _ := L4ChecksumValid(bad); ok {
					t.Errorf("byte %d flipped: still valid (carried %#04x computed %#04x)", at, got, want)
				}
			}
		})
	}

	// A zero UDP checksum is "none" for IPv4 and invalid for IPv6.
	for _, p := range []Packet{{Src: src4, Dst: dst4, Proto: layers.IPProtocolUDP}, {Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP}} {
		frame := Build(t, p)
		l := MustLayout(t, frame)
		frame[l.L4+6], frame[l.L4+7] = 0, 0
		ok, _, _, err := L4ChecksumValid(frame)
		if err != nil {
			t.Fatal(err)
		}
		if want := l.Family == 4; ok != want {
			t.Errorf("IPv%d UDP with checksum 0: valid=%v, want %v", l.Family, ok, want)
		}
	}
}
