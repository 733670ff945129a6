// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb/bfd"
)

// bfdControl is a BFD control packet (RFC 5880 4.1) without
// authentication.
type bfdControl struct {
	version, state        uint8
	poll, final, auth     bool
	mult, length          uint8
	my, your              uint32
	minTx, minRx, minEcho uint32
}

func (c bfdControl) bytes() []byte {
	b := make([]byte, 24)
	b[0] = c.version << 5 // diagnostic 0
	b[1] = c.state << 6
	if c.poll {
		b[1] |= 0x20
	}
	if c.final {
		b[1] |= 0x10
	}
	if c.auth {
		b[1] |= 0x04
	}
	b[2], b[3] = c.mult, c.length
	binary.BigEndian.PutUint32(b[4:], c.my)
	binary.BigEndian.PutUint32(b[8:], c.your)
	binary.BigEndian.PutUint32(b[12:], c.minTx)
	binary.BigEndian.PutUint32(b[16:], c.minRx)
	binary.BigEndian.PutUint32(b[20:], c.minEcho)
	return b
}

func parseBFDControl(b []byte) bfdControl {
	return bfdControl{
		version: b[0] >> 5, state: b[1] >> 6,
		poll: b[1]&0x20 != 0, final: b[1]&0x10 != 0, auth: b[1]&0x04 != 0,
		mult: b[2], length: b[3],
		my: binary.BigEndian.Uint32(b[4:]), your: binary.BigEndian.Uint32(b[8:]),
		minTx: binary.BigEndian.Uint32(b[12:]), minRx: binary.BigEndian.Uint32(b[16:]), minEcho: binary.BigEndian.Uint32(b[20:]),
	}
}

// The held session of the tests: l4lbd's discriminator, the router's, and
// l4lbd's source port and timers.
const (
	heldLocal   = 0x0a0b0c0d
	heldRemote  = 0x01020304
	heldSrcPort = 50123
)

// routerUp is the router's packet of the held session, Up.
func routerUp() bfdControl {
	return bfdControl{version: 1, state: 3, mult: 3, length: 24, my: heldRemote, your: heldLocal, minTx: 300000, minRx: 300000}
}

