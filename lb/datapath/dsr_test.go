// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
)

// TestDSRForward sends one packet per family and protocol to a VIP and
// checks every field of the encapsulated packet the program transmits.
func TestDSRForward(t *testing.T) {
	e := newEnv(t)
	var svcs []lb.Service
	for _, fam := range families {
		svcs = append(svcs,
			dsrService("web-"+fam.name, fam.vip, 80, lb.TCP, fam.backends[:3]...),
			dsrService("dns-"+fam.name, fam.vip, 53, lb.UDP, fam.backends[:3]...))
	}
	e.reconcile(t, svcs...)

	for _, svc := range svcs {
		t.Run(svc.Name, func(t *testing.T) {
			f := flowTo(svc.Frontend, familyOf(svc.Frontend.Addr).client, 40000)
			p := packet(f, true, false, []byte("hello, backend"))
			// Fields the outer header copies or must leave alone: DSCP
			// and ECN bits, DF, the identification, a TTL that is not
			// the outer one, and an IPv6 flow label the outer replaces.
			p.TOS, p.DF, p.ID, p.TTL, p.FlowLabel = 0xb9, true, 0x4242, 17, 0xabcde
			in := e.frame(t, p)
			before := e.reasons(t)

			got := e.checkTX(t, in, e.run(t, in))

			if want := mustPick(t, svc, f); got != want {
				t.Errorf("sent to backend %s, want %s (table[FlowHash %% %d] in Go)", got, want, testTableSize)
			}
			e.expectReasons(t, before, nil)
		})
	}
}

// TestDSRPaddingNotCarried checks that bytes after the IP packet (Ethernet
// padding of a minimum-size frame, or a trailer) stay out of the tunnel.
func TestDSRPaddingNotCarried(t *testing.T) {
	e := newEnv(t)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[:3]...)
			e.reconcile(t, svc)
			f := flowTo(svc.Frontend, fam.client, 40001)
			in := e.frame(t, packet(f, true, false, nil))
			l3end := 14 + len(pkttest.IPPacket(t, in))
			if fam.vip.Is4() {
				// A 40-byte IPv4 SYN needs 6 bytes of padding to make
				// the 60-byte minimum frame, which the builder adds as
				// a NIC would hand it over.
				if l3end != 54 || len(in) != 60 {
					t.Fatalf("IPv4 SYN: IP packet ends at %d in a %d-byte frame, want 54 in 60", l3end, len(in))
				}
			} else {
				// No padding for IPv6: give the frame a trailer instead.
				in = append(in, make([]byte, 6)...)
			}
			for i := l3end; i < len(in); i++ {
				in[i] = 0xee
			}

			got := e.checkTX(t, in, e.run(t, in))
			if want := mustPick(t, svc, f); got != want {
				t.Errorf("sent to backend %s, want %s", got, want)
			}
		})
	}
}

// TestNoBackend checks that a frontend without an eligible backend drops
// new flows and counts them.
func TestNoBackend(t *testing.T) {
	tests := []struct {
		name  string
		state func(b lb.Backend) lb.Backend
		none  bool
	}{
		{name: "no backends", none: true},
		{name: "all draining", state: func(b lb.Backend) lb.Backend { b.State = lb.Draining; return b }},
		{name: "all weight 0", state: func(b lb.Backend) lb.Backend { b.Weight = 0; return b }},
		{name: "all disabled", state: func(b lb.Backend) lb.Backend { b.State = lb.Disabled; return b }},
	}
	e := newEnv(t)
	for _, fam := range families {
		for _, tt := range tests {
			t.Run(fam.name+"/"+tt.name, func(t *testing.T) {
				svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[:3]...)
				if tt.none {
					svc.Backends = nil
				}
				for i := range svc.Backends {
					svc.Backends[i] = tt.state(svc.Backends[i])
				}
				e.reconcile(t, svc)
				id := e.state(t, svc.Frontend).ID
				statsBefore, err := e.lb.ServiceCounters(id)
				if err != nil {
					t.Fatal(err)
				}
				before := e.reasons(t)

				for _, ack := range []bool{false, true} {
					f := flowTo(svc.Frontend, fam.client, 40002)
					r := e.run(t, e.frame(t, packet(f, !ack, ack, nil)))
					if r.verdict != xdpDrop {
						t.Errorf("ack=%v: verdict %s, want XDP_DROP", ack, verdictName(r.verdict))
					}
				}
				e.expectReasons(t, before, map[string]uint64{"drop_no_backend": 2})
				stats, err := e.lb.ServiceCounters(id)
				if err != nil {
					t.Fatal(err)
				}
				if stats != statsBefore {
					t.Errorf("service counters moved from %+v to %+v for dropped packets", statsBefore, stats)
				}
				if n, err := e.lb.ConntrackEntries(); err != nil || n != 0 {
					t.Errorf("connection table holds %d entries (err %v), want 0: a dropped flow must leave none", n, err)
				}
			})
		}
	}
}

