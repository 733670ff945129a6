// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
)

// nhValid is L4LB_NH_VALID of bpf/include/types.h.
const nhValid = 0x1

// nhPaths is L4LB_NH_PATHS: the most next hops a backend's route spreads
// over (ECMP).
const nhPaths = 8

// nextHops is the control side of the datapath's next-hop cache
// (bpf/include/nexthop.h): for every programmed backend it resolves the
// route from the kernel (the FIB entry that matches the backend, every
// path of a multipath route), the neighbour MAC of each path's next hop
// and the egress interface's MAC and MTU, and writes them to the
// backend_routes and nexthops arrays, so that the datapath forwards
// without asking bpf_fib_lookup. It subscribes to netlink route,
// neighbour and link changes and rewrites what they affect as they come,
// within milliseconds: a neighbour's new MAC, a route moved to another
// gateway, a link's MTU, a link down.
//
// A backend whose next hop has no MAC yet (unresolved, failed) gets an
// entry without L4LB_NH_VALID; the datapath then asks bpf_fib_lookup,
// which hands the packet to the stack to resolve the neighbour.
//
// With keep (KeepNeighbours) it also keeps a managed neighbour entry
// (NTF_EXT_MANAGED: the kernel resolves it proactively and keeps it fresh)
// for every next hop, and puts it back when the kernel deletes it (link
// down, `ip neigh flush`): the datapath's packets bypass the kernel's
// neighbour state machine, so without a managed entry nothing would
// refresh a MAC the XDP program uses. The slow path does not make up for
// a lost entry in every mode: a SNAT packet carries the box's own address
// as its source, which the IPv4 stack drops as a martian (unless
// accept_local is set) before it would resolve the next hop.
//
// One neighbour change rewrites one nexthops entry; one route change
// rewrites the backend_routes entries of the backends it covers.
type nextHops struct {
	log   *slog.Logger
	cache *cacheGen // bumped after every write (flowcache.go)
	// onMAC is told of a link's new MAC (the datapath's ingress MACs,
	// local.go).
	onMAC func(index int, mac net.HardwareAddr)
	// onAddr is told of an address added to (or removed from) a link
	// (the datapath's local addresses, local.go).
	onAddr func(index int, addr netip.Addr, added bool)
	nl     *netlink.Handle
	ns     netns.NsHandle
	keep   bool
	routes *ebpf.Map // backend_routes
	hops   *ebpf.Map // nexthops
	maxID  uint32

	mu       sync.Mutex
	written  bool                      // an entry was written under mu (see unlock)
	backends map[uint32]netip.Addr     // backend id -> address
	addrs    map[netip.Addr]*addrRoute // backend address -> its route
	byKey    map[hopKey]*hop           // next hop -> its entry
	links    map[int]linkInfo          // ifindex -> MAC and MTU
	free     []uint32                  // ids to reuse, oldest first
	next     uint32                    // next never-used id
	done     chan struct{}
}

// hopKey names a next hop: the neighbour on an interface.
type hopKey struct {
	link int
	ip   netip.Addr
}

type hop struct {
	id    uint32
	refs  int
	mac   net.HardwareAddr // nil: unresolved
	owned bool             // a managed neighbour entry we installed
	value bpf.LbNexthop    // as last written
}

// addrRoute is the route of one backend address, shared by the ids that
// have it (one address may back several services).
type addrRoute struct {
	ids      map[uint32]bool
	resolved bool     // looked up at least once
	hops     []hopKey // the paths, sorted; empty: no route
	mtu      uint32
}

type linkInfo struct {
	mac net.HardwareAddr
	mtu uint32
	up  bool
}

func newNextHops(log *slog.Logger, ns *netns.NsHandle, keep bool, cache *cacheGen, routes, hops *ebpf.Map, maxID uint32,
	onMAC func(index int, mac net.HardwareAddr), onAddr func(index int, addr netip.Addr, added bool)) (*nextHops, error) {
	n := &nextHops{log: log, keep: keep, cache: cache, routes: routes, hops: hops, maxID: maxID, ns: netns.None(), onMAC: onMAC, onAddr: onAddr,
		backends: map[uint32]netip.Addr{}, addrs: map[netip.Addr]*addrRoute{}, byKey: map[hopKey]*hop{},
		links: map[int]linkInfo{}, next: 1}
	if ns != nil {
		n.ns = *ns
	}
	var err error
	n.nl, err = netlinkIn(ns)
	if err != nil {
		return nil, fmt.Errorf("datapath: netlink handle for the next-hop cache: %w", err)
	}
	if err := n.adopt(); err != nil {
		n.nl.Close()
		return nil, err
	}
	n.watch()
	return n, nil
}

