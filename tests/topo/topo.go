// SPDX-License-Identifier: Apache-2.0

// Package topo builds the l4lb test topology in network namespaces, for the
// end-to-end tests and the demo: one L2 segment (a bridge in a "switch"
// namespace) joining a client, LB boxes and backends, each host in its own
// namespace with eth0 on 10.100.0.0/24 and fd10::/64. VIPs are routed from
// the client to an LB box; backends hold the VIPs on lo and accept DSR
// traffic through l4lb's backend companion. With Options.Router the client
// sits behind a router instead (its own link, 10.100.1.0/24 and fd10:1::/64),
// which is .1 on the segment and the backends' default gateway, hashes
// flows over equal-cost routes by their 5-tuple, and learns the VIPs from
// the LB boxes (over BGP, in the tests that run one). Everything is removed
// when the test (or the demo) ends.
package topo

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/l4lb/l4lb/internal/testnet"
)

// Host is one machine of the topology.
type Host struct {
	Name  string
	NS    *testnet.NS
	Addr4 netip.Addr
	Addr6 netip.Addr
	// Iface is the host's interface on the segment.
	Iface string
	MAC   net.HardwareAddr
	top   *Topology
}

// Topology is a client, LB boxes and backends on one segment.
type Topology struct {
	T      testnet.TB
	Switch *testnet.NS
	Client *Host
	// Router is nil unless Options.Router; its Iface is on the segment,
	// ClientIface on the client's link.
	Router   *Host
	LBs      []*Host
	Backends []*Host
	// Dir holds configs, sockets and logs of this topology.
	Dir string
	// PinRoot is a bpffs directory private to this topology.
	PinRoot string
}

// Options size the topology.
type Options struct {
	LBs      int
	Backends int
	// Dir for configs and sockets; a temporary directory when empty.
	Dir string
	// Router puts the client behind a router (see the package doc).
	Router bool
}

// Addressing of the segment, and of the client's link behind the router.
const (
	Prefix4       = "10.100.0."
	Prefix6       = "fd10::"
	ClientPrefix4 = "10.100.1."
	ClientPrefix6 = "fd10:1::"
)

// ClientIface is the router's interface toward the client.
const ClientIface = "eth1"

