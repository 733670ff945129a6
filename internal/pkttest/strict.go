// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// The strict checker: whether a Linux receiver (the LB's own stack or a
// backend's) would accept a frame, written from the kernel's receive rules
// (ip_rcv, ip_options_compile, ipv6_rcv, ip6_parse_tlv, ipv6_rthdr_rcv,
// tcp_v4_rcv / udp_rcv, icmp_rcv) and the RFCs, with no code shared with the
// datapath's C parser. The datapath's fuzzer uses it as its oracle: what the
// datapath forwards must pass it, before and after the rewrite.
//
// Where the kernel's verdict depends on configuration, the checker takes the
// defaults of a box that is not a router for source routes and has no
// segment routing, CIPSO or jumbogram setup (IPsec headers are walked, not
// refused: the backend may hold the security association). It is deliberately not
// stricter than the kernel anywhere else: TCP options and L4 checksums are
// the endpoints' business (the kernel drops a bad checksum at delivery,
// which harms nobody), so they are reported (Strict.L4SumOK) but not errors.

// Strict is a frame the checker accepted.
type Strict struct {
	// L3 is the frame offset of the IP header; VLANs counts the 802.1Q /
	// 802.1ad tags before it.
	L3, VLANs int
	// Family is 4 or 6.
	Family int
	// IPLen is the IP packet's length as its header states it.
	IPLen int
	// L4 is the frame offset of the transport header (after IPv4 options
	// or IPv6 extension headers), Proto its protocol and L4HLen its length
	// (TCP: the data offset; UDP 8; ICMP 8).
	L4, L4HLen int
	Proto      uint8
	// Trailing counts the bytes after the IP packet.
	Trailing int
	// TTL is the IPv4 TTL or the IPv6 hop limit.
	TTL uint8
	// L4SumOK says the TCP or UDP checksum is right (an IPv4 UDP checksum
	// of 0, none, counts as right). ICMP checksums are checked, not
	// reported: a wrong one is an error.
	L4SumOK bool
	// ICMPError says the packet is an ICMP or ICMPv6 error message.
	ICMPError bool
	// Inner is the encapsulated packet (IP-in-IP, IPv6-in-IPv6, Geneve)
	// when the frame was checked with Decap; its offsets are the frame's.
	Inner *Strict
	// Geneve is set when Inner came out of a Geneve header.
	Geneve bool
}

// Innermost is s, or the packet s encapsulates.
func (s *Strict) Innermost() *Strict {
	for s.Inner != nil {
		s = s.Inner
	}
	return s
}

// StrictMode says what the checker expects of a frame.
type StrictMode struct {
	// Decap checks an encapsulated packet as well (protocols 4 and 41,
	// UDP to GenevePort): the LB's outputs. Without it, such a packet is
	// checked up to its outer L4.
	Decap bool
	// NoTrailing refuses bytes after the IP packet: the LB trims them from
	// everything it sends.
	NoTrailing bool
}

// StrictError is what the checker refuses, with the rule it broke: a
// short stable name (such as "ipv4-options" or "ipv6-padding") by which a
// fuzzer run can be told to tolerate a finding already reported.
type StrictError struct {
	Rule string
	Msg  string
}

func (e *StrictError) Error() string { return e.Msg }

func bad(rule, format string, args ...any) error {
	return &StrictError{Rule: rule, Msg: fmt.Sprintf(format, args...)}
}

// StrictRule is the rule err (from CheckStrict) broke, or "".
func StrictRule(err error) string {
	var se *StrictError
	if errors.As(err, &se) {
		return se.Rule
	}
	return ""
}

// IP protocol numbers and IPv4 option types the checker reads (RFC 791,
// RFC 8200, IANA).
const (
	ipProtoICMP   = 1
	ipProtoIPIP   = 4
	ipProtoTCP    = 6
	ipProtoUDP    = 17
	ipProtoIPv6   = 41
	ipProtoICMPv6 = 58
	ipProtoNoNext = 59

	ipoptEnd   = 0
	ipoptNOP   = 1
	ipoptRR    = 7
	ipoptTS    = 0x44
	ipoptLSRR  = 0x83
	ipoptCIPSO = 0x86
	ipoptSSRR  = 0x89
	ipoptRA    = 0x94

	tlvPad1     = 0
	tlvPadN     = 1
	tlvRA       = 5
	tlvCALIPSO  = 7
	tlvIOAM     = 0x31
	tlvJumbo    = 0xc2
	maxTLVCount = 8 // net.ipv6.sysctl max_{hbh,dst}_opts_number default
)

