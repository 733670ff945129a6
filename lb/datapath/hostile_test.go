// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// The packet tests of what a router would refuse to forward (issue 29):
// frames not addressed to the box, the box's own addresses as a source,
// martian IPv6 sources, AH on a rewritten packet, and the ICMP answers a
// router owes a too-big packet on every forwarding path.

// hostileServices are, per family, a DSR (ipip) TCP service on port 80, a
// SNAT TCP one on port 81 and a DSR opt TCP one on port 82.
func hostileServices() []lb.Service {
	var svcs []lb.Service
	for _, fam := range families {
		svcs = append(svcs,
			dsrService("dsr-"+fam.name, fam.vip, 80, lb.TCP, fam.backends[:3]...),
			snatService("snat-"+fam.name, fam.vip, 81, lb.TCP, fam.backends[:3]...))
		opt := dsrService("opt-"+fam.name, fam.vip, 82, lb.TCP, fam.backends[:3]...)
		opt.Dispatch = lb.DispatchOpt
		svcs = append(svcs, opt)
	}
	return svcs
}

// hostileModes names the services of hostileServices by port.
var hostileModes = []struct {
	name string
	port uint16
}{{"dsr", 80}, {"snat", 81}, {"opt", 82}}

// expectRefused runs in through k and checks that it went to the stack
// untouched, counted once under reason, and made no SNAT binding.
func (e *env) expectRefused(t testing.TB, k hook, in []byte, reason string) {
	t.Helper()
	before := e.reasons(t)
	r := e.runOn(t, k, in)
	if r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
		t.Fatalf("verdict %s (changed %v), want %s untouched; output:\n%s", k.verdictName(r.verdict),
			!bytes.Equal(r.out[:len(in)], in), k.verdictName(k.pass()), pkttest.Decode(r.out).Dump())
	}
	e.expectReasons(t, before, map[string]uint64{reason: 1})
	if _, ok := e.binding(t, flowOf(t, in)); ok {
		t.Errorf("a refused packet made a SNAT binding")
	}
}