// New builds the topology.
func New(t testnet.TB, o Options) *Topology {
	t.Helper()
	testnet.RequireRoot(t)
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "l4lb-topo-"); err != nil {
			t.Fatalf("temp dir: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	pin := filepath.Join("/sys/fs/bpf", "l4lb-test-"+filepath.Base(dir))
	t.Cleanup(func() { os.RemoveAll(pin) })
	tp := &Topology{T: t, Dir: dir, PinRoot: pin}
	tp.Switch = testnet.NewNS(t, "sw")
	// The switch only bridges: without IPv6 of its own it adds no
	// solicitations or listener reports to what the LB boxes count.
	tp.Switch.Sysctl(t, "net.ipv6.conf.all.disable_ipv6", "1")
	tp.Switch.Sysctl(t, "net.ipv6.conf.default.disable_ipv6", "1")
	tp.Switch.Run(t, "ip", "link", "add", "br0", "type", "bridge")
	tp.Switch.Up(t, "br0")

	if o.Router {
		tp.Router = tp.addHost("router", 1)
		tp.Client = tp.addClientBehindRouter()
	} else {
		tp.Client = tp.addHost("client", 2)
	}
	for i := range o.LBs {
		tp.LBs = append(tp.LBs, tp.addHost(fmt.Sprintf("lb%d", i+1), 11+i))
	}
	for i := range o.Backends {
		tp.Backends = append(tp.Backends, tp.addHost(fmt.Sprintf("be%d", i+1), 21+i))
	}
	for _, lb := range tp.LBs {
		// veth quirk: frames an XDP program transmits (XDP_TX) on a veth
		// are only received by a peer that runs NAPI, which an XDP
		// program enables.
		tp.attachPass(tp.Switch, "p-"+lb.Name)
	}
	if o.Router {
		for _, h := range append(append([]*Host{}, tp.LBs...), tp.Backends...) {
			h.NS.Run(t, "ip", "route", "add", "default", "via", tp.Router.Addr4.String(), "dev", "eth0")
			h.NS.Run(t, "ip", "-6", "route", "add", "default", "via", tp.Router.Addr6.String(), "dev", "eth0")
		}
		for _, lb := range tp.LBs {
			// A dead LB box's MAC ages out of the bridge; frames the
			// router still sends there would then flood to the other
			// box, whose XDP forwards them and hides that the box is
			// gone. A real switch fabric does not flood to a routed
			// LB port either.
			tp.Switch.Run(t, "bridge", "link", "set", "dev", "p-"+lb.Name, "flood", "off")
		}
	}
	return tp
}

// addClientBehindRouter puts the client on a link of its own to the
// router and makes the router route between it and the segment, hashing
// flows over equal-cost next hops by their 5-tuple.
func (tp *Topology) addClientBehindRouter() *Host {
	t := tp.T
	t.Helper()
	r := tp.Router
	ns := testnet.NewNS(t, "client")
	ns.Sysctl(t, "net.ipv6.conf.default.router_solicitations", "0")
	ns.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0")
	testnet.Veth(t, ns, "eth0", r.NS, ClientIface)
	h := &Host{
		Name:  "client",
		NS:    ns,
		Addr4: netip.MustParseAddr(ClientPrefix4 + "2"),
		Addr6: netip.MustParseAddr(ClientPrefix6 + "2"),
		Iface: "eth0",
		top:   tp,
	}
	// Packets the router forwards to an LB box are forwarded raw by
	// its XDP program: they must carry complete checksums (see addHost).
	ns.Run(t, "ethtool", "-K", "eth0", "tx", "off")
	r.NS.Run(t, "ethtool", "-K", ClientIface, "tx", "off")
	ns.AddAddr(t, "eth0", h.Addr4.String()+"/24")
	ns.AddAddr(t, "eth0", h.Addr6.String()+"/64")
	r.NS.AddAddr(t, ClientIface, ClientPrefix4+"1/24")
	r.NS.AddAddr(t, ClientIface, ClientPrefix6+"1/64")
	h.MAC = ns.MAC(t, "eth0")
	ns.Run(t, "ip", "route", "add", "default", "via", ClientPrefix4+"1", "dev", "eth0")
	ns.Run(t, "ip", "-6", "route", "add", "default", "via", ClientPrefix6+"1", "dev", "eth0")
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.all.forwarding", "1"},
		// Policy 1 on veth reuses the socket's skb hash, which TCP
		// re-rolls on every retransmission timeout: flows would jump
		// between LB boxes. Policy 3 hashes the fields below, taken from
		// the headers as a real router does: source and destination
		// address, protocol, source and destination port.
		{"net.ipv4.fib_multipath_hash_policy", "3"},
		{"net.ipv4.fib_multipath_hash_fields", "0x37"},
		{"net.ipv6.fib_multipath_hash_policy", "3"},
		{"net.ipv6.fib_multipath_hash_fields", "0x37"},
	} {
		r.NS.Sysctl(t, kv[0], kv[1])
	}
	return h
}

func (tp *Topology) addHost(name string, n int) *Host {
	t := tp.T
	t.Helper()
	ns := testnet.NewNS(t, name)
	// Keep the segment quiet, as a test that counts the packets an LB box
	// sees needs it: no router solicitations (there is no router), and no
	// duplicate address detection for the link-local address (the global
	// ones skip it already), whose solicitations and delayed listener
	// reports would otherwise arrive while the first flows run.
	ns.Sysctl(t, "net.ipv6.conf.default.router_solicitations", "0")
	ns.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0")
	testnet.Veth(t, ns, "eth0", tp.Switch, "p-"+name)
	tp.Switch.Run(t, "ip", "link", "set", "p-"+name, "master", "br0")
	h := &Host{
		Name:  name,
		NS:    ns,
		Addr4: netip.MustParseAddr(fmt.Sprintf("%s%d", Prefix4, n)),
		Addr6: netip.MustParseAddr(fmt.Sprintf("%s%d", Prefix6, n)),
		Iface: "eth0",
		top:   tp,
	}
	// On a real wire every packet carries a complete checksum. A veth
	// hands locally generated packets over with the checksum only
	// started (CHECKSUM_PARTIAL), which an XDP program that forwards the
	// raw frame would carry on unfinished; checksum in software instead.
	ns.Run(t, "ethtool", "-K", "eth0", "tx", "off")
	ns.AddAddr(t, "eth0", h.Addr4.String()+"/24")
	ns.AddAddr(t, "eth0", h.Addr6.String()+"/64")
	h.MAC = ns.MAC(t, "eth0")
	return h
}

