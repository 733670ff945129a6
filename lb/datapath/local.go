// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/l4lb/l4lb/bpf"
)

// boxAddrs keeps what the datapath knows of the box itself, for the checks
// of what it may forward: the MAC of every interface it is attached to
// (ingress_macs, bpf/include/l2.h: a frame to another MAC is not for the
// box), and the box's own addresses besides the SNAT addresses, VIPs and
// the attached interfaces' addresses (local_addrs,
// bpf/include/localaddr.h: no forwarded packet may come from one). An
// address is in local_addrs while anything owns it (a frontend, an
// interface), so a VIP shared by several frontends stays until the last
// one goes. Neither map is pinned: a new datapath fills its own from the
// services it adopts and the interfaces it attaches to, before its
// programs replace the old ones.
type boxAddrs struct {
	mu    sync.Mutex
	macs  *ebpf.Map // nil: an object from before these checks (Config.Object)
	addrs *ebpf.Map // likewise
	cache *cacheGen
	// owners of each address in local_addrs: "frontend …" or "interface …".
	owners map[netip.Addr]map[string]struct{}
	// ifaces are the interfaces learnt, with their index and addresses.
	ifaces map[string]learntIface
}

type learntIface struct {
	index int
	mac   net.HardwareAddr
	addrs []netip.Addr
}

func newBoxAddrs(macs, addrs *ebpf.Map, cache *cacheGen) *boxAddrs {
	return &boxAddrs{macs: macs, addrs: addrs, cache: cache,
		owners: map[netip.Addr]map[string]struct{}{}, ifaces: map[string]learntIface{}}
}

func localKey(a netip.Addr) bpf.LbLocalAddr { return bpf.LbLocalAddr{Addr: a.As16()} }

// own adds owner to a's owners, and a to local_addrs with its first one.
func (b *boxAddrs) own(a netip.Addr, owner string) error {
	if b.addrs == nil {
		return nil
	}
	a = a.Unmap()
	set := b.owners[a]
	if _, ok := set[owner]; ok {
		return nil
	}
	if len(set) == 0 {
		k, one := localKey(a), uint8(1)
		if err := b.addrs.Update(&k, &one, ebpf.UpdateAny); err != nil {
			if isFull(err) {
				return fmt.Errorf("record %s as a local address: local_addrs is full (%d entries; it holds max_services + 1024): raise datapath.max_services: %w", a, b.addrs.MaxEntries(), err)
			}
			return fmt.Errorf("record %s as a local address: %w", a, err)
		}
		set = map[string]struct{}{}
		b.owners[a] = set
	}
	set[owner] = struct{}{}
	return nil
}

// disown removes owner from a's owners, and a from local_addrs with its last.
func (b *boxAddrs) disown(a netip.Addr, owner string) error {
	if b.addrs == nil {
		return nil
	}
	a = a.Unmap()
	set, ok := b.owners[a]
	if !ok {
		return nil
	}
	delete(set, owner)
	if len(set) > 0 {
		return nil
	}
	delete(b.owners, a)
	k := localKey(a)
	if err := b.addrs.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget local address %s: %w", a, err)
	}
	return nil
}

func frontendOwner(fe string) string { return "frontend " + fe }
func ifaceOwner(name string) string  { return "interface " + name }

// addFrontend records fe's VIP as local: before its service entry, so that
// no packet of the service's finds the check missing.
func (b *boxAddrs) addFrontend(addr netip.Addr, fe string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.own(addr, frontendOwner(fe))
}

func (b *boxAddrs) removeFrontend(addr netip.Addr, fe string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.disown(addr, frontendOwner(fe))
}

