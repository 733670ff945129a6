// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/lb/config"
)

// Why in Go and not in the XDP program: ARP and neighbour solicitations
// come at the rate of clients' cache refreshes, not of traffic; the
// datapath passes them to the stack untouched, where a packet socket sees
// them; and the answer depends on the announcement rule, which lives here.
// The datapath's hot path stays as it is.

// gratuitous is when a VIP is announced after it appears: at once, and
// again in case the first frame is lost (a switch port still coming up,
// a busy segment).
var gratuitous = []time.Duration{0, time.Second, 3 * time.Second}

// Responder answers ARP requests and IPv6 neighbour solicitations for the
// announced VIPs on each configured interface with the interface's MAC,
// and announces each VIP that appears with a gratuitous ARP (IPv4) or an
// unsolicited neighbour advertisement (IPv6). Its methods are safe for
// concurrent use.
type Responder struct {
	log    *slog.Logger
	ifaces []*l2Iface

	mu   sync.Mutex
	vips map[netip.Addr]bool
	// cur is the announced set the readers consult on every packet.
	cur atomic.Pointer[map[netip.Addr]bool]
	wg  sync.WaitGroup
	// ctx ends when Run's context does; it stops pending announcements.
	ctx     context.Context
	cancel  context.CancelFunc
	minimum int
	// fo is nil without [l2.failover]: this box answers alone.
	fo *elector
}

// l2Iface is one interface's sockets and counters.
type l2Iface struct {
	ifi       *net.Interface
	linkLocal netip.Addr // NA source; invalid when the interface has none
	arp, nd   *packet.Conn
	// adv carries the failover adverts; nil without failover.
	adv *packet.Conn
	// groups counts the VIPs per solicited-node multicast MAC joined.
	groups map[string]int

	arpReplies, ndReplies, gratuitousSent atomic.Uint64
}

// Filters keep the sockets to what they answer: ARP requests, and
// ICMPv6 neighbour solicitations without extension headers; never the
// box's own frames.
var (
	arpFilter = []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 3},
		bpf.LoadAbsolute{Off: 20, Size: 2}, // ARP operation
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 1, SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	}
	ndFilter = []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 5},
		bpf.LoadAbsolute{Off: 14 + 6, Size: 1}, // IPv6 next header
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6, SkipTrue: 3},
		bpf.LoadAbsolute{Off: 14 + 40, Size: 1}, // ICMPv6 type
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(layers.ICMPv6TypeNeighborSolicitation), SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	}
)

// NewResponder opens a packet socket for ARP and one for IPv6 on every
// interface of cfg; it answers nothing until Run and Set.
func NewResponder(cfg *config.L2, log *slog.Logger) (*Responder, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &Responder{log: log.With("component", "l2"), vips: map[netip.Addr]bool{}, minimum: cfg.MinHealthy}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	empty := map[netip.Addr]bool{}
	r.cur.Store(&empty)
	for _, name := range cfg.Interfaces {
		li, err := openIface(name)
		if err != nil {
			r.cancel()
			r.close()
			return nil, err
		}
		r.ifaces = append(r.ifaces, li)
		if cfg.Failover != nil {
			if err := li.openAdverts(); err != nil {
				r.cancel()
				r.close()
				return nil, err
			}
		}
	}
	if cfg.Failover != nil && len(r.ifaces) > 0 {
		fo, err := newElector(*cfg.Failover, r.ifaces, r.log)
		if err != nil {
			r.cancel()
			r.close()
			return nil, err
		}
		fo.onActive = r.announceAll
		r.fo = fo
	}
	return r, nil
}

func openIface(name string) (*l2Iface, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("l2: interface %s: %w (check l2.interfaces)", name, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("l2: interface %s has no Ethernet address: ARP and NDP need one", name)
	}
	li := &l2Iface{ifi: ifi, groups: map[string]int{}}
	if addrs, err := ifi.Addrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
				li.linkLocal = p.Addr()
				break
			}
		}
	}
	compile := func(f []bpf.Instruction) []bpf.RawInstruction {
		raw, err := bpf.Assemble(f)
		if err != nil {
			panic(err) // the filters are constants
		}
		return raw
	}
	if li.arp, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, &packet.Config{Filter: compile(arpFilter)}); err != nil {
		return nil, fmt.Errorf("l2: ARP socket on %s: %w (needs CAP_NET_RAW)", name, err)
	}
	if li.nd, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_IPV6, &packet.Config{Filter: compile(ndFilter)}); err != nil {
		li.arp.Close()
		return nil, fmt.Errorf("l2: NDP socket on %s: %w (needs CAP_NET_RAW)", name, err)
	}
	return li, nil
}

