// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// The maps the datapath fills from its own records rather than from the
// reconciler's: the words of svc_gen (filter.go), the next hops and backend
// routes (nexthop.go), the box's addresses and MACs (local.go) and the
// interfaces XDP may transmit on. CheckDerived compares each with its
// record at the end of every self-check pass and writes back what differs,
// as a Drift naming the map. Each check holds its record's lock, the one
// the writes take, so it never compares with a record half updated.

// The maps a Drift of these checks names (the map's own name).
const (
	mapSvcGen        = "svc_gen"
	mapNexthops      = "nexthops"
	mapBackendRoutes = "backend_routes"
	mapLocalAddrs    = "local_addrs"
	mapIngressMACs   = "ingress_macs"
	mapTxPorts       = "tx_ports"
)

// readArray reads the first n entries of an array map in batches.
func readArray[V any](m *ebpf.Map, n uint32) ([]V, error) {
	keys := make([]uint32, n)
	vals := make([]V, n)
	var (
		cur  ebpf.MapBatchCursor
		read int
	)
	for read < int(n) {
		got, err := m.BatchLookup(&cur, keys[read:], vals[read:], nil)
		read += got
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	for i := range read {
		if keys[i] != uint32(i) {
			return nil, fmt.Errorf("entry %d came back as key %d", i, keys[i])
		}
	}
	return vals[:read], nil
}

// unreadable is the Drift of a map the check could not read.
func unreadable(m string, err error) reconciler.Drift {
	return reconciler.Drift{Map: m, Found: "a map that cannot be read", Want: "its record", Err: fmt.Errorf("read %s: %w", m, err)}
}

// check compares every word of svc_gen with the word last written or
// adopted at its id (0 where none was).
func (w *svcWords) check() []reconciler.Drift {
	w.mu.Lock()
	defer w.mu.Unlock()
	vals, err := readArray[uint32](w.m, w.m.MaxEntries())
	if err != nil {
		return []reconciler.Drift{unreadable(mapSvcGen, err)}
	}
	var drifts []reconciler.Drift
	for i, got := range vals {
		id := uint32(i)
		want := w.word[id]
		if got == want {
			continue
		}
		d := reconciler.Drift{Map: mapSvcGen, ID: id, Found: fmt.Sprintf("word %#x", got), Want: fmt.Sprintf("word %#x", want)}
		if err := w.m.Update(&id, &want, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("write the word of service id %d: %w", id, err)
		}
		drifts = append(drifts, d)
	}
	if len(drifts) > 0 {
		// Flows cached the wrong words.
		if err := w.cache.bump(); err != nil {
			drifts[0].Err = errors.Join(drifts[0].Err, err)
		}
	}
	return drifts
}

// check compares the next-hop entries in use and every backend's route
// with what was last written for them. Entries at next-hop ids no route
// names are not read: no packet reaches them.
func (n *nextHops) check() []reconciler.Drift {
	n.mu.Lock()
	defer n.unlock()
	var drifts []reconciler.Drift
	for k, h := range n.byKey {
		if h.refs == 0 || h.value == (bpf.LbNexthop{}) {
			continue
		}
		var got bpf.LbNexthop
		if err := n.hops.Lookup(&h.id, &got); err != nil {
			drifts = append(drifts, unreadable(mapNexthops, err))
			continue
		}
		if got == h.value {
			continue
		}
		d := reconciler.Drift{Map: mapNexthops, ID: h.id, Found: describeHop(got), Want: describeHop(h.value) + " (next hop " + k.ip.String() + ")"}
		if err := n.hops.Update(&h.id, &h.value, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("write next hop %d: %w", h.id, err)
		}
		n.written = true
		drifts = append(drifts, d)
	}
	routes, err := readArray[bpf.LbBackendRoute](n.routes, min(n.routes.MaxEntries(), n.maxID+1))
	if err != nil {
		return append(drifts, unreadable(mapBackendRoutes, err))
	}
	for i, got := range routes {
		id := uint32(i)
		var want bpf.LbBackendRoute
		if addr, ok := n.backends[id]; ok {
			want = n.routeLocked(n.addrs[addr])
		}
		if got == want {
			continue
		}
		d := reconciler.Drift{Map: mapBackendRoutes, ID: id, Found: describeRoute(got), Want: describeRoute(want)}
		if err := n.routes.Update(&id, &want, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("write the route of backend %d: %w", id, err)
		}
		n.written = true
		drifts = append(drifts, d)
	}
	return drifts
}

func describeHop(v bpf.LbNexthop) string {
	return fmt.Sprintf("ifindex %d, %s -> %s, flags %#x", v.Ifindex, net.HardwareAddr(v.Smac[:]), net.HardwareAddr(v.Dmac[:]), v.Flags)
}

func describeRoute(v bpf.LbBackendRoute) string {
	if v == (bpf.LbBackendRoute{}) {
		return "no route"
	}
	return fmt.Sprintf("next hops %v, mtu %d", v.Ids[:min(int(v.Count), len(v.Ids))], v.Mtu)
}

// check compares local_addrs with the addresses something owns, and
// ingress_macs with the interfaces learnt.
func (b *boxAddrs) check() []reconciler.Drift {
	b.mu.Lock()
	defer b.mu.Unlock()
	var drifts []reconciler.Drift
	if b.addrs != nil {
		drifts = append(drifts, b.checkAddrs()...)
	}
	if b.macs != nil {
		drifts = append(drifts, b.checkMACs()...)
	}
	if len(drifts) > 0 {
		// The CPUs keep copies of ingress_macs (l2.h).
		if err := b.cache.bump(); err != nil {
			drifts[0].Err = errors.Join(drifts[0].Err, err)
		}
	}
	return drifts
}

func (b *boxAddrs) checkAddrs() []reconciler.Drift {
	var (
		drifts []reconciler.Drift
		k      bpf.LbLocalAddr
		v      uint8
	)
	seen := make(map[netip.Addr]bool, len(b.owners))
	it := b.addrs.Iterate()
	for it.Next(&k, &v) {
		a := netip.AddrFrom16(k.Addr).Unmap()
		if len(b.owners[a]) > 0 {
			seen[a] = true
			continue
		}
		d := reconciler.Drift{Map: mapLocalAddrs, Found: a.String(), Want: "no entry (nothing of the box has the address)"}
		key := k
		if err := b.addrs.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			d.Err = fmt.Errorf("delete local address %s: %w", a, err)
		}
		drifts = append(drifts, d)
	}
	if err := it.Err(); err != nil {
		return append(drifts, unreadable(mapLocalAddrs, err))
	}
	for a, owners := range b.owners {
		if len(owners) == 0 || seen[a] {
			continue
		}
		d := reconciler.Drift{Map: mapLocalAddrs, Found: "no entry", Want: fmt.Sprintf("%s (%d owners)", a, len(owners))}
		key, one := localKey(a), uint8(1)
		if err := b.addrs.Update(&key, &one, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("record %s as a local address: %w", a, err)
		}
		drifts = append(drifts, d)
	}
	return drifts
}

