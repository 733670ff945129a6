// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Ethertypes and IP protocol numbers the frame helpers walk.
const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100
	etherTypeQinQ = 0x88a8

	protoHopOpts  = 0
	protoRouting  = 43
	protoFragment = 44
	protoAH       = 51
	protoDstOpts  = 60
)

// Layout locates the headers of a frame built by this package, so tests can
// patch one field of a well-formed packet and nothing else.
type Layout struct {
	// L3 and L4 are the offsets of the IP header and of the header after
	// it (after IPv6 extension headers).
	L3, L4 int
	// Family is 4 or 6.
	Family int
	// L3Len is the IP packet's length as its header states it.
	L3Len int
	// Proto is the protocol of the header at L4.
	Proto layers.IPProtocol
}

// LayoutOf locates the headers of frame. It trusts the header fields it
// needs: use it on the well-formed frame before patching it.
func LayoutOf(frame []byte) (Layout, error) {
	var l Layout
	if len(frame) < 14 {
		return l, fmt.Errorf("frame of %d bytes has no Ethernet header", len(frame))
	}
	off := 12
	etype := binary.BigEndian.Uint16(frame[off:])
	for etype == etherTypeVLAN || etype == etherTypeQinQ {
		off += 4
		if len(frame) < off+2 {
			return l, errors.New("frame ends inside a VLAN tag")
		}
		etype = binary.BigEndian.Uint16(frame[off:])
	}
	l.L3 = off + 2
	ip := frame[l.L3:]
	switch etype {
	case etherTypeIPv4:
		if len(ip) < 20 {
			return l, errors.New("frame ends inside the IPv4 header")
		}
		l.Family = 4
		l.L3Len = int(binary.BigEndian.Uint16(ip[2:]))
		l.L4 = l.L3 + int(ip[0]&0x0f)*4
		l.Proto = layers.IPProtocol(ip[9])
	case etherTypeIPv6:
		if len(ip) < 40 {
			return l, errors.New("frame ends inside the IPv6 header")
		}
		l.Family = 6
		l.L3Len = 40 + int(binary.BigEndian.Uint16(ip[4:]))
		next := ip[6]
		off := 40
		for next == protoHopOpts || next == protoRouting || next == protoDstOpts || next == protoFragment || next == protoAH {
			if len(ip) < off+2 {
				return l, errors.New("frame ends inside an IPv6 extension header")
			}
			hdr := ip[off:]
			switch next {
			case protoFragment:
				off += 8
			case protoAH:
				off += (int(hdr[1]) + 2) * 4
			default:
				off += (int(hdr[1]) + 1) * 8
			}
			next = hdr[0]
		}
		l.L4 = l.L3 + off
		l.Proto = layers.IPProtocol(next)
	default:
		return l, fmt.Errorf("ethertype %#04x is not IP", etype)
	}
	return l, nil
}

// MustLayout is LayoutOf for frames the test itself built.
func MustLayout(t testing.TB, frame []byte) Layout {
	t.Helper()
	l, err := LayoutOf(frame)
	if err != nil {
		t.Fatalf("locate headers: %v", err)
	}
	return l
}

// IPPacket returns the IP packet of frame as its header sizes it, without
// any Ethernet padding after it.
func IPPacket(t testing.TB, frame []byte) []byte {
	t.Helper()
	l := MustLayout(t, frame)
	if l.L3+l.L3Len > len(frame) {
		t.Fatalf("IP packet of %d bytes does not fit a %d-byte frame", l.L3Len, len(frame))
	}
	return frame[l.L3 : l.L3+l.L3Len]
}

