// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/datapath"
)

// tcxNext is TCX_NEXT (-1) as BPF_PROG_TEST_RUN reports it.
const tcxNext = ^uint32(0)

// Outer addresses of tunnelled test packets: an LB's encapsulation source
// and a backend.
var (
	lbSource4 = netip.MustParseAddr("172.16.1.2")
	lbSource6 = netip.MustParseAddr("100::1:2")
)

// companion is the backend companion loaded unpinned, serving vip4 and vip6.
type companion struct {
	c *datapath.Companion
}

func newCompanion(t *testing.T) *companion {
	t.Helper()
	testnet.RequireRoot(t)
	c, err := datapath.LoadCompanion(datapath.CompanionConfig{MaxFlows: 1024})
	if err != nil {
		t.Fatalf("load companion: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetVIPs([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatalf("set VIPs: %v", err)
	}
	return &companion{c: c}
}

// run runs the tc program once on frame (skb context).
func (c *companion) run(t testing.TB, frame []byte) result {
	t.Helper()
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Repeat: 1}
	v, err := c.c.Program().Run(opts)
	if err != nil {
		t.Fatalf("run companion on a %d-byte frame: %v", len(frame), err)
	}
	return result{verdict: v, out: opts.DataOut}
}

func (c *companion) counters(t testing.TB) map[string]uint64 {
	t.Helper()
	m, err := c.c.Counters()
	if err != nil {
		t.Fatalf("read companion counters: %v", err)
	}
	out := map[string]uint64{}
	for name, rc := range m {
		out[name] = rc.Packets
	}
	return out
}

// expectCounters checks that exactly the counters in want moved since before.
func (c *companion) expectCounters(t testing.TB, before, want map[string]uint64) {
	t.Helper()
	after := c.counters(t)
	for name := range want {
		if _, ok := after[name]; !ok {
			t.Errorf("%q is not a companion counter (have %v)", name, after)
		}
	}
	for name, n := range after {
		if got := n - before[name]; got != want[name] {
			t.Errorf("counter %s: counted %d packets, want %d", name, got, want[name])
		}
	}
}

// clientIP returns the IP packet a client sends to dst.
func clientIP(t testing.TB, dst netip.AddrPort, proto layers.IPProtocol) []byte {
	t.Helper()
	src := client4
	if dst.Addr().Is6() {
		src = client6
	}
	p := pkttest.Packet{Src: netip.AddrPortFrom(src, 40000), Dst: dst, Proto: proto, ACK: proto == layers.IPProtocolTCP, Payload: []byte("payload")}
	return bytes.Clone(pkttest.IPPacket(t, pkttest.Build(t, p)))
}

// tunnel wraps inner as an LB sends it to backend.
func tunnel(t testing.TB, backend netip.Addr, inner []byte) []byte {
	t.Helper()
	src := lbSource4
	if backend.Is6() {
		src = lbSource6
	}
	return pkttest.BuildTunnel(t, pkttest.Tunnel{Src: src, Dst: backend, Inner: inner})
}

// companionCase is one frame and what the companion must do with it.
type companionCase struct {
	name  string
	frame []byte
	// decapTo, when set, is the exact frame expected out; otherwise the
	// frame must come out unchanged.
	decapTo []byte
	reason  string
}