// adopt takes over the next-hop ids an earlier l4lbd wrote, so that
// re-resolving the adopted backends rewrites entries in place instead of
// moving them (a packet between two writes sees the old next hop or the
// new one, never an unrelated one).
func (n *nextHops) adopt() error {
	var (
		id uint32
		v  bpf.LbNexthop
	)
	it := n.hops.Iterate()
	for it.Next(&id, &v) {
		if v.Family == 0 || id == 0 {
			continue
		}
		k := hopKey{link: int(v.Ifindex), ip: netip.AddrFrom16(v.Addr).Unmap()}
		n.byKey[k] = &hop{id: id, value: v}
		n.next = max(n.next, id+1)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read the next-hop cache: %w", err)
	}
	return nil
}

// settle frees the adopted next hops no backend uses after the adopted
// backends were added.
func (n *nextHops) settle() {
	n.mu.Lock()
	defer n.unlock()
	for k, h := range n.byKey {
		if h.refs == 0 {
			n.dropLocked(k, h)
		}
	}
}

// add records backend id at addr and resolves its route.
func (n *nextHops) add(id uint32, addr netip.Addr) {
	n.mu.Lock()
	defer n.unlock()
	if old, ok := n.backends[id]; ok {
		if old == addr {
			return
		}
		n.removeLocked(id)
	}
	n.backends[id] = addr
	r, ok := n.addrs[addr]
	if !ok {
		r = &addrRoute{ids: map[uint32]bool{}}
		n.addrs[addr] = r
		n.resolveLocked(addr, r)
	}
	r.ids[id] = true
	n.writeRouteLocked(id, r)
}

// remove forgets backend id; its route entry is cleared first.
func (n *nextHops) remove(id uint32) {
	n.mu.Lock()
	defer n.unlock()
	n.removeLocked(id)
}

func (n *nextHops) removeLocked(id uint32) {
	addr, ok := n.backends[id]
	if !ok {
		return
	}
	delete(n.backends, id)
	n.writeRouteLocked(id, nil)
	r := n.addrs[addr]
	delete(r.ids, id)
	if len(r.ids) == 0 {
		delete(n.addrs, addr)
		for _, k := range r.hops {
			n.releaseLocked(k)
		}
	}
}

// resolveLocked finds addr's route and takes its next hops.
func (n *nextHops) resolveLocked(addr netip.Addr, r *addrRoute) {
	old := r.hops
	r.hops, r.mtu = n.lookupRouteLocked(addr)
	if len(r.hops) == 0 && (len(old) > 0 || !r.resolved) {
		n.log.Warn("no usable route to backend; its traffic takes bpf_fib_lookup", "backend", addr)
	}
	r.resolved = true
	for _, k := range r.hops {
		n.acquireLocked(k)
	}
	for _, k := range old {
		n.releaseLocked(k)
	}
}

