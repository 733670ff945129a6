// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"encoding/binary"
	"fmt"

	"github.com/gopacket/gopacket/layers"
)

// sum16 adds b to sum as big-endian 16-bit words (RFC 1071), an odd last
// byte padded with a zero.
func sum16(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

// fold reduces a one's-complement sum to 16 bits.
func fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// l4Field locates the TCP or UDP checksum of frame and returns its frame
// offset with the layout.
func l4Field(frame []byte) (Layout, int, error) {
	l, err := LayoutOf(frame)
	if err != nil {
		return l, 0, err
	}
	end := l.L3 + l.L3Len
	if end > len(frame) || l.L4 > end {
		return l, 0, fmt.Errorf("IP packet of %d bytes (L4 at %d) does not fit a %d-byte frame", l.L3Len, l.L4-l.L3, len(frame)-l.L3)
	}
	if l.Family == 4 && binary.BigEndian.Uint16(frame[l.L3+6:])&0x3fff != 0 {
		return l, 0, fmt.Errorf("IPv4 fragment: its L4 checksum covers bytes it does not carry")
	}
	var field int
	switch l.Proto {
	case layers.IPProtocolTCP:
		field = l.L4 + 16
	case layers.IPProtocolUDP:
		field = l.L4 + 6
	default:
		return l, 0, fmt.Errorf("protocol %s is not TCP or UDP", l.Proto)
	}
	if field+2 > end {
		return l, 0, fmt.Errorf("%s header cut short", l.Proto)
	}
	return l, field, nil
}

// L4Checksum computes from scratch the TCP or UDP checksum that frame's L4
// header should carry: over the pseudo-header (addresses, protocol, L4
// length) and the whole segment, the carried checksum taken as zero. A UDP
// sum that comes out zero is returned as 0xffff, as senders transmit it.
// IPv6 extension headers are skipped; a routing header's final destination
// is not looked up.
func L4Checksum(frame []byte) (uint16, error) {
	l, field, err := l4Field(frame)
	if err != nil {
		return 0, err
	}
	ip := frame[l.L3 : l.L3+l.L3Len]
	seg := frame[l.L4 : l.L3+l.L3Len]
	var sum uint32
	if l.Family == 4 {
		sum = sum16(sum, ip[12:20])
	} else {
		sum = sum16(sum, ip[8:40])
	}
	sum += uint32(l.Proto) + uint32(len(seg))
	at := field - l.L4
	sum = sum16(sum, seg[:at])
	sum = sum16(sum, seg[at+2:])
	c := ^fold(sum)
	if c == 0 && l.Proto == layers.IPProtocolUDP {
		c = 0xffff
	}
	return c, nil
}

// L4ChecksumValid recomputes frame's TCP or UDP checksum and compares it
// with the one carried. An IPv4 UDP checksum of 0 means none was computed
// and is valid; for IPv6 it is not (RFC 8200). For TCP, 0x0000 and 0xffff
// are the same one's-complement number, so either is valid where the other
// is computed.
func L4ChecksumValid(frame []byte) (ok bool, carried, computed uint16, err error) {
	l, field, err := l4Field(frame)
	if err != nil {
		return false, 0, 0, err
	}
	carried = binary.BigEndian.Uint16(frame[field:])
	computed, err = L4Checksum(frame)
	if err != nil {
		return false, carried, 0, err
	}
	switch {
	case carried == computed:
		return true, carried, computed, nil
	case l.Proto == layers.IPProtocolUDP && carried == 0:
		return l.Family == 4, carried, computed, nil
	case l.Proto == layers.IPProtocolTCP && carried^computed == 0xffff && (carried == 0 || computed == 0):
		return true, carried, computed, nil
	}
	return false, carried, computed, nil
}
