// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/tests/topo"
)

// VIPs on the segment itself: clients reach them through ARP / NDP only.
var (
	l2VIP  = netip.MustParseAddr(topo.Prefix4 + "200")
	l2VIP6 = netip.MustParseAddr(topo.Prefix6 + "200")
	l2VIP2 = netip.MustParseAddr(topo.Prefix4 + "201")
)

func l2Config(vips ...netip.Addr) string {
	var b strings.Builder
	b.WriteString(boxHead("[]", "dsr", 251))
	b.WriteString("\n[l2]\n")
	for i, v := range vips {
		prefix := topo.Prefix4
		if v.Is6() {
			prefix = topo.Prefix6
		}
		fmt.Fprintf(&b, "\n[[service]]\nname = \"web%d\"\nvip = %q\nport = 80\nprotocol = \"tcp\"\n", i, v)
		for n := 21; n <= 22; n++ {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"%s%d\"\n", prefix, n)
		}
	}
	return b.String()
}

// captureFrames opens a packet socket for proto (an ETH_P_ value) on h's
// segment interface and hands each frame to each, on a goroutine of its
// own, until the test ends. It returns the interface and the socket, to
// send on.
func captureFrames(t *testing.T, h *topo.Host, proto int, each func(gopacket.Packet)) (*net.Interface, *packet.Conn) {
	var ifi *net.Interface
	var conn *packet.Conn
	err := h.NS.Do(func() error {
		var err error
		if ifi, err = net.InterfaceByName(h.Iface); err != nil {
			return err
		}
		conn, err = packet.Listen(ifi, packet.Raw, proto, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			each(gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default))
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return ifi, conn
}

// announcements records, on the client, when each VIP was first announced
// with a gratuitous ARP or an unsolicited neighbour advertisement from mac.
type announcements struct {
	mac  net.HardwareAddr
	mu   sync.Mutex
	seen map[netip.Addr]time.Time
}

func captureAnnouncements(t *testing.T, h *topo.Host, mac net.HardwareAddr) *announcements {
	a := &announcements{mac: mac, seen: map[netip.Addr]time.Time{}}
	captureFrames(t, h, unix.ETH_P_ALL, func(pkt gopacket.Packet) {
		eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		if eth == nil || !slices.Equal(eth.SrcMAC, a.mac) {
			return
		}
		var vip netip.Addr
		if arp, ok := pkt.Layer(layers.LayerTypeARP).(*layers.ARP); ok && slices.Equal(arp.SourceProtAddress, arp.DstProtAddress) {
			vip, _ = netip.AddrFromSlice(arp.SourceProtAddress)
		}
		if na, ok := pkt.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement); ok && na.Flags&0x40 == 0 {
			vip, _ = netip.AddrFromSlice(na.TargetAddress)
		}
		if vip.IsValid() {
			a.mu.Lock()
			if _, ok := a.seen[vip]; !ok {
				a.seen[vip] = time.Now()
			}
			a.mu.Unlock()
		}
	})
	return a
}

func (a *announcements) wait(t *testing.T, vip netip.Addr, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		at, ok := a.seen[vip]
		a.mu.Unlock()
		if ok {
			return at
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no gratuitous announcement of %s from %s within %s", vip, a.mac, within)
	return time.Time{}
}

// TestL2Announcement: a client on the LB box's segment reaches VIPs of
// that segment with no route for them, through the box's ARP and neighbour
// advertisement answers; the box announces each VIP with a gratuitous ARP
// or unsolicited advertisement at start and when one is added.
func TestL2Announcement(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	lb := tp.LBs[0]
	for _, be := range tp.Backends {
		be.HoldVIPs(l2VIP, l2VIP6, l2VIP2)
		be.StartCompanion(l4lbd(), l2VIP.String(), l2VIP6.String(), l2VIP2.String())
		be.Serve(netip.AddrPortFrom(l2VIP, 80), netip.AddrPortFrom(l2VIP6, 80), netip.AddrPortFrom(l2VIP2, 80))
	}
	ann := captureAnnouncements(t, tp.Client, lb.MAC)
	if reachable(tp, netip.AddrPortFrom(l2VIP, 80)) {
		t.Fatalf("%s reachable before l4lbd runs", l2VIP)
	}
	start := time.Now()
	d := lb.StartL4LBD(l4lbd(), l2Config(l2VIP, l2VIP6))
	g4 := ann.wait(t, l2VIP, 10*time.Second)
	g6 := ann.wait(t, l2VIP6, 10*time.Second)
	t.Logf("MEASURE l4lbd start -> gratuitous ARP: %s, unsolicited NA: %s", g4.Sub(start).Round(time.Millisecond), g6.Sub(start).Round(time.Millisecond))

	for _, vip := range []netip.Addr{l2VIP, l2VIP6} {
		// The client's route to the VIP is its connected segment: no
		// route was added for it.
		routes, err := tp.Client.NS.Netlink().RouteGet(net.IP(vip.AsSlice()))
		if err != nil || len(routes) == 0 || routes[0].Gw != nil {
			t.Fatalf("client route to %s: %+v %v; want the connected segment", vip, routes, err)
		}
		c, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip, 80))
		if err != nil {
			t.Fatalf("connect to %s: %v\n%s", vip, err, d.Log())
		}
		if err := c.Echo("hello"); err != nil {
			t.Errorf("echo through %s: %v", vip, err)
		}
		c.Abort()
		fam := netlink.FAMILY_V4
		if vip.Is6() {
			fam = netlink.FAMILY_V6
		}
		neigh, _ := tp.Client.NS.Netlink().NeighList(tp.Client.NS.Link(t, "eth0").Attrs().Index, fam)
		found := false
		for _, n := range neigh {
			if n.IP.Equal(net.IP(vip.AsSlice())) {
				found = slices.Equal(n.HardwareAddr, lb.MAC)
			}
		}
		if !found {
			t.Errorf("client's neighbour entry for %s is not the LB box's MAC %s: %v", vip, lb.MAC, neigh)
		}
	}

	// A VIP added by a reload is announced too.
	d.WriteConfig(l2Config(l2VIP, l2VIP6, l2VIP2))
	added := time.Now()
	d.Reload()
	g := ann.wait(t, l2VIP2, 10*time.Second)
	t.Logf("MEASURE reload adding a VIP -> gratuitous ARP: %s", g.Sub(added).Round(time.Millisecond))
	if !reachable(tp, netip.AddrPortFrom(l2VIP2, 80)) {
		t.Errorf("%s not reachable after it was added", l2VIP2)
	}
	st, err := d.API().Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.L2 == nil || len(st.L2.Interfaces) != 1 || st.L2.Interfaces[0].ARPReplies == 0 || st.L2.Interfaces[0].NDReplies == 0 || st.L2.Interfaces[0].GratuitousSent < 3 {
		t.Errorf("status shows no L2 answers: %+v", st.L2)
	}
}

