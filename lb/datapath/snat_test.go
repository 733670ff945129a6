// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// routerMAC is the neighbour MAC of the router the SNAT tests send clients'
// replies to (10.0.0.254 / fd00::fe on lb0).
var routerMAC = net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 0xfe}

// snatBackendPort is where SNAT backends listen: not the service port, so
// that the destination port rewrite shows.
const snatBackendPort = 8080

// snatCase is one combination the SNAT tests cover.
type snatCase struct {
	hook  hook
	fam   family
	proto lb.Protocol
}

func (c snatCase) String() string { return c.hook.String() + "/" + c.fam.name + "/" + c.proto.String() }

// snatCases is {xdp, tc} x {IPv4, IPv6} x {TCP, UDP}.
func snatCases() []snatCase {
	var out []snatCase
	for _, k := range hooks {
		for _, fam := range families {
			for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
				out = append(out, snatCase{hook: k, fam: fam, proto: proto})
			}
		}
	}
	return out
}

// newSNATEnv is an env whose default route leads to a router on lb0, so
// that replies can be routed back to any client.
func newSNATEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	e := newEnvWith(t, o)
	e.ns.AddNeigh(t, "lb0", "10.0.0.254", routerMAC)
	e.ns.AddNeigh(t, "lb0", "fd00::fe", routerMAC)
	e.ns.AddRoute(t, "default", "10.0.0.254", "lb0")
	e.ns.AddRoute(t, "default", "fd00::fe", "lb0")
	return e
}

// snatService is a SNAT service whose backends listen on snatBackendPort.
func snatService(name string, vip netip.Addr, port uint16, proto lb.Protocol, backends ...netip.Addr) lb.Service {
	s := lb.Service{Name: name, Frontend: lb.Frontend{Addr: vip, Port: port, Proto: proto}, Mode: lb.ModeSNAT}
	for _, b := range backends {
		s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(b, snatBackendPort), Weight: 1})
	}
	return s
}

// clientPacket is a client packet of flow f with fields a rewrite must
// keep: TOS, DF, identification, flow label, a payload.
func clientPacket(f maglev.Flow, syn, ack bool) pkttest.Packet {
	p := packet(f, syn, ack, []byte("payload to the backend"))
	p.TOS, p.DF, p.ID, p.TTL, p.FlowLabel = 0xb9, true, 0x4242, 17, 0xabcde
	return p
}

// replyPacket is what backend sends back on a binding: from backend:port to
// the SNAT address and port.
func replyPacket(from, to netip.AddrPort, proto lb.Protocol, fin, rst bool) pkttest.Packet {
	return pkttest.Packet{
		SrcMAC: backendMAC(from.Addr()),
		Src:    from, Dst: to,
		Proto:   layers.IPProtocol(proto),
		ACK:     proto == lb.TCP,
		FIN:     fin,
		RST:     rst,
		Payload: []byte("reply to the client"),
		TTL:     9, TOS: 0x28, ID: 0x1717, FlowLabel: 0x12345,
	}
}

// natted is what the LB must send for in: the same frame from srcMAC to
// dstMAC, its source and destination rewritten to src and dst, the TTL /
// hop limit one less and both checksums computed from scratch (an IPv4 UDP
// checksum of 0 stays 0). Any other byte that differs is a bug.
func natted(t testing.TB, in []byte, dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort) []byte {
	t.Helper()
	out := bytes.Clone(in)
	l := pkttest.MustLayout(t, out)
	copy(out[0:6], dstMAC)
	copy(out[6:12], srcMAC)
	ip := out[l.L3:]
	if l.Family == 4 {
		copy(ip[12:16], src.Addr().AsSlice())
		copy(ip[16:20], dst.Addr().AsSlice())
		ip[8]--
		pkttest.FixIPv4Checksum(out, l)
	} else {
		copy(ip[8:24], src.Addr().AsSlice())
		copy(ip[24:40], dst.Addr().AsSlice())
		ip[7]--
	}
	binary.BigEndian.PutUint16(out[l.L4:], src.Port())
	binary.BigEndian.PutUint16(out[l.L4+2:], dst.Port())
	at := l.L4 + 16
	if l.Proto == layers.IPProtocolUDP {
		at = l.L4 + 6
		if l.Family == 4 && binary.BigEndian.Uint16(in[at:]) == 0 {
			return out
		}
	}
	c, err := pkttest.L4Checksum(out)
	if err != nil {
		t.Fatalf("checksum of the expected frame: %v", err)
	}
	binary.BigEndian.PutUint16(out[at:], c)
	return out
}

// expectFrame checks got against want byte for byte and, separately, that
// got's checksums are right.
func expectFrame(t testing.TB, what string, got, want []byte) {
	t.Helper()
	l := pkttest.MustLayout(t, got)
	if l.Family == 4 && !pkttest.IPv4ChecksumValid(got[l.L3:]) {
		t.Errorf("%s: IPv4 header checksum %#04x, want %#04x", what, binary.BigEndian.Uint16(got[l.L3+10:]), pkttest.IPv4Checksum(got[l.L3:l.L4]))
	}
	if ok, carried, computed, err := pkttest.L4ChecksumValid(got); err != nil || !ok {
		t.Errorf("%s: %s checksum %#04x, recomputed %#04x (err %v)", what, l.Proto, carried, computed, err)
	}
	if !bytes.Equal(got, want) {
		var diff []string
		for i := range max(len(got), len(want)) {
			if i >= len(got) || i >= len(want) || got[i] != want[i] {
				diff = append(diff, fmt.Sprint(i))
			}
		}
		t.Errorf("%s: frame differs at byte offsets %s (IP at %d, L4 at %d):\n got %x\nwant %x\n%s",
			what, strings.Join(diff, ","), l.L3, l.L4, got, want, pkttest.Decode(got).Dump())
	}
}

// source is the source address and port of a frame.
func source(t testing.TB, frame []byte) netip.AddrPort {
	t.Helper()
	f := flowOf(t, frame)
	return netip.AddrPortFrom(f.Src, f.SrcPort)
}

// firstPort is the port the allocator tries first for flow f in lo..hi.
func firstPort(f maglev.Flow, lo, hi uint16) uint16 {
	h := uint32(maglev.FlowHash(testSeed, f))
	return lo + uint16(h%(uint32(hi)-uint32(lo)+1))
}