// setInterface records name's index, MAC and addresses, replacing what
// was recorded for it before.
func (b *boxAddrs) setInterface(name string, index int, mac net.HardwareAddr, addrs []netip.Addr) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	old := b.ifaces[name]
	for _, a := range addrs {
		errs = append(errs, b.own(a, ifaceOwner(name)))
	}
	for _, a := range old.addrs {
		if !slices.Contains(addrs, a) {
			errs = append(errs, b.disown(a, ifaceOwner(name)))
		}
	}
	if b.macs != nil {
		if old.index != 0 && old.index != index {
			idx := uint32(old.index)
			if err := b.macs.Delete(&idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("forget the MAC of %s's old index %d: %w", name, old.index, err))
			}
		}
		var v bpf.LbIngressMac
		if len(mac) != len(v.Mac) {
			errs = append(errs, fmt.Errorf("interface %s has no Ethernet address (%q): the XDP datapath forwards only frames to its interface's MAC", name, mac))
		} else {
			copy(v.Mac[:], mac)
			idx := uint32(index)
			if err := b.macs.Update(&idx, &v, ebpf.UpdateAny); err != nil {
				errs = append(errs, fmt.Errorf("record the MAC of %s: %w", name, err))
			}
		}
		// The CPUs' copies of ingress_macs go with the generation (l2.h).
		errs = append(errs, b.cache.bump())
	}
	b.ifaces[name] = learntIface{index: index, mac: slices.Clone(mac), addrs: addrs}
	return errors.Join(errs...)
}

// macChanged follows a learnt interface's new MAC (netlink, through the
// next-hop cache's link events): frames to the old one are no longer the
// box's, frames to the new one are.
func (b *boxAddrs) macChanged(index int, mac net.HardwareAddr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.macs == nil || len(mac) != 6 {
		return
	}
	for name, li := range b.ifaces {
		if li.index != index || slices.Equal(li.mac, mac) {
			continue
		}
		li.mac = slices.Clone(mac)
		b.ifaces[name] = li
		var v bpf.LbIngressMac
		copy(v.Mac[:], mac)
		idx := uint32(index)
		// A failed write keeps the old MAC until the next start; the
		// interface then forwards nothing, which the reasons show.
		_ = b.macs.Update(&idx, &v, ebpf.UpdateAny)
		_ = b.cache.bump()
	}
}

// addrChanged follows an address added to or removed from a learnt
// interface (netlink, through the next-hop cache's address events): an
// address the box gains after start is one no forwarded packet may come
// from, as those it had then are.
func (b *boxAddrs) addrChanged(index int, addr netip.Addr, added bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, li := range b.ifaces {
		if li.index != index || slices.Contains(li.addrs, addr) == added {
			continue
		}
		if added {
			// A failed write (local_addrs full) leaves the address
			// out until the next start, as at start.
			if err := b.own(addr, ifaceOwner(name)); err != nil {
				continue
			}
			li.addrs = append(slices.Clone(li.addrs), addr)
		} else {
			_ = b.disown(addr, ifaceOwner(name))
			li.addrs = slices.DeleteFunc(slices.Clone(li.addrs), func(a netip.Addr) bool { return a == addr })
		}
		b.ifaces[name] = li
	}
}

// forgetInterface removes what setInterface recorded for name.
func (b *boxAddrs) forgetInterface(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.ifaces[name]
	if !ok {
		return nil
	}
	delete(b.ifaces, name)
	var errs []error
	for _, a := range old.addrs {
		errs = append(errs, b.disown(a, ifaceOwner(name)))
	}
	if b.macs != nil {
		idx := uint32(old.index)
		if err := b.macs.Delete(&idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("forget the MAC of %s: %w", name, err))
		}
		errs = append(errs, b.cache.bump())
	}
	return errors.Join(errs...)
}

// LearnInterface records iface's MAC and addresses, as they are now, for
// the datapath's checks of what it may forward: at XDP only frames
// addressed to the MAC of the interface they arrive on are forwarded, and
// at either hook no packet from one of the box's addresses. AttachXDP and
// AttachTC call it (l4lbd attaches when it starts); a new MAC is followed
// from netlink, new addresses are learnt by calling it again. Call it
// directly to run the programs without attaching them (tests, benchmarks).
func (d *LB) LearnInterface(iface string) error {
	h, err := netlinkIn(d.cfg.Netns)
	if err != nil {
		return fmt.Errorf("datapath: netlink handle to read %s: %w", iface, err)
	}
	defer h.Close()
	l, err := h.LinkByName(iface)
	if err != nil {
		return fmt.Errorf("datapath: read link %s: %w", iface, err)
	}
	list, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("datapath: read the addresses of %s: %w", iface, err)
	}
	var addrs []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs = append(addrs, ip.Unmap())
		}
	}
	if err := d.box.setInterface(iface, l.Attrs().Index, l.Attrs().HardwareAddr, addrs); err != nil {
		return fmt.Errorf("datapath: %w", err)
	}
	return nil
}
