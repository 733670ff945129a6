// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// neighbours keeps a managed neighbour entry (NTF_EXT_MANAGED: the kernel
// resolves it proactively and keeps it fresh) for the next hop of every
// programmed backend. The XDP program's bpf_fib_lookup then finds a MAC for
// every backend and never has to hand a packet to the stack for ARP / ND.
// Failures only cost the slow path, so they are logged, not returned.
//
// The kernel deletes managed entries too: a link going down flushes every
// neighbour of the link, and so does `ip neigh flush`. The slow path does
// not make up for a lost entry in every mode: a SNAT packet carries the
// box's own address as its source, which the IPv4 stack drops as a martian
// (unless accept_local is set) before it would resolve the next hop, so
// that backend's SNAT flows would stay black-holed. So the entries are
// watched and put back (see watch).
type neighbours struct {
	log *slog.Logger

	mu        sync.Mutex
	byBackend map[uint32]netip.Addr // backend id -> backend address
	hops      map[netip.Addr]*hop   // backend address -> its next hop
	// done stops the watch; nil when it did not start.
	done chan struct{}
}

type hop struct {
	refs  int
	link  int
	ip    netip.Addr
	owned bool // we created the entry, so we remove it
}

func newNeighbours(log *slog.Logger) *neighbours {
	n := &neighbours{log: log, byBackend: map[uint32]netip.Addr{}, hops: map[netip.Addr]*hop{}}
	n.watch()
	return n
}

// watch puts back the entries the kernel deletes: at once when the link is
// up, otherwise when it comes up (an entry added to a link that is down
// would only be flushed again, or wait unresolved).
func (n *neighbours) watch() {
	done := make(chan struct{})
	neighCh := make(chan netlink.NeighUpdate, 64)
	linkCh := make(chan netlink.LinkUpdate, 16)
	onErr := func(err error) {
		n.log.Warn("watching neighbour entries failed; a deleted managed entry may not be reinstalled", "error", err)
	}
	if err := netlink.NeighSubscribeWithOptions(neighCh, done, netlink.NeighSubscribeOptions{ErrorCallback: onErr}); err != nil {
		n.log.Warn("cannot watch neighbour entries; managed entries the kernel deletes (link down, neighbour flush) are not reinstalled", "error", err)
		return
	}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
		close(done)
		n.log.Warn("cannot watch links; managed entries the kernel deletes (link down, neighbour flush) are not reinstalled", "error", err)
		return
	}
	n.done = done
	go func() {
		for {
			select {
			case u, ok := <-neighCh:
				if !ok {
					return
				}
				if u.Type == unix.RTM_DELNEIGH {
					if ip, ok := netip.AddrFromSlice(u.IP); ok {
						n.reinstall(u.LinkIndex, ip.Unmap())
					}
				}
			case u, ok := <-linkCh:
				if !ok {
					return
				}
				if u.Attrs().Flags&net.FlagUp != 0 {
					n.reinstall(u.Attrs().Index, netip.Addr{})
				}
			}
		}
	}()
}

// reinstall puts back the owned entries of link that are missing: the one
// for ip, or every one when ip is the zero Addr. Nothing happens while the
// link is down.
func (n *neighbours) reinstall(link int, ip netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l, err := netlink.LinkByIndex(link); err != nil || l.Attrs().Flags&net.FlagUp == 0 {
		return
	}
	var present map[netip.Addr]bool
	done := map[netip.Addr]bool{}
	for _, h := range n.hops {
		if !h.owned || h.link != link || done[h.ip] || (ip.IsValid() && h.ip != ip) {
			continue
		}
		done[h.ip] = true
		if present == nil {
			present = n.managedOn(link)
		}
		if present[h.ip] {
			continue
		}
		if err := netlink.NeighSet(neighOf(h)); err != nil {
			n.log.Warn("could not reinstall the managed neighbour of a backend's next hop; its traffic takes the slow path",
				"next_hop", h.ip, "error", err)
			continue
		}
		n.log.Debug("reinstalled a managed neighbour the kernel deleted", "next_hop", h.ip)
	}
}

// managedOn lists the managed neighbour entries of link.
func (n *neighbours) managedOn(link int) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		list, err := netlink.NeighList(link, fam)
		if err != nil {
			continue
		}
		for _, e := range list {
			if ip, ok := netip.AddrFromSlice(e.IP); ok && e.FlagsExt&netlink.NTF_EXT_MANAGED != 0 {
				out[ip.Unmap()] = true
			}
		}
	}
	return out
}

func (n *neighbours) add(id uint32, addr netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.byBackend[id]; ok {
		if old == addr {
			return
		}
		n.releaseLocked(old)
	}
	n.byBackend[id] = addr
	if h, ok := n.hops[addr]; ok {
		h.refs++
		return
	}
	h := &hop{refs: 1}
	n.hops[addr] = h
	n.resolve(addr, h)
}

func (n *neighbours) remove(id uint32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr, ok := n.byBackend[id]; ok {
		delete(n.byBackend, id)
		n.releaseLocked(addr)
	}
}

func (n *neighbours) releaseLocked(addr netip.Addr) {
	h := n.hops[addr]
	if h == nil {
		return
	}
	if h.refs--; h.refs > 0 {
		return
	}
	delete(n.hops, addr)
	if h.owned {
		// Only drop it if no other backend's next hop is the same host.
		for _, o := range n.hops {
			if o.owned && o.link == h.link && o.ip == h.ip {
				return
			}
		}
		_ = netlink.NeighDel(neighOf(h))
	}
}

// resolve finds addr's next hop and installs a managed entry for it.
func (n *neighbours) resolve(addr netip.Addr, h *hop) {
	routes, err := netlink.RouteGet(net.IP(addr.AsSlice()))
	if err != nil || len(routes) == 0 {
		n.log.Warn("no route to backend; its traffic takes the slow path", "backend", addr, "error", err)
		return
	}
	r := routes[0]
	h.link = r.LinkIndex
	h.ip = addr
	if r.Gw != nil {
		if gw, ok := netip.AddrFromSlice(r.Gw); ok {
			h.ip = gw.Unmap()
		}
	}
	if r.Type == 2 /* RTN_LOCAL */ || h.link == 0 {
		return
	}
	// An entry that is already permanent (static) is the operator's; one
	// already managed (ours, from before a restart) is left alone, since
	// replacing it would send it back through resolution.
	if existing, err := netlink.NeighList(h.link, family(h.ip)); err == nil {
		for _, e := range existing {
			if !e.IP.Equal(net.IP(h.ip.AsSlice())) {
				continue
			}
			if e.FlagsExt&netlink.NTF_EXT_MANAGED != 0 {
				h.owned = true
				return
			}
			if e.State&netlink.NUD_PERMANENT != 0 {
				return
			}
		}
	}
	if err := netlink.NeighSet(neighOf(h)); err != nil {
		n.log.Warn("could not install a managed neighbour for a backend's next hop; first packets take the slow path",
			"backend", addr, "next_hop", h.ip, "error", err)
		return
	}
	h.owned = true
}

func (n *neighbours) close() {
	// Entries stay: the next l4lbd finds them resolved.
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done != nil {
		close(n.done)
		n.done = nil
	}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func neighOf(h *hop) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex: h.link,
		Family:    family(h.ip),
		State:     netlink.NUD_NONE,
		FlagsExt:  netlink.NTF_EXT_MANAGED,
		IP:        net.IP(h.ip.AsSlice()),
	}
}
