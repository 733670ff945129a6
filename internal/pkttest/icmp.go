// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// ICMP and ICMPv6 error types and codes the datapath sends or passes on
// (RFC 792, RFC 4443), written out here so tests check the datapath against
// the RFCs rather than against its own headers.
const (
	ICMPv4DestUnreachable = 3
	ICMPv4FragNeeded      = 4 // code of ICMPv4DestUnreachable
	ICMPv4PortUnreachable = 3 // code of ICMPv4DestUnreachable
	ICMPv4TimeExceeded    = 11
	ICMPv4EchoRequest     = 8
	ICMPv6DestUnreachable = 1
	ICMPv6PacketTooBig    = 2
	ICMPv6TimeExceeded    = 3
	ICMPv6EchoRequest     = 128
)

// ICMPError describes an ICMP (IPv4) or ICMPv6 error message: an IP header,
// the 8-byte ICMP header and the quoted start of the packet it is about.
type ICMPError struct {
	SrcMAC, DstMAC net.HardwareAddr
	// Src and Dst are the message's own addresses; their family picks ICMP
	// or ICMPv6.
	Src, Dst   netip.Addr
	Type, Code uint8
	// Info is the header's second word: the next-hop MTU of
	// fragmentation-needed (in its low 16 bits) or of packet-too-big, or 0.
	Info uint32
	// TTL is the TTL or hop limit; 0 means 64. TOS is the IPv4 TOS or IPv6
	// traffic class; DF and ID are IPv4's.
	TTL, TOS uint8
	DF       bool
	ID       uint16
	// Quote is what follows the ICMP header.
	Quote []byte
}

// BuildICMPError serializes e with correct IP lengths, the IPv4 header
// checksum and the ICMP checksum (ICMPv6: over the pseudo-header too), all
// computed here from scratch.
func BuildICMPError(t TB, e ICMPError) []byte {
	t.Helper()
	if e.SrcMAC == nil {
		e.SrcMAC = ClientMAC
	}
	if e.DstMAC == nil {
		e.DstMAC = LBMAC
	}
	if e.TTL == 0 {
		e.TTL = 64
	}
	msg := make([]byte, 8, 8+len(e.Quote))
	msg[0], msg[1] = e.Type, e.Code
	binary.BigEndian.PutUint32(msg[4:], e.Info)
	msg = append(msg, e.Quote...)
	eth := &layers.Ethernet{SrcMAC: e.SrcMAC, DstMAC: e.DstMAC}
	var ip gopacket.SerializableLayer
	var pseudo uint32
	if e.Src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip4 := &layers.IPv4{Version: 4, TTL: e.TTL, TOS: e.TOS, Id: e.ID, Protocol: layers.IPProtocolICMPv4,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice()}
		if e.DF {
			ip4.Flags = layers.IPv4DontFragment
		}
		ip = ip4
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip = &layers.IPv6{Version: 6, HopLimit: e.TTL, TrafficClass: e.TOS, NextHeader: layers.IPProtocolICMPv6,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice()}
		pseudo = sum16(sum16(0, e.Src.AsSlice()), e.Dst.AsSlice()) + uint32(len(msg)) + uint32(layers.IPProtocolICMPv6)
	}
	binary.BigEndian.PutUint16(msg[2:], ^fold(sum16(pseudo, msg)))
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, ip, gopacket.Payload(msg)); err != nil {
		t.Fatalf("build ICMP error: %v", err)
	}
	return buf.Bytes()
}

// icmpMessage locates the ICMP or ICMPv6 message of frame.
func icmpMessage(frame []byte) (Layout, []byte, error) {
	l, err := LayoutOf(frame)
	if err != nil {
		return l, nil, err
	}
	end := l.L3 + l.L3Len
	if end > len(frame) || l.L4+8 > end {
		return l, nil, fmt.Errorf("IP packet of %d bytes (ICMP at %d) does not hold an ICMP header within a %d-byte frame", l.L3Len, l.L4-l.L3, len(frame)-l.L3)
	}
	want := layers.IPProtocolICMPv4
	if l.Family == 6 {
		want = layers.IPProtocolICMPv6
	}
	if l.Proto != want {
		return l, nil, fmt.Errorf("protocol %s is not %s", l.Proto, want)
	}
	return l, frame[l.L4:end], nil
}

// ICMPChecksum computes from scratch the checksum frame's ICMP message (or
// ICMPv6 message, whose sum covers the pseudo-header) should carry, the
// carried one taken as zero.
func ICMPChecksum(frame []byte) (uint16, error) {
	l, msg, err := icmpMessage(frame)
	if err != nil {
		return 0, err
	}
	var sum uint32
	if l.Family == 6 {
		ip := frame[l.L3:]
		sum = sum16(sum, ip[8:40]) + uint32(len(msg)) + uint32(layers.IPProtocolICMPv6)
	}
	sum = sum16(sum, msg[:2])
	sum = sum16(sum, msg[4:])
	return ^fold(sum), nil
}

// ICMPChecksumValid recomputes frame's ICMP checksum and compares it with
// the one carried; 0x0000 and 0xffff are the same one's-complement number.
func ICMPChecksumValid(frame []byte) (ok bool, carried, computed uint16, err error) {
	_, msg, err := icmpMessage(frame)
	if err != nil {
		return false, 0, 0, err
	}
	carried = binary.BigEndian.Uint16(msg[2:])
	computed, err = ICMPChecksum(frame)
	if err != nil {
		return false, carried, 0, err
	}
	return carried == computed || carried^computed == 0xffff && (carried == 0 || computed == 0), carried, computed, nil
}

// CompletedChecksum is what a device completing a CHECKSUM_PARTIAL
// checksum writes into its field, given seg: everything from where the
// checksum starts (the L4 header) to the end of the packet, the field
// holding what it holds now (the pseudo-header sum, when the sender left it
// partial). It is the complement of seg's one's-complement sum; 0 is sent as
// 0xffff.
func CompletedChecksum(seg []byte) uint16 {
	c := ^fold(sum16(0, seg))
	if c == 0 {
		c = 0xffff
	}
	return c
}