// expectForwarded runs in through k and checks that it left lb0 towards a
// backend, with no reason counted.
func (e *env) expectForwarded(t testing.TB, k hook, in []byte) {
	t.Helper()
	before := e.reasons(t)
	r := e.runOn(t, k, in)
	if r.verdict != k.tx() {
		t.Fatalf("verdict %s, want %s; output:\n%s", k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	e.expectReasons(t, before, nil)
}

// TestNotForHost sends SYNs (DSR, SNAT and opt) and a SNAT reply whose
// Ethernet destination is not lb0's MAC: broadcast, multicast of the
// family, another host's unicast MAC. Each goes to the stack untouched as
// pass_not_for_host (tc: the kernel's pkt_type; XDP: the MAC l4lbd learnt
// for the ingress interface); the same packet to lb0's MAC is forwarded.
func TestNotForHost(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	svcs := hostileServices()
	e.reconcile(t, svcs...)
	others := []struct {
		name string
		mac  func(fam family) net.HardwareAddr
	}{
		{"broadcast", func(family) net.HardwareAddr { return net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} }},
		{"multicast", func(fam family) net.HardwareAddr {
			if fam.vip.Is4() {
				return net.HardwareAddr{0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}
			}
			return net.HardwareAddr{0x33, 0x33, 0x00, 0x00, 0x00, 0x01}
		}},
		{"another host", func(family) net.HardwareAddr { return net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x99} }},
		// lb0's MAC with the group bit set: only the I/G bit differs.
		{"lb0's MAC as a group", func(family) net.HardwareAddr {
			m := bytes.Clone(e.lbMAC)
			m[0] |= 1
			return m
		}},
	}
	for _, k := range hooks {
		for _, fam := range families {
			for i, m := range hostileModes {
				t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, m.name), func(t *testing.T) {
					f := maglev.Flow{Src: fam.client, Dst: fam.vip, SrcPort: uint16(30000 + 100*int(k) + 10*i), DstPort: m.port, Proto: uint8(lb.TCP)}
					for _, o := range others {
						p := kindPacket(f, pktKinds[0])
						p.DstMAC = o.mac(fam)
						t.Run(o.name, func(t *testing.T) { e.expectRefused(t, k, e.frame(t, p), "pass_not_for_host") })
					}
					e.expectForwarded(t, k, e.frame(t, kindPacket(f, pktKinds[0])))
				})
			}
			t.Run(fmt.Sprintf("%s/%s/snat reply", k, fam.name), func(t *testing.T) {
				svc := serviceOf(t, svcs, fam, lb.TCP)
				for _, s := range svcs {
					if s.Frontend.Addr == fam.vip && s.Frontend.Port == 81 {
						svc = s
					}
				}
				f := flowTo(svc.Frontend, fam.client, 31000+uint16(k))
				snat := e.sendSNAT(t, k, svc, f, clientPacket(f, true, false))
				be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
				p := replyPacket(be, snat, lb.TCP, false, false)
				p.DstMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
				in := e.frame(t, p)
				before := e.reasons(t)
				if r := e.runOn(t, k, in); r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
					t.Fatalf("broadcast reply: verdict %s, want %s untouched", k.verdictName(r.verdict), k.verdictName(k.pass()))
				}
				e.expectReasons(t, before, map[string]uint64{"pass_not_for_host": 1})
				e.replySNAT(t, k, f, be, snat, false, false)
			})
		}
	}
	// At XDP the MAC is the ingress interface's: one the datapath never
	// learnt forwards nothing, whatever the frame's destination.
	t.Run("xdp/interface not learnt", func(t *testing.T) {
		lo := e.ns.Link(t, "lo")
		f := maglev.Flow{Src: client4, Dst: vip4, SrcPort: 32000, DstPort: 80, Proto: uint8(lb.TCP)}
		for _, mac := range []net.HardwareAddr{lo.Attrs().HardwareAddr, e.lbMAC} {
			p := kindPacket(f, pktKinds[0])
			p.DstMAC = mac
			in := e.frame(t, p)
			before := e.reasons(t)
			r := e.runXDPOn(t, lo.Attrs().Index, in)
			if r.verdict != hookXDP.pass() {
				t.Fatalf("frame to %s on lo: verdict %s, want XDP_PASS", mac, hookXDP.verdictName(r.verdict))
			}
			e.expectReasons(t, before, map[string]uint64{"pass_not_for_host": 1})
		}
	})
}

// TestLocalSource sends SYNs from the box's own addresses (a SNAT address,
// which is lb0's, the VIP itself, another service's VIP, and an address
// lb0 has besides) to every mode: each is passed as pass_local_source and
// makes no binding. A client's SYN is forwarded; once the VIP's last
// service is gone, the VIP is a source like any other.
func TestLocalSource(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	extra4, extra6 := netip.MustParseAddr("10.0.0.77"), netip.MustParseAddr("fd00::77")
	e.ns.AddAddr(t, "lb0", extra4.String()+"/24")
	e.ns.AddAddr(t, "lb0", extra6.String()+"/64")
	if err := e.lb.LearnInterface("lb0"); err != nil {
		t.Fatal(err)
	}
	other4, other6 := netip.MustParseAddr("192.0.2.99"), netip.MustParseAddr("2001:db8::99")
	svcs := append(hostileServices(),
		dsrService("other-ipv4", other4, 80, lb.TCP, backends4[:1]...),
		dsrService("other-ipv6", other6, 80, lb.TCP, backends6[:1]...))
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			other, extra := other4, extra4
			if fam.vip.Is6() {
				other, extra = other6, extra6
			}
			for i, m := range hostileModes {
				t.Run(fmt.Sprintf("%s/%s/%s", k, fam.name, m.name), func(t *testing.T) {
					for j, src := range []netip.Addr{fam.lbAddr, fam.vip, other, extra} {
						f := maglev.Flow{Src: src, Dst: fam.vip, SrcPort: uint16(33000 + 100*int(k) + 10*i + j), DstPort: m.port, Proto: uint8(lb.TCP)}
						t.Run(src.String(), func(t *testing.T) {
							e.expectRefused(t, k, e.frame(t, kindPacket(f, pktKinds[0])), "pass_local_source")
						})
					}
					f := maglev.Flow{Src: fam.client, Dst: fam.vip, SrcPort: uint16(33500 + 100*int(k) + 10*i), DstPort: m.port, Proto: uint8(lb.TCP)}
					e.expectForwarded(t, k, e.frame(t, kindPacket(f, pktKinds[0])))
				})
			}
		}
	}
	// The other VIPs' services go: their addresses are no longer the box's.
	e.reconcile(t, hostileServices()...)
	for _, k := range hooks {
		for i, src := range []netip.Addr{other4, other6} {
			fam := familyOf(src)
			f := maglev.Flow{Src: src, Dst: fam.vip, SrcPort: uint16(34000 + 10*int(k) + i), DstPort: 80, Proto: uint8(lb.TCP)}
			t.Run(fmt.Sprintf("%s/%s once its service is gone", k, src), func(t *testing.T) {
				e.expectForwarded(t, k, e.frame(t, kindPacket(f, pktKinds[0])))
			})
		}
	}
}