func TestCompanion(t *testing.T) {
	c := newCompanion(t)
	var tests []companionCase
	for _, fam := range families {
		vip := fam.vip
		be := fam.backends[0]
		for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			inner := clientIP(t, netip.AddrPortFrom(vip, 80), proto)
			frame := tunnel(t, be, inner)
			tests = append(tests, companionCase{
				name: fmt.Sprintf("%s/%s to a VIP", fam.name, proto), frame: frame,
				decapTo: append(bytes.Clone(frame[:14]), inner...), reason: "decap_ipip",
			})
		}
		inner := clientIP(t, netip.AddrPortFrom(vip, 80), layers.IPProtocolTCP)
		good := tunnel(t, be, inner)
		other := clientIP(t, netip.AddrPortFrom(vip.Next(), 80), layers.IPProtocolTCP)
		tests = append(tests,
			companionCase{name: fam.name + "/inner destination not a VIP", frame: tunnel(t, be, other), reason: "pass_not_vip"},
			companionCase{name: fam.name + "/plain packet to the VIP", frame: pkttest.Build(t, pkttest.Packet{
				Src: netip.AddrPortFrom(fam.client, 40000), Dst: netip.AddrPortFrom(vip, 80), ACK: true,
			}), reason: "pass_other"},
			companionCase{name: fam.name + "/inner version wrong", reason: "pass_malformed",
				frame: patch(t, good, func(b []byte, l pkttest.Layout) { b[l.L4] ^= 0xf0 })},
		)
		if fam.vip.Is4() {
			padded := clientIP(t, netip.AddrPortFrom(vip, 80), layers.IPProtocolTCP)[:20]
			put16(padded, 2, 20)
			padded[9] = 59 // no next header
			pkttest.FixIPv4Checksum(padded, pkttest.Layout{})
			frame := tunnel(t, be, padded)
			if len(frame) != 60 {
				t.Fatalf("padded tunnel frame is %d bytes, want 60", len(frame))
			}
			withOpts := pkttest.BuildTunnel(t, pkttest.Tunnel{Src: lbSource4, Dst: be, Inner: inner,
				IPv4Options: []layers.IPv4Option{{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}}})
			tests = append(tests,
				companionCase{name: "ipv4/Ethernet padding after the packet", frame: frame,
					decapTo: append(append(bytes.Clone(frame[:14]), padded...), frame[54:]...), reason: "decap_ipip"},
				companionCase{name: "ipv4/outer header with options", frame: withOpts,
					decapTo: append(bytes.Clone(withOpts[:14]), inner...), reason: "decap_ipip"},
				companionCase{name: "ipv4/outer total length one short", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, uint16(l.L3Len-1)) })},
				companionCase{name: "ipv4/outer total length one long", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+2, uint16(l.L3Len+1)) })},
				companionCase{name: "ipv4/inner total length one long", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L4+2, uint16(len(inner)+1)) })},
				companionCase{name: "ipv4/outer fragment", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+6, 0x2000) })},
				companionCase{name: "ipv4/outer IHL 4", reason: "pass_malformed", frame: pkttest.SetIHL(t, good, 4)},
				companionCase{name: "ipv4/ARP", frame: pkttest.BuildARP(t, pkttest.LBMAC, lbSource4, be), reason: "pass_other"},
			)
		} else {
			tests = append(tests,
				companionCase{name: "ipv6/outer version 4", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { b[l.L3] = 0x40 })},
				companionCase{name: "ipv6/outer payload length one short", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+4, uint16(len(inner)-1)) })},
				companionCase{name: "ipv6/outer payload length one long", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L3+4, uint16(len(inner)+1)) })},
				companionCase{name: "ipv6/inner payload length one long", reason: "pass_malformed",
					frame: patch(t, good, func(b []byte, l pkttest.Layout) { put16(b, l.L4+4, uint16(len(inner)-40+1)) })},
			)
		}
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := c.counters(t)
			r := c.run(t, bytes.Clone(tt.frame))
			if r.verdict != tcxNext {
				t.Errorf("verdict %d, want TCX_NEXT", int32(r.verdict))
			}
			want := tt.frame
			if tt.decapTo != nil {
				want = tt.decapTo
			}
			if !bytes.Equal(r.out, want) {
				t.Errorf("output frame:\n got %x\nwant %x", r.out, want)
			}
			c.expectCounters(t, before, map[string]uint64{tt.reason: 1})
		})
	}
}

// TestCompanionTruncated cuts tunnelled packets at every length from the
// end of the outer header to one byte short: none may be decapsulated.
// (BPF_PROG_TEST_RUN refuses skb input with an IP ethertype that is shorter
// than the IP header, so shorter cuts cannot be run.)
func TestCompanionTruncated(t *testing.T) {
	c := newCompanion(t)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			full := tunnel(t, fam.backends[0], clientIP(t, netip.AddrPortFrom(fam.vip, 80), layers.IPProtocolTCP))
			outer := 20
			if fam.vip.Is6() {
				outer = 40
			}
			want := map[string]uint64{}
			before := c.counters(t)
			for n := 14 + outer; n < len(full); n++ {
				in := bytes.Clone(full[:n])
				r := c.run(t, in)
				if r.verdict != tcxNext {
					t.Errorf("%d bytes: verdict %d, want TCX_NEXT", n, int32(r.verdict))
				}
				if !bytes.Equal(r.out, full[:n]) {
					t.Errorf("%d-byte frame of %d changed:\n got %x\nwant %x", n, len(full), r.out, full[:n])
				}
				want["pass_malformed"]++
			}
			c.expectCounters(t, before, want)
		})
	}
}
