// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
)

// runEgress runs the companion's tc egress program once on frame.
func (c *companion) runEgress(t testing.TB, frame []byte) result {
	t.Helper()
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Repeat: 1}
	v, err := c.c.ProgramEgress().Run(opts)
	if err != nil {
		t.Fatalf("run companion egress on a %d-byte frame: %v", len(frame), err)
	}
	return result{verdict: v, out: opts.DataOut}
}

// expectFlow checks the companion's opt flow entry for client's flow to
// localPort: want, or no entry when want is the zero AddrPort.
func (c *companion) expectFlow(t testing.TB, client netip.AddrPort, localPort uint16, proto lb.Protocol, want netip.AddrPort) {
	t.Helper()
	k := bpf.BackendOptFlowKey{
		Client:     client.Addr().As16(),
		ClientPort: netOrder(client.Port()),
		LocalPort:  netOrder(localPort),
		Proto:      uint8(proto),
	}
	var v bpf.BackendOptFlowValue
	err := c.c.Maps()[bpf.BackendMapOptFlows].Lookup(&k, &v)
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		if want.IsValid() {
			t.Errorf("no opt flow entry for %s -> :%d/%s, want one for %s", client, localPort, proto, want)
		}
	case err != nil:
		t.Fatalf("look up opt flow: %v", err)
	default:
		got := netip.AddrPortFrom(netip.AddrFrom16(v.Vip).Unmap(), fromNetOrder(v.VipPort))
		if got != want || v.Pad != [2]uint8{} {
			t.Errorf("opt flow entry for %s -> :%d/%s is %s (pad %v), want %v", client, localPort, proto, got, v.Pad, want)
		}
	}
}

