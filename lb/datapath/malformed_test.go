// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
)

// malformedEnv programs a TCP and a UDP frontend on both VIPs.
func malformedEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	var svcs []lb.Service
	for _, fam := range families {
		svcs = append(svcs,
			dsrService("web-"+fam.name, fam.vip, 80, lb.TCP, fam.backends[:3]...),
			dsrService("dns-"+fam.name, fam.vip, 53, lb.UDP, fam.backends[:3]...))
	}
	e.reconcile(t, svcs...)
	return e
}

// vipPacket is a well-formed packet with a 16-byte payload to a frontend of
// malformedEnv.
func vipPacket(fam family, proto layers.IPProtocol) pkttest.Packet {
	port := uint16(80)
	if proto == layers.IPProtocolUDP {
		port = 53
	}
	return pkttest.Packet{
		Src:     netip.AddrPortFrom(fam.client, 40000),
		Dst:     netip.AddrPortFrom(fam.vip, port),
		Proto:   proto,
		ACK:     proto == layers.IPProtocolTCP,
		Payload: []byte("0123456789abcdef"),
	}
}

// patch returns a copy of frame changed by fn; an IPv4 header checksum is
// fixed afterwards, so that only the field fn means to break is wrong.
func patch(t testing.TB, frame []byte, fn func(b []byte, l pkttest.Layout)) []byte {
	t.Helper()
	b := bytes.Clone(frame)
	l := pkttest.MustLayout(t, b)
	fn(b, l)
	if l.Family == 4 {
		pkttest.FixIPv4Checksum(b, l)
	}
	return b
}

func put16(b []byte, off int, v uint16) { binary.BigEndian.PutUint16(b[off:], v) }

// TestTruncated cuts TCP and UDP packets to a VIP at every length from the
// Ethernet header to one byte short of the IP packet: none may be
// forwarded, and each is passed untouched as malformed.
func TestTruncated(t *testing.T) {
	e := malformedEnv(t)
	for _, fam := range families {
		for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			t.Run(fmt.Sprintf("%s/%s", fam.name, proto), func(t *testing.T) {
				full := e.frame(t, vipPacket(fam, proto))
				// The whole packet is forwarded; that is what makes
				// the truncated ones' fate meaningful.
				e.checkTX(t, full, e.run(t, full))

				// The kernel refuses test input shorter than an
				// Ethernet header, so cuts start at 14 bytes.
				end := 14 + len(pkttest.IPPacket(t, full))
				var frames [][]byte
				for n := 14; n < end; n++ {
					frames = append(frames, bytes.Clone(full[:n]))
				}
				before := e.reasons(t)
				for i, r := range e.runAll(t, frames) {
					switch r.verdict {
					case xdpPass:
						if !bytes.Equal(r.out, frames[i]) {
							t.Errorf("%d-byte frame passed changed:\n got %x\nwant %x", len(frames[i]), r.out, frames[i])
						}
					case xdpDrop:
					default:
						t.Errorf("%d-byte frame of a %d-byte packet: verdict %s, want XDP_PASS or XDP_DROP",
							len(frames[i]), end, verdictName(r.verdict))
					}
				}
				e.expectReasons(t, before, map[string]uint64{"pass_malformed_l3": uint64(len(frames))})
			})
		}
	}
}

// malformedCase is one broken (or borderline but valid) frame to a VIP.
type malformedCase struct {
	name  string
	frame []byte
	// reason is the counter a passed frame must hit; empty means the
	// frame is well-formed and must be forwarded.
	reason string
}