func (b *boxAddrs) checkMACs() []reconciler.Drift {
	want := map[uint32]bpf.LbIngressMac{}
	for _, li := range b.ifaces {
		var v bpf.LbIngressMac
		if len(li.mac) == len(v.Mac) {
			copy(v.Mac[:], li.mac)
			want[uint32(li.index)] = v
		}
	}
	var (
		drifts []reconciler.Drift
		k      uint32
		v      bpf.LbIngressMac
	)
	seen := map[uint32]bool{}
	it := b.macs.Iterate()
	for it.Next(&k, &v) {
		w, ok := want[k]
		if ok && w == v {
			seen[k] = true
			continue
		}
		d := reconciler.Drift{Map: mapIngressMACs, ID: k, Found: net.HardwareAddr(v.Mac[:]).String(), Want: "no entry (no interface learnt at the index)"}
		idx := k
		var err error
		if ok {
			seen[k] = true
			d.Want = net.HardwareAddr(w.Mac[:]).String()
			err = b.macs.Update(&idx, &w, ebpf.UpdateAny)
		} else if err = b.macs.Delete(&idx); errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
		if err != nil {
			d.Err = fmt.Errorf("write the ingress MAC of ifindex %d: %w", idx, err)
		}
		drifts = append(drifts, d)
	}
	if err := it.Err(); err != nil {
		return append(drifts, unreadable(mapIngressMACs, err))
	}
	for idx, w := range want {
		if seen[idx] {
			continue
		}
		d := reconciler.Drift{Map: mapIngressMACs, ID: idx, Found: "no entry", Want: net.HardwareAddr(w.Mac[:]).String()}
		if err := b.macs.Update(&idx, &w, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("write the ingress MAC of ifindex %d: %w", idx, err)
		}
		drifts = append(drifts, d)
	}
	return drifts
}

// txPortSet is the record of tx_ports: the interfaces an XDP program of this
// datapath runs on, by index, which XDP_REDIRECT may send to.
type txPortSet struct {
	mu  sync.Mutex
	m   *ebpf.Map
	idx map[uint32]bool
}

func (t *txPortSet) add(idx uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.m.Update(&idx, &idx, ebpf.UpdateAny); err != nil {
		return err
	}
	if t.idx == nil {
		t.idx = map[uint32]bool{}
	}
	t.idx[idx] = true
	return nil
}

func (t *txPortSet) remove(idx uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.idx, idx)
	_ = t.m.Delete(&idx)
}

// check compares tx_ports with the interfaces attached at XDP: an entry
// missing drops the redirects to that interface, an entry too many lets
// packets out of an interface l4lbd does not run on.
func (t *txPortSet) check() []reconciler.Drift {
	t.mu.Lock()
	defer t.mu.Unlock()
	var (
		drifts []reconciler.Drift
		k, v   uint32
	)
	seen := map[uint32]bool{}
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		idx := k
		if t.idx[idx] && v == idx {
			seen[idx] = true
			continue
		}
		d := reconciler.Drift{Map: mapTxPorts, ID: idx, Found: fmt.Sprintf("ifindex %d", v), Want: "no entry (no XDP program of l4lbd's runs there)"}
		var err error
		if t.idx[idx] {
			seen[idx] = true
			d.Want = fmt.Sprintf("ifindex %d", idx)
			err = t.m.Update(&idx, &idx, ebpf.UpdateAny)
		} else if err = t.m.Delete(&idx); errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
		if err != nil {
			d.Err = fmt.Errorf("write tx_ports entry %d: %w", idx, err)
		}
		drifts = append(drifts, d)
	}
	if err := it.Err(); err != nil {
		return append(drifts, unreadable(mapTxPorts, err))
	}
	for idx := range t.idx {
		if seen[idx] {
			continue
		}
		d := reconciler.Drift{Map: mapTxPorts, ID: idx, Found: "no entry", Want: fmt.Sprintf("ifindex %d", idx)}
		if err := t.m.Update(&idx, &idx, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("write tx_ports entry %d: %w", idx, err)
		}
		drifts = append(drifts, d)
	}
	return drifts
}