// Run answers until ctx ends, then closes the sockets.
func (r *Responder) Run(ctx context.Context) {
	stop := context.AfterFunc(ctx, r.cancel)
	defer stop()
	for _, li := range r.ifaces {
		r.wg.Add(2)
		go func() { defer r.wg.Done(); r.readARP(li) }()
		go func() { defer r.wg.Done(); r.readND(li) }()
	}
	r.log.Info("answering ARP and neighbour solicitations for announced VIPs", "interfaces", r.names(), "failover", r.fo != nil)
	var foDone chan struct{}
	if r.fo != nil {
		foDone = make(chan struct{})
		go func() { defer close(foDone); r.fo.run(r.ctx, &r.wg) }()
	}
	<-r.ctx.Done()
	if foDone != nil {
		// The elector's last advert (leaving) goes out before the
		// sockets close.
		<-foDone
	}
	r.close()
	r.wg.Wait()
}

// answering reports whether this box answers for its VIPs now: always
// without failover, while it is the active box and its lease runs.
func (r *Responder) answering() bool { return r.fo == nil || r.fo.holds(time.Now()) }

// Ready tells the failover election that every checked backend has had a
// probe end, so that the VIPs this box answers for are the complete set.
// A box that is not ready yields to one that is.
func (r *Responder) Ready() {
	if r.fo != nil {
		r.fo.setReady(time.Now())
	}
}

// announceAll announces every announced VIP, for a box that just became
// the active one.
func (r *Responder) announceAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	vips := slices.SortedFunc(maps.Keys(r.vips), netip.Addr.Compare)
	if len(vips) == 0 {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.announce(vips)
	}()
}

func (r *Responder) close() {
	for _, li := range r.ifaces {
		if li.arp != nil {
			li.arp.Close()
		}
		if li.nd != nil {
			li.nd.Close()
		}
		if li.adv != nil {
			li.adv.Close()
		}
	}
}

func (r *Responder) names() []string {
	var out []string
	for _, li := range r.ifaces {
		out = append(out, li.ifi.Name)
	}
	return out
}

// MinHealthy is the [l2] threshold.
func (r *Responder) MinHealthy() int { return r.minimum }

// Set makes the answered VIPs exactly vips and announces the new ones.
func (r *Responder) Set(vips []netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add, del := diff(r.vips, vips)
	if len(add) == 0 && len(del) == 0 {
		return
	}
	next := make(map[netip.Addr]bool, len(vips))
	for _, a := range vips {
		next[a] = true
	}
	for _, a := range del {
		r.log.Info("no longer answering for VIP", "vip", a)
		for _, li := range r.ifaces {
			li.leave(a)
		}
	}
	for _, a := range add {
		r.log.Info("answering for VIP", "vip", a)
		for _, li := range r.ifaces {
			if err := li.join(a); err != nil {
				r.log.Warn("cannot receive neighbour solicitations for the VIP", "vip", a, "interface", li.ifi.Name, "error", err)
			}
		}
	}
	r.vips = next
	r.cur.Store(&next)
	if len(add) > 0 && r.answering() {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.announce(add)
		}()
	}
}

// announce sends the gratuitous frames for vips on every interface, as
// long as each is still announced.
func (r *Responder) announce(vips []netip.Addr) {
	ctx := r.ctx
	var last time.Duration
	for _, at := range gratuitous {
		select {
		case <-ctx.Done():
			return
		case <-time.After(at - last):
		}
		last = at
		if !r.answering() {
			return
		}
		cur := *r.cur.Load()
		for _, a := range vips {
			if !cur[a] {
				continue
			}
			for _, li := range r.ifaces {
				if err := li.gratuitous(a); err != nil {
					r.log.Warn("gratuitous announcement failed", "vip", a, "interface", li.ifi.Name, "error", err)
				}
			}
		}
	}
}