// TestMartianSourcesEveryMode sends SYNs from the IPv6 sources no router
// forwards (::, link-local, v4-mapped) and IPv4's 0/8 and broadcast to a
// DSR, a SNAT and an opt service: each is passed as pass_martian_source
// and makes no binding; the neighbours just outside each range (fec0::1,
// a global address next to ::ffff:0:0/96) are forwarded.
func TestMartianSourcesEveryMode(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	e.reconcile(t, hostileServices()...)
	for _, k := range hooks {
		for i, m := range hostileModes {
			t.Run(fmt.Sprintf("%s/%s", k, m.name), func(t *testing.T) {
				for j, c := range []struct {
					src     string
					martian bool
				}{
					{"::", true}, {"fe80::1", true}, {"febf::1", true}, {"::ffff:198.51.100.7", true},
					{"0.0.0.0", true}, {"255.255.255.255", true},
					{"fec0::1", false}, {"::1:ffff:c633:6407", false}, {"2001:db8:1::8", false},
				} {
					src := netip.MustParseAddr(c.src)
					fam := familyOf(src)
					f := maglev.Flow{Src: src, Dst: fam.vip, SrcPort: uint16(35000 + 100*int(k) + 10*i + j), DstPort: m.port, Proto: uint8(lb.TCP)}
					t.Run(c.src, func(t *testing.T) {
						in := e.frame(t, kindPacket(f, pktKinds[0]))
						if c.martian {
							e.expectRefused(t, k, in, "pass_martian_source")
						} else {
							e.expectForwarded(t, k, in)
						}
					})
				}
			})
		}
	}
}

// ah is an IPv6 authentication header body of n bytes in all (12 at
// least: next header, length, reserved, SPI, sequence number, then the
// ICV), as pkttest.Ext carries it (without its first two bytes).
func ah(n int) []byte {
	b := make([]byte, n-2)
	b[5] = 0x42 // SPI
	b[9] = 1    // sequence number
	return b
}

// TestIPv6AH sends TCP segments carrying an IPv6 authentication header:
// DSR over ipip carries them byte for byte and forwards them; SNAT and
// opt, whose rewrites would break the ICV, pass them as pass_ipv6_ah; an
// AH shorter than its 12 fixed bytes is malformed in every mode.
func TestIPv6AH(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	e.reconcile(t, hostileServices()...)
	fam := families[1]
	for _, k := range hooks {
		for i, m := range hostileModes {
			t.Run(fmt.Sprintf("%s/%s", k, m.name), func(t *testing.T) {
				f := maglev.Flow{Src: fam.client, Dst: fam.vip, SrcPort: uint16(36000 + 100*int(k) + 10*i), DstPort: m.port, Proto: uint8(lb.TCP)}
				p := kindPacket(f, pktKinds[0])
				p.IPv6Ext = []pkttest.Ext{{Type: layers.IPProtocolAH, Body: ah(24)}}
				in := e.frame(t, p)
				if m.name == "dsr" {
					e.expectForwarded(t, k, in)
					r := e.runOn(t, k, in)
					checkEncap(t, in, r.out)
				} else {
					e.expectRefused(t, k, in, "pass_ipv6_ah")
				}
				// 8 bytes (length field 0): no room for the sequence number.
				short := bytes.Clone(in)
				l := pkttest.MustLayout(t, short)
				short[l.L3+40+1] = 0
				copy(short[l.L3+40+8:], in[l.L3+40+24:])
				short = short[:len(in)-16]
				put16(short, l.L3+4, uint16(l.L3Len-40-16))
				before := e.reasons(t)
				if r := e.runOn(t, k, short); r.verdict != k.pass() || !bytes.Equal(r.out[:len(short)], short) {
					t.Fatalf("AH of 8 bytes: verdict %s, want %s untouched", k.verdictName(r.verdict), k.verdictName(k.pass()))
				}
				e.expectReasons(t, before, map[string]uint64{"pass_malformed_l3": 1})
				if _, ok := e.binding(t, f); ok {
					t.Errorf("a malformed packet made a SNAT binding")
				}
			})
		}
	}
}