// TestNextHop covers the ways the route to a backend can fail.
func TestNextHop(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name+"/no route", func(t *testing.T) {
			e := newEnv(t)
			svc := dsrService("web", fam.vip, 80, lb.TCP, fam.unrouted)
			e.reconcile(t, svc)
			before := e.reasons(t)
			r := e.run(t, e.frame(t, packet(flowTo(svc.Frontend, fam.client, 40003), true, false, nil)))
			if r.verdict != xdpDrop {
				t.Errorf("verdict %s, want XDP_DROP", verdictName(r.verdict))
			}
			e.expectReasons(t, before, map[string]uint64{"drop_no_route": 1})
		})

		t.Run(fam.name+"/no neighbour", func(t *testing.T) {
			e := newEnv(t)
			svc := dsrService("web", fam.vip, 80, lb.TCP, fam.noNeigh)
			e.reconcile(t, svc)
			before := e.reasons(t)
			in := e.frame(t, packet(flowTo(svc.Frontend, fam.client, 40004), true, false, []byte("x")))
			r := e.run(t, in)
			if r.verdict != xdpPass {
				t.Fatalf("verdict %s, want XDP_PASS (the stack resolves the neighbour)", verdictName(r.verdict))
			}
			if got := checkEncap(t, in, r.out); got != fam.noNeigh {
				t.Errorf("encapsulated to %s, want %s", got, fam.noNeigh)
			}
			// The stack only forwards a frame addressed to the interface.
			if got := net.HardwareAddr(r.out[0:6]); !bytes.Equal(got, e.lbMAC) {
				t.Errorf("Ethernet destination %s, want lb0's %s so that the stack accepts the frame", got, e.lbMAC)
			}
			e.expectReasons(t, before, map[string]uint64{"pass_no_neigh": 1})
			c, err := e.lb.ServiceCounters(e.state(t, svc.Frontend).ID)
			if err != nil {
				t.Fatal(err)
			}
			if c.Packets != 1 {
				t.Errorf("service counted %d packets, want 1: the packet is forwarded, with the stack's help", c.Packets)
			}
		})
	}

	for _, fam := range families {
		t.Run(fam.name+"/other interface", func(t *testing.T) {
			e := newEnv(t)
			// A second interface, lb1, with its own subnet and backend.
			peer := testnet.NewNS(t, "peer1")
			testnet.Veth(t, e.ns, "lb1", peer, "peer1")
			// The program is attached to lb1 below and counts whatever
			// arrives there: the peer must not send the router
			// solicitations and MLD reports IPv6 sends on its own.
			peer.Sysctl(t, "net.ipv6.conf.peer1.disable_ipv6", "1")
			e.ns.AddAddr(t, "lb1", "10.1.0.1/24")
			e.ns.AddAddr(t, "lb1", "fd01::1/64")
			be := netip.MustParseAddr("10.1.0.11")
			if fam.vip.Is6() {
				be = netip.MustParseAddr("fd01::11")
			}
			e.ns.AddNeigh(t, "lb1", be.String(), backendMAC(be))
			lb1MAC := e.ns.MAC(t, "lb1")
			svc := dsrService("web", fam.vip, 80, lb.TCP, be)
			e.reconcile(t, svc)
			in := e.frame(t, packet(flowTo(svc.Frontend, fam.client, 40006), true, false, nil))

			// Not attached to lb1: the program may not transmit there
			// and hands the packet to the stack, which must accept it.
			before := e.reasons(t)
			r := e.run(t, in)
			if r.verdict != xdpPass {
				t.Fatalf("egress lb1 not in tx_ports: verdict %s, want XDP_PASS", verdictName(r.verdict))
			}
			if got := checkEncap(t, in, r.out); got != be {
				t.Errorf("encapsulated to %s, want %s", got, be)
			}
			if got := net.HardwareAddr(r.out[0:6]); !bytes.Equal(got, e.lbMAC) {
				t.Errorf("Ethernet destination %s, want lb0's %s so that the stack accepts the frame", got, e.lbMAC)
			}
			e.expectReasons(t, before, map[string]uint64{"pass_no_tx_port": 1})

			// Attached to lb1: redirected there, with lb1's MAC.
			err := e.ns.Do(func() error { return e.lb.AttachXDP("lb1", datapath.XDPGeneric) })
			if err != nil {
				t.Fatalf("attach to lb1: %v", err)
			}
			before = e.reasons(t)
			r = e.run(t, in)
			if r.verdict != xdpRedirect {
				t.Fatalf("egress lb1 in tx_ports: verdict %s, want XDP_REDIRECT", verdictName(r.verdict))
			}
			if got := checkEncap(t, in, r.out); got != be {
				t.Errorf("encapsulated to %s, want %s", got, be)
			}
			if got, want := net.HardwareAddr(r.out[0:6]), backendMAC(be); !bytes.Equal(got, want) {
				t.Errorf("Ethernet destination %s, want %s", got, want)
			}
			if got := net.HardwareAddr(r.out[6:12]); !bytes.Equal(got, lb1MAC) {
				t.Errorf("Ethernet source %s, want lb1's %s", got, lb1MAC)
			}
			e.expectReasons(t, before, nil)
		})
	}

	t.Run("MTU", func(t *testing.T) {
		const mtu = 1400
		e := newEnv(t)
		if err := e.ns.Netlink().LinkSetMTU(e.ns.Link(t, "lb0"), mtu); err != nil {
			t.Fatalf("set lb0's MTU to %d: %v", mtu, err)
		}
		for _, fam := range families {
			svc := dsrService("web-"+fam.name, fam.vip, 80, lb.TCP, fam.backends[:3]...)
			e.reconcile(t, svc)
			outer := 20
			if fam.vip.Is6() {
				outer = 40
			}
			tests := []struct {
				l3      int // IP length of the client's packet
				verdict uint32
				reason  string
			}{
				{l3: mtu - outer, verdict: xdpTX},
				{l3: mtu - outer + 1, verdict: xdpDrop, reason: "drop_frag_needed"},
				{l3: mtu, verdict: xdpDrop, reason: "drop_frag_needed"},
			}
			for _, tt := range tests {
				f := flowTo(svc.Frontend, fam.client, 40005)
				hdrs := len(pkttest.IPPacket(t, e.frame(t, packet(f, false, true, nil))))
				in := e.frame(t, packet(f, false, true, make([]byte, tt.l3-hdrs)))
				if got := len(pkttest.IPPacket(t, in)); got != tt.l3 {
					t.Fatalf("built a %d-byte IP packet, want %d", got, tt.l3)
				}
				before := e.reasons(t)
				r := e.run(t, in)
				if r.verdict != tt.verdict {
					t.Errorf("%s, %d-byte packet, MTU %d: verdict %s, want %s", fam.name, tt.l3, mtu, verdictName(r.verdict), verdictName(tt.verdict))
					continue
				}
				if tt.verdict == xdpTX {
					e.checkTX(t, in, r)
				}
				want := map[string]uint64{}
				if tt.reason != "" {
					want[tt.reason] = 1
				}
				e.expectReasons(t, before, want)
			}
		}
	})
}

// TestDSRIPv4OptionsForwarded checks that IPv4 options (IHL 6..15) are
// carried intact inside the tunnel.
func TestDSRIPv4OptionsForwarded(t *testing.T) {
	e := newEnv(t)
	svc := dsrService("web", vip4, 80, lb.TCP, backends4[:3]...)
	e.reconcile(t, svc)
	for ihl := 6; ihl <= 15; ihl++ {
		// A router alert option, then NOPs up to the header length.
		opts := []layers.IPv4Option{{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}}
		for range (ihl - 6) * 4 {
			opts = append(opts, layers.IPv4Option{OptionType: 1})
		}
		f := flowTo(svc.Frontend, client4, uint16(41000+ihl))
		p := packet(f, false, true, []byte("data"))
		p.IPv4Options = opts
		in := e.frame(t, p)
		l := pkttest.MustLayout(t, in)
		if got := int(in[l.L3] & 0x0f); got != ihl {
			t.Fatalf("built IHL %d, want %d", got, ihl)
		}
		got := e.checkTX(t, in, e.run(t, in))
		if want := mustPick(t, svc, f); got != want {
			t.Errorf("IHL %d: sent to %s, want %s", ihl, got, want)
		}
	}
}