// CheckStrict checks frame and returns what it found, or the first thing a
// receiver would refuse.
func CheckStrict(frame []byte, m StrictMode) (*Strict, error) {
	if len(frame) < 14 {
		return nil, bad("ethernet", "Ethernet: %d-byte frame", len(frame))
	}
	off, vlans := 12, 0
	etype := binary.BigEndian.Uint16(frame[off:])
	for etype == etherTypeVLAN || etype == etherTypeQinQ {
		off += 4
		vlans++
		if len(frame) < off+2 {
			return nil, bad("ethernet", "Ethernet: frame ends inside a VLAN tag")
		}
		etype = binary.BigEndian.Uint16(frame[off:])
	}
	var s *Strict
	var err error
	switch etype {
	case etherTypeIPv4:
		s, err = checkIPv4(frame, off+2, len(frame), m, 0)
	case etherTypeIPv6:
		s, err = checkIPv6(frame, off+2, len(frame), m, 0)
	default:
		return nil, bad("not-ip", "Ethernet: ethertype %#04x is not IP", etype)
	}
	if err != nil {
		return nil, err
	}
	s.VLANs = vlans
	return s, nil
}

// checkIPv4 checks the IPv4 packet at frame[l3:end].
func checkIPv4(frame []byte, l3, end int, m StrictMode, depth int) (*Strict, error) {
	b := frame[l3:end]
	if len(b) < 20 {
		return nil, bad("ipv4-header", "IPv4: %d bytes, shorter than a header", len(b))
	}
	if v := b[0] >> 4; v != 4 {
		return nil, bad("ipv4-header", "IPv4: version %d", v)
	}
	hlen := int(b[0]&0x0f) * 4
	if hlen < 20 {
		return nil, bad("ipv4-header", "IPv4: IHL %d", hlen/4)
	}
	if hlen > len(b) {
		return nil, bad("ipv4-header", "IPv4: IHL %d past the %d bytes there", hlen/4, len(b))
	}
	tot := int(binary.BigEndian.Uint16(b[2:]))
	if tot < hlen || tot > len(b) {
		return nil, bad("ipv4-header", "IPv4: total length %d, header %d, %d bytes there", tot, hlen, len(b))
	}
	if fold(sum16(0, b[:hlen])) != 0xffff {
		return nil, bad("ipv4-checksum", "IPv4: header checksum %#04x wrong (want %#04x)", binary.BigEndian.Uint16(b[10:]), IPv4Checksum(b[:hlen]))
	}
	if src := netip.AddrFrom4([4]byte(b[12:16])); martian(src) {
		return nil, bad("martian-source", "IPv4: martian source %s", src)
	}
	if err := checkIPv4Options(b[20:hlen]); err != nil {
		return nil, fmt.Errorf("IPv4 options: %w", err)
	}
	if frag := binary.BigEndian.Uint16(b[6:]); frag&0x3fff != 0 {
		return nil, bad("fragment", "IPv4: fragment (flags/offset %#04x)", frag)
	}
	s := &Strict{L3: l3, Family: 4, IPLen: tot, L4: l3 + hlen, Proto: b[9], TTL: b[8], Trailing: len(b) - tot}
	if err := checkTail(frame, s, m, depth); err != nil {
		return nil, err
	}
	return s, nil
}