// lookupRouteLocked returns the paths of the FIB entry that matches addr, as
// `ip route get ADDR fibmatch` shows it, and the route's MTU. None when
// there is no usable route (local, unreachable, blackhole).
func (n *nextHops) lookupRouteLocked(addr netip.Addr) ([]hopKey, uint32) {
	dst := net.IP(addr.AsSlice())
	routes, err := n.nl.RouteGetWithOptions(dst, &netlink.RouteGetOptions{FIBMatch: true})
	if err != nil || len(routes) == 0 {
		n.log.Debug("no route to backend", "backend", addr, "error", err)
		return nil, 0
	}
	rt := routes[0]
	if rt.Type != unix.RTN_UNICAST {
		return nil, 0
	}
	var keys []hopKey
	var mtu uint32
	path := func(link int, gw net.IP) {
		if link == 0 || len(keys) == nhPaths {
			return
		}
		ip := addr
		if g, ok := netip.AddrFromSlice(gw); ok && gw != nil && !g.IsUnspecified() {
			ip = g.Unmap()
		}
		keys = append(keys, hopKey{link: link, ip: ip})
		l := n.linkLocked(link)
		if mtu == 0 || (l.mtu > 0 && l.mtu < mtu) {
			mtu = l.mtu
		}
	}
	if len(rt.MultiPath) > 0 {
		for _, p := range rt.MultiPath {
			path(p.LinkIndex, p.Gw)
		}
	} else {
		path(rt.LinkIndex, rt.Gw)
	}
	if len(keys) == 0 {
		// A FIB entry the library could not split into paths (a
		// nexthop object, say): the kernel's own choice for this
		// address, one path.
		if plain, err := n.nl.RouteGet(dst); err == nil && len(plain) > 0 {
			path(plain[0].LinkIndex, plain[0].Gw)
		}
	}
	if rt.MTU > 0 && (mtu == 0 || uint32(rt.MTU) < mtu) {
		mtu = uint32(rt.MTU)
	}
	slices.SortFunc(keys, func(a, b hopKey) int {
		if a.link != b.link {
			return a.link - b.link
		}
		return a.ip.Compare(b.ip)
	})
	return slices.Compact(keys), mtu
}

// linkLocked returns the MAC and MTU of ifindex, cached until a link
// event changes them.
func (n *nextHops) linkLocked(ifindex int) linkInfo {
	if l, ok := n.links[ifindex]; ok {
		return l
	}
	lk, err := n.nl.LinkByIndex(ifindex)
	if err != nil {
		return linkInfo{}
	}
	a := lk.Attrs()
	l := linkInfo{mac: a.HardwareAddr, mtu: uint32(a.MTU), up: a.Flags&net.FlagUp != 0}
	n.links[ifindex] = l
	return l
}

// acquireLocked takes a reference on next hop k, creating its entry.
func (n *nextHops) acquireLocked(k hopKey) {
	h, ok := n.byKey[k]
	if ok && h.refs > 0 {
		h.refs++
		return
	}
	if !ok {
		id, err := n.allocLocked()
		if err != nil {
			n.log.Warn("next-hop cache full; the backend's traffic takes bpf_fib_lookup", "next_hop", k.ip, "error", err)
			return
		}
		h = &hop{id: id}
		n.byKey[k] = h
	}
	h.refs = 1
	if n.keep {
		h.owned = n.installManaged(k)
	}
	h.mac = n.neighbourMAC(k)
	n.writeHopLocked(k, h)
}

// releaseLocked drops a reference on next hop k.
func (n *nextHops) releaseLocked(k hopKey) {
	h, ok := n.byKey[k]
	if !ok {
		return
	}
	if h.refs--; h.refs > 0 {
		return
	}
	n.dropLocked(k, h)
}

// dropLocked clears next hop k's entry and frees its id; the managed
// neighbour entry we installed goes too.
func (n *nextHops) dropLocked(k hopKey, h *hop) {
	delete(n.byKey, k)
	var zero bpf.LbNexthop
	if err := n.hops.Update(&h.id, &zero, ebpf.UpdateAny); err != nil {
		n.log.Warn("could not clear a next-hop entry", "next_hop", k.ip, "error", err)
	}
	n.written = true
	n.free = append(n.free, h.id)
	if h.owned {
		_ = n.nl.NeighDel(managedNeigh(k))
	}
}

func (n *nextHops) allocLocked() (uint32, error) {
	if n.next <= n.maxID {
		n.next++
		return n.next - 1, nil
	}
	if len(n.free) > 0 {
		id := n.free[0]
		n.free = n.free[1:]
		return id, nil
	}
	return 0, fmt.Errorf("all %d next-hop ids in use", n.maxID)
}

// neighbourMAC is k's MAC when the kernel has a usable one.
func (n *nextHops) neighbourMAC(k hopKey) net.HardwareAddr {
	list, err := n.nl.NeighList(k.link, family(k.ip))
	if err != nil {
		return nil
	}
	for _, e := range list {
		if ip, ok := netip.AddrFromSlice(e.IP); ok && ip.Unmap() == k.ip {
			return usableMAC(e)
		}
	}
	return nil
}