// sendSNAT sends one client packet of f through hook k, checks that it
// leaves to the backend Go predicts for svc with every field as natted
// says, and returns the SNAT source it got.
func (e *env) sendSNAT(t testing.TB, k hook, svc lb.Service, f maglev.Flow, p pkttest.Packet) netip.AddrPort {
	t.Helper()
	in := e.frame(t, p)
	r := e.runOn(t, k, in)
	if r.verdict != k.tx() {
		t.Fatalf("client packet of %v: verdict %s, want %s; output:\n%s", f, k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
	src := source(t, r.out)
	expectFrame(t, "forward", r.out, natted(t, in, backendMAC(be.Addr()), e.lbMAC, src, be))
	return src
}

// replySNAT sends a reply from backend be to the SNAT source snat through
// hook k and checks that it leaves to the client of f as VIP -> client.
func (e *env) replySNAT(t testing.TB, k hook, f maglev.Flow, be, snat netip.AddrPort, fin, rst bool) {
	t.Helper()
	in := e.frame(t, replyPacket(be, snat, lb.Protocol(f.Proto), fin, rst))
	r := e.runOn(t, k, in)
	if r.verdict != k.tx() {
		t.Fatalf("reply to %s: verdict %s, want %s; output:\n%s", snat, k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	want := natted(t, in, routerMAC, e.lbMAC, netip.AddrPortFrom(f.Dst, f.DstPort), netip.AddrPortFrom(f.Src, f.SrcPort))
	expectFrame(t, "reply", r.out, want)
}

// binding is what the SNAT tables hold for a flow.
type binding struct {
	fwd bpf.LbSnatFwdValue
	rev bpf.LbSnatRevValue
}

// revKey is the snat_rev key of a reply from be to snat.
func revKey(be, snat netip.AddrPort, proto lb.Protocol) []byte {
	k := make([]byte, 0, 40)
	b, s := be.Addr().As16(), snat.Addr().As16()
	k = append(k, b[:]...)
	k = append(k, s[:]...)
	k = binary.BigEndian.AppendUint16(k, be.Port())
	k = binary.BigEndian.AppendUint16(k, snat.Port())
	return append(k, byte(proto), 0, 0, 0)
}

// binding reads both halves of f's binding; ok is false when either is
// missing.
func (e *env) binding(t testing.TB, f maglev.Flow) (b binding, ok bool) {
	t.Helper()
	return e.bindingIn(t, f, bpf.LbMapSnatFwd, bpf.LbMapSnatRev)
}

// ovfBinding is f's binding in the overflow tables.
func (e *env) ovfBinding(t testing.TB, f maglev.Flow) (b binding, ok bool) {
	t.Helper()
	return e.bindingIn(t, f, bpf.LbMapSnatFwdOvf, bpf.LbMapSnatRevOvf)
}

func (e *env) bindingIn(t testing.TB, f maglev.Flow, fwdMap, revMap string) (b binding, ok bool) {
	t.Helper()
	key := maglev.FlowKey(f)
	if err := e.lb.Maps()[fwdMap].Lookup(key[:], &b.fwd); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return b, false
		}
		t.Fatalf("look up the SNAT forward entry of %v: %v", f, err)
	}
	be := netip.AddrPortFrom(netip.AddrFrom16(b.fwd.BackendAddr), ntohs(b.fwd.BackendPort))
	snat := netip.AddrPortFrom(netip.AddrFrom16(b.fwd.SnatAddr), ntohs(b.fwd.SnatPort))
	if err := e.lb.Maps()[revMap].Lookup(revKey(be, snat, lb.Protocol(f.Proto)), &b.rev); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return b, false
		}
		t.Fatalf("look up the SNAT reverse entry of %v: %v", f, err)
	}
	return b, true
}

func ntohs(v uint16) uint16 { return bits.ReverseBytes16(v) }

func (e *env) snatEntries(t testing.TB) (flows, ports int) {
	t.Helper()
	flows, ports, err := e.lb.SNATEntries()
	if err != nil {
		t.Fatalf("count SNAT entries: %v", err)
	}
	return flows, ports
}

// TestSNATForwardAndReply sends a client packet, then a reply, for every
// hook, family and protocol, and checks every byte of both rewritten
// frames, the checksums by recomputation, and what the tables hold.
func TestSNATForwardAndReply(t *testing.T) {
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[:3]...)
			e.reconcile(t, svc)
			f := flowTo(svc.Frontend, c.fam.client, 40000)
			be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
			before := e.reasons(t)

			// TCP opens with a SYN: it already needs a binding.
			snat := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, true, false))
			if snat.Addr() != c.fam.lbAddr {
				t.Errorf("SNAT source address %s, want %s (the family's only SNAT address)", snat.Addr(), c.fam.lbAddr)
			}
			if want := firstPort(f, datapath.DefaultSNATPortMin, datapath.DefaultSNATPortMax); snat.Port() != want {
				t.Errorf("SNAT source port %d, want %d: the flow hash's start in an empty table", snat.Port(), want)
			}

			e.replySNAT(t, c.hook, f, be, snat, false, false)

			// The rest of the flow keeps its binding.
			for range 3 {
				if got := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true)); got != snat {
					t.Fatalf("later packet left from %s, want the flow's binding %s", got, snat)
				}
				e.replySNAT(t, c.hook, f, be, snat, false, false)
			}
			if flows, ports := e.snatEntries(t); flows != 1 || ports != 1 {
				t.Errorf("SNAT tables hold %d forward and %d reverse entries, want 1 and 1", flows, ports)
			}
			b, ok := e.binding(t, f)
			if !ok {
				t.Fatalf("flow %v has no complete binding", f)
			}
			st := e.state(t, svc.Frontend)
			var beID uint32
			for _, x := range st.Backends {
				if x.Addr == be {
					beID = uint32(x.ID)
				}
			}
			svcID := uint32(st.ID)
			want := binding{
				fwd: bpf.LbSnatFwdValue{SnatAddr: snat.Addr().As16(), BackendAddr: be.Addr().As16(), SnatPort: htons(snat.Port()), BackendPort: htons(be.Port()),
					BackendId: beID, LastSeen: b.fwd.LastSeen, State: bpf.LbL4lbSnatStateL4LB_SNAT_OPEN},
				rev: bpf.LbSnatRevValue{ClientAddr: f.Src.As16(), Vip: f.Dst.As16(), ClientPort: htons(f.SrcPort), VipPort: htons(f.DstPort),
					SvcId: svcID, LastSeen: b.rev.LastSeen, State: bpf.LbL4lbSnatStateL4LB_SNAT_OPEN},
			}
			if b != want {
				t.Errorf("binding\n got %+v\nwant %+v", b, want)
			}
			if b.fwd.LastSeen == 0 || b.rev.LastSeen == 0 {
				t.Errorf("binding last seen at %d / %d, want a time", b.fwd.LastSeen, b.rev.LastSeen)
			}
			e.expectReasons(t, before, nil)
			stats, err := e.lb.ServiceCounters(e.state(t, svc.Frontend).ID)
			if err != nil {
				t.Fatal(err)
			}
			if stats.Packets != 4 {
				t.Errorf("service counted %d packets, want the 4 client packets", stats.Packets)
			}
			// The replies, at L3 as the backend sent them.
			replyL3 := uint64(len(e.frame(t, replyPacket(be, snat, c.proto, false, false))) - 14)
			if stats.ReplyPackets != 4 || stats.ReplyBytes != 4*replyL3 {
				t.Errorf("service counted %d replies of %d bytes, want the 4 replies of %d bytes", stats.ReplyPackets, stats.ReplyBytes, 4*replyL3)
			}
			bst, err := e.lb.BackendCounters(reconciler.BackendID(beID))
			if err != nil {
				t.Fatal(err)
			}
			if bst.Packets != 4 || bst.ReplyPackets != 0 {
				t.Errorf("backend counted %d packets and %d replies, want the 4 client packets and no replies (counted per service)", bst.Packets, bst.ReplyPackets)
			}
		})
	}
}

