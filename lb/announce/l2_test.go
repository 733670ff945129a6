// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/config"
)

// l2Pair is an LB namespace and a client namespace on one veth link.
type l2Pair struct {
	lb, client *testnet.NS
	lbMAC      net.HardwareAddr
}

func newL2Pair(t *testing.T) *l2Pair {
	p := &l2Pair{lb: testnet.NewNS(t, "l2lb"), client: testnet.NewNS(t, "l2cl")}
	for _, ns := range []*testnet.NS{p.lb, p.client} {
		ns.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0")
		ns.Sysctl(t, "net.ipv6.conf.default.router_solicitations", "0")
	}
	testnet.Veth(t, p.lb, "eth0", p.client, "cl0")
	p.lb.AddAddr(t, "eth0", "10.100.0.11/24")
	p.lb.AddAddr(t, "eth0", "fd10::11/64")
	p.client.AddAddr(t, "cl0", "10.100.0.2/24")
	p.client.AddAddr(t, "cl0", "fd10::2/64")
	p.lbMAC = p.lb.MAC(t, "eth0")
	return p
}

// responder starts a Responder whose sockets live in the LB namespace.
func (p *l2Pair) responder(t *testing.T) *Responder {
	t.Helper()
	var r *Responder
	err := p.lb.Do(func() error {
		var err error
		r, err = NewResponder(&config.L2{Interfaces: []string{"eth0"}, MinHealthy: 1}, testLog(t))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// resolve makes the client's kernel resolve a (by sending it a datagram)
// and returns the MAC it learned, or nil when resolution failed.
func (p *l2Pair) resolve(t *testing.T, a netip.Addr) net.HardwareAddr {
	t.Helper()
	link := p.client.Link(t, "cl0")
	fam := netlink.FAMILY_V4
	if a.Is6() {
		fam = netlink.FAMILY_V6
	}
	_ = p.client.Netlink().NeighDel(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: fam, IP: net.IP(a.AsSlice())})
	err := p.client.Do(func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(a, 9).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("who has it"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Resolution gives up after 3 solicitations a second apart.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ns, _ := p.client.Netlink().NeighList(link.Attrs().Index, fam)
		for _, n := range ns {
			if !n.IP.Equal(net.IP(a.AsSlice())) {
				continue
			}
			if n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
				return n.HardwareAddr
			}
			if n.State&netlink.NUD_FAILED != 0 {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// TestResponderAnswers checks ARP and NDP through the client's own kernel:
// an announced VIP resolves to the LB's MAC, a withdrawn one does not.
func TestResponderAnswers(t *testing.T) {
	p := newL2Pair(t)
	r := p.responder(t)
	v4, v6 := netip.MustParseAddr("10.100.0.200"), netip.MustParseAddr("fd10::200")
	r.Set([]netip.Addr{v4, v6})
	for _, a := range []netip.Addr{v4, v6} {
		if got := p.resolve(t, a); !slices.Equal(got, p.lbMAC) {
			t.Errorf("client resolved %s to %v, want the LB's %v", a, got, p.lbMAC)
		}
	}
	st := r.Status()
	if st.Interfaces[0].ARPReplies == 0 || st.Interfaces[0].NDReplies == 0 {
		t.Errorf("status counts no replies: %+v", st)
	}
	r.Set(nil)
	for _, a := range []netip.Addr{v4, v6} {
		if got := p.resolve(t, a); got != nil {
			t.Errorf("client resolved %s to %v after the VIP was withdrawn", a, got)
		}
	}
}

// TestResponderGratuitous captures, on the client, the gratuitous ARP and
// the unsolicited neighbour advertisement a new VIP gets.
func TestResponderGratuitous(t *testing.T) {
	p := newL2Pair(t)
	var conn *packet.Conn
	err := p.client.Do(func() error {
		ifi, err := net.InterfaceByName("cl0")
		if err != nil {
			return err
		}
		conn, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := p.responder(t)
	v4, v6 := netip.MustParseAddr("10.100.0.200"), netip.MustParseAddr("fd10::200")
	r.Set([]netip.Addr{v4, v6})

	var garp, na bool
	buf := make([]byte, 2048)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !garp || !na {
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			t.Fatalf("gratuitous ARP seen %v, unsolicited NA seen %v: %v", garp, na, err)
		}
		pkt := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)
		eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		if eth == nil || !slices.Equal(eth.SrcMAC, p.lbMAC) {
			continue
		}
		if a, ok := pkt.Layer(layers.LayerTypeARP).(*layers.ARP); ok {
			garp = garp || (slices.Equal(a.SourceProtAddress, v4.AsSlice()) && slices.Equal(a.DstProtAddress, v4.AsSlice()) &&
				slices.Equal(a.SourceHwAddress, p.lbMAC) && slices.Equal(eth.DstMAC, broadcast))
		}
		if adv, ok := pkt.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement); ok {
			ip6 := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
			na = na || (adv.TargetAddress.Equal(net.IP(v6.AsSlice())) && ip6.DstIP.Equal(net.IP(allNodes.AsSlice())) &&
				ip6.HopLimit == 255 && adv.Flags&naOverride != 0 && adv.Flags&naSolicited == 0)
		}
	}
	// The counter moves just after each send returns, so the last frame
	// can be on the wire before it is counted.
	for deadline := time.Now().Add(5 * time.Second); r.Status().Interfaces[0].GratuitousSent < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if st := r.Status(); st.Interfaces[0].GratuitousSent < 2 {
		t.Errorf("status counts %d gratuitous frames, want at least 2", st.Interfaces[0].GratuitousSent)
	}
}