// TestMalformed checks each header field the parser validates, with the
// reason it must count; borderline valid frames must still be forwarded.
func TestMalformed(t *testing.T) {
	e := malformedEnv(t)
	var tests []malformedCase
	for _, fam := range families {
		for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			good := e.frame(t, vipPacket(fam, proto))
			prefix := fmt.Sprintf("%s/%s/", fam.name, proto)
			for _, c := range l3Cases(t, e, fam, proto, good) {
				c.name = prefix + c.name
				tests = append(tests, c)
			}
			for _, c := range l4Cases(t, proto, good) {
				c.name = prefix + c.name
				tests = append(tests, c)
			}
			vlan := vipPacket(fam, proto)
			vlan.VLAN = 100
			tests = append(tests, malformedCase{name: prefix + "802.1Q tag", frame: e.frame(t, vlan), reason: "pass_vlan"})
			vlan.Dst = netip.AddrPortFrom(fam.vip.Next(), vlan.Dst.Port())
			tests = append(tests, malformedCase{name: prefix + "802.1Q tag, not a VIP", frame: e.frame(t, vlan), reason: "pass_not_service"})
		}
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			in := bytes.Clone(c.frame)
			before := e.reasons(t)
			r := e.run(t, in)
			if c.reason == "" {
				e.checkTX(t, c.frame, r)
				e.expectReasons(t, before, nil)
				return
			}
			if r.verdict != xdpPass {
				t.Errorf("verdict %s, want XDP_PASS", verdictName(r.verdict))
			} else if !bytes.Equal(r.out, c.frame) {
				t.Errorf("frame passed changed:\n got %x\nwant %x", r.out, c.frame)
			}
			e.expectReasons(t, before, map[string]uint64{c.reason: 1})
		})
	}
}

// l3Cases breaks the IP header of good.
func l3Cases(t testing.TB, e *env, fam family, proto layers.IPProtocol, good []byte) []malformedCase {
	l := pkttest.MustLayout(t, good)
	l4len := l.L3Len - (l.L4 - l.L3)
	var cs []malformedCase
	if fam.vip.Is4() {
		for ihl := uint8(0); ihl < 5; ihl++ {
			cs = append(cs, malformedCase{name: fmt.Sprintf("IHL %d", ihl), frame: pkttest.SetIHL(t, good, ihl), reason: "pass_malformed_l3"})
		}
		cs = append(cs,
			malformedCase{name: "version 6 in an IPv4 frame", reason: "pass_malformed_l3",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { b[l.L3] = 0x65 })},
			malformedCase{name: "total length one past the frame", reason: "pass_malformed_l3",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, uint16(len(b)-l.L3+1)) })},
			malformedCase{name: "total length 65535", reason: "pass_malformed_l3",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, 0xffff) })},
			malformedCase{name: "total length below IHL*4", reason: "pass_malformed_l3",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, 19) })},
			malformedCase{name: "total length 0", reason: "pass_malformed_l3",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, 0) })},
			malformedCase{name: "total length cuts the L4 header", reason: "pass_malformed_l4",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, 20+4) })},
			malformedCase{name: "MF set", reason: "pass_fragment",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+6, 0x2000) })},
			malformedCase{name: "fragment offset 1", reason: "pass_fragment",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+6, 0x0001) })},
			malformedCase{name: "DF and the last fragment offset", reason: "pass_fragment",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+6, 0x5fff) })},
			// Bytes after the IP packet are padding, not an error.
			malformedCase{name: "total length shorter than the frame", frame: append(bytes.Clone(good), 1, 2, 3, 4)},
		)
		return cs
	}

	p := vipPacket(fam, proto)
	ext := func(types ...layers.IPProtocol) []byte {
		q := p
		for _, ty := range types {
			q.IPv6Ext = append(q.IPv6Ext, pkttest.Ext{Type: ty, Body: pkttest.PadN(1)})
		}
		return e.frame(t, q)
	}
	const (
		hbh  = layers.IPProtocolIPv6HopByHop
		dst  = layers.IPProtocolIPv6Destination
		frag = layers.IPProtocolIPv6Fragment
	)
	fragment := p
	fragment.IPv6Ext = []pkttest.Ext{{Type: frag, Body: []byte{0, 1, 0, 0, 0, 42}}} // offset 0, MF
	cs = append(cs,
		malformedCase{name: "version 4 in an IPv6 frame", reason: "pass_malformed_l3",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) { b[l.L3] = 0x40 })},
		malformedCase{name: "payload length 0 (jumbogram)", reason: "pass_malformed_l3",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+4, 0) })},
		malformedCase{name: "payload length one past the frame", reason: "pass_malformed_l3",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+4, uint16(len(b)-l.L3-40+1)) })},
		malformedCase{name: "payload length 65535", reason: "pass_malformed_l3",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+4, 0xffff) })},
		malformedCase{name: "payload length cuts the L4 header", reason: "pass_malformed_l4",
			frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+4, 4) })},
		malformedCase{name: "fragment header", frame: e.frame(t, fragment), reason: "pass_fragment"},
		malformedCase{name: "hop-by-hop and destination options", frame: ext(hbh, dst)},
		malformedCase{name: "six extension headers (the walk limit)", frame: ext(hbh, dst, dst, dst, dst, dst)},
		malformedCase{name: "seven extension headers", frame: ext(hbh, dst, dst, dst, dst, dst, dst), reason: "pass_ext_chain"},
		malformedCase{name: "extension header past the payload", reason: "pass_malformed_l3",
			// The destination options header (16 bytes in, after the
			// hop-by-hop one) claims up to 8 bytes more than the
			// payload holds after its start; a trailer keeps them
			// inside the frame, so only the IPv6 length rules it out.
			frame: patch(t, append(ext(hbh, dst), make([]byte, 64)...), func(b []byte, l pkttest.Layout) {
				b[l.L3+40+16+1] = byte((16 + l4len) / 8)
			})},
		malformedCase{name: "extension header past the frame", reason: "pass_malformed_l3",
			frame: patch(t, ext(hbh), func(b []byte, l pkttest.Layout) { b[l.L3+40+1] = 255 })},
	)
	return cs
}

