// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
)

// neighbours keeps a managed neighbour entry (NTF_EXT_MANAGED: the kernel
// resolves it proactively and keeps it fresh) for the next hop of every
// programmed backend. The XDP program's bpf_fib_lookup then finds a MAC for
// every backend and never has to hand a packet to the stack for ARP / ND.
// Failures only cost the slow path, so they are logged, not returned.
type neighbours struct {
	log *slog.Logger

	mu        sync.Mutex
	byBackend map[uint32]netip.Addr // backend id -> backend address
	hops      map[netip.Addr]*hop   // backend address -> its next hop
}

type hop struct {
	refs  int
	link  int
	ip    netip.Addr
	owned bool // we created the entry, so we remove it
}

func newNeighbours(log *slog.Logger) *neighbours {
	return &neighbours{log: log, byBackend: map[uint32]netip.Addr{}, hops: map[netip.Addr]*hop{}}
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