// TestICMPTooBigSNAT sends SNAT packets one byte over the egress MTU: a
// client's gets ICMP fragmentation-needed / packet-too-big from the VIP
// announcing the MTU itself (SNAT adds nothing), a backend's reply one
// from the SNAT address, as a router on either path would answer; the
// packets that fit are forwarded, and IPv4 without DF is dropped
// unanswered.
func TestICMPTooBigSNAT(t *testing.T) {
	e := newSNATEnv(t, envOptions{icmpRate: 1000})
	e.setMTU(t, tooBigMTU)
	svcs := hostileServices()
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			var svc lb.Service
			for _, s := range svcs {
				if s.Frontend.Addr == fam.vip && s.Frontend.Port == 81 {
					svc = s
				}
			}
			t.Run(fmt.Sprintf("%s/%s", k, fam.name), func(t *testing.T) {
				f := flowTo(svc.Frontend, fam.client, 37000+uint16(k))
				snat := e.sendSNAT(t, k, svc, f, clientPacket(f, true, false))

				fits := e.sizedPacket(t, f, pktKinds[1], tooBigMTU)
				e.expectForwarded(t, k, fits)
				big := e.sizedPacket(t, f, pktKinds[1], tooBigMTU+1)
				before := e.reasons(t)
				e.expectTooBig(t, k, big, e.runOn(t, k, big), tooBigMTU)
				e.expectReasons(t, before, map[string]uint64{"icmp_frag_needed_sent": 1})

				be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
				reply := func(l3 int) []byte {
					p := replyPacket(be, snat, lb.TCP, false, false)
					p.DF = true
					return e.padded(t, p, l3)
				}
				before = e.reasons(t)
				if r := e.runOn(t, k, reply(tooBigMTU)); r.verdict != k.tx() {
					t.Fatalf("reply that fits: verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
				}
				e.expectReasons(t, before, nil)
				in := reply(tooBigMTU + 1)
				before = e.reasons(t)
				e.expectTooBigVia(t, k, in, e.runOn(t, k, in), tooBigMTU, backendMAC(be.Addr()))
				e.expectReasons(t, before, map[string]uint64{"icmp_frag_needed_sent": 1})

				if fam.vip.Is4() {
					p := kindPacket(f, pktKinds[1])
					p.DF = false
					before = e.reasons(t)
					if r := e.runOn(t, k, e.padded(t, p, tooBigMTU+1)); r.verdict != k.drop() {
						t.Errorf("IPv4 without DF: verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.drop()))
					}
					e.expectReasons(t, before, map[string]uint64{"drop_frag_needed": 1})
				}
			})
		}
	}
}