// checkReply checks a reply the companion rewrote against want (built with
// the VIP:port as source): checksums recomputed, then byte for byte.
func checkReply(t testing.TB, got, want []byte) {
	t.Helper()
	l := pkttest.MustLayout(t, got)
	if l.Family == 4 && !pkttest.IPv4ChecksumValid(got[l.L3:]) {
		t.Errorf("IPv4 header checksum %#04x, recomputed %#04x", binary.BigEndian.Uint16(got[l.L3+10:]), pkttest.IPv4Checksum(got[l.L3:l.L4]))
	}
	if ok, carried, computed, err := pkttest.L4ChecksumValid(got); err != nil || !ok {
		t.Errorf("%s checksum %#04x, recomputed %#04x (err %v)", l.Proto, carried, computed, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("reply:\n got %x\nwant %x\n%s", got, want, pkttest.Decode(got).Dump())
	}
}

// geneveFrame is a client's packet to vip:port as the LB sends it by
// Geneve to fam's first backend, the option naming optVIP.
func geneveFrame(t testing.TB, fam family, dst netip.AddrPort, optVIP netip.AddrPort, proto layers.IPProtocol) (frame, inner []byte) {
	t.Helper()
	inner = clientIP(t, dst, proto)
	src := lbSource4
	if fam.vip.Is6() {
		src = lbSource6
	}
	return pkttest.BuildGeneve(t, pkttest.Geneve{Src: src, Dst: fam.backends[0], SrcPort: 50000, VIP: optVIP, Inner: inner}), inner
}

// TestCompanionGeneve covers Geneve decapsulation: valid packets, a wrong
// VIP in the option, other senders' Geneve, and every field that can be
// malformed.
func TestCompanionGeneve(t *testing.T) {
	c := newCompanion(t)
	var tests []companionCase
	for _, fam := range families {
		vip := netip.AddrPortFrom(fam.vip, 80)
		for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			frame, inner := geneveFrame(t, fam, vip, vip, proto)
			tests = append(tests, companionCase{
				name: fmt.Sprintf("%s/%s to a VIP", fam.name, proto), frame: frame,
				decapTo: append(bytes.Clone(frame[:14]), inner...), reason: "decap_geneve",
			})
		}
		good, _ := geneveFrame(t, fam, vip, vip, layers.IPProtocolTCP)
		other := netip.AddrPortFrom(fam.vip.Next(), 80)
		notVIP, _ := geneveFrame(t, fam, vip, other, layers.IPProtocolTCP)
		mismatch, _ := geneveFrame(t, fam, other, vip, layers.IPProtocolTCP)
		wrongFamily := vip6
		if fam.vip.Is6() {
			wrongFamily = vip4
		}
		crossed, _ := geneveFrame(t, fam, vip, netip.AddrPortFrom(wrongFamily, 80), layers.IPProtocolTCP)
		// Geneve header offset within the frame.
		gOff := 14 + 20 + 8
		ipLenOff := 14 + 2 // IPv4 total length
		if fam.vip.Is6() {
			gOff = 14 + 40 + 8
			ipLenOff = 14 + 4 // IPv6 payload length
		}
		udpLenOff := gOff - 4
		innerOff := gOff + 32
		geneve := func(name, reason string, fn func(b []byte)) companionCase {
			return companionCase{name: fam.name + "/" + name, reason: reason,
				frame: patch(t, good, func(b []byte, _ pkttest.Layout) { fn(b) })}
		}
		tests = append(tests,
			companionCase{name: fam.name + "/option VIP not a VIP here", frame: notVIP, reason: "pass_not_vip"},
			companionCase{name: fam.name + "/inner destination is not the option's VIP", frame: mismatch, reason: "pass_malformed"},
			companionCase{name: fam.name + "/option VIP of the other family", frame: crossed, reason: "pass_malformed"},
			geneve("another sender's option class", "pass_other", func(b []byte) { put16(b, gOff+8, 0x0101) }),
			geneve("another option type", "pass_other", func(b []byte) { b[gOff+10] = 0x02 }),
			geneve("UDP to another port", "pass_other", func(b []byte) { put16(b, gOff-6, 6082) }),
			geneve("Geneve version 1", "pass_malformed", func(b []byte) { b[gOff] |= 0x40 }),
			geneve("options length 5 words", "pass_malformed", func(b []byte) { b[gOff] = 5 }),
			geneve("control packet (O flag)", "pass_malformed", func(b []byte) { b[gOff+1] = 0x80 }),
			geneve("critical option present (C flag)", "pass_malformed", func(b []byte) { b[gOff+1] = 0x40 }),
			geneve("protocol type of the other family", "pass_malformed", func(b []byte) {
				put16(b, gOff+2, binary.BigEndian.Uint16(b[gOff+2:])^(0x0800^0x86dd))
			}),
			geneve("VNI 1", "pass_malformed", func(b []byte) { b[gOff+6] = 1 }),
			geneve("option length 4 words", "pass_malformed", func(b []byte) { b[gOff+11] = 4 }),
			geneve("UDP length one short", "pass_malformed", func(b []byte) { put16(b, udpLenOff, binary.BigEndian.Uint16(b[udpLenOff:])-1) }),
			geneve("UDP length one long", "pass_malformed", func(b []byte) { put16(b, udpLenOff, binary.BigEndian.Uint16(b[udpLenOff:])+1) }),
			geneve("outer length one short", "pass_malformed", func(b []byte) { put16(b, ipLenOff, binary.BigEndian.Uint16(b[ipLenOff:])-1) }),
			geneve("outer length one long", "pass_malformed", func(b []byte) { put16(b, ipLenOff, binary.BigEndian.Uint16(b[ipLenOff:])+1) }),
			geneve("inner version wrong", "pass_malformed", func(b []byte) { b[innerOff] ^= 0xf0 }),
			geneve("inner length one long", "pass_malformed", func(b []byte) {
				if fam.vip.Is4() {
					put16(b, innerOff+2, binary.BigEndian.Uint16(b[innerOff+2:])+1)
				} else {
					put16(b, innerOff+4, binary.BigEndian.Uint16(b[innerOff+4:])+1)
				}
			}),
		)
		if fam.vip.Is4() {
			tests = append(tests, geneve("outer fragment", "pass_malformed", func(b []byte) { put16(b, 14+6, 0x2000) }))
		}
	}
	runCompanionCases(t, c, tests)
}