// martian says whether a receiver drops, or a router refuses to forward, a
// packet from src whatever its routes: IPv4 from 0/8, loopback, multicast
// or the limited broadcast (ip_route_input_slow's martian sources), IPv6
// from loopback or multicast (ipv6_rcv, RFC 4291), the unspecified
// address, link-local (ip6_forward) or v4-mapped (RFC 4291 2.5.5.2).
func martian(src netip.Addr) bool {
	if src.Is4() {
		a := src.As4()
		return a[0] == 0 || src.IsLoopback() || src.IsMulticast() || a == [4]byte{255, 255, 255, 255}
	}
	return src.IsLoopback() || src.IsMulticast() || src.IsUnspecified() || src.IsLinkLocalUnicast() || src.Is4In6()
}

// Martian is martian for tests that build clients: a source the datapath
// refuses whatever its services.
func Martian(src netip.Addr) bool { return martian(src) }

// checkIPv4Options walks opts (the header bytes after the first 20) as
// ip_options_compile does for a received packet, then refuses what
// ip_rcv_options refuses by default (source routes) and CIPSO, which needs
// a configured DOI.
func checkIPv4Options(opts []byte) error {
	var rr, ts bool
	for i := 0; i < len(opts); {
		typ := opts[i]
		if typ == ipoptEnd {
			return nil
		}
		if typ == ipoptNOP {
			i++
			continue
		}
		if len(opts)-i < 2 {
			return bad("ipv4-options", "option %#02x at %d has no length byte", typ, i)
		}
		l := int(opts[i+1])
		if l < 2 || l > len(opts)-i {
			return bad("ipv4-options", "option %#02x at %d: length %d, %d bytes left", typ, i, l, len(opts)-i)
		}
		o := opts[i : i+l]
		switch typ {
		case ipoptLSRR, ipoptSSRR:
			return bad("ipv4-source-route", "source route option %#02x (refused: accept_source_route=0)", typ)
		case ipoptCIPSO:
			return bad("ipv4-cipso", "CIPSO option (no DOI configured)")
		case ipoptRR:
			if rr {
				return bad("ipv4-options", "record route twice")
			}
			rr = true
			if l < 3 || o[2] < 4 {
				return bad("ipv4-options", "record route: length %d pointer %d", l, ptrOf(o))
			}
			if ptr := int(o[2]); ptr <= l && ptr+3 > l {
				return bad("ipv4-options", "record route: pointer %d leaves no slot in %d bytes", ptr, l)
			}
		case ipoptTS:
			if ts {
				return bad("ipv4-options", "timestamp twice")
			}
			ts = true
			if l < 4 || o[2] < 5 {
				return bad("ipv4-options", "timestamp: length %d pointer %d", l, ptrOf(o))
			}
			ptr, flags := int(o[2]), o[3]&0x0f
			if ptr <= l {
				if ptr+3 > l {
					return bad("ipv4-options", "timestamp: pointer %d leaves no slot in %d bytes", ptr, l)
				}
				if (flags == 1 || flags == 3) && ptr+7 > l {
					return bad("ipv4-options", "timestamp flags %d: pointer %d leaves no address+time slot in %d bytes", flags, ptr, l)
				}
			} else if flags != 3 && o[3]>>4 == 15 {
				return bad("ipv4-ts-overflow", "timestamp full and its overflow count at 15")
			}
		case ipoptRA:
			if l < 4 {
				return bad("ipv4-options", "router alert of length %d", l)
			}
		}
		i += l
	}
	return nil
}

func ptrOf(o []byte) int {
	if len(o) < 3 {
		return -1
	}
	return int(o[2])
}