// usableMAC is the neighbour's MAC when its state lets the kernel use it.
func usableMAC(e netlink.Neigh) net.HardwareAddr {
	const ok = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT
	if e.State&ok == 0 || len(e.HardwareAddr) != 6 {
		return nil
	}
	return slices.Clone(e.HardwareAddr)
}

// writeHopLocked writes k's entry when it changed.
func (n *nextHops) writeHopLocked(k hopKey, h *hop) {
	l := n.linkLocked(k.link)
	v := bpf.LbNexthop{Ifindex: uint32(k.link), Family: 6, Addr: k.ip.As16()}
	if k.ip.Is4() {
		v.Family = 4
	}
	if len(h.mac) == 6 && len(l.mac) == 6 && l.up {
		copy(v.Dmac[:], h.mac)
		copy(v.Smac[:], l.mac)
		v.Flags = nhValid
	}
	if v == h.value {
		return
	}
	if err := n.hops.Update(&h.id, &v, ebpf.UpdateAny); err != nil {
		n.log.Warn("could not write a next-hop entry; its backends' traffic takes bpf_fib_lookup", "next_hop", k.ip, "error", err)
		return
	}
	h.value = v
	n.written = true
}

// writeRouteLocked writes backend id's route (r nil: none).
func (n *nextHops) writeRouteLocked(id uint32, r *addrRoute) {
	v := n.routeLocked(r)
	if err := n.routes.Update(&id, &v, ebpf.UpdateAny); err != nil {
		n.log.Warn("could not write a backend's route; its traffic takes bpf_fib_lookup", "backend_id", id, "error", err)
	}
	n.written = true
}

// routeLocked is the backend_routes entry of a backend whose route is r
// (nil: none).
func (n *nextHops) routeLocked(r *addrRoute) bpf.LbBackendRoute {
	var v bpf.LbBackendRoute
	if r != nil {
		v.Mtu = r.mtu
		for _, k := range r.hops {
			if h, ok := n.byKey[k]; ok && h.refs > 0 {
				v.Ids[v.Count] = h.id
				v.Count++
			}
		}
	}
	return v
}

// unlock releases n.mu, first ending the CPUs' cached copies of whatever
// was written under it (n.written): one bump of the flow caches'
// generation for a change, however many entries it rewrote.
func (n *nextHops) unlock() {
	if n.written {
		n.written = false
		if err := n.cache.bump(); err != nil {
			n.log.Warn("next hop written, but the flow caches may keep the old one for up to a second", "error", err)
		}
	}
	n.mu.Unlock()
}

// rerouteLocked resolves again every backend address dst covers (all of
// them when dst is not valid) and rewrites the routes that changed.
func (n *nextHops) rerouteLocked(dst netip.Prefix) {
	for addr, r := range n.addrs {
		if dst.IsValid() && !dst.Contains(addr) {
			continue
		}
		before, mtu := slices.Clone(r.hops), r.mtu
		n.resolveLocked(addr, r)
		if slices.Equal(before, r.hops) && mtu == r.mtu {
			continue
		}
		for id := range r.ids {
			n.writeRouteLocked(id, r)
		}
	}
}

// neighbourChanged updates the next hop at (link, ip) after a netlink
// neighbour message; a managed entry of ours the kernel deleted is put
// back.
func (n *nextHops) neighbourChanged(u netlink.NeighUpdate) {
	ip, ok := netip.AddrFromSlice(u.IP)
	if !ok {
		return
	}
	k := hopKey{link: u.LinkIndex, ip: ip.Unmap()}
	n.mu.Lock()
	defer n.unlock()
	h, ok := n.byKey[k]
	if !ok || h.refs == 0 {
		return
	}
	if u.Type == unix.RTM_DELNEIGH {
		h.mac = nil
		n.writeHopLocked(k, h)
		if h.owned {
			// After a pause: `ip neigh flush` deletes until none is
			// left, and gives up if entries keep coming back.
			time.AfterFunc(reinstallDelay, func() { n.reinstall(k) })
		}
		return
	}
	h.mac = usableMAC(u.Neigh)
	n.writeHopLocked(k, h)
}

// reinstallDelay is how long a managed neighbour entry the kernel deleted
// stays deleted before it is put back.
const reinstallDelay = 200 * time.Millisecond

