// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Wire constants of the DSR dispatches geneve and opt, written out from
// their definitions (RFC 8926, RFC 4727) rather than taken from the C
// headers, so a test built on them checks the datapath against the spec.
const (
	// GenevePort is Geneve's UDP port.
	GenevePort = 6081
	// GeneveClass is the l4lb option class (RFC 8926 experimental range).
	GeneveClass = 0xFF4C
	// GeneveType is the l4lb option type.
	GeneveType = 0x01
	// GeneveHeaderLen is the Geneve header the LB sends: 8 bytes of base
	// header and the 24-byte l4lb option.
	GeneveHeaderLen = 32
	// IPv4OptType is the opt dispatch's IPv4 option: copied, class 0,
	// number 30.
	IPv4OptType = 0x9E
	// IPv6OptType is the opt dispatch's IPv6 destination option: skip if
	// unknown, not changed en route, number 30.
	IPv6OptType = 0x1E
)

// GeneveHeader returns the Geneve header the LB puts in front of a client
// packet to vip: version 0, 6 words of options, the inner family's
// ethertype as protocol, VNI 0, then the l4lb option (class, type, 5 words
// of data: the VIP as 16 bytes, IPv4-mapped for IPv4, the port and two zero
// bytes).
func GeneveHeader(vip netip.AddrPort) []byte {
	h := make([]byte, GeneveHeaderLen)
	h[0] = 6
	etype := uint16(etherTypeIPv6)
	if vip.Addr().Is4() {
		etype = etherTypeIPv4
	}
	binary.BigEndian.PutUint16(h[2:], etype)
	binary.BigEndian.PutUint16(h[8:], GeneveClass)
	h[10] = GeneveType
	h[11] = 5
	a := vip.Addr().As16()
	copy(h[12:28], a[:])
	binary.BigEndian.PutUint16(h[28:], vip.Port())
	return h
}

// Geneve describes a Geneve frame as an LB sends it to a backend.
type Geneve struct {
	SrcMAC, DstMAC net.HardwareAddr
	// Src and Dst are the outer addresses.
	Src, Dst netip.Addr
	// SrcPort is the outer UDP source port.
	SrcPort uint16
	// Header is the Geneve header; nil means GeneveHeader(VIP).
	Header []byte
	// VIP names the frontend in the option.
	VIP netip.AddrPort
	// Inner is the client's IP packet.
	Inner []byte
}

// BuildGeneve serializes g with correct IP lengths and checksum, UDP length,
// and a UDP checksum of 0, as the LB sends it.
func BuildGeneve(t testing.TB, g Geneve) []byte {
	t.Helper()
	if g.SrcMAC == nil {
		g.SrcMAC = LBMAC
	}
	if g.DstMAC == nil {
		g.DstMAC = ClientMAC
	}
	if g.Header == nil {
		g.Header = GeneveHeader(g.VIP)
	}
	eth := &layers.Ethernet{SrcMAC: g.SrcMAC, DstMAC: g.DstMAC}
	var outer gopacket.SerializableLayer
	if g.Src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		outer = &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, Flags: layers.IPv4DontFragment,
			SrcIP: g.Src.AsSlice(), DstIP: g.Dst.AsSlice()}
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		outer = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: g.Src.AsSlice(), DstIP: g.Dst.AsSlice()}
	}
	udp := make([]byte, 8, 8+len(g.Header)+len(g.Inner))
	binary.BigEndian.PutUint16(udp[0:], g.SrcPort)
	binary.BigEndian.PutUint16(udp[2:], GenevePort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(g.Header)+len(g.Inner)))
	udp = append(append(udp, g.Header...), g.Inner...)
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, outer, gopacket.Payload(udp)); err != nil {
		t.Fatalf("build Geneve frame: %v", err)
	}
	return buf.Bytes()
}

// IPv4Opt returns the IPv4 option of the opt dispatch naming vip (an IPv4
// address): type, length 8, the port and the address.
func IPv4Opt(vip netip.AddrPort) layers.IPv4Option {
	data := make([]byte, 6)
	binary.BigEndian.PutUint16(data, vip.Port())
	a := vip.Addr().Unmap().As4()
	copy(data[2:], a[:])
	return layers.IPv4Option{OptionType: IPv4OptType, OptionLength: 8, OptionData: data}
}

// IPv6DstOpt returns the destination-options header of the opt dispatch
// naming vip: a 2-byte PadN, then the option (type, length 18, the port and
// the address); 24 bytes in all.
func IPv6DstOpt(vip netip.AddrPort) Ext {
	body := make([]byte, 22)
	body[0], body[1] = 1, 0 // PadN of two bytes
	body[2], body[3] = IPv6OptType, 18
	binary.BigEndian.PutUint16(body[4:], vip.Port())
	a := vip.Addr().As16()
	copy(body[6:], a[:])
	return Ext{Type: layers.IPProtocolIPv6Destination, Body: body}
}