// attachPass attaches an XDP program that passes everything.
func (tp *Topology) attachPass(ns *testnet.NS, iface string) {
	t := tp.T
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		t.Fatalf("XDP pass program: %v", err)
	}
	idx := ns.Link(t, iface).Attrs().Index
	var l link.Link
	err = ns.Do(func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx})
		return err
	})
	prog.Close()
	if err != nil {
		t.Fatalf("attach XDP pass to %s: %v", iface, err)
	}
	t.Cleanup(func() { l.Close() })
}

// RouteVIPs points the client's routes for the VIPs at an LB box,
// replacing earlier routes.
func (tp *Topology) RouteVIPs(via *Host, vips ...netip.Addr) {
	t := tp.T
	t.Helper()
	for _, v := range vips {
		gw, plen := via.Addr4, "/32"
		if v.Is6() {
			gw, plen = via.Addr6, "/128"
		}
		tp.Client.NS.Run(t, "ip", "route", "replace", v.String()+plen, "via", gw.String(), "dev", "eth0")
	}
}

// HoldVIPs puts the VIPs on a backend's lo and keeps the backend from
// answering ARP / ND for them on the segment (the LB box owns that role).
func (h *Host) HoldVIPs(vips ...netip.Addr) {
	t := h.top.T
	t.Helper()
	h.NS.Sysctl(t, "net.ipv4.conf.all.arp_ignore", "1")
	h.NS.Sysctl(t, "net.ipv4.conf.all.arp_announce", "2")
	for _, v := range vips {
		if v.Is4() {
			h.NS.AddAddr(t, "lo", v.String()+"/32")
		} else {
			h.NS.AddAddr(t, "lo", v.String()+"/128")
		}
	}
}

// Cleanup registers f on the topology's test.
func (tp *Topology) Cleanup(f func()) { tp.T.Cleanup(f) }

// RxPackets is the packet count the kernel reports as received on the
// host's segment interface, whatever handled them (the stack, an XDP or a
// tc program). On an LB box, what it received beyond the packets it
// forwarded to backends tells whether replies crossed it.
func (h *Host) RxPackets() uint64 {
	t := h.top.T
	t.Helper()
	return h.NS.Link(t, h.Iface).Attrs().Statistics.RxPackets
}

// Blackhole makes the switch drop every frame to and from h while h's link
// keeps its carrier, as when a box loses power behind a switch port that
// stays up, or a cable fails one way: nothing on either side sees the link
// go down, so only a liveness protocol (BFD, the BGP hold timer) notices.
// The returned function restores the link; the test's end does too.
func (tp *Topology) Blackhole(h *Host) (restore func()) {
	tp.T.Helper()
	restore, _ = tp.BlackholeAt(h)
	return restore
}

// BlackholeAt is Blackhole that also returns when the drop began: after
// the drop program is loaded, as the first direction is cut, so that a
// measurement does not count the loading.
func (tp *Topology) BlackholeAt(h *Host) (restore func(), at time.Time) {
	t := tp.T
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* TC_ACT_SHOT */), asm.Return()},
	})
	if err != nil {
		t.Fatalf("tc drop program: %v", err)
	}
	defer prog.Close()
	iface := "p-" + h.Name
	idx := tp.Switch.Link(t, iface).Attrs().Index
	var links []link.Link
	restore = func() {
		for _, l := range links {
			l.Close()
		}
		links = nil
	}
	for _, dir := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		var l link.Link
		err := tp.Switch.Do(func() error {
			if at.IsZero() {
				at = time.Now()
			}
			var err error
			l, err = link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: dir})
			return err
		})
		if err != nil {
			restore()
			t.Fatalf("attach tc drop to %s (%s): %v", iface, dir, err)
		}
		links = append(links, l)
	}
	t.Cleanup(restore)
	return restore, at
}