// IPv4Checksum returns the header checksum that hdr (an IPv4 header of
// IHL*4 bytes) should carry, ignoring the one it carries.
func IPv4Checksum(hdr []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(hdr); i += 2 {
		if i == 10 {
			continue
		}
		sum += uint32(binary.BigEndian.Uint16(hdr[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// IPv4ChecksumValid reports whether the IPv4 header at the start of ip
// carries the right checksum.
func IPv4ChecksumValid(ip []byte) bool {
	if len(ip) < 20 {
		return false
	}
	n := int(ip[0]&0x0f) * 4
	if n < 20 || n > len(ip) {
		return false
	}
	return binary.BigEndian.Uint16(ip[10:]) == IPv4Checksum(ip[:n])
}

// FixIPv4Checksum rewrites the header checksum of frame's IPv4 header after
// a patch, so that a test changes exactly the field it means to. IHL values
// below 5 are summed over the fixed 20 bytes, values past the frame's end
// over what is there.
func FixIPv4Checksum(frame []byte, l Layout) {
	n := min(max(int(frame[l.L3]&0x0f)*4, 20), len(frame)-l.L3)
	hdr := frame[l.L3 : l.L3+n]
	binary.BigEndian.PutUint16(hdr[10:], IPv4Checksum(hdr))
}

// SetIHL returns a copy of an IPv4 frame with the header length field set to
// ihl (0..15) and the checksum fixed; nothing else moves.
func SetIHL(t testing.TB, frame []byte, ihl uint8) []byte {
	t.Helper()
	out := append([]byte(nil), frame...)
	l := MustLayout(t, out)
	if l.Family != 4 {
		t.Fatalf("SetIHL on an IPv%d frame", l.Family)
	}
	out[l.L3] = out[l.L3]&0xf0 | ihl&0x0f
	FixIPv4Checksum(out, l)
	return out
}

// PadN is the body (what follows the next-header and length bytes) of a
// hop-by-hop or destination options header holding one PadN option: 6 bytes
// plus 8 per extra word.
func PadN(extraWords int) []byte {
	b := make([]byte, 6+8*extraWords)
	b[0] = 1 // PadN
	b[1] = byte(len(b) - 2)
	return b
}

// BuildARP returns a broadcast ARP request from sender (at srcMAC) for target.
func BuildARP(t testing.TB, srcMAC net.HardwareAddr, sender, target netip.Addr) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP}
	arp := &layers.ARP{
		AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
		HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPRequest,
		SourceHwAddress: srcMAC, SourceProtAddress: sender.AsSlice(),
		DstHwAddress: make([]byte, 6), DstProtAddress: target.AsSlice(),
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, arp); err != nil {
		t.Fatalf("build ARP frame: %v", err)
	}
	return buf.Bytes()
}

// Tunnel describes an IP-in-IP frame as an LB sends it to a backend.
type Tunnel struct {
	SrcMAC, DstMAC net.HardwareAddr
	// Src and Dst are the outer addresses; their family picks IPv4-in-IPv4
	// or IPv6-in-IPv6.
	Src, Dst netip.Addr
	// Inner is the encapsulated IP packet.
	Inner []byte
	// IPv4Options are added to an outer IPv4 header.
	IPv4Options []layers.IPv4Option
}

// BuildTunnel serializes tun with correct lengths and checksums.
func BuildTunnel(t testing.TB, tun Tunnel) []byte {
	t.Helper()
	if tun.SrcMAC == nil {
		tun.SrcMAC = LBMAC
	}
	if tun.DstMAC == nil {
		tun.DstMAC = ClientMAC
	}
	eth := &layers.Ethernet{SrcMAC: tun.SrcMAC, DstMAC: tun.DstMAC}
	var outer gopacket.SerializableLayer
	if tun.Src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		outer = &layers.IPv4{
			Version: 4, TTL: 64, Protocol: layers.IPProtocolIPv4, Flags: layers.IPv4DontFragment,
			SrcIP: tun.Src.AsSlice(), DstIP: tun.Dst.AsSlice(), Options: tun.IPv4Options,
		}
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		outer = &layers.IPv6{
			Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolIPv6,
			SrcIP: tun.Src.AsSlice(), DstIP: tun.Dst.AsSlice(),
		}
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, outer, gopacket.Payload(tun.Inner)); err != nil {
		t.Fatalf("build tunnel frame: %v", err)
	}
	return buf.Bytes()
}

// ExtraBytes returns what frame carries after its IP packet (Ethernet
// padding, or garbage): the bytes a forwarded packet must not keep.
func ExtraBytes(t testing.TB, frame []byte) []byte {
	t.Helper()
	l := MustLayout(t, frame)
	if l.L3+l.L3Len > len(frame) {
		t.Fatalf("IP packet of %d bytes does not fit a %d-byte frame", l.L3Len, len(frame))
	}
	return frame[l.L3+l.L3Len:]
}