// TestL2Capabilities proves systemd/l4lb-l2.conf: with [l2], l4lbd needs
// CAP_NET_RAW on top of the unit's three capabilities, answers with it, and
// without it refuses to start, naming it.
func TestL2Capabilities(t *testing.T) {
	unit := []string{"bpf", "net_admin", "perfmon"}
	for _, raw := range []bool{true, false} {
		name := "with net_raw"
		caps := append(append([]string{}, unit...), "net_raw")
		if !raw {
			name, caps = "without net_raw", unit
		}
		t.Run(name, func(t *testing.T) {
			tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
			for _, be := range tp.Backends {
				be.HoldVIPs(l2VIP)
				be.StartCompanion(l4lbd(), l2VIP.String())
				be.Serve(netip.AddrPortFrom(l2VIP, 80))
			}
			if raw {
				d := tp.LBs[0].StartL4LBDWrapped(capSet(caps...), l4lbd(), l2Config(l2VIP))
				c, err := tp.Client.DialTCP(0, netip.AddrPortFrom(l2VIP, 80))
				if err != nil {
					t.Fatalf("connect to %s with capabilities %v: %v\n%s", l2VIP, caps, err, d.Log())
				}
				c.Abort()
				return
			}
			failed, log := (&topoStart{h: tp.LBs[0]}).run(t, capSet(caps...), l2Config(l2VIP))
			if failed == nil {
				t.Fatalf("l4lbd with [l2] started without CAP_NET_RAW:\n%s", log)
			}
			if !strings.Contains(log, "CAP_NET_RAW") {
				t.Errorf("l4lbd's error does not name CAP_NET_RAW:\n%s", log)
			}
			t.Logf("without CAP_NET_RAW: %s", grepLines(log, "CAP_NET_RAW"))
		})
	}
}
