// SPDX-License-Identifier: Apache-2.0

// Package pkttest builds and decodes packets for the datapath's tests and
// benchmarks, so that tests describe packets by their fields instead of hex
// blobs, and check outputs field by field.
package pkttest

import (
	"net"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Packet describes a client packet to build.
type Packet struct {
	SrcMAC, DstMAC net.HardwareAddr
	// VLAN, when non-zero, adds an 802.1Q tag with this id.
	VLAN uint16
	Src  netip.AddrPort
	Dst  netip.AddrPort
	// Proto is layers.IPProtocolTCP (the default), IPProtocolUDP, or
	// IPProtocolICMPv4 / IPProtocolICMPv6 for an echo request (ports unused).
	Proto layers.IPProtocol
	// TCP flags.
	SYN, ACK, FIN, RST bool
	Payload            []byte
	TTL                uint8 // 0: 64
	TOS                uint8
	DF                 bool
	ID                 uint16
	// MF and FragOffset (in 8-byte units) make an IPv4 fragment.
	MF         bool
	FragOffset uint16
	// IPv4Options are appended to the IPv4 header (padded to 4 bytes).
	IPv4Options []layers.IPv4Option
	// IPv6Ext are extension headers placed between the IPv6 header and L4,
	// each given as (next-header type, body bytes after the two-byte prefix).
	IPv6Ext []Ext
	// FlowLabel for IPv6.
	FlowLabel uint32
}

// Ext is one IPv6 extension header: Type is its own protocol number (0 hop-
// by-hop, 43 routing, 60 destination options, 44 fragment); Body is what
// follows the next-header and length bytes (6 bytes, or 6 + n*8).
type Ext struct {
	Type layers.IPProtocol
	Body []byte
}

// Default MACs for test packets.
var (
	ClientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	LBMAC     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

// TB is what Build needs from a test; benchmarks outside `go test` pass
// their own.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Build serializes p with correct lengths and checksums.
func Build(t TB, p Packet) []byte {
	t.Helper()
	b, err := build(p)
	if err != nil {
		t.Fatalf("build packet: %v", err)
	}
	return b
}

func build(p Packet) ([]byte, error) {
	if p.SrcMAC == nil {
		p.SrcMAC = ClientMAC
	}
	if p.DstMAC == nil {
		p.DstMAC = LBMAC
	}
	if p.TTL == 0 {
		p.TTL = 64
	}
	if p.Proto == 0 {
		p.Proto = layers.IPProtocolTCP
	}
	v6 := p.Src.Addr().Is6()
	eth := &layers.Ethernet{SrcMAC: p.SrcMAC, DstMAC: p.DstMAC, EthernetType: layers.EthernetTypeIPv4}
	if v6 {
		eth.EthernetType = layers.EthernetTypeIPv6
	}
	var ls []gopacket.SerializableLayer
	if p.VLAN != 0 {
		dot1q := &layers.Dot1Q{VLANIdentifier: p.VLAN, Type: eth.EthernetType}
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, eth, dot1q)
	} else {
		ls = append(ls, eth)
	}

	var netLayer gopacket.NetworkLayer
	if v6 {
		ip6 := &layers.IPv6{
			Version: 6, TrafficClass: p.TOS, FlowLabel: p.FlowLabel, HopLimit: p.TTL,
			SrcIP: net.IP(p.Src.Addr().AsSlice()), DstIP: net.IP(p.Dst.Addr().AsSlice()),
			NextHeader: p.Proto,
		}
		netLayer = ip6
		ls = append(ls, ip6)
		if len(p.IPv6Ext) > 0 {
			ip6.NextHeader = p.IPv6Ext[0].Type
			for i, e := range p.IPv6Ext {
				next := p.Proto
				if i+1 < len(p.IPv6Ext) {
					next = p.IPv6Ext[i+1].Type
				}
				ls = append(ls, rawExt{next: next, ah: e.Type == layers.IPProtocolAH, body: e.Body})
			}
		}
	} else {
		ip4 := &layers.IPv4{
			Version: 4, TOS: p.TOS, TTL: p.TTL, Id: p.ID, Protocol: p.Proto,
			SrcIP: net.IP(p.Src.Addr().AsSlice()), DstIP: net.IP(p.Dst.Addr().AsSlice()),
			Options: p.IPv4Options,
		}
		if p.DF {
			ip4.Flags |= layers.IPv4DontFragment
		}
		if p.MF {
			ip4.Flags |= layers.IPv4MoreFragments
		}
		ip4.FragOffset = p.FragOffset
		netLayer = ip4
		ls = append(ls, ip4)
	}
	switch p.Proto {
	case layers.IPProtocolTCP:
		tcp := &layers.TCP{
			SrcPort: layers.TCPPort(p.Src.Port()), DstPort: layers.TCPPort(p.Dst.Port()),
			SYN: p.SYN, ACK: p.ACK, FIN: p.FIN, RST: p.RST, Window: 65535, Seq: 1000,
		}
		if p.ACK {
			tcp.Ack = 2000
		}
		_ = tcp.SetNetworkLayerForChecksum(netLayer)
		ls = append(ls, tcp)
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.Src.Port()), DstPort: layers.UDPPort(p.Dst.Port())}
		_ = udp.SetNetworkLayerForChecksum(netLayer)
		ls = append(ls, udp)
	case layers.IPProtocolICMPv4:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1})
	case layers.IPProtocolICMPv6:
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
		_ = icmp.SetNetworkLayerForChecksum(netLayer)
		ls = append(ls, icmp, &layers.ICMPv6Echo{Identifier: 1, SeqNumber: 1})
	}
	ls = append(ls, gopacket.Payload(p.Payload))
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...)
	return buf.Bytes(), err
}

// rawExt serializes one IPv6 extension header with a computed length.
type rawExt struct {
	next layers.IPProtocol
	// ah: an authentication header, whose length counts 4-byte words
	// less 2 (RFC 4302) rather than 8-byte words less 1.
	ah   bool
	body []byte
}

func (r rawExt) LayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

func (r rawExt) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	n := 2 + len(r.body)
	out, err := b.PrependBytes(n)
	if err != nil {
		return err
	}
	out[0] = byte(r.next)
	out[1] = byte((n - 8) / 8)
	if r.ah {
		out[1] = byte(n/4 - 2)
	}
	copy(out[2:], r.body)
	return nil
}

// Decoded is a packet decoded for field checks.
type Decoded struct {
	gopacket.Packet
	Eth *layers.Ethernet
	// Outer and inner IP layers: for a plain packet Inner is nil.
	Outer4, Inner4 *layers.IPv4
	Outer6, Inner6 *layers.IPv6
	TCP            *layers.TCP
	UDP            *layers.UDP
}

// Decode parses a frame, including one level of IP-in-IP.
func Decode(b []byte) *Decoded {
	pkt := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: false})
	d := &Decoded{Packet: pkt}
	for _, l := range pkt.Layers() {
		switch v := l.(type) {
		case *layers.Ethernet:
			d.Eth = v
		case *layers.IPv4:
			if d.Outer4 == nil {
				d.Outer4 = v
			} else {
				d.Inner4 = v
			}
		case *layers.IPv6:
			if d.Outer6 == nil {
				d.Outer6 = v
			} else {
				d.Inner6 = v
			}
		case *layers.TCP:
			d.TCP = v
		case *layers.UDP:
			d.UDP = v
		}
	}
	return d
}