// solicitedNode is the Ethernet multicast address that neighbour
// solicitations for a go to (RFC 4291 solicited-node group, RFC 2464).
func solicitedNode(a netip.Addr) net.HardwareAddr {
	b := a.As16()
	return net.HardwareAddr{0x33, 0x33, 0xff, b[13], b[14], b[15]}
}

// join subscribes the ND socket to a VIP's solicited-node group: a NIC
// filters multicast it has not been asked for.
func (li *l2Iface) join(a netip.Addr) error {
	if !a.Is6() {
		return nil
	}
	mac := solicitedNode(a)
	li.groups[mac.String()]++
	if li.groups[mac.String()] > 1 {
		return nil
	}
	return li.nd.JoinGroup(mac)
}

func (li *l2Iface) leave(a netip.Addr) {
	if !a.Is6() {
		return
	}
	mac := solicitedNode(a)
	k := mac.String()
	if li.groups[k]--; li.groups[k] <= 0 {
		delete(li.groups, k)
		_ = li.nd.LeaveGroup(mac)
	}
}

var (
	broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	allNodes  = netip.MustParseAddr("ff02::1")
	// allNodesMAC is allNodes' Ethernet group (RFC 2464).
	allNodesMAC = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
)

// Flags of a neighbour advertisement (RFC 4861 4.4).
const (
	naSolicited = 0x40
	naOverride  = 0x20
)

func (li *l2Iface) gratuitous(a netip.Addr) error {
	var err error
	if a.Is4() {
		// A request from the VIP for the VIP: neighbours that know it
		// update their entry, and nobody answers.
		err = li.sendARP(layers.ARPRequest, broadcast, a, net.HardwareAddr{0, 0, 0, 0, 0, 0}, a)
	} else {
		err = li.sendNA(a, allNodesMAC, allNodes, false)
	}
	if err == nil {
		li.gratuitousSent.Add(1)
	}
	return err
}

func (li *l2Iface) sendARP(op uint16, dst net.HardwareAddr, from netip.Addr, targetMAC net.HardwareAddr, targetIP netip.Addr) error {
	eth := &layers.Ethernet{SrcMAC: li.ifi.HardwareAddr, DstMAC: dst, EthernetType: layers.EthernetTypeARP}
	arp := &layers.ARP{
		AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
		HwAddressSize: 6, ProtAddressSize: 4, Operation: op,
		SourceHwAddress: li.ifi.HardwareAddr, SourceProtAddress: from.AsSlice(),
		DstHwAddress: targetMAC, DstProtAddress: targetIP.AsSlice(),
	}
	return li.write(li.arp, dst, eth, arp)
}

// sendNA advertises a with this interface's MAC to ip (at mac).
func (li *l2Iface) sendNA(a netip.Addr, mac net.HardwareAddr, ip netip.Addr, solicited bool) error {
	src := li.linkLocal
	if !src.IsValid() {
		src = a
	}
	eth := &layers.Ethernet{SrcMAC: li.ifi.HardwareAddr, DstMAC: mac, EthernetType: layers.EthernetTypeIPv6}
	ip6 := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolICMPv6, HopLimit: 255, SrcIP: src.AsSlice(), DstIP: ip.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborAdvertisement, 0)}
	if err := icmp.SetNetworkLayerForChecksum(ip6); err != nil {
		return err
	}
	flags := uint8(naOverride)
	if solicited {
		flags |= naSolicited
	}
	na := &layers.ICMPv6NeighborAdvertisement{
		Flags: flags, TargetAddress: a.AsSlice(),
		Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptTargetAddress, Data: li.ifi.HardwareAddr}},
	}
	return li.write(li.nd, mac, eth, ip6, icmp, na)
}

func (li *l2Iface) write(c *packet.Conn, dst net.HardwareAddr, ls ...gopacket.SerializableLayer) error {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return err
	}
	_, err := c.WriteTo(buf.Bytes(), &packet.Addr{HardwareAddr: dst})
	return err
}