// reinstall puts back the managed entry of next hop k when it is still
// ours, still missing and its link up.
func (n *nextHops) reinstall(k hopKey) {
	n.mu.Lock()
	defer n.unlock()
	h, ok := n.byKey[k]
	if !ok || h.refs == 0 || !h.owned || n.done == nil || !n.linkLocked(k.link).up || n.neighbourPresent(k) {
		return
	}
	if err := n.nl.NeighSet(managedNeigh(k)); err != nil {
		n.log.Warn("could not reinstall the managed neighbour of a backend's next hop; its traffic takes the slow path",
			"next_hop", k.ip, "error", err)
	}
}

// neighbourPresent reports whether the kernel has an entry for k.
func (n *nextHops) neighbourPresent(k hopKey) bool {
	list, err := n.nl.NeighList(k.link, family(k.ip))
	if err != nil {
		return false
	}
	for _, e := range list {
		if ip, ok := netip.AddrFromSlice(e.IP); ok && ip.Unmap() == k.ip {
			return true
		}
	}
	return false
}

// linkChanged refreshes what depends on a link: its MAC and up state in
// every next hop on it, its MTU in the routes through it. A link that
// comes up gets its managed entries back and every route resolved again.
func (n *nextHops) linkChanged(u netlink.LinkUpdate) {
	a := u.Attrs()
	n.mu.Lock()
	defer n.unlock()
	old, known := n.links[a.Index]
	cur := linkInfo{mac: slices.Clone(a.HardwareAddr), mtu: uint32(a.MTU), up: a.Flags&net.FlagUp != 0 && u.Header.Type != unix.RTM_DELLINK}
	n.links[a.Index] = cur
	if known && old.up == cur.up && old.mtu == cur.mtu && slices.Equal(old.mac, cur.mac) {
		return
	}
	if n.onMAC != nil && (!known || !slices.Equal(old.mac, cur.mac)) {
		n.onMAC(a.Index, cur.mac)
	}
	for k, h := range n.byKey {
		if k.link != a.Index || h.refs == 0 {
			continue
		}
		if cur.up && !old.up && h.owned {
			_ = n.nl.NeighSet(managedNeigh(k))
		}
		h.mac = n.neighbourMAC(k)
		n.writeHopLocked(k, h)
	}
	if !known || old.mtu != cur.mtu || old.up != cur.up {
		n.rerouteLocked(netip.Prefix{})
	}
}

// routeChanged resolves again the backends a changed route covers.
func (n *nextHops) routeChanged(u netlink.RouteUpdate) {
	var dst netip.Prefix
	if u.Dst != nil {
		if p, ok := netipPrefix(u.Dst); ok {
			dst = p
		}
	}
	n.mu.Lock()
	defer n.unlock()
	n.rerouteLocked(dst)
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if a.Is4In6() {
		a = a.Unmap()
		if bits == 128 {
			ones -= 96
		}
	}
	p := netip.PrefixFrom(a, ones)
	return p.Masked(), p.IsValid()
}

