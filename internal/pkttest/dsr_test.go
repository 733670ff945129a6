// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

func TestGeneveHeader(t *testing.T) {
	for _, tt := range []struct {
		vip  netip.AddrPort
		want []byte
	}{
		{dst4, append([]byte{
			0x06, 0x00, 0x08, 0x00, 0, 0, 0, 0, // version 0, 6 words of options, IPv4, VNI 0
			0xff, 0x4c, 0x01, 0x05, // class, type, 5 words of data
			0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 10, // IPv4-mapped VIP
		}, 0, 80, 0, 0)},
		{dst6, append(append([]byte{
			0x06, 0x00, 0x86, 0xdd, 0, 0, 0, 0,
			0xff, 0x4c, 0x01, 0x05,
		}, dst6.Addr().AsSlice()...), 0, 80, 0, 0)},
	} {
		if got := GeneveHeader(tt.vip); !bytes.Equal(got, tt.want) {
			t.Errorf("GeneveHeader(%s):\n got %x\nwant %x", tt.vip, got, tt.want)
		}
	}
}

func TestBuildGeneve(t *testing.T) {
	for _, fam := range []struct {
		src, dst    netip.Addr
		client, vip netip.AddrPort
	}{
		{netip.MustParseAddr("172.16.0.1"), netip.MustParseAddr("10.0.0.11"), src4, dst4},
		{netip.MustParseAddr("100::1"), netip.MustParseAddr("fd00::11"), src6, dst6},
	} {
		inner := Build(t, Packet{Src: fam.client, Dst: fam.vip, Payload: []byte("x")})[14:]
		frame := BuildGeneve(t, Geneve{Src: fam.src, Dst: fam.dst, SrcPort: 50000, VIP: fam.vip, Inner: inner})
		l := MustLayout(t, frame)
		if l.Proto != layers.IPProtocolUDP || l.L3Len != len(frame)-14 {
			t.Fatalf("%s: layout %+v of a %d-byte frame", fam.vip, l, len(frame))
		}
		udp := frame[l.L4:]
		if sp, dp, n, c := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:]), binary.BigEndian.Uint16(udp[4:]), binary.BigEndian.Uint16(udp[6:]); sp != 50000 || dp != 6081 || int(n) != 8+32+len(inner) || c != 0 {
			t.Errorf("%s: UDP %d -> %d length %d checksum %#x, want 50000 -> 6081, %d, 0", fam.vip, sp, dp, n, c, 8+32+len(inner))
		}
		if !bytes.Equal(udp[8:40], GeneveHeader(fam.vip)) || !bytes.Equal(udp[40:], inner) {
			t.Errorf("%s: Geneve header or inner packet misplaced:\n%x", fam.vip, udp)
		}
		if l.Family == 4 && !IPv4ChecksumValid(frame[14:]) {
			t.Errorf("outer IPv4 checksum invalid")
		}
	}
}

func TestDSROptions(t *testing.T) {
	p := Packet{Src: src4, Dst: dst4, SYN: true, IPv4Options: []layers.IPv4Option{IPv4Opt(dst4)}}
	frame := Build(t, p)
	l := MustLayout(t, frame)
	if want := []byte{0x9e, 8, 0, 80, 192, 0, 2, 10}; l.L4-l.L3 != 28 || !bytes.Equal(frame[l.L3+20:l.L4], want) {
		t.Errorf("IPv4 option: header of %d bytes, option %x; want 28 and %x", l.L4-l.L3, frame[l.L3+20:l.L4], want)
	}

	p = Packet{Src: src6, Dst: dst6, Proto: layers.IPProtocolUDP, IPv6Ext: []Ext{IPv6DstOpt(dst6)}}
	frame = Build(t, p)
	l = MustLayout(t, frame)
	want := append([]byte{17, 2, 1, 0, 0x1e, 18, 0, 80}, dst6.Addr().AsSlice()...)
	if l.L4-l.L3 != 64 || frame[l.L3+6] != 60 || !bytes.Equal(frame[l.L3+40:l.L4], want) {
		t.Errorf("IPv6 destination options: header chain of %d bytes, next header %d, %x; want 64, 60, %x",
			l.L4-l.L3, frame[l.L3+6], frame[l.L3+40:l.L4], want)
	}
	if ok, carried, computed, err := L4ChecksumValid(frame); !ok || err != nil {
		t.Errorf("UDP checksum after the destination options: carried %#x computed %#x (%v)", carried, computed, err)
	}
}