func htons(v uint16) uint16 { return bits.ReverseBytes16(v) }

// TestSNATDistinctPorts sends two clients with the same source port whose
// flows hash to the same first port: the second must get another one, and
// replies must reach each its own client.
func TestSNATDistinctPorts(t *testing.T) {
	const lo, hi = 40000, 40007
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{snatPortMin: lo, snatPortMax: hi})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[0])
			e.reconcile(t, svc)
			be := netip.AddrPortFrom(c.fam.backends[0], snatBackendPort)
			a := flowTo(svc.Frontend, c.fam.client, 5353)
			b := a
			for range 1000 {
				b.Src = b.Src.Next()
				if firstPort(b, lo, hi) == firstPort(a, lo, hi) {
					break
				}
			}
			if firstPort(b, lo, hi) != firstPort(a, lo, hi) {
				t.Fatal("found no second client whose flow hashes to the first one's port")
			}

			sa := e.sendSNAT(t, c.hook, svc, a, clientPacket(a, false, true))
			sb := e.sendSNAT(t, c.hook, svc, b, clientPacket(b, false, true))
			if sa.Port() != firstPort(a, lo, hi) {
				t.Errorf("first client got port %d, want its first candidate %d", sa.Port(), firstPort(a, lo, hi))
			}
			next := firstPort(a, lo, hi) + 1
			if next > hi {
				next = lo
			}
			if sb == sa || sb.Port() != next {
				t.Errorf("second client got %s, first %s: want the next port %d", sb, sa, next)
			}
			e.replySNAT(t, c.hook, a, be, sa, false, false)
			e.replySNAT(t, c.hook, b, be, sb, false, false)

			// The LRU forgets the first flow entirely and the second
			// flow's reverse entry: the second flow keeps its port
			// (claimed back from its forward entry) although a fresh
			// allocation would now get the first port.
			ka := maglev.FlowKey(a)
			for _, err := range []error{
				e.lb.Maps()[bpf.LbMapSnatFwd].Delete(ka[:]),
				e.lb.Maps()[bpf.LbMapSnatRev].Delete(revKey(be, sa, c.proto)),
				e.lb.Maps()[bpf.LbMapSnatRev].Delete(revKey(be, sb, c.proto)),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := e.sendSNAT(t, c.hook, svc, b, clientPacket(b, false, true)); got != sb {
				t.Errorf("second flow after losing its reverse entry left from %s, want its binding %s", got, sb)
			}
			e.replySNAT(t, c.hook, b, be, sb, false, false)
		})
	}
}

// TestSNATExhaustion gives a backend two ports: a third flow is dropped and
// counted, and the two bound flows keep their ports both ways.
func TestSNATExhaustion(t *testing.T) {
	const lo, hi = 40000, 40001
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{snatPortMin: lo, snatPortMax: hi})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[0])
			e.reconcile(t, svc)
			be := netip.AddrPortFrom(c.fam.backends[0], snatBackendPort)
			flows := []maglev.Flow{
				flowTo(svc.Frontend, c.fam.client, 1000),
				flowTo(svc.Frontend, c.fam.client, 1001),
				flowTo(svc.Frontend, c.fam.client, 1002),
			}
			s0 := e.sendSNAT(t, c.hook, svc, flows[0], clientPacket(flows[0], false, true))
			s1 := e.sendSNAT(t, c.hook, svc, flows[1], clientPacket(flows[1], false, true))
			if s0 == s1 {
				t.Fatalf("two flows share %s", s0)
			}
			// Answered: open, so not for a new flow to take.
			e.replySNAT(t, c.hook, flows[0], be, s0, false, false)
			e.replySNAT(t, c.hook, flows[1], be, s1, false, false)

			before := e.reasons(t)
			for range 2 {
				r := e.runOn(t, c.hook, e.frame(t, clientPacket(flows[2], false, true)))
				if r.verdict != c.hook.drop() {
					t.Fatalf("third flow: verdict %s, want %s", c.hook.verdictName(r.verdict), c.hook.verdictName(c.hook.drop()))
				}
			}
			e.expectReasons(t, before, map[string]uint64{"drop_snat_exhausted": 2})
			if flows, ports := e.snatEntries(t); flows != 2 || ports != 2 {
				t.Errorf("SNAT tables hold %d forward and %d reverse entries, want 2 and 2", flows, ports)
			}

			// Nothing moved: each flow keeps its port, both ways.
			for i, s := range []netip.AddrPort{s0, s1} {
				if got := e.sendSNAT(t, c.hook, svc, flows[i], clientPacket(flows[i], false, true)); got != s {
					t.Errorf("flow %d moved from %s to %s", i, s, got)
				}
				e.replySNAT(t, c.hook, flows[i], be, s, false, false)
			}
		})
	}
}