// runCompanionCases runs each case through the companion's ingress.
func runCompanionCases(t *testing.T, c *companion, tests []companionCase) {
	t.Helper()
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

// TestCompanionGeneveTruncated cuts Geneve packets at every length from the
// end of the outer IP header to one byte short: none is decapsulated. Cuts
// that still show the UDP destination port are Geneve gone wrong
// (pass_malformed); shorter ones cannot be told from other traffic.
func TestCompanionGeneveTruncated(t *testing.T) {
	c := newCompanion(t)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			vip := netip.AddrPortFrom(fam.vip, 80)
			full, _ := geneveFrame(t, fam, vip, vip, layers.IPProtocolTCP)
			outer := 20
			if fam.vip.Is6() {
				outer = 40
			}
			want := map[string]uint64{}
			before := c.counters(t)
			for n := 14 + outer; n < len(full); n++ {
				r := c.run(t, bytes.Clone(full[:n]))
				if r.verdict != tcxNext {
					t.Errorf("%d bytes: verdict %d, want TCX_NEXT", n, int32(r.verdict))
				}
				if !bytes.Equal(r.out, full[:n]) {
					t.Errorf("%d-byte frame of %d changed:\n got %x\nwant %x", n, len(full), r.out, full[:n])
				}
				if n < 14+outer+4 {
					want["pass_other"]++
				} else {
					want["pass_malformed"]++
				}
			}
			c.expectCounters(t, before, want)
		})
	}
}

// optIngress is a packet as the opt dispatch delivers it to fam's first
// backend on port 8080, from client port cport, naming vip.
func optIngress(t testing.TB, fam family, cport uint16, proto layers.IPProtocol, vip netip.AddrPort) pkttest.Packet {
	p := pkttest.Packet{
		Src: netip.AddrPortFrom(fam.client, cport), Dst: netip.AddrPortFrom(fam.backends[0], 8080),
		Proto: proto, SYN: proto == layers.IPProtocolTCP, Payload: []byte("x"),
	}
	if fam.vip.Is4() {
		p.IPv4Options = []layers.IPv4Option{pkttest.IPv4Opt(vip)}
	} else {
		p.IPv6Ext = []pkttest.Ext{pkttest.IPv6DstOpt(vip)}
	}
	return p
}

