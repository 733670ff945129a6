// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// tooBigMTU is lb0's MTU in the ICMP tests: every path to a backend or a
// client leaves through it.
const tooBigMTU = 1400

// dispatchOverhead is what dispatch d adds to a packet of kind: what the
// LB must subtract from the egress MTU in its answer.
func dispatchOverhead(d lb.Dispatch, fam family, kind pktKind) int {
	v4 := fam.vip.Is4()
	switch d {
	case lb.DispatchGeneve:
		return geneveOverhead(v4)
	case lb.DispatchOpt:
		return optLen(kindPacket(maglev.Flow{Src: fam.client, Proto: uint8(kind.proto)}, kind))
	}
	if v4 {
		return 20
	}
	return 40
}

// dispatchBackendPorts are the backend ports of each dispatch's test
// services (0: the service port).
func dispatchBackendPorts(d lb.Dispatch) (tcp, udp uint16) {
	if d == lb.DispatchOpt {
		return optTCPBackendPort, optUDPBackendPort
	}
	return 0, 0
}

// sizedPacket is kind's client packet on flow f, padded to an IP length of
// exactly l3 bytes.
func (e *env) sizedPacket(t testing.TB, f maglev.Flow, kind pktKind, l3 int) []byte {
	t.Helper()
	return e.padded(t, kindPacket(f, kind), l3)
}

// padded is the frame of p with its payload grown or cut so that its IP
// packet is l3 bytes long.
func (e *env) padded(t testing.TB, p pkttest.Packet, l3 int) []byte {
	t.Helper()
	hdrs := len(pkttest.IPPacket(t, e.frame(t, p))) - len(p.Payload)
	p.Payload = make([]byte, l3-hdrs)
	for i := range p.Payload {
		p.Payload[i] = byte(i)
	}
	in := e.frame(t, p)
	if got := len(pkttest.IPPacket(t, in)); got != l3 {
		t.Fatalf("built a %d-byte IP packet, want %d", got, l3)
	}
	return in
}

// setMTU sets lb0's MTU.
func (e *env) setMTU(t testing.TB, mtu int) {
	t.Helper()
	if err := e.ns.Netlink().LinkSetMTU(e.ns.Link(t, "lb0"), mtu); err != nil {
		t.Fatalf("set lb0's MTU to %d: %v", mtu, err)
	}
}

// expectTooBig checks that r answers the client packet in with ICMP
// fragmentation-needed / packet-too-big announcing mtu, byte for byte: from
// the VIP to the client through the router, TTL / hop limit 64, IPv4 TOS
// 0xc0 with DF, as much of the client's packet quoted as RFC 1812 (576
// bytes in all) and RFC 4443 (1280) allow, in whole 4-byte words, and both
// checksums recomputed. The quoted TCP/UDP checksum field is the one byte
// pair that may differ from the client's: it must hold the value a device
// completing a partial checksum over the quote would write back unchanged.
func (e *env) expectTooBig(t testing.TB, k hook, in []byte, r result, mtu int) {
	t.Helper()
	e.expectTooBigVia(t, k, in, r, mtu, routerMAC)
}