// checkIPv6 checks the IPv6 packet at frame[l3:end].
func checkIPv6(frame []byte, l3, end int, m StrictMode, depth int) (*Strict, error) {
	b := frame[l3:end]
	if len(b) < 40 {
		return nil, bad("ipv6-header", "IPv6: %d bytes, shorter than a header", len(b))
	}
	if v := b[0] >> 4; v != 6 {
		return nil, bad("ipv6-header", "IPv6: version %d", v)
	}
	plen := int(binary.BigEndian.Uint16(b[4:]))
	if plen == 0 {
		return nil, bad("ipv6-header", "IPv6: payload length 0 (a jumbogram)")
	}
	if 40+plen > len(b) {
		return nil, bad("ipv6-header", "IPv6: payload length %d past the %d bytes there", plen, len(b)-40)
	}
	ip := b[:40+plen]
	if src := netip.AddrFrom16([16]byte(ip[8:24])); martian(src) {
		return nil, bad("martian-source", "IPv6: martian source %s", src)
	}
	next, pos := ip[6], 40
	for i := 0; ; i++ {
		var hl int
		switch next {
		case protoHopOpts, protoDstOpts, protoRouting:
			if pos+8 > len(ip) {
				return nil, bad("ipv6-header", "IPv6: extension header %d at %d past the payload", next, pos)
			}
			hl = (int(ip[pos+1]) + 1) * 8
		case protoFragment:
			hl = 8
		case protoAH:
			// Whether the receiver has its security association is
			// configuration, not syntax: only the length is checked.
			if pos+8 > len(ip) {
				return nil, bad("ipv6-header", "IPv6: AH at %d past the payload", pos)
			}
			// Its 12 fixed bytes at least (RFC 4302 2.2).
			if ip[pos+1] < 1 {
				return nil, bad("ipv6-ah-short", "IPv6: AH of %d bytes, shorter than its fixed 12", (int(ip[pos+1])+2)*4)
			}
			hl = (int(ip[pos+1]) + 2) * 4
		default:
			s := &Strict{L3: l3, Family: 6, IPLen: 40 + plen, L4: l3 + pos, Proto: next, TTL: ip[7], Trailing: len(b) - len(ip)}
			if err := checkTail(frame, s, m, depth); err != nil {
				return nil, err
			}
			return s, nil
		}
		if pos+hl > len(ip) {
			return nil, bad("ipv6-header", "IPv6: extension header %d at %d: %d bytes, %d left", next, pos, hl, len(ip)-pos)
		}
		h := ip[pos : pos+hl]
		switch next {
		case protoHopOpts:
			if i != 0 {
				return nil, bad("ipv6-ext-order", "IPv6: hop-by-hop options as header %d, not first", i+1)
			}
			if err := checkTLVs(h, true); err != nil {
				return nil, fmt.Errorf("IPv6 hop-by-hop options: %w", err)
			}
		case protoDstOpts:
			if err := checkTLVs(h, false); err != nil {
				return nil, fmt.Errorf("IPv6 destination options: %w", err)
			}
		case protoRouting:
			switch typ, left := h[2], h[3]; {
			case typ == 3 || typ == 4:
				return nil, bad("ipv6-routing-type", "IPv6: routing header type %d (RPL / segment routing, off by default)", typ)
			case typ == 2:
				// ipv6_rthdr_rcv discards a type 2 header it did not
				// process itself (Mobile IPv6).
				return nil, bad("ipv6-routing-type", "IPv6: routing header type 2 (Mobile IPv6)")
			case left != 0:
				return nil, bad("ipv6-routing", "IPv6: routing header with %d segments left", left)
			}
		case protoFragment:
			if fo := binary.BigEndian.Uint16(h[2:]); fo&0xfff9 != 0 {
				return nil, bad("fragment", "IPv6: fragment (offset/flags %#04x)", fo)
			}
		}
		next = h[0]
		pos += hl
	}
}