// TestCompanionOpt covers the opt dispatch at the companion: recording at
// ingress (the packet itself untouched), what is not recorded, and the
// reverse rewrite of replies at egress.
func TestCompanionOpt(t *testing.T) {
	c := newCompanion(t)
	type optCase struct {
		name   string
		p      pkttest.Packet
		frame  []byte // instead of p, when set
		reason string
		// record is the entry expected for p's flow afterwards (zero: none).
		record netip.AddrPort
	}
	var tests []optCase
	for _, fam := range families {
		vip := netip.AddrPortFrom(fam.vip, 80)
		for i, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			p := optIngress(t, fam, uint16(44000+i), proto, vip)
			tests = append(tests, optCase{name: fmt.Sprintf("%s/%s naming a VIP", fam.name, proto), p: p, reason: "opt_record", record: vip})
		}
		tests = append(tests,
			optCase{name: fam.name + "/naming no VIP here", p: optIngress(t, fam, 44010, layers.IPProtocolTCP, netip.AddrPortFrom(fam.vip.Next(), 80)), reason: "pass_not_vip"},
			optCase{name: fam.name + "/plain packet", p: pkttest.Packet{Src: netip.AddrPortFrom(fam.client, 44011), Dst: netip.AddrPortFrom(fam.backends[0], 8080), SYN: true}, reason: "pass_other"},
		)
		cut := optIngress(t, fam, 44012, layers.IPProtocolUDP, vip)
		full := pkttest.Build(t, cut)
		l := pkttest.MustLayout(t, full)
		tests = append(tests, optCase{name: fam.name + "/cut before the ports", p: cut, frame: full[:l.L4+1], reason: "pass_malformed"})
		if fam.vip.Is4() {
			long := optIngress(t, fam, 44013, layers.IPProtocolTCP, vip)
			long.IPv4Options[0].OptionLength = 12
			long.IPv4Options[0].OptionData = append(long.IPv4Options[0].OptionData, 0, 0, 0, 0)
			later := optIngress(t, fam, 44014, layers.IPProtocolTCP, vip)
			later.IPv4Options = append(later.IPv4Options, layers.IPv4Option{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}})
			tests = append(tests,
				optCase{name: "ipv4/option length 12", p: long, reason: "pass_malformed"},
				optCase{name: "ipv4/client options after ours", p: later, reason: "opt_record", record: vip},
			)
		} else {
			mapped := optIngress(t, fam, 44015, layers.IPProtocolTCP, netip.AddrPortFrom(netip.AddrFrom16(vip4.As16()), 80))
			short := optIngress(t, fam, 44016, layers.IPProtocolTCP, vip)
			short.IPv6Ext[0].Body[3] = 17
			chain := optIngress(t, fam, 44017, layers.IPProtocolUDP, vip)
			chain.IPv6Ext = append(chain.IPv6Ext,
				pkttest.Ext{Type: layers.IPProtocolIPv6Routing, Body: append([]byte{0, 0}, make([]byte, 4)...)},
				pkttest.Ext{Type: layers.IPProtocolIPv6Destination, Body: pkttest.PadN(1)})
			tests = append(tests,
				optCase{name: "ipv6/IPv4-mapped VIP", p: mapped, reason: "pass_malformed"},
				optCase{name: "ipv6/option length 17", p: short, reason: "pass_malformed"},
				optCase{name: "ipv6/extension headers after ours", p: chain, reason: "opt_record", record: vip},
			)
		}
	}
	for _, tt := range tests {
		t.Run("ingress/"+tt.name, func(t *testing.T) {
			frame := tt.frame
			if frame == nil {
				frame = pkttest.Build(t, tt.p)
			}
			before := c.counters(t)
			r := c.run(t, bytes.Clone(frame))
			if r.verdict != tcxNext {
				t.Errorf("verdict %d, want TCX_NEXT", int32(r.verdict))
			}
			if !bytes.Equal(r.out, frame) {
				t.Errorf("frame changed:\n got %x\nwant %x", r.out, frame)
			}
			c.expectCounters(t, before, map[string]uint64{tt.reason: 1})
			c.expectFlow(t, tt.p.Src, tt.p.Dst.Port(), protoOf(tt.p), tt.record)
		})
	}

	// Egress: replies of the flows recorded above leave from the VIP; any
	// other packet is left alone.
	for _, fam := range families {
		vip := netip.AddrPortFrom(fam.vip, 80)
		be := netip.AddrPortFrom(fam.backends[0], 8080)
		for i, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
			client := netip.AddrPortFrom(fam.client, uint16(44000+i))
			reply := pkttest.Packet{Src: be, Dst: client, Proto: proto, ACK: proto == layers.IPProtocolTCP, Payload: []byte("reply"),
				TOS: 0x10, TTL: 33, ID: 0x2222, DF: true, FlowLabel: 0x54321}
			t.Run(fmt.Sprintf("egress/%s/%s reply", fam.name, proto), func(t *testing.T) {
				before := c.counters(t)
				r := c.runEgress(t, pkttest.Build(t, reply))
				if r.verdict != tcxNext {
					t.Errorf("verdict %d, want TCX_NEXT", int32(r.verdict))
				}
				want := reply
				want.Src = vip
				checkReply(t, r.out, pkttest.Build(t, want))
				c.expectCounters(t, before, map[string]uint64{"opt_reply": 1})
			})
		}
		if fam.vip.Is4() {
			t.Run("egress/ipv4/UDP reply without checksum", func(t *testing.T) {
				reply := pkttest.Packet{Src: be, Dst: netip.AddrPortFrom(fam.client, 44001), Proto: layers.IPProtocolUDP, Payload: []byte("reply")}
				in := pkttest.Build(t, reply)
				l := pkttest.MustLayout(t, in)
				put16(in, l.L4+6, 0)
				before := c.counters(t)
				r := c.runEgress(t, in)
				if got := binary.BigEndian.Uint16(r.out[l.L4+6:]); got != 0 {
					t.Errorf("UDP checksum %#04x, want 0 kept (none computed)", got)
				}
				if got := netip.AddrFrom4([4]byte(r.out[l.L3+12 : l.L3+16])); got != vip.Addr() {
					t.Errorf("source %s, want %s", got, vip.Addr())
				}
				c.expectCounters(t, before, map[string]uint64{"opt_reply": 1})
			})
		}
		for _, tt := range []struct {
			name  string
			reply pkttest.Packet
		}{
			{"another client port", pkttest.Packet{Src: be, Dst: netip.AddrPortFrom(fam.client, 44099), ACK: true}},
			{"another local port", pkttest.Packet{Src: netip.AddrPortFrom(be.Addr(), 8081), Dst: netip.AddrPortFrom(fam.client, 44000), ACK: true}},
			{"another protocol", pkttest.Packet{Src: be, Dst: netip.AddrPortFrom(fam.client, 44000), Proto: layers.IPProtocolUDP}},
			{"the client not recorded (naming no VIP)", pkttest.Packet{Src: be, Dst: netip.AddrPortFrom(fam.client, 44010), ACK: true}},
		} {
			t.Run("egress/"+fam.name+"/unknown flow: "+tt.name, func(t *testing.T) {
				in := pkttest.Build(t, tt.reply)
				before := c.counters(t)
				r := c.runEgress(t, bytes.Clone(in))
				if r.verdict != tcxNext || !bytes.Equal(r.out, in) {
					t.Errorf("verdict %d, frame changed %v; want TCX_NEXT and the frame untouched", int32(r.verdict), !bytes.Equal(r.out, in))
				}
				c.expectCounters(t, before, map[string]uint64{"egress_other": 1})
			})
		}
	}
	t.Run("egress/ARP", func(t *testing.T) {
		in := pkttest.BuildARP(t, pkttest.LBMAC, backends4[0], client4)
		before := c.counters(t)
		r := c.runEgress(t, bytes.Clone(in))
		if r.verdict != tcxNext || !bytes.Equal(r.out, in) {
			t.Errorf("verdict %d, frame changed %v; want TCX_NEXT and the frame untouched", int32(r.verdict), !bytes.Equal(r.out, in))
		}
		c.expectCounters(t, before, map[string]uint64{"egress_other": 1})
	})
}