// expectTooBigVia is expectTooBig for an answer whose next hop is the
// neighbour nextHop (a backend on lb0's subnet rather than the router).
func (e *env) expectTooBigVia(t testing.TB, k hook, in []byte, r result, mtu int, nextHop net.HardwareAddr) {
	t.Helper()
	if r.verdict != k.tx() {
		t.Fatalf("verdict %s, want %s (the answer sent back out); output:\n%s", k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	f := flowOf(t, in)
	l := pkttest.MustLayout(t, in)
	orig := pkttest.IPPacket(t, in)
	hdr, limit := 48, 1280
	if l.Family == 4 {
		hdr, limit = 28, 576
	}
	n := min(len(orig), limit-hdr) &^ 3
	if len(r.out) != 14+hdr+n {
		t.Fatalf("answer is %d bytes, want 14 + %d + a %d-byte quote:\n%s", len(r.out), hdr, n, pkttest.Decode(r.out).Dump())
	}
	quote := bytes.Clone(orig[:n])
	got := r.out[14+hdr:]
	l4 := l.L4 - l.L3
	field := l4 + 6
	if l.Proto == 6 {
		field = l4 + 16
	}
	if field+2 <= n {
		v := binary.BigEndian.Uint16(got[field:])
		if c := pkttest.CompletedChecksum(got[l4:]); c != v && !(c == 0xffff && v == 0) {
			t.Errorf("quoted L4 checksum %#04x: completing it over the quote would write %#04x, so the ICMP checksum would break", v, c)
		}
		binary.BigEndian.PutUint16(quote[field:], v)
	}
	msg := pkttest.ICMPError{
		SrcMAC: e.lbMAC, DstMAC: nextHop,
		Src: f.Dst, Dst: f.Src,
		Type: pkttest.ICMPv6PacketTooBig, Info: uint32(mtu),
		Quote: quote,
	}
	if l.Family == 4 {
		msg.Type, msg.Code, msg.TOS, msg.DF = pkttest.ICMPv4DestUnreachable, pkttest.ICMPv4FragNeeded, 0xc0, true
	}
	if ok, carried, computed, err := pkttest.ICMPChecksumValid(r.out); !ok {
		t.Errorf("ICMP checksum %#04x, recomputed %#04x (err %v)", carried, computed, err)
	}
	if l.Family == 4 && !pkttest.IPv4ChecksumValid(r.out[14:]) {
		t.Errorf("IPv4 header checksum %#04x, recomputed %#04x", binary.BigEndian.Uint16(r.out[24:]), pkttest.IPv4Checksum(r.out[14:34]))
	}
	expectBytes(t, "ICMP answer", r.out, pkttest.BuildICMPError(t, msg))
}

// expectBytes compares two frames and lists the offsets that differ.
func expectBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	var diff []string
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) || got[i] != want[i] {
			diff = append(diff, fmt.Sprint(i))
			if len(diff) == 20 {
				diff = append(diff, "...")
				break
			}
		}
	}
	t.Errorf("%s: %d bytes, want %d; differs at offsets %s:\n got %x\nwant %x",
		what, len(got), len(want), strings.Join(diff, ","), head(got), head(want))
}

// head is the start of a frame, enough to show its headers in a message.
func head(b []byte) []byte { return b[:min(len(b), 160)] }

// TestICMPTooBig sends, for every hook, family, dispatch and kind of packet
// the dispatch grows, a packet that exactly fits the egress MTU once grown
// (it is forwarded) and one a byte larger (the client gets ICMP announcing
// the MTU minus the dispatch's overhead, checked byte for byte).
func TestICMPTooBig(t *testing.T) {
	for _, d := range []lb.Dispatch{lb.DispatchIPIP, lb.DispatchGeneve, lb.DispatchOpt} {
		t.Run(d.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{icmpRate: 1000})
			e.setMTU(t, tooBigMTU)
			svcs := dispatchServices(d, 0, 0)
			if tcp, udp := dispatchBackendPorts(d); tcp != 0 {
				svcs = dispatchServices(d, tcp, udp)
			}
			e.reconcile(t, svcs...)
			for _, k := range hooks {
				for _, fam := range families {
					for i, kind := range pktKinds {
						over := dispatchOverhead(d, fam, kind)
						if over == 0 {
							continue // never grows: never too big because of the LB
						}
						t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, kind.name), func(t *testing.T) {
							svc := serviceOf(t, svcs, fam, kind.proto)
							id := e.state(t, svc.Frontend).ID
							f := flowTo(svc.Frontend, fam.client, uint16(44000+10*int(k)+i))

							fits := e.sizedPacket(t, f, kind, tooBigMTU-over)
							before := e.reasons(t)
							c0, _ := e.lb.ServiceCounters(id)
							if r := e.runOn(t, k, fits); r.verdict != k.tx() {
								t.Fatalf("%d-byte packet (fits once grown by %d): verdict %s, want %s", tooBigMTU-over, over, k.verdictName(r.verdict), k.verdictName(k.tx()))
							}
							e.expectReasons(t, before, nil)

							big := e.sizedPacket(t, f, kind, tooBigMTU-over+1)
							before = e.reasons(t)
							e.expectTooBig(t, k, big, e.runOn(t, k, big), tooBigMTU-over)
							e.expectReasons(t, before, map[string]uint64{"icmp_frag_needed_sent": 1})
							c1, _ := e.lb.ServiceCounters(id)
							if c1.Packets-c0.Packets != 1 {
								t.Errorf("service counted %d packets, want 1: the answered packet was not forwarded", c1.Packets-c0.Packets)
							}
						})
					}
				}
			}
		})
	}
}