// TestSNATExpiry gives a backend one port with 1s timeouts: a second flow
// is refused while the first flow's binding lives, and takes the port over
// once it is idle past its timeout; the first flow then finds its port
// taken and, with no other, is dropped rather than sharing it. A reply on
// the dead binding goes to the stack untouched.
func TestSNATExpiry(t *testing.T) {
	const port = 40000
	timeouts := datapath.SNATTimeouts{TCP: time.Second, TCPClosing: time.Second, UDP: time.Second}
	for _, k := range hooks {
		t.Run(k.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{snatPortMin: port, snatPortMax: port, snatTimeouts: timeouts})
			type item struct {
				c    snatCase
				svc  lb.Service
				a, b maglev.Flow
				snat netip.AddrPort
			}
			var items []*item
			var svcs []lb.Service
			for _, fam := range families {
				for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
					c := snatCase{hook: k, fam: fam, proto: proto}
					it := &item{c: c, svc: snatService(fmt.Sprintf("svc%d", len(items)), fam.vip, 80, proto, fam.backends[0])}
					it.a = flowTo(it.svc.Frontend, fam.client, 1000)
					it.b = flowTo(it.svc.Frontend, fam.client, 1001)
					items = append(items, it)
					svcs = append(svcs, it.svc)
				}
			}
			e.reconcile(t, svcs...)
			for _, it := range items {
				it.snat = e.sendSNAT(t, k, it.svc, it.a, clientPacket(it.a, false, true))
				e.replySNAT(t, k, it.a, netip.AddrPortFrom(it.c.fam.backends[0], snatBackendPort), it.snat, false, false)
				r := e.runOn(t, k, e.frame(t, clientPacket(it.b, false, true)))
				if r.verdict != k.drop() {
					t.Fatalf("%s: second flow while the first lives: verdict %s, want %s", it.c, k.verdictName(r.verdict), k.verdictName(k.drop()))
				}
			}

			time.Sleep(1500 * time.Millisecond)

			for _, it := range items {
				old, _ := e.binding(t, it.a)
				be := netip.AddrPortFrom(it.c.fam.backends[0], snatBackendPort)

				// A late reply on the dead binding: not ours any more.
				in := e.frame(t, replyPacket(be, it.snat, it.c.proto, false, false))
				before := e.reasons(t)
				r := e.runOn(t, k, in)
				if r.verdict != k.pass() || !bytes.Equal(r.out, in) {
					t.Errorf("%s: reply on a dead binding: verdict %s, frame changed %v; want it passed untouched", it.c, k.verdictName(r.verdict), !bytes.Equal(r.out, in))
				}
				e.expectReasons(t, before, map[string]uint64{"pass_not_service": 1})

				if got := e.sendSNAT(t, k, it.svc, it.b, clientPacket(it.b, false, true)); got != it.snat {
					t.Errorf("%s: second flow got %s after the first expired, want the freed %s", it.c, got, it.snat)
				}
				e.replySNAT(t, k, it.b, be, it.snat, false, false)

				before = e.reasons(t)
				r = e.runOn(t, k, e.frame(t, clientPacket(it.a, false, true)))
				if r.verdict != k.drop() {
					t.Errorf("%s: first flow back after expiry: verdict %s, want %s (its port is taken, there is no other)", it.c, k.verdictName(r.verdict), k.verdictName(k.drop()))
				}
				e.expectReasons(t, before, map[string]uint64{"drop_snat_exhausted": 1})
				if b, ok := e.binding(t, it.b); !ok || b.rev.LastSeen <= old.rev.LastSeen {
					t.Errorf("%s: the port's reverse entry was not replaced by the second flow's (ok %v)", it.c, ok)
				}
			}
		})
	}
}

// TestSNATClosing checks that a FIN or RST either way moves a TCP binding
// to the closing timeout (1s here, established 1h): after 1.5s its port is
// free for another flow, while an open binding's is not.
func TestSNATClosing(t *testing.T) {
	const port = 40000
	timeouts := datapath.SNATTimeouts{TCP: time.Hour, TCPClosing: time.Second}
	type action struct {
		name           string
		client, server bool // who sends it
		fin, rst       bool
		closing        bool
	}
	actions := []action{
		{name: "nothing"},
		{name: "client FIN", client: true, fin: true, closing: true},
		{name: "client RST", client: true, rst: true, closing: true},
		{name: "backend FIN", server: true, fin: true, closing: true},
		{name: "backend RST", server: true, rst: true, closing: true},
	}
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				e := newSNATEnv(t, envOptions{snatPortMin: port, snatPortMax: port, snatTimeouts: timeouts})
				// One backend port per action: each its own port space.
				var svcs []lb.Service
				for i := range actions {
					s := snatService(fmt.Sprintf("svc%d", i), fam.vip, uint16(80+i), lb.TCP, fam.backends[0])
					s.Backends[0].Addr = netip.AddrPortFrom(fam.backends[0], uint16(9000+i))
					svcs = append(svcs, s)
				}
				e.reconcile(t, svcs...)
				snats := make([]netip.AddrPort, len(actions))
				for i, a := range actions {
					f := flowTo(svcs[i].Frontend, fam.client, 1000)
					in := e.frame(t, clientPacket(f, true, false))
					r := e.runOn(t, k, in)
					if r.verdict != k.tx() {
						t.Fatalf("%s: SYN: verdict %s", a.name, k.verdictName(r.verdict))
					}
					snats[i] = source(t, r.out)
					expectState(t, e, a.name+" after SYN", f, bpf.LbL4lbSnatStateL4LB_SNAT_SYN)
					be := svcs[i].Backends[0].Addr
					handshake(t, e, k, f, be, snats[i], a.name)
					switch {
					case a.client:
						p := clientPacket(f, false, true)
						p.FIN, p.RST = a.fin, a.rst
						if r := e.runOn(t, k, e.frame(t, p)); r.verdict != k.tx() {
							t.Fatalf("%s: verdict %s", a.name, k.verdictName(r.verdict))
						}
					case a.server:
						r := e.runOn(t, k, e.frame(t, replyPacket(be, snats[i], lb.TCP, a.fin, a.rst)))
						if r.verdict != k.tx() {
							t.Fatalf("%s: verdict %s", a.name, k.verdictName(r.verdict))
						}
					}
					want := bpf.LbL4lbSnatStateL4LB_SNAT_OPEN
					if a.closing {
						want = bpf.LbL4lbSnatStateL4LB_SNAT_CLOSING
					}
					b, _ := e.binding(t, f)
					if b.rev.State != want {
						t.Errorf("%s: binding state %v, want %v", a.name, b.rev.State, want)
					}
				}

				time.Sleep(1500 * time.Millisecond)

				for i, a := range actions {
					g := flowTo(svcs[i].Frontend, fam.client, 2000)
					r := e.runOn(t, k, e.frame(t, clientPacket(g, true, false)))
					if !a.closing {
						if r.verdict != k.drop() {
							t.Errorf("%s: a new flow got the port of an open binding (verdict %s)", a.name, k.verdictName(r.verdict))
						}
						continue
					}
					if r.verdict != k.tx() {
						t.Errorf("%s: new flow after the closing timeout: verdict %s, want %s", a.name, k.verdictName(r.verdict), k.verdictName(k.tx()))
						continue
					}
					if got := source(t, r.out); got != snats[i] {
						t.Errorf("%s: new flow got %s, want the freed %s", a.name, got, snats[i])
					}
				}
			})
		}
	}
}