// l4Cases breaks the TCP or UDP header of good.
func l4Cases(t testing.TB, proto layers.IPProtocol, good []byte) []malformedCase {
	l := pkttest.MustLayout(t, good)
	l4len := l.L3Len - (l.L4 - l.L3)
	var cs []malformedCase
	if proto == layers.IPProtocolTCP {
		doff := func(n int) func(b []byte, l pkttest.Layout) {
			return func(b []byte, l pkttest.Layout) { b[l.L4+12] = byte(n<<4) | b[l.L4+12]&0x0f }
		}
		for n := range 5 {
			cs = append(cs, malformedCase{name: fmt.Sprintf("TCP data offset %d", n), frame: patch(t, good, doff(n)), reason: "pass_malformed_l4"})
		}
		cs = append(cs,
			malformedCase{name: "TCP data offset one word past the packet", frame: patch(t, good, doff(l4len/4+1)), reason: "pass_malformed_l4"},
			malformedCase{name: "TCP data offset 15", frame: patch(t, good, doff(15)), reason: "pass_malformed_l4"},
			// Options filling the whole segment are still a valid header.
			malformedCase{name: "TCP data offset up to the packet end", frame: patch(t, good, doff(l4len/4))},
		)
		return cs
	}
	ulen := func(n int) func(b []byte, l pkttest.Layout) {
		return func(b []byte, l pkttest.Layout) { put16(b, l.L4+4, uint16(n)) }
	}
	for n := range 8 {
		cs = append(cs, malformedCase{name: fmt.Sprintf("UDP length %d", n), frame: patch(t, good, ulen(n)), reason: "pass_malformed_l4"})
	}
	cs = append(cs,
		malformedCase{name: "UDP length one past the packet", frame: patch(t, good, ulen(l4len+1)), reason: "pass_malformed_l4"},
		malformedCase{name: "UDP length 65535", frame: patch(t, good, ulen(0xffff)), reason: "pass_malformed_l4"},
	)
	return cs
}