// TestICMPTooBigNoAnswer covers the packets that are too big and get no
// answer: dropped and counted as drop_frag_needed.
func TestICMPTooBigNoAnswer(t *testing.T) {
	tests := []struct {
		name     string
		fam      family
		mtu      int
		rate     uint32
		noRoute  bool // no route back to the client
		clearDF  bool
		overhead int // what the packet exceeds the MTU by, before the dispatch's 20/40
	}{
		{name: "IPv4 without DF: XDP cannot fragment", fam: families[0], mtu: tooBigMTU, rate: 100, clearDF: true},
		{name: "IPv4 rate 0", fam: families[0], mtu: tooBigMTU, rate: 0},
		{name: "IPv6 rate 0", fam: families[1], mtu: tooBigMTU, rate: 0},
		{name: "IPv6 path below 1280 + overhead", fam: families[1], mtu: 1300, rate: 100},
		{name: "IPv4 no route back", fam: families[0], mtu: tooBigMTU, rate: 100, noRoute: true},
		{name: "IPv6 no route back", fam: families[1], mtu: tooBigMTU, rate: 100, noRoute: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e *env
			if tt.noRoute {
				e = newEnvWith(t, envOptions{icmpRate: tt.rate})
			} else {
				e = newSNATEnv(t, envOptions{icmpRate: tt.rate})
			}
			e.setMTU(t, tt.mtu)
			svcs := dispatchServices(lb.DispatchIPIP, 0, 0)
			e.reconcile(t, svcs...)
			svc := serviceOf(t, svcs, tt.fam, lb.TCP)
			over := 20
			if tt.fam.vip.Is6() {
				over = 40
			}
			for _, k := range hooks {
				f := flowTo(svc.Frontend, tt.fam.client, 45000+uint16(k))
				p := kindPacket(f, pktKinds[1])
				p.DF = !tt.clearDF
				hdrs := len(pkttest.IPPacket(t, e.frame(t, p))) - len(p.Payload)
				p.Payload = make([]byte, tt.mtu-over+1-hdrs)
				before := e.reasons(t)
				if r := e.runOn(t, k, e.frame(t, p)); r.verdict != k.drop() {
					t.Errorf("%s: verdict %s, want %s", k, k.verdictName(r.verdict), k.verdictName(k.drop()))
				}
				e.expectReasons(t, before, map[string]uint64{"drop_frag_needed": 1})
			}
		})
	}
}