// TestICMPTooBigJumbo sends DSR packets bigger than the MTU of the path
// back to the client (a jumbo frame in, 1400 out): both hooks answer them.
// At tc the answer's route lookup used to check the oversized skb itself
// against that MTU, and dropped the packet unanswered.
func TestICMPTooBigJumbo(t *testing.T) {
	e := newSNATEnv(t, envOptions{icmpRate: 1000})
	e.setMTU(t, tooBigMTU)
	svcs := hostileServices()
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(fmt.Sprintf("%s/%s", k, fam.name), func(t *testing.T) {
				over := 20
				if fam.vip.Is6() {
					over = 40
				}
				f := maglev.Flow{Src: fam.client, Dst: fam.vip, SrcPort: 38000 + uint16(k), DstPort: 80, Proto: uint8(lb.TCP)}
				in := e.sizedPacket(t, f, pktKinds[1], 2000)
				before := e.reasons(t)
				e.expectTooBig(t, k, in, e.runOn(t, k, in), tooBigMTU-over)
				e.expectReasons(t, before, map[string]uint64{"icmp_frag_needed_sent": 1})
			})
		}
	}
}

// TestICMPTooBigNotToNonUnicast sends too-big packets from the unspecified
// address and from multicast and broadcast sources: none is answered (RFC
// 4443 2.4(e), RFC 1812 4.3.2.7), nothing leaves; a unicast neighbour is.
func TestICMPTooBigNotToNonUnicast(t *testing.T) {
	e := newSNATEnv(t, envOptions{icmpRate: 1000})
	e.setMTU(t, tooBigMTU)
	e.reconcile(t, hostileServices()...)
	for _, k := range hooks {
		for i, c := range []struct {
			src    string
			answer bool
		}{{"::", false}, {"ff02::1", false}, {"0.0.0.0", false}, {"224.0.0.1", false}, {"255.255.255.255", false},
			{"2001:db8:1::9", true}, {"198.51.100.9", true}} {
			src := netip.MustParseAddr(c.src)
			fam := familyOf(src)
			t.Run(fmt.Sprintf("%s/%s", k, c.src), func(t *testing.T) {
				f := maglev.Flow{Src: src, Dst: fam.vip, SrcPort: uint16(39000 + 10*int(k) + i), DstPort: 80, Proto: uint8(lb.TCP)}
				in := e.sizedPacket(t, f, pktKinds[1], 1500)
				r := e.runOn(t, k, in)
				if c.answer {
					e.expectTooBig(t, k, in, r, tooBigMTU-map[bool]int{true: 20, false: 40}[src.Is4()])
					return
				}
				if r.verdict == k.tx() || r.verdict == tcActRedirect {
					t.Fatalf("verdict %s: something was sent to %s:\n%s", k.verdictName(r.verdict), src, pkttest.Decode(r.out).Dump())
				}
			})
		}
	}
}

// TestNotForHostMACChange changes lb0's MAC: the datapath follows it from
// netlink, so frames to the new MAC are forwarded and frames to the old one
// refused as pass_not_for_host, at both hooks.
func TestNotForHostMACChange(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	e.reconcile(t, hostileServices()...)
	old := bytes.Clone(e.lbMAC)
	mac := net.HardwareAddr{0x02, 0x42, 0x00, 0x00, 0x00, 0x01}
	if err := e.ns.Netlink().LinkSetHardwareAddr(e.ns.Link(t, "lb0"), mac); err != nil {
		t.Fatalf("set lb0's MAC: %v", err)
	}
	e.lbMAC = mac
	for _, k := range hooks {
		f := maglev.Flow{Src: client4, Dst: vip4, SrcPort: 40100 + uint16(k), DstPort: 80, Proto: uint8(lb.TCP)}
		in := e.frame(t, kindPacket(f, pktKinds[0]))
		// The netlink event reaches the datapath within milliseconds. A
		// new MAC also flushes lb0's neighbours, so the frame may go to
		// the stack to resolve its backend (pass_no_neigh): what matters
		// is that it is the box's now.
		deadline := time.Now().Add(5 * time.Second)
		for {
			before := e.reasons(t)
			r := e.runOn(t, k, in)
			moved := diffReasons(before, e.reasons(t))
			if r.verdict == k.tx() || r.verdict == k.pass() && moved["pass_no_neigh"] == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: a frame to lb0's new MAC %s is still not taken: verdict %s, reasons %v", k, mac, k.verdictName(r.verdict), moved)
			}
			time.Sleep(10 * time.Millisecond)
		}
		p := kindPacket(f, pktKinds[0])
		p.DstMAC = old
		e.expectRefused(t, k, e.frame(t, p), "pass_not_for_host")
	}
}

