// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/tests/topo"
)

const e2eSeed = "5f1c0ffee0ddba11deadbeef00c0ffee"

var (
	vip4 = netip.MustParseAddr("10.200.0.10")
	vip6 = netip.MustParseAddr("2001:db8:200::10")
)

// dsrConfig is an l4lbd config with a TCP and a UDP service per family,
// DSR over IPIP, to the given backends (host numbers on the segment).
func dsrConfig(backends ...int) string { return dsrConfigAt("xdp", backends...) }

// dsrConfigAt is dsrConfig with the program attached at "xdp" or "tc".
func dsrConfigAt(attach string, backends ...int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = []
bpffs          = "{{bpffs}}"
log_level      = "debug"

[datapath]
interfaces    = ["eth0"]
attach        = %q
mode          = "dsr"
dsr_dispatch  = "ipip"
conntrack_max = 65536
max_services  = 64
max_backends  = 256

[maglev]
hash_seed  = %q
table_size = 1021
`, attach, e2eSeed)
	for _, svc := range []struct {
		name, vip, proto, prefix string
		port                     int
	}{
		{"web4", vip4.String(), "tcp", topo.Prefix4, 80},
		{"dns4", vip4.String(), "udp", topo.Prefix4, 53},
		{"web6", vip6.String(), "tcp", topo.Prefix6, 80},
		{"dns6", vip6.String(), "udp", topo.Prefix6, 53},
	} {
		fmt.Fprintf(&b, "\n[[service]]\nname = %q\nvip = %q\nport = %d\nprotocol = %q\n", svc.name, svc.vip, svc.port, svc.proto)
		for _, n := range backends {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"%s%d\"\n", svc.prefix, n)
		}
	}
	return b.String()
}

type dsrRig struct {
	// diagnosed is set once diagnose logged the topology's state.
	diagnosed bool
	tp        *topo.Topology
	lbs       []*topo.L4LBD
	servers   []*topo.Server
}

func newDSRRig(t *testing.T) *dsrRig {
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 3})
	r := &dsrRig{tp: tp}
	for _, be := range tp.Backends {
		be.HoldVIPs(vip4, vip6)
		be.StartCompanion(l4lbd(), vip4.String(), vip6.String())
		r.servers = append(r.servers, be.Serve(
			netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(vip4, 53),
			netip.AddrPortFrom(vip6, 80), netip.AddrPortFrom(vip6, 53)))
	}
	// lb1 runs the XDP program, lb2 the tc one: the same flows must land
	// on the same backends through either.
	for i, lb := range tp.LBs {
		attach := "xdp"
		if i == 1 {
			attach = "tc"
		}
		r.lbs = append(r.lbs, lb.StartL4LBD(l4lbd(), dsrConfigAt(attach, 21, 22, 23)))
	}
	tp.RouteVIPs(tp.LBs[0], vip4, vip6)
	return r
}

// predicted is the backend Go's Maglev picks for a flow of a service.
func predicted(t *testing.T, vip netip.Addr, sport, dport uint16, proto uint8, backends ...int) string {
	t.Helper()
	seed, err := maglev.ParseSeed(e2eSeed)
	if err != nil {
		t.Fatal(err)
	}
	var bs []maglev.Backend
	for _, n := range backends {
		a := netip.MustParseAddr(fmt.Sprintf("%s%d", topo.Prefix4, n))
		if vip.Is6() {
			a = netip.MustParseAddr(fmt.Sprintf("%s%d", topo.Prefix6, n))
		}
		bs = append(bs, maglev.Backend{Addr: netip.AddrPortFrom(a, dport), Weight: 1})
	}
	table, err := maglev.Build(seed, 1021, bs)
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr(topo.Prefix4 + "2")
	if vip.Is6() {
		client = netip.MustParseAddr(topo.Prefix6 + "2")
	}
	i := maglev.Lookup(seed, table, maglev.Flow{Src: client, Dst: vip, SrcPort: sport, DstPort: dport, Proto: proto})
	return fmt.Sprintf("be%d", backends[i]-20)
}

func TestDSRIPIP(t *testing.T) {
	r := newDSRRig(t)
	for _, fam := range []struct {
		name string
		vip  netip.Addr
	}{{"ipv4", vip4}, {"ipv6", vip6}} {
		t.Run(fam.name, func(t *testing.T) {
			const flows = 60
			web := netip.AddrPortFrom(fam.vip, 80)
			dns := netip.AddrPortFrom(fam.vip, 53)
			tcpRound := func(via string) map[uint16]string {
				got := map[uint16]string{}
				for i := range flows {
					sport := uint16(20000 + i)
					c, err := r.tp.Client.DialTCP(sport, web)
					if err != nil {
						t.Fatalf("via %s: TCP flow %d: %v", via, sport, err)
					}
					if err := c.Echo(fmt.Sprintf("hello %d", i)); err != nil {
						t.Fatalf("via %s: TCP flow %d: %v", via, sport, err)
					}
					got[sport] = c.Backend
					c.Abort()
				}
				return got
			}
			udpRound := func(via string) map[uint16]string {
				got := map[uint16]string{}
				for i := range flows {
					sport := uint16(30000 + i)
					u, err := r.tp.Client.DialUDP(sport, dns)
					if err != nil {
						t.Fatal(err)
					}
					name, err := u.Ask(fmt.Sprintf("q%d", i))
					u.Close()
					if err != nil {
						t.Fatalf("via %s: UDP flow %d: %v", via, sport, err)
					}
					got[sport] = name
				}
				return got
			}

			r.tp.RouteVIPs(r.tp.LBs[0], fam.vip)
			tcp1, udp1 := tcpRound("lb1"), udpRound("lb1")
			for name, got := range map[string]map[uint16]string{"tcp": tcp1, "udp": udp1} {
				share := map[string]int{}
				for _, be := range got {
					share[be]++
				}
				t.Logf("%s spread over backends: %v", name, share)
				for _, be := range r.tp.Backends {
					if share[be.Name] == 0 {
						t.Errorf("%s: backend %s got no flow out of %d", name, be.Name, flows)
					}
				}
			}
			for sport, be := range tcp1 {
				if want := predicted(t, fam.vip, sport, 80, 6, 21, 22, 23); be != want {
					t.Errorf("TCP flow from port %d went to %s; Maglev in Go says %s", sport, be, want)
				}
			}
			for sport, be := range udp1 {
				if want := predicted(t, fam.vip, sport, 53, 17, 21, 22, 23); be != want {
					t.Errorf("UDP flow from port %d went to %s; Maglev in Go says %s", sport, be, want)
				}
			}

			// The same 5-tuples again, through the same box and through the
			// other box: the same backend every time.
			tcp2, udp2 := tcpRound("lb1"), udpRound("lb1")
			r.tp.RouteVIPs(r.tp.LBs[1], fam.vip)
			tcp3, udp3 := tcpRound("lb2"), udpRound("lb2")
			r.tp.RouteVIPs(r.tp.LBs[0], fam.vip)
			for sport, be := range tcp1 {
				if tcp2[sport] != be || tcp3[sport] != be {
					t.Errorf("TCP flow from port %d: lb1 %s, lb1 again %s, lb2 %s", sport, be, tcp2[sport], tcp3[sport])
				}
			}
			for sport, be := range udp1 {
				if udp2[sport] != be || udp3[sport] != be {
					t.Errorf("UDP flow from port %d: lb1 %s, lb1 again %s, lb2 %s", sport, be, udp2[sport], udp3[sport])
				}
			}
		})
	}

	// Replies went from the backends straight to the client: the LB's
	// program saw (almost) nothing but the client's packets to the VIPs.
	for i, d := range r.lbs {
		st, err := d.API().Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var forwarded uint64
		svcs, err := d.API().Services(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs {
			forwarded += s.Counters.Packets
		}
		other := reasonPackets(st, "pass_not_service")
		t.Logf("lb%d: forwarded %d packets; other IP packets seen %d", i+1, forwarded, other)
		if forwarded == 0 {
			t.Errorf("lb%d forwarded nothing", i+1)
		}
		// Each TCP flow's server sends at least 4 packets back; had they
		// crossed the LB they would show up as non-service traffic.
		if other > forwarded/10 {
			t.Errorf("lb%d saw %d non-service packets for %d forwarded: replies seem to cross the LB", i+1, other, forwarded)
		}
	}
	var decap uint64
	for _, s := range r.servers {
		decap += uint64(s.Accepted.Load() + s.Datagram.Load())
	}
	if decap == 0 {
		t.Error("no backend received anything")
	}
}

func reasonPackets(st api.Status, name string) uint64 {
	for _, r := range st.Reasons {
		if r.Name == name {
			return r.Packets
		}
	}
	return 0
}

// TestDSRRemoveBackend removes a backend with SIGHUP while flows are open:
// only that backend's flows move; established flows to the others go on.
func TestDSRRemoveBackend(t *testing.T) {
	r := newDSRRig(t)
	for _, fam := range []struct {
		name string
		vip  netip.Addr
	}{{"ipv4", vip4}, {"ipv6", vip6}} {
		t.Run(fam.name, func(t *testing.T) {
			r.lbs[0].WriteConfig(dsrConfig(21, 22, 23))
			if rl := r.lbs[0].Reload(); !rl.OK {
				t.Fatalf("reload: %s", rl.Error)
			}
			const flows = 40
			var conns []*topo.Conn
			var udps []*topo.UDPFlow
			before := map[int]string{}
			for i := range flows {
				c, err := r.tp.Client.DialTCP(0, netip.AddrPortFrom(fam.vip, 80))
				if err != nil {
					t.Fatalf("TCP flow %d: %v", i, err)
				}
				// Data after the handshake puts the flow in the
				// connection table.
				if err := c.Echo("first"); err != nil {
					t.Fatalf("TCP flow %d: %v", i, err)
				}
				t.Cleanup(c.Abort)
				conns = append(conns, c)
				u, err := r.tp.Client.DialUDP(0, netip.AddrPortFrom(fam.vip, 53))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(u.Close)
				name, err := u.Ask("first")
				if err != nil {
					t.Fatalf("UDP flow %d: %v", i, err)
				}
				udps = append(udps, u)
				before[i] = name
			}

			r.lbs[0].WriteConfig(dsrConfig(21, 22))
			if rl := r.lbs[0].Reload(); !rl.OK {
				t.Fatalf("reload: %s", rl.Error)
			}

			var kept, movedTCP, movedUDP int
			for i, c := range conns {
				if c.Backend == "be3" {
					continue // its backend is gone; the flow is re-balanced
				}
				if err := c.Echo("after"); err != nil {
					t.Errorf("established TCP flow %d to %s broke after removing be3: %v", i, c.Backend, err)
					continue
				}
				kept++
			}
			for i, u := range udps {
				name, err := u.Ask("after")
				if err != nil {
					t.Errorf("UDP flow %d (client port %d, was on %s): %v", i, u.LocalPort(), before[i], err)
					r.diagnose(t, u.LocalPort())
					continue
				}
				switch {
				case before[i] == "be3":
					if name == "be3" {
						t.Errorf("UDP flow %d still reaches the removed be3", i)
					}
					movedUDP++
				case name != before[i]:
					t.Errorf("UDP flow %d moved from %s to %s though its backend stayed", i, before[i], name)
				}
			}
			for _, c := range conns {
				if c.Backend == "be3" {
					movedTCP++
				}
			}
			t.Logf("kept %d TCP flows on be1/be2; %d TCP and %d UDP flows were on be3 and moved", kept, movedTCP, movedUDP)
			if movedUDP == 0 || movedTCP == 0 {
				t.Errorf("no flow was on be3: the test proves nothing (TCP %d, UDP %d)", movedTCP, movedUDP)
			}
		})
	}
}

// diagnose logs, once per test, what the topology knows when a flow from
// the client's port went unanswered: lb1's drop and pass reasons, the
// flow's connection entry, the backends' counts, every host's neighbours
// and lb1's log.
func (r *dsrRig) diagnose(t *testing.T, port uint16) {
	t.Helper()
	if r.diagnosed {
		return
	}
	r.diagnosed = true
	ctx := context.Background()
	st, err := r.lbs[0].API().Status(ctx)
	if err != nil {
		t.Logf("diagnose: status: %v", err)
		return
	}
	for _, rs := range st.Reasons {
		if rs.Packets > 0 {
			t.Logf("diagnose: reason %s: %d packets", rs.Name, rs.Packets)
		}
	}
	fl, err := r.lbs[0].API().Flows(ctx, api.FlowQuery{})
	if err != nil {
		t.Logf("diagnose: flows: %v", err)
		return
	}
	suffix := fmt.Sprintf(":%d", port)
	for _, f := range fl.Flows {
		if strings.HasSuffix(f.Client, suffix) {
			t.Logf("diagnose: flow %+v", f)
		}
	}
	for _, s := range r.servers {
		t.Logf("diagnose: %s accepted %d, datagrams %d", s.Name, s.Accepted.Load(), s.Datagram.Load())
	}
	for _, h := range append([]*topo.Host{r.tp.Client, r.tp.LBs[0]}, r.tp.Backends...) {
		out, _ := h.NS.Command("ip", "-6", "neigh").CombinedOutput()
		out4, _ := h.NS.Command("ip", "-4", "neigh").CombinedOutput()
		t.Logf("diagnose: %s neighbours:\n%s%s", h.Name, out, out4)
	}
	t.Logf("diagnose: lb1 log:\n%s", r.lbs[0].Log())
}