// TestBFDHold checks the datapath's answers for a restarting l4lbd
// (bpf/include/bfd.h): with a session held, the router's Up packet is
// answered in place (XDP_TX) with l4lbd's packet, a poll with the final
// bit; anything that does not match the session exactly, a deadline
// passed, a released session, and tc go to the stack untouched.
func TestBFDHold(t *testing.T) {
	e := newEnv(t)
	for _, fam := range families {
		router := fam.client
		t.Run(fam.name, func(t *testing.T) {
			frame := func(c bfdControl, mut func(*pkttest.Packet)) []byte {
				p := pkttest.Packet{
					Src:     netip.AddrPortFrom(router, 49999),
					Dst:     netip.AddrPortFrom(fam.lbAddr, 3784),
					Proto:   layers.IPProtocolUDP,
					TTL:     255,
					Payload: c.bytes(),
				}
				if mut != nil {
					mut(&p)
				}
				return e.frame(t, p)
			}
			hold := bfd.Saved{Peer: router, LocalDiscr: heldLocal, RemoteDiscr: heldRemote, SrcPort: heldSrcPort,
				DetectMultiplier: 3, MinTx: 300 * time.Millisecond, MinRx: 250 * time.Millisecond,
				RemoteDetectMultiplier: 4, RemoteMinTx: 200 * time.Millisecond, RemoteMinRx: 100 * time.Millisecond}
			up := frame(routerUp(), nil)

			// Nothing held: the stack's.
			e.expectPassed(t, hookXDP, up)
			if err := e.lb.HoldBFD([]bfd.Saved{hold}, time.Minute); err != nil {
				t.Fatal(err)
			}
			for _, poll := range []bool{false, true} {
				c := routerUp()
				c.poll = poll
				in := frame(c, nil)
				before := e.reasons(t)
				r := e.run(t, in)
				if r.verdict != xdpTX {
					t.Fatalf("poll %v: verdict %s, want XDP_TX", poll, verdictName(r.verdict))
				}
				e.expectReasons(t, before, nil)
				checkBFDAnswer(t, in, r.out[:len(in)], fam.lbAddr, router, poll)
			}

			refused := []struct {
				name string
				in   []byte
			}{
				{"ttl 64", frame(routerUp(), func(p *pkttest.Packet) { p.TTL = 64 })},
				{"down", frame(func() bfdControl { c := routerUp(); c.state = 1; c.your = 0; return c }(), nil)},
				{"init", frame(func() bfdControl { c := routerUp(); c.state = 2; return c }(), nil)},
				{"other session of the router", frame(func() bfdControl { c := routerUp(); c.my++; return c }(), nil)},
				{"not our discriminator", frame(func() bfdControl { c := routerUp(); c.your++; return c }(), nil)},
				{"authentication", frame(func() bfdControl { c := routerUp(); c.auth = true; return c }(), nil)},
				{"version 0", frame(func() bfdControl { c := routerUp(); c.version = 0; return c }(), nil)},
				{"longer packet", frame(routerUp(), func(p *pkttest.Packet) { p.Payload = append(p.Payload, 0, 0, 0, 0) })},
				{"another router", frame(routerUp(), func(p *pkttest.Packet) { p.Src = netip.AddrPortFrom(fam.unrouted, 49999) })},
				{"broadcast frame", frame(routerUp(), func(p *pkttest.Packet) { p.DstMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} })},
			}
			for _, c := range refused {
				t.Run(c.name, func(t *testing.T) { e.expectPassed(t, hookXDP, c.in) })
			}
			// tc cannot keep a rewritten checksum: the stack's.
			e.expectPassed(t, hookTC, up)

			held, err := e.lb.HeldBFD()
			if err != nil || len(held) != 1 {
				t.Fatalf("HeldBFD = %+v, %v; want the session", held, err)
			}
			if h := held[0]; h.Peer != router || h.LocalDiscr != heldLocal || h.RemoteDiscr != heldRemote || h.SrcPort != heldSrcPort ||
				h.MinTx != hold.MinTx || h.MinRx != hold.MinRx || h.DetectMultiplier != 3 || h.Answered != 2 || time.Until(h.Until) < 30*time.Second ||
				h.RemoteDetectMultiplier != 4 || h.RemoteMinTx != hold.RemoteMinTx || h.RemoteMinRx != hold.RemoteMinRx {
				t.Errorf("HeldBFD = %+v; want %+v, answered 2, about a minute left", h, hold)
			}
			n, err := e.lb.ReleaseBFD(router)
			if err != nil || n != 2 {
				t.Errorf("ReleaseBFD = %d, %v; want 2 answered", n, err)
			}
			e.expectPassed(t, hookXDP, up)

			// A deadline passed: not answered, not handed on.
			if err := e.lb.HoldBFD([]bfd.Saved{hold}, time.Millisecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			e.expectPassed(t, hookXDP, up)
			if held, err := e.lb.HeldBFD(); err != nil || len(held) != 0 {
				t.Errorf("HeldBFD after the deadline = %+v, %v; want none", held, err)
			}
			if _, err := e.lb.ReleaseBFD(router); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// expectPassed runs in through k and checks it went to the stack
// untouched, counted as pass_not_service.
func (e *env) expectPassed(t testing.TB, k hook, in []byte) {
	t.Helper()
	before := e.reasons(t)
	r := e.runOn(t, k, in)
	if r.verdict != k.pass() || !bytes.Equal(r.out[:len(in)], in) {
		t.Fatalf("%s: verdict %s (changed %v), want %s untouched", k, k.verdictName(r.verdict),
			!bytes.Equal(r.out[:len(in)], in), k.verdictName(k.pass()))
	}
	e.expectReasons(t, before, map[string]uint64{"pass_not_service": 1})
}

// checkBFDAnswer checks out, the answer to the router's packet in: the
// frame sent back with addresses swapped, TTL 255, from the session's
// port to the control port, valid checksums, and the held session's
// packet, with the final bit if in polled.
func checkBFDAnswer(t *testing.T, in, out []byte, lbAddr, router netip.Addr, poll bool) {
	t.Helper()
	if ok, carried, computed, err := pkttest.L4ChecksumValid(out); err != nil || !ok {
		t.Errorf("UDP checksum %#04x, want %#04x (%v)", carried, computed, err)
	}
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	eth := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	inEth := gopacket.NewPacket(in, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !bytes.Equal(eth.SrcMAC, inEth.DstMAC) || !bytes.Equal(eth.DstMAC, inEth.SrcMAC) {
		t.Errorf("MACs %s -> %s, want %s -> %s", eth.SrcMAC, eth.DstMAC, inEth.DstMAC, inEth.SrcMAC)
	}
	var src, dst netip.Addr
	if ip := pkt.Layer(layers.LayerTypeIPv4); ip != nil {
		ip4 := ip.(*layers.IPv4)
		src, dst = netip.AddrFrom4([4]byte(ip4.SrcIP.To4())), netip.AddrFrom4([4]byte(ip4.DstIP.To4()))
		if ip4.TTL != 255 {
			t.Errorf("TTL %d, want 255", ip4.TTL)
		}
		hdr := pkttest.IPPacket(t, out)[:20]
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(hdr[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		if sum != 0xffff {
			t.Errorf("IPv4 header checksum wrong")
		}
	} else {
		ip6 := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		src, dst = netip.AddrFrom16([16]byte(ip6.SrcIP)), netip.AddrFrom16([16]byte(ip6.DstIP))
		if ip6.HopLimit != 255 {
			t.Errorf("hop limit %d, want 255", ip6.HopLimit)
		}
	}
	if src != lbAddr || dst != router {
		t.Errorf("IP %s -> %s, want %s -> %s", src, dst, lbAddr, router)
	}
	udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if udp.SrcPort != heldSrcPort || udp.DstPort != 3784 {
		t.Errorf("UDP %d -> %d, want %d -> 3784", udp.SrcPort, udp.DstPort, heldSrcPort)
	}
	got := parseBFDControl(udp.Payload)
	want := bfdControl{version: 1, state: 3, final: poll, mult: 3, length: 24, my: heldLocal, your: heldRemote, minTx: 300000, minRx: 250000}
	if got != want {
		t.Errorf("answer %+v, want %+v", got, want)
	}
}