// handshake completes the TCP handshake of f, whose SYN made its binding
// at snat: an ACK before the backend answered (what a spoofer sends after
// its SYN) leaves the binding half-open; the backend's SYN+ACK, then the
// client's ACK, open it.
func handshake(t testing.TB, e *env, k hook, f maglev.Flow, be, snat netip.AddrPort, what string) {
	t.Helper()
	if r := e.runOn(t, k, e.frame(t, clientPacket(f, false, true))); r.verdict != k.tx() {
		t.Fatalf("%s: ACK before the answer: verdict %s", what, k.verdictName(r.verdict))
	}
	expectState(t, e, what+" after an unanswered ACK", f, bpf.LbL4lbSnatStateL4LB_SNAT_SYN)
	synAck(t, e, k, be, snat, what)
	if b, ok := e.binding(t, f); !ok || b.rev.State != bpf.LbL4lbSnatStateL4LB_SNAT_SYN_ANSWERED {
		t.Fatalf("%s: after the SYN+ACK: reverse state %v (bound %v), want syn answered", what, b.rev.State, ok)
	}
	if r := e.runOn(t, k, e.frame(t, clientPacket(f, false, true))); r.verdict != k.tx() {
		t.Fatalf("%s: ACK: verdict %s", what, k.verdictName(r.verdict))
	}
	expectState(t, e, what+" after the client's ACK", f, bpf.LbL4lbSnatStateL4LB_SNAT_OPEN)
}

// synAck sends the backend's SYN+ACK on the binding at snat.
func synAck(t testing.TB, e *env, k hook, be, snat netip.AddrPort, what string) {
	t.Helper()
	p := replyPacket(be, snat, lb.TCP, false, false)
	p.SYN = true
	if r := e.runOn(t, k, e.frame(t, p)); r.verdict != k.tx() {
		t.Fatalf("%s: SYN+ACK: verdict %s", what, k.verdictName(r.verdict))
	}
}

func expectState(t testing.TB, e *env, what string, f maglev.Flow, want bpf.LbL4lbSnatState) {
	t.Helper()
	b, ok := e.binding(t, f)
	if !ok {
		t.Fatalf("%s: flow %v has no complete binding", what, f)
	}
	if b.fwd.State != want || b.rev.State != want {
		t.Errorf("%s: state %v forward, %v reverse; want %v", what, b.fwd.State, b.rev.State, want)
	}
}

// TestSNATTTL checks that a client packet the LB would forward with TTL 0
// goes to the stack untouched (which answers time-exceeded) without making
// a binding, that TTL 2 still goes out with 1, and that a reply with TTL 1
// is dropped.
func TestSNATTTL(t *testing.T) {
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[0])
			e.reconcile(t, svc)
			f := flowTo(svc.Frontend, c.fam.client, 1000)
			p := clientPacket(f, false, true)
			p.TTL = 1
			in := e.frame(t, p)
			before := e.reasons(t)
			r := e.runOn(t, c.hook, in)
			if r.verdict != c.hook.pass() || !bytes.Equal(r.out, in) {
				t.Errorf("TTL 1: verdict %s, changed %v; want it passed untouched", c.hook.verdictName(r.verdict), !bytes.Equal(r.out, in))
			}
			e.expectReasons(t, before, map[string]uint64{"pass_ttl_exceeded": 1})
			if flows, ports := e.snatEntries(t); flows+ports != 0 {
				t.Errorf("TTL 1 made SNAT entries (%d, %d)", flows, ports)
			}
			if n := e.conntrackEntries(t); n != 0 {
				t.Errorf("TTL 1 made %d connection entries", n)
			}

			p = clientPacket(f, false, true)
			p.TTL = 2
			snat := e.sendSNAT(t, c.hook, svc, f, p) // checks TTL 1 on the way out

			be := netip.AddrPortFrom(c.fam.backends[0], snatBackendPort)
			rp := replyPacket(be, snat, c.proto, false, false)
			rp.TTL = 1
			before = e.reasons(t)
			if r := e.runOn(t, c.hook, e.frame(t, rp)); r.verdict != c.hook.drop() {
				t.Errorf("reply with TTL 1: verdict %s, want %s", c.hook.verdictName(r.verdict), c.hook.verdictName(c.hook.drop()))
			}
			e.expectReasons(t, before, map[string]uint64{"drop_ttl_exceeded": 1})
			// A dropped reply is not a reply sent.
			stats, err := e.lb.ServiceCounters(e.state(t, svc.Frontend).ID)
			if err != nil {
				t.Fatal(err)
			}
			if stats.ReplyPackets != 0 || stats.ReplyBytes != 0 {
				t.Errorf("the dropped reply counted as %d replies of %d bytes, want none", stats.ReplyPackets, stats.ReplyBytes)
			}
		})
	}
}