// protoOf is p's protocol; a pkttest.Packet without one is TCP.
func protoOf(p pkttest.Packet) lb.Protocol {
	if p.Proto == 0 {
		return lb.TCP
	}
	return lb.Protocol(p.Proto)
}

// TestCompanionPins checks the companion's pins: its maps appear under the
// directory while it runs, a second companion with another --max-flows is
// refused with an error naming what to do, and Close removes everything.
func TestCompanionPins(t *testing.T) {
	testnet.RequireRoot(t)
	dir, err := os.MkdirTemp("/sys/fs/bpf", "l4lb-companion-test-")
	if err != nil {
		t.Fatalf("bpffs directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, err := datapath.LoadCompanion(datapath.CompanionConfig{PinPath: dir, MaxFlows: 1024})
	if err != nil {
		t.Fatalf("load pinned companion: %v", err)
	}
	for _, name := range []string{bpf.BackendMapVips, bpf.BackendMapBackendReasons, bpf.BackendMapOptFlows} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("map %s not pinned: %v", name, err)
		}
	}
	_, err = datapath.LoadCompanion(datapath.CompanionConfig{PinPath: dir, MaxFlows: 2048})
	if err == nil || !strings.Contains(err.Error(), "--max-flows") {
		t.Errorf("second companion with another table size: error %v, want one naming --max-flows", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory still there after Close (stat: %v)", err)
	}
}