// runBurst runs hook k on each frame in turn, all from one thread pinned
// to one CPU: the rate limiter's buckets are per CPU.
func (e *env) runBurst(t testing.TB, k hook, frames [][]byte) []result {
	t.Helper()
	res := make([]result, len(frames))
	err := e.ns.Do(func() error {
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			return err
		}
		var one unix.CPUSet
		for c := range 1024 {
			if old.IsSet(c) {
				one.Set(c)
				break
			}
		}
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &old)
		prog, ctx := e.lb.Program(), any(xdpMD{IngressIfindex: uint32(e.ifindex)})
		if k == hookTC {
			prog, ctx = e.lb.ProgramTC(), skbContext(e.ifindex)
		}
		for i, f := range frames {
			if md, ok := ctx.(xdpMD); ok {
				md.DataEnd = uint32(len(f))
				ctx = md
			}
			opts := &ebpf.RunOptions{Data: f, DataOut: make([]byte, len(f)+256), Context: ctx, Repeat: 1}
			v, err := prog.Run(opts)
			if err != nil {
				return fmt.Errorf("frame %d: %w", i, err)
			}
			res[i] = result{verdict: v, out: opts.DataOut}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("run %s program: %v", k, err)
	}
	return res
}

// TestICMPRateLimit sends a burst of too-big packets at a small rate limit:
// exactly the rate is answered, the rest is dropped and counted. The burst
// takes far less than one token's worth of time; a run that took longer is
// retried on a fresh datapath rather than judged.
func TestICMPRateLimit(t *testing.T) {
	const rate, burst = 3, 10
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				for attempt := 1; ; attempt++ {
					e := newSNATEnv(t, envOptions{icmpRate: rate})
					e.setMTU(t, tooBigMTU)
					svcs := dispatchServices(lb.DispatchIPIP, 0, 0)
					e.reconcile(t, svcs...)
					svc := serviceOf(t, svcs, fam, lb.UDP)
					over := dispatchOverhead(lb.DispatchIPIP, fam, pktKinds[2])
					frames := make([][]byte, burst)
					for i := range frames {
						frames[i] = e.sizedPacket(t, flowTo(svc.Frontend, fam.client, uint16(46000+i)), pktKinds[2], tooBigMTU-over+1)
					}
					before := e.reasons(t)
					start := time.Now()
					res := e.runBurst(t, k, frames)
					if took := time.Since(start); took >= time.Second/rate {
						if attempt < 3 {
							t.Logf("burst took %s, longer than a token's %s: retrying", took, time.Second/rate)
							continue
						}
						t.Fatalf("burst took %s three times, longer than a token's %s: cannot judge the limit", took, time.Second/rate)
					}
					for i, r := range res {
						if i < rate {
							e.expectTooBig(t, k, frames[i], r, tooBigMTU-over)
						} else if r.verdict != k.drop() {
							t.Errorf("packet %d of the burst: verdict %s, want %s (over the limit)", i, k.verdictName(r.verdict), k.verdictName(k.drop()))
						}
					}
					e.expectReasons(t, before, map[string]uint64{"icmp_frag_needed_sent": rate, "icmp_rate_limited": burst - rate})
					return
				}
			})
		}
	}
}

// TestICMPRateLimitLoads loads the datapath at the ends of the rate
// limit's range: the verifier checks the answer's code only when a rate
// lets it run, so each setting must load. A rate above the maximum is
// refused with an error naming the key to fix.
func TestICMPRateLimitLoads(t *testing.T) {
	testnet.RequireRoot(t)
	for _, rate := range []uint32{0, 1, datapath.MaxICMPRateLimit, datapath.MaxICMPRateLimit + 1} {
		d, err := datapath.Load(datapath.Config{Seed: testSeed, MaxServices: 4, MaxBackends: 4, ConntrackMax: 1024, ICMPRateLimit: rate})
		if rate > datapath.MaxICMPRateLimit {
			if err == nil || !strings.Contains(err.Error(), "datapath.icmp_rate_limit") {
				t.Errorf("rate %d: error %v, want one naming datapath.icmp_rate_limit", rate, err)
			}
			if d != nil {
				d.Close()
			}
			continue
		}
		if err != nil {
			t.Fatalf("rate %d: %v", rate, err)
		}
		d.Close()
	}
}