// TestSNATNotOurs sends traffic to a SNAT address that matches no binding:
// it must reach the stack untouched.
func TestSNATNotOurs(t *testing.T) {
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				e := newSNATEnv(t, envOptions{})
				svc := snatService("svc", fam.vip, 80, lb.TCP, fam.backends[0])
				e.reconcile(t, svc)
				f := flowTo(svc.Frontend, fam.client, 1000)
				be := netip.AddrPortFrom(fam.backends[0], snatBackendPort)
				snat := e.sendSNAT(t, k, svc, f, clientPacket(f, false, true))
				other := snat.Port() + 1
				if other > datapath.DefaultSNATPortMax {
					other = datapath.DefaultSNATPortMin
				}
				tests := []struct {
					name string
					p    pkttest.Packet
				}{
					{"no binding on the port", replyPacket(be, netip.AddrPortFrom(snat.Addr(), other), lb.TCP, false, false)},
					{"port below the range", replyPacket(be, netip.AddrPortFrom(snat.Addr(), 22), lb.TCP, false, false)},
					{"other backend port", replyPacket(netip.AddrPortFrom(be.Addr(), be.Port()+1), snat, lb.TCP, false, false)},
					{"other backend", replyPacket(netip.AddrPortFrom(fam.backends[1], be.Port()), snat, lb.TCP, false, false)},
					{"UDP to a TCP binding", replyPacket(be, snat, lb.UDP, false, false)},
					{"client to the SNAT address", clientPacket(maglev.Flow{Src: fam.client, Dst: snat.Addr(), SrcPort: 1000, DstPort: snat.Port(), Proto: uint8(lb.TCP)}, false, true)},
				}
				for _, tt := range tests {
					in := e.frame(t, tt.p)
					before := e.reasons(t)
					r := e.runOn(t, k, in)
					if r.verdict != k.pass() || !bytes.Equal(r.out, in) {
						t.Errorf("%s: verdict %s, changed %v; want it passed untouched", tt.name, k.verdictName(r.verdict), !bytes.Equal(r.out, in))
					}
					e.expectReasons(t, before, map[string]uint64{"pass_not_service": 1})
				}
				// The binding is still there and works.
				e.replySNAT(t, k, f, be, snat, false, false)
			})
		}
	}
}

// TestSNATUDPChecksumZero checks that an IPv4 UDP datagram without a
// checksum stays without one both ways, and that an IPv6 one (invalid, but
// seen) is still updated rather than left at 0.
func TestSNATUDPChecksumZero(t *testing.T) {
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				e := newSNATEnv(t, envOptions{})
				svc := snatService("dns", fam.vip, 53, lb.UDP, fam.backends[0])
				e.reconcile(t, svc)
				f := flowTo(svc.Frontend, fam.client, 1000)
				in := e.frame(t, clientPacket(f, false, false))
				l := pkttest.MustLayout(t, in)
				in[l.L4+6], in[l.L4+7] = 0, 0
				r := e.runOn(t, k, in)
				if r.verdict != k.tx() {
					t.Fatalf("verdict %s", k.verdictName(r.verdict))
				}
				got := binary.BigEndian.Uint16(r.out[l.L4+6:])
				if fam.vip.Is4() {
					if got != 0 {
						t.Errorf("IPv4 UDP checksum 0 became %#04x", got)
					}
					be := netip.AddrPortFrom(fam.backends[0], snatBackendPort)
					expectFrame(t, "forward", r.out, natted(t, in, backendMAC(be.Addr()), e.lbMAC, source(t, r.out), be))
					return
				}
				// The update of 0 is what the sum would be had the
				// client sent the right one, minus that right one: not 0.
				if got == 0 {
					t.Errorf("IPv6 UDP checksum stayed 0")
				}
			})
		}
	}
}

// TestSNATHybrid checks that a hybrid service is DSR for TCP and SNAT for
// UDP.
func TestSNATHybrid(t *testing.T) {
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				e := newSNATEnv(t, envOptions{})
				tcp := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0])
				tcp.Mode = lb.ModeHybrid
				udp := snatService("dns", fam.vip, 53, lb.UDP, fam.backends[0])
				udp.Mode = lb.ModeHybrid
				e.reconcile(t, tcp, udp)

				f := flowTo(udp.Frontend, fam.client, 1000)
				if snat := e.sendSNAT(t, k, udp, f, clientPacket(f, false, false)); snat.Addr() != fam.lbAddr {
					t.Errorf("hybrid UDP left from %s, want SNAT from %s", snat, fam.lbAddr)
				}
				g := flowTo(tcp.Frontend, fam.client, 1000)
				in := e.frame(t, clientPacket(g, true, false))
				r := e.runOn(t, k, in)
				if r.verdict != k.tx() {
					t.Fatalf("hybrid TCP: verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
				}
				if got := checkEncap(t, in, r.out); got != fam.backends[0] {
					t.Errorf("hybrid TCP encapsulated to %s, want DSR to %s", got, fam.backends[0])
				}
			})
		}
	}
}

// TestSNATSupported checks that a SNAT service of a family without a SNAT
// address is refused up front and by the binding, with a clear error.
func TestSNATSupported(t *testing.T) {
	for _, svc := range []lb.Service{
		snatService("tcp", vip4, 80, lb.TCP, backends4[0]),
		snatService("udp", vip6, 53, lb.UDP, backends6[0]),
		{Frontend: lb.Frontend{Addr: vip4, Port: 53, Proto: lb.UDP}, Mode: lb.ModeHybrid, Dispatch: lb.DispatchIPIP},
	} {
		if err := datapath.Supported(svc); err != nil {
			t.Errorf("Supported(%s %s) = %v, want nil", svc.Mode, svc.Frontend, err)
		}
	}

	e := newSNATEnv(t, envOptions{snatAddrs: []netip.Addr{lbAddr4}})
	ok := snatService("v4", vip4, 80, lb.TCP, backends4[0])
	if err := e.lb.Supported(withDefaults(ok)); err != nil {
		t.Errorf("IPv4 SNAT service with an IPv4 SNAT address refused: %v", err)
	}
	for _, svc := range []lb.Service{
		snatService("v6", vip6, 80, lb.TCP, backends6[0]),
		{Name: "hybrid", Frontend: lb.Frontend{Addr: vip6, Port: 53, Proto: lb.UDP}, Mode: lb.ModeHybrid},
	} {
		err := e.lb.Supported(withDefaults(svc))
		if err == nil || !strings.Contains(err.Error(), "IPv6") || !strings.Contains(err.Error(), "snat_addresses") {
			t.Errorf("%s: Supported = %v, want an error naming IPv6 and snat_addresses", svc.Name, err)
		}
		if err := e.rec.Reconcile([]lb.Service{withDefaults(svc)}); err == nil {
			t.Errorf("%s: reconcile programmed a SNAT service the datapath cannot source", svc.Name)
		}
	}
	// A DSR service of that family is fine.
	if err := e.lb.Supported(withDefaults(dsrService("dsr6", vip6, 80, lb.TCP, backends6[0]))); err != nil {
		t.Errorf("IPv6 DSR service refused: %v", err)
	}
}