func (r *Responder) readARP(li *l2Iface) {
	buf := make([]byte, 1514)
	var eth layers.Ethernet
	var arp layers.ARP
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &arp)
	parser.IgnoreUnsupported = true
	var decoded []gopacket.LayerType
	for {
		n, _, err := li.arp.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				r.log.Error("ARP socket failed; no longer answering ARP", "interface", li.ifi.Name, "error", err)
			}
			return
		}
		if err := parser.DecodeLayers(buf[:n], &decoded); err != nil || !slices.Contains(decoded, layers.LayerTypeARP) {
			continue
		}
		if arp.Operation != layers.ARPRequest || len(arp.DstProtAddress) != 4 || len(arp.SourceHwAddress) != 6 {
			continue
		}
		target := netip.AddrFrom4([4]byte(arp.DstProtAddress))
		if !(*r.cur.Load())[target] || slices.Equal(arp.SourceHwAddress, li.ifi.HardwareAddr) || !r.answering() {
			continue
		}
		sender := netip.AddrFrom4([4]byte(arp.SourceProtAddress))
		if sender == target {
			continue // someone else's gratuitous ARP
		}
		requester := net.HardwareAddr(slices.Clone(arp.SourceHwAddress))
		if err := li.sendARP(layers.ARPReply, requester, target, requester, sender); err != nil {
			r.log.Warn("ARP reply failed", "vip", target, "interface", li.ifi.Name, "error", err)
			continue
		}
		li.arpReplies.Add(1)
	}
}

func (r *Responder) readND(li *l2Iface) {
	buf := make([]byte, 1514)
	var (
		eth  layers.Ethernet
		ip6  layers.IPv6
		icmp layers.ICMPv6
		ns   layers.ICMPv6NeighborSolicitation
	)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip6, &icmp, &ns)
	parser.IgnoreUnsupported = true
	var decoded []gopacket.LayerType
	for {
		n, _, err := li.nd.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				r.log.Error("NDP socket failed; no longer answering neighbour solicitations", "interface", li.ifi.Name, "error", err)
			}
			return
		}
		if err := parser.DecodeLayers(buf[:n], &decoded); err != nil || !slices.Contains(decoded, layers.LayerTypeICMPv6NeighborSolicitation) {
			continue
		}
		// RFC 4861 7.1.1: a solicitation that crossed a router is forged.
		if ip6.HopLimit != 255 || icmp.TypeCode.Code() != 0 {
			continue
		}
		target, ok := netip.AddrFromSlice(ns.TargetAddress)
		if !ok || !(*r.cur.Load())[target] || slices.Equal(eth.SrcMAC, li.ifi.HardwareAddr) || !r.answering() {
			continue
		}
		from, _ := netip.AddrFromSlice(ip6.SrcIP)
		dstMAC, dstIP, solicited := net.HardwareAddr(slices.Clone(eth.SrcMAC)), from, true
		if from.IsUnspecified() {
			// Duplicate address detection by someone else: tell
			// everyone (RFC 4861 7.2.4).
			dstMAC, dstIP, solicited = allNodesMAC, allNodes, false
		}
		if err := li.sendNA(target, dstMAC, dstIP, solicited); err != nil {
			r.log.Warn("neighbour advertisement failed", "vip", target, "interface", li.ifi.Name, "error", err)
			continue
		}
		li.ndReplies.Add(1)
	}
}

// InterfaceStatus counts what the responder sent on one interface.
type InterfaceStatus struct {
	Name           string
	ARPReplies     uint64
	NDReplies      uint64
	GratuitousSent uint64
}

// ResponderStatus is what the responder answers for and what it sent.
type ResponderStatus struct {
	Announced  []netip.Addr
	Interfaces []InterfaceStatus
	// Failover is nil without [l2.failover].
	Failover *FailoverStatus
}

// Status reports the answered VIPs and the counters.
func (r *Responder) Status() ResponderStatus {
	var st ResponderStatus
	for a := range *r.cur.Load() {
		st.Announced = append(st.Announced, a)
	}
	slices.SortFunc(st.Announced, netip.Addr.Compare)
	for _, li := range r.ifaces {
		st.Interfaces = append(st.Interfaces, InterfaceStatus{
			Name: li.ifi.Name, ARPReplies: li.arpReplies.Load(), NDReplies: li.ndReplies.Load(), GratuitousSent: li.gratuitousSent.Load(),
		})
	}
	if r.fo != nil {
		st.Failover = r.fo.status()
	}
	return st
}