// checkTLVs walks the options of a hop-by-hop or destination-options
// header h as ip6_parse_tlv does: padding runs of at most 7 bytes, PadN
// bytes all zero, at most maxTLVCount other options, each inside the header;
// an unknown option whose type does not say "skip" makes the packet
// dropped, and so do the known ones the kernel validates when they are
// malformed (router alert, CALIPSO, a misaligned IOAM) or unsupported
// (jumbo payload).
func checkTLVs(h []byte, hopByHop bool) error {
	padlen, count := 0, 0
	for i := 2; i < len(h); {
		typ := h[i]
		if typ == tlvPad1 {
			padlen++
			if padlen > 7 {
				return bad("ipv6-padding", "more than 7 bytes of padding in a row at %d", i)
			}
			i++
			continue
		}
		if len(h)-i < 2 {
			return bad("ipv6-tlv", "option %#02x at %d has no length byte", typ, i)
		}
		ol := int(h[i+1]) + 2
		if ol > len(h)-i {
			return bad("ipv6-tlv", "option %#02x at %d: %d bytes, %d left", typ, i, ol, len(h)-i)
		}
		o := h[i : i+ol]
		if typ == tlvPadN {
			padlen += ol
			if padlen > 7 {
				return bad("ipv6-padding", "more than 7 bytes of padding in a row at %d", i)
			}
			for _, c := range o[2:] {
				if c != 0 {
					return bad("ipv6-padding", "PadN at %d carries a non-zero byte", i)
				}
			}
			i += ol
			continue
		}
		padlen = 0
		count++
		if count > maxTLVCount {
			return bad("ipv6-tlv-count", "more than %d options", maxTLVCount)
		}
		switch {
		case hopByHop && typ == tlvRA:
			if ol != 4 {
				return bad("ipv6-tlv-known", "router alert of length %d", ol-2)
			}
		case hopByHop && typ == tlvIOAM:
			// ipv6_hop_ioam drops a misaligned one, enabled or not;
			// the hop-by-hop header is always 40 bytes in.
			if i%4 != 0 {
				return bad("ipv6-tlv-known", "IOAM option at %d, not 4n-aligned", 40+i)
			}
		case hopByHop && typ == tlvJumbo:
			return bad("ipv6-tlv-known", "jumbo payload option")
		case hopByHop && typ == tlvCALIPSO:
			if o[1] < 8 || int(o[6])*4+8 > int(o[1]) {
				return bad("ipv6-tlv-known", "CALIPSO option of length %d", o[1])
			}
		case typ>>6 != 0:
			return bad("ipv6-tlv", "option %#02x: unknown, and its type says discard", typ)
		}
		i += ol
	}
	return nil
}

// checkTail checks what follows the IP header(s) of s: the transport
// header, an encapsulated packet, and trailing bytes.
func checkTail(frame []byte, s *Strict, m StrictMode, depth int) error {
	if m.NoTrailing && s.Trailing != 0 {
		return bad("trailing", "IPv%d: %d bytes after the packet", s.Family, s.Trailing)
	}
	seg := frame[s.L4 : s.L3+s.IPLen]
	switch s.Proto {
	case ipProtoTCP:
		if len(seg) < 20 {
			return bad("tcp-header", "TCP: %d bytes, shorter than a header", len(seg))
		}
		doff := int(seg[12]>>4) * 4
		if doff < 20 || doff > len(seg) {
			return bad("tcp-header", "TCP: data offset %d in a %d-byte segment", doff/4, len(seg))
		}
		s.L4HLen = doff
		s.L4SumOK = transportSum(frame, s, seg) == 0xffff
	case ipProtoUDP:
		if len(seg) < 8 {
			return bad("udp-length", "UDP: %d bytes, shorter than a header", len(seg))
		}
		if ul := int(binary.BigEndian.Uint16(seg[4:])); ul != len(seg) {
			return bad("udp-length", "UDP: length %d, the IP payload is %d", ul, len(seg))
		}
		s.L4HLen = 8
		s.L4SumOK = s.Family == 4 && binary.BigEndian.Uint16(seg[6:]) == 0 || transportSum(frame, s, seg) == 0xffff
		if m.Decap && depth == 0 && binary.BigEndian.Uint16(seg[2:]) == GenevePort {
			return checkGeneve(frame, s, m)
		}
	case ipProtoICMP, ipProtoICMPv6:
		return checkICMP(frame, s, seg)
	case ipProtoIPIP, ipProtoIPv6:
		if !m.Decap {
			return nil
		}
		if depth > 0 {
			return bad("tunnel", "tunnel inside a tunnel")
		}
		inner := m
		inner.NoTrailing = true
		var err error
		if s.Proto == ipProtoIPIP {
			s.Inner, err = checkIPv4(frame, s.L4, s.L3+s.IPLen, inner, depth+1)
		} else {
			s.Inner, err = checkIPv6(frame, s.L4, s.L3+s.IPLen, inner, depth+1)
		}
		if err != nil {
			return fmt.Errorf("inner packet: %w", err)
		}
	case ipProtoNoNext:
		return bad("ipv6-header", "IPv6: no next header")
	}
	return nil
}