// TestSNATInterfaceAddresses checks the SNAT addresses taken from the
// interfaces when none are configured: each interface's primary address of
// each family, not secondary or link-local ones.
func TestSNATInterfaceAddresses(t *testing.T) {
	e := newEnv(t)
	e.ns.AddAddr(t, "lb0", "10.0.0.2/24")   // secondary: same subnet
	e.ns.AddAddr(t, "lb0", "fe80::99/64")   // link-local
	e.ns.AddAddr(t, "lo", "192.0.2.200/32") // loopback device, global address
	var (
		got []netip.Addr
		d   *datapath.LB
	)
	err := e.ns.Do(func() error {
		var err error
		if got, err = datapath.InterfaceAddresses([]string{"lb0", "lo"}); err != nil {
			return err
		}
		if _, err := datapath.InterfaceAddresses([]string{"nosuch0"}); err == nil || !strings.Contains(err.Error(), "nosuch0") {
			return fmt.Errorf("missing interface: err %v, want one naming it", err)
		}
		// An interface that cannot be read costs only its addresses.
		d, err = datapath.Load(datapath.Config{Seed: testSeed, MaxServices: 4, MaxBackends: 4, ConntrackMax: 1024, SNATInterfaces: []string{"nosuch0", "lb0"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	want := []netip.Addr{lbAddr4, lbAddr6, netip.MustParseAddr("192.0.2.200")}
	if !slices.Equal(got, want) {
		t.Errorf("InterfaceAddresses = %v, want %v", got, want)
	}
	if got, want := d.SNATAddresses(), want[:2]; !slices.Equal(got, want) {
		t.Errorf("Load with SNATInterfaces nosuch0, lb0: SNAT addresses %v, want %v", got, want)
	}
	if c := d.SNATCapacity(); c < 1024 {
		t.Errorf("SNAT capacity %d, want at least the connection table's 1024", c)
	}
}

// TestSNATRepair checks what happens to a live flow when the LRU forgets
// half of its binding, and when the flow changes backend.
func TestSNATRepair(t *testing.T) {
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			e := newSNATEnv(t, envOptions{})
			b := c.fam.backends
			svc := snatService("svc", c.fam.vip, 80, c.proto, b[0], b[1])
			e.reconcile(t, svc)
			fwdMap, revMap := e.lb.Maps()[bpf.LbMapSnatFwd], e.lb.Maps()[bpf.LbMapSnatRev]
			f := flowTo(svc.Frontend, c.fam.client, 1000)
			snat := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true))
			be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
			key := maglev.FlowKey(f)

			// Forward half lost: the probe finds the flow's own reverse
			// entry at the hashed port and keeps the binding.
			if err := fwdMap.Delete(key[:]); err != nil {
				t.Fatal(err)
			}
			if got := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true)); got != snat {
				t.Errorf("after losing the forward entry the flow left from %s, want its binding %s", got, snat)
			}
			if _, ok := e.binding(t, f); !ok {
				t.Errorf("forward entry not rebuilt")
			}

			// Reverse half lost: the forward entry claims its port back.
			if err := revMap.Delete(revKey(be, snat, c.proto)); err != nil {
				t.Fatal(err)
			}
			if got := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true)); got != snat {
				t.Errorf("after losing the reverse entry the flow left from %s, want its binding %s", got, snat)
			}
			e.replySNAT(t, c.hook, f, be, snat, false, false)

			// The backend goes away: the flow is balanced to the other
			// one and its old tuple is released.
			var other netip.Addr
			for _, a := range b[:2] {
				if a != be.Addr() {
					other = a
				}
			}
			svc = snatService("svc", c.fam.vip, 80, c.proto, other)
			e.reconcile(t, svc)
			moved := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true))
			if flows, ports := e.snatEntries(t); flows != 1 || ports != 1 {
				t.Errorf("after the move the SNAT tables hold %d forward and %d reverse entries, want 1 and 1", flows, ports)
			}
			e.replySNAT(t, c.hook, f, netip.AddrPortFrom(other, snatBackendPort), moved, false, false)
			in := e.frame(t, replyPacket(be, snat, c.proto, false, false))
			if r := e.runOn(t, c.hook, in); r.verdict != c.hook.pass() || !bytes.Equal(r.out, in) {
				t.Errorf("reply from the old backend: verdict %s; want it passed untouched", c.hook.verdictName(r.verdict))
			}
		})
	}
}