// diffReasons is what moved between two reads of the reason counters.
func diffReasons(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			out[k] = v - before[k]
		}
	}
	return out
}

// TestICMPErrorFromLocalSource sends an ICMP error about a DSR flow's reply
// from the box's own address (its SNAT address, and the VIP itself), and
// from a broadcast Ethernet destination: none is passed on to a backend,
// each is counted; the same error from a router reaches the backend.
func TestICMPErrorFromLocalSource(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	svcs := hostileServices()
	e.reconcile(t, svcs...)
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(fmt.Sprintf("%s/%s", k, fam.name), func(t *testing.T) {
				svc := serviceOf(t, svcs, fam, lb.TCP)
				f := flowTo(svc.Frontend, fam.client, 41000+uint16(k))
				kind := errKinds(fam)[1]
				quote := quoteOf(t, replyPkt(f, netip.AddrPortFrom(f.Dst, f.DstPort)), kind)
				for _, src := range []netip.Addr{fam.lbAddr, fam.vip} {
					in := e.icmpErr(t, src, f.Dst, kind, quote)
					before := e.reasons(t)
					if r := e.runOn(t, k, in); r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
						t.Fatalf("error from %s: verdict %s, want %s untouched", src, k.verdictName(r.verdict), k.verdictName(k.pass()))
					}
					e.expectReasons(t, before, map[string]uint64{"pass_local_source": 1})
				}
				in := e.icmpErr(t, routerOf(fam), f.Dst, kind, quote)
				copy(in[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
				before := e.reasons(t)
				if r := e.runOn(t, k, in); r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
					t.Fatalf("broadcast error: verdict %s, want %s untouched", k.verdictName(r.verdict), k.verdictName(k.pass()))
				}
				e.expectReasons(t, before, map[string]uint64{"pass_not_for_host": 1})
				e.sendICMPToFlow(t, k, svc, f, kind)
			})
		}
	}
}

// TestLocalSourceAddrAdded adds an address to lb0 after the datapath
// started: it follows it from netlink, so a SYN from that address is
// refused as pass_local_source at both hooks; once the address is removed,
// the same SYN is forwarded again.
func TestLocalSourceAddrAdded(t *testing.T) {
	e := newSNATEnv(t, envOptions{})
	e.reconcile(t, hostileServices()...)
	for _, fam := range families {
		added := netip.MustParseAddr("198.51.100.77")
		if fam.name == "ipv6" {
			added = netip.MustParseAddr("2001:db8:1::77")
		}
		f := maglev.Flow{Src: added, Dst: fam.vip, SrcPort: 40200, DstPort: 80, Proto: uint8(lb.TCP)}
		in := e.frame(t, kindPacket(f, pktKinds[0]))
		for _, k := range hooks {
			e.expectForwarded(t, k, in)
		}
		bits := added.BitLen()
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: added.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}
		link := e.ns.Link(t, "lb0")
		if err := e.ns.Netlink().AddrAdd(link, addr); err != nil {
			t.Fatalf("add %s to lb0: %v", added, err)
		}
		// The netlink event reaches the datapath within milliseconds.
		waitReason(t, e, in, "pass_local_source", "after "+added.String()+" was added to lb0")
		for _, k := range hooks {
			e.expectRefused(t, k, in, "pass_local_source")
		}
		if err := e.ns.Netlink().AddrDel(link, addr); err != nil {
			t.Fatalf("remove %s from lb0: %v", added, err)
		}
		waitReason(t, e, in, "", "after "+added.String()+" was removed from lb0")
		for _, k := range hooks {
			e.expectForwarded(t, k, in)
		}
	}
}

// waitReason runs in at XDP until it moves reason ("": is forwarded), for
// up to 5 seconds.
func waitReason(t *testing.T, e *env, in []byte, reason, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		before := e.reasons(t)
		r := e.runOn(t, hookXDP, in)
		moved := diffReasons(before, e.reasons(t))
		if reason == "" && r.verdict == hookXDP.tx() || reason != "" && moved[reason] == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: verdict %s, reasons %v, want %q", what, hookXDP.verdictName(r.verdict), moved, reason)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