// transportSum is the one's-complement sum over the pseudo-header and seg,
// 0xffff when the carried checksum is right.
func transportSum(frame []byte, s *Strict, seg []byte) uint16 {
	ip := frame[s.L3:]
	var sum uint32
	if s.Family == 4 {
		sum = sum16(0, ip[12:20])
	} else {
		sum = sum16(0, ip[8:40])
	}
	sum += uint32(s.Proto) + uint32(len(seg))
	return fold(sum16(sum, seg))
}

// checkICMP checks an ICMP or ICMPv6 message: its checksum, and for an
// error, that it quotes at least the offending packet's IP header and 8
// bytes after it, as icmp_rcv / icmpv6_notify need to match it.
func checkICMP(frame []byte, s *Strict, seg []byte) error {
	name := "ICMP"
	if s.Proto == ipProtoICMPv6 {
		name = "ICMPv6"
	}
	if len(seg) < 8 {
		return bad("icmp-header", "%s: %d bytes, shorter than a header", name, len(seg))
	}
	s.L4HLen = 8
	var sum uint16
	if s.Proto == ipProtoICMPv6 {
		sum = transportSum(frame, s, seg)
	} else {
		sum = fold(sum16(0, seg))
	}
	if sum != 0xffff {
		return bad("icmp-checksum", "%s: checksum %#04x wrong", name, binary.BigEndian.Uint16(seg[2:]))
	}
	typ, quote := seg[0], seg[8:]
	if s.Proto == ipProtoICMP {
		switch typ {
		case 3, 4, 5, 11, 12:
		default:
			return nil
		}
		s.ICMPError = true
		if len(quote) < 20 || quote[0]>>4 != 4 || int(quote[0]&0x0f) < 5 || len(quote) < int(quote[0]&0x0f)*4+8 {
			return bad("icmp-quote", "ICMP error type %d: quote of %d bytes is not an IPv4 header and 8 bytes", typ, len(quote))
		}
		return nil
	}
	if typ < 1 || typ > 4 {
		return nil
	}
	s.ICMPError = true
	if len(quote) < 48 || quote[0]>>4 != 6 {
		return bad("icmp-quote", "ICMPv6 error type %d: quote of %d bytes is not an IPv6 header and 8 bytes", typ, len(quote))
	}
	return nil
}

// checkGeneve checks the Geneve header after s's UDP header (RFC 8926):
// version 0, options that fit it, a protocol that is the inner packet's,
// and the inner packet itself.
func checkGeneve(frame []byte, s *Strict, m StrictMode) error {
	at := s.L4 + 8
	end := s.L3 + s.IPLen
	if at+8 > end {
		return bad("geneve", "Geneve: %d bytes, shorter than a header", end-at)
	}
	g := frame[at:end]
	if v := g[0] >> 6; v != 0 {
		return bad("geneve", "Geneve: version %d", v)
	}
	hl := 8 + int(g[0]&0x3f)*4
	if hl > len(g) {
		return bad("geneve", "Geneve: %d bytes of header, %d there", hl, len(g))
	}
	for i := 8; i < hl; {
		if i+4 > hl {
			return bad("geneve", "Geneve: option at %d cut short", i)
		}
		i += 4 + int(g[i+3]&0x1f)*4
		if i > hl {
			return bad("geneve", "Geneve: option past the options' length %d", hl)
		}
	}
	inner := m
	inner.NoTrailing = true
	var err error
	switch proto := binary.BigEndian.Uint16(g[2:]); proto {
	case etherTypeIPv4:
		s.Inner, err = checkIPv4(frame, at+hl, end, inner, 1)
	case etherTypeIPv6:
		s.Inner, err = checkIPv6(frame, at+hl, end, inner, 1)
	default:
		return bad("geneve", "Geneve: protocol %#04x", proto)
	}
	if err != nil {
		return fmt.Errorf("Geneve inner packet: %w", err)
	}
	s.Geneve = true
	return nil
}