// TestSNATCachedBinding checks the established SNAT flow's short cut
// (snat_cached in bpf/include/snat.h): once the flow's flow-cache slot
// holds the port of its binding, each packet still follows the binding's
// tables, not the slot. A lost forward half, a lost reverse half, and a
// binding moved to another port behind the slot's back (its old reverse
// entry still there, still the flow's) are each found by the very next
// packet.
func TestSNATCachedBinding(t *testing.T) {
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			// The flow cache is per CPU: every packet on the same one.
			onOneCPU(t)
			e := newSNATEnv(t, envOptions{})
			b := c.fam.backends
			svc := snatService("svc", c.fam.vip, 80, c.proto, b[0], b[1])
			e.reconcile(t, svc)
			fwdMap, revMap := e.lb.Maps()[bpf.LbMapSnatFwd], e.lb.Maps()[bpf.LbMapSnatRev]
			f := flowTo(svc.Frontend, c.fam.client, 1000)
			be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
			key := maglev.FlowKey(f)
			slotKey := bpf.LbFlowKey{Src: f.Src.As16(), Dst: f.Dst.As16(), Sport: htons(f.SrcPort), Dport: htons(f.DstPort), Proto: f.Proto}
			pkt := clientPacket(f, false, true)
			send := func(step string, want netip.AddrPort) {
				t.Helper()
				if got := e.sendSNAT(t, c.hook, svc, f, pkt); got != want {
					t.Fatalf("%s: the flow left from %s, want %s", step, got, want)
				}
			}
			cached := func(step string, port uint16) {
				t.Helper()
				n := 0
				e.eachCacheSlot(t, func(s *bpf.LbFlowCacheEntry) bool {
					if s.BackendId != 0 && s.Key == slotKey && s.SnatOk == 1 && s.SnatPort == htons(port) {
						n++
					}
					return false
				})
				if n != 1 {
					t.Fatalf("%s: %d flow-cache slots hold port %d of the flow's binding, want 1", step, n, port)
				}
			}

			// The first packet makes the binding, the second fills the
			// slot, the third takes the short cut.
			snat := e.sendSNAT(t, c.hook, svc, f, pkt)
			send("second packet", snat)
			send("third packet", snat)
			cached("after three packets", snat.Port())

			if err := fwdMap.Delete(key[:]); err != nil {
				t.Fatal(err)
			}
			send("forward half lost", snat)
			if _, ok := e.binding(t, f); !ok {
				t.Fatalf("forward half lost: not rebuilt")
			}
			cached("forward half rebuilt", snat.Port())

			if err := revMap.Delete(revKey(be, snat, c.proto)); err != nil {
				t.Fatal(err)
			}
			send("reverse half lost", snat)
			e.replySNAT(t, c.hook, f, be, snat, false, false)

			// Moved: the forward half names another port, whose reverse
			// entry is the flow's; the slot and the old reverse entry
			// still say the old port.
			bnd, ok := e.binding(t, f)
			if !ok {
				t.Fatalf("no binding to move")
			}
			moved := netip.AddrPortFrom(snat.Addr(), snat.Port()+1)
			if snat.Port() == datapath.DefaultSNATPortMax {
				moved = netip.AddrPortFrom(snat.Addr(), snat.Port()-1)
			}
			if err := revMap.Put(revKey(be, moved, c.proto), bnd.rev); err != nil {
				t.Fatal(err)
			}
			bnd.fwd.SnatPort = htons(moved.Port())
			if err := fwdMap.Put(key[:], bnd.fwd); err != nil {
				t.Fatal(err)
			}
			send("binding moved", moved)
			e.replySNAT(t, c.hook, f, be, moved, false, false)
			cached("binding moved", moved.Port())
			send("binding moved, next packet", moved)
		})
	}
}

// BenchmarkSNAT reports the kernel-timed median per packet of the SNAT
// paths at both hooks, next to DSR over IPIP on the same box and run:
// `go test ./lb/datapath -run '^$' -bench SNAT`. Each run gets a fresh
// packet (see internal/bpftest).
func BenchmarkSNAT(b *testing.B) {
	const runs = 4000
	for _, k := range hooks {
		b.Run(k.String(), func(b *testing.B) {
			e := newSNATEnv(b, envOptions{})
			fam := families[0]
			dsr := dsrService("dsr", fam.vip, 80, lb.TCP, fam.backends[:3]...)
			snat := snatService("snat", fam.vip, 81, lb.TCP, fam.backends[:3]...)
			e.reconcile(b, dsr, snat)
			prog, ctx := e.lb.Program(), any(xdpMD{IngressIfindex: uint32(e.ifindex)})
			if k == hookTC {
				prog, ctx = e.lb.ProgramTC(), skbContext(e.ifindex)
			}
			// The floor: a program that only returns, timed the same way.
			floorType, floorRet := ebpf.XDP, int32(xdpPass)
			if k == hookTC {
				floorType, floorRet = ebpf.SchedCLS, -1
			}
			floor, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: floorType, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, floorRet), asm.Return()}})
			if err != nil {
				b.Fatal(err)
			}
			defer floor.Close()
			run := func(prog *ebpf.Program, frame []byte, want uint32) time.Duration {
				var d time.Duration
				err := e.ns.Do(func() error {
					c := ctx
					if x, ok := c.(xdpMD); ok {
						x.DataEnd = uint32(len(frame))
						c = x
					}
					res, err := bpftest.Run(prog, frame, c, 1)
					if err != nil {
						return err
					}
					if res.Verdict != want {
						return fmt.Errorf("verdict %s", k.verdictName(res.Verdict))
					}
					d = res.Duration
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				return d
			}
			time1 := func(frame []byte) time.Duration { return run(prog, frame, k.tx()) }
			median := func(name string, frame func(i int) []byte) {
				ds := make([]time.Duration, runs)
				for i := range ds {
					ds[i] = time1(frame(i))
				}
				slices.Sort(ds)
				b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), name+"-ns/pkt")
			}
			b.ReportMetric(0, "ns/op") // the per-packet metrics are the result
			fds := make([]time.Duration, runs)
			for i := range fds {
				fds[i] = run(floor, e.frame(b, clientPacket(flowTo(snat.Frontend, fam.client, 1), false, true)), k.pass())
			}
			slices.Sort(fds)
			b.ReportMetric(float64(fds[len(fds)/2].Nanoseconds()), "floor-ns/pkt")
			est := func(svc lb.Service) func(int) []byte {
				f := flowTo(svc.Frontend, fam.client, 1000)
				frame := e.frame(b, clientPacket(f, false, true))
				time1(bytes.Clone(frame)) // establish
				return func(int) []byte { return bytes.Clone(frame) }
			}
			median("dsr-est", est(dsr))
			median("snat-est", est(snat))
			median("snat-new", func(i int) []byte {
				return e.frame(b, clientPacket(flowTo(snat.Frontend, fam.client, uint16(2000+i)), true, false))
			})
			f := flowTo(snat.Frontend, fam.client, 1000)
			be := netip.AddrPortFrom(mustPick(b, snat, f), snatBackendPort)
			var bd binding
			if err := e.lb.Maps()[bpf.LbMapSnatFwd].Lookup(maglev.FlowKey(f), &bd.fwd); err != nil {
				b.Fatal(err)
			}
			reply := e.frame(b, replyPacket(be, netip.AddrPortFrom(netip.AddrFrom16(bd.fwd.SnatAddr).Unmap(), ntohs(bd.fwd.SnatPort)), lb.TCP, false, false))
			median("snat-reply", func(int) []byte { return bytes.Clone(reply) })
		})
	}
}