// watch follows the kernel's route, neighbour, link and address changes until
// close. A subscription the kernel ends (its socket overran under a burst
// of changes, say) is opened again and everything resolved afresh, since
// changes may have been missed meanwhile.
func (n *nextHops) watch() {
	stop := make(chan struct{})
	n.done = stop
	// The first subscription is made before Load returns, so that a change
	// made right after (by an operator, or a test changing an MTU) cannot
	// happen before anyone listens: nothing would re-read it.
	sub, err := n.subscribe(stop)
	go func() {
		for {
			if err == nil && !n.follow(stop, sub) {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n.resync()
			sub, err = n.subscribe(stop)
		}
	}()
}

// subscription is one set of netlink subscriptions; closing done ends it.
type subscription struct {
	done  chan struct{}
	neigh chan netlink.NeighUpdate
	link  chan netlink.LinkUpdate
	route chan netlink.RouteUpdate
	addr  chan netlink.AddrUpdate
}

// subscribe opens the neighbour, link, route and address subscriptions in
// n's namespace.
func (n *nextHops) subscribe(stop chan struct{}) (*subscription, error) {
	s := &subscription{
		done:  make(chan struct{}),
		neigh: make(chan netlink.NeighUpdate, 1024),
		link:  make(chan netlink.LinkUpdate, 256),
		route: make(chan netlink.RouteUpdate, 1024),
		addr:  make(chan netlink.AddrUpdate, 256),
	}
	onErr := func(err error) {
		select {
		case <-stop:
			// Closing the subscriptions makes their reads fail.
		default:
			n.log.Warn("watching routes, neighbours or links failed; resubscribing and resolving every backend again", "error", err)
		}
	}
	ns := n.ns
	const buf = 1 << 20
	err := netlink.NeighSubscribeWithOptions(s.neigh, s.done, netlink.NeighSubscribeOptions{Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	if err == nil {
		err = netlink.LinkSubscribeWithOptions(s.link, s.done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	}
	if err == nil {
		err = netlink.RouteSubscribeWithOptions(s.route, s.done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	}
	if err == nil {
		err = netlink.AddrSubscribeWithOptions(s.addr, s.done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	}
	if err != nil {
		close(s.done)
		n.log.Warn("cannot watch routes, neighbours and links; retrying", "error", err)
		return nil, err
	}
	return s, nil
}

// follow applies the changes s reports until stop (false) or until one of
// its subscriptions ends (true); either way s is closed.
func (n *nextHops) follow(stop chan struct{}, s *subscription) bool {
	defer close(s.done)
	for {
		select {
		case <-stop:
			return false
		case u, ok := <-s.neigh:
			if !ok {
				return true
			}
			n.neighbourChanged(u)
		case u, ok := <-s.link:
			if !ok {
				return true
			}
			n.linkChanged(u)
		case u, ok := <-s.route:
			if !ok {
				return true
			}
			n.routeChanged(u)
		case u, ok := <-s.addr:
			if !ok {
				return true
			}
			if a, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok && n.onAddr != nil {
				n.onAddr(u.LinkIndex, a.Unmap(), u.NewAddr)
			}
		}
	}
}

// resync reads every link and neighbour again and resolves every backend
// address again.
func (n *nextHops) resync() {
	n.mu.Lock()
	defer n.unlock()
	n.links = map[int]linkInfo{}
	for k, h := range n.byKey {
		if h.refs > 0 {
			h.mac = n.neighbourMAC(k)
			n.writeHopLocked(k, h)
		}
	}
	n.rerouteLocked(netip.Prefix{})
}

// installManaged makes sure k has a managed neighbour entry and reports
// whether it is ours to remove. An entry that is already permanent
// (static) is the operator's; one already managed (ours, from before a
// restart) is left as it is, since replacing it would send it back
// through resolution.
func (n *nextHops) installManaged(k hopKey) bool {
	if lk, err := n.nl.LinkByIndex(k.link); err != nil || lk.Type() == "loopback" {
		return false
	}
	if existing, err := n.nl.NeighList(k.link, family(k.ip)); err == nil {
		for _, e := range existing {
			if ip, ok := netip.AddrFromSlice(e.IP); !ok || ip.Unmap() != k.ip {
				continue
			}
			if e.FlagsExt&netlink.NTF_EXT_MANAGED != 0 {
				return true
			}
			if e.State&netlink.NUD_PERMANENT != 0 {
				return false
			}
		}
	}
	if err := n.nl.NeighSet(managedNeigh(k)); err != nil {
		n.log.Warn("could not install a managed neighbour for a backend's next hop; first packets take the slow path",
			"next_hop", k.ip, "error", err)
		return false
	}
	return true
}

func (n *nextHops) close() {
	// Entries stay, in the kernel and in the maps: the next l4lbd adopts
	// them, and the attached program keeps forwarding meanwhile.
	n.mu.Lock()
	defer n.unlock()
	if n.done != nil {
		close(n.done)
		n.done = nil
	}
	n.nl.Close()
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func managedNeigh(k hopKey) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex: k.link,
		Family:    family(k.ip),
		State:     netlink.NUD_NONE,
		FlagsExt:  netlink.NTF_EXT_MANAGED,
		IP:        net.IP(k.ip.AsSlice()),
	}
}

// netlinkIn opens a netlink handle in ns, or in the current namespace when
// ns is nil (Config.Netns).
func netlinkIn(ns *netns.NsHandle) (*netlink.Handle, error) {
	if ns != nil {
		return netlink.NewHandleAt(*ns)
	}
	return netlink.NewHandle()
}
