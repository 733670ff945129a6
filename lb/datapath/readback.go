// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// The reconciler's self-check (reconciler.Check) reads the maps the control
// plane owns back through these methods: service entries, source ranges,
// backend entries and the Maglev tables. It never reads the maps the
// programs own (connection table, SNAT tables, affinity, counters, caches),
// whose contents change with every packet and are nobody's record.

var _ reconciler.Reader = (*LB)(nil)

// tombstones remembers the map ids of the empty tables DeleteTables left in
// slots, so that the self-check need not open a slot's map to learn that it
// holds no table (opening a map by id needs CAP_SYS_ADMIN).
type tombstones struct {
	mu  sync.Mutex
	ids map[ebpf.MapID]bool
}

func (t *tombstones) add(m *ebpf.Map) {
	info, err := m.Info()
	if err != nil {
		return
	}
	id, ok := info.ID()
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ids == nil {
		t.ids = map[ebpf.MapID]bool{}
	}
	t.ids[id] = true
}

func (t *tombstones) has(id ebpf.MapID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ids[id]
}

// tableHandles keeps the self-check's open handle on the table in each
// Maglev slot, by slot, so that a pass reads a table it read before with
// one batch lookup: opening a table and asking the kernel what it is (its
// id, its name) costs three times as much as reading it. A handle is
// dropped as soon as its slot is pointed at another map (a swap or a
// delete), so it never keeps a replaced table alive. At most
// maxTableHandles are kept (one file descriptor each); tables beyond are
// opened for each read.
type tableHandles struct {
	mu sync.Mutex
	m  map[uint32]tableHandle
}

type tableHandle struct {
	id ebpf.MapID
	m  *ebpf.Map // nil for the empty table DeleteTables leaves
}

const maxTableHandles = 1 << 16

func (h *tableHandles) drop(keys ...uint32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		if t, ok := h.m[k]; ok {
			if t.m != nil {
				t.m.Close()
			}
			delete(h.m, k)
		}
	}
}

func (h *tableHandles) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.m {
		if t.m != nil {
			t.m.Close()
		}
	}
	h.m = nil
}

// readTableHandle is readTable through the handle kept for slot svc.
func (d *LB) readTableHandle(svc uint32, id ebpf.MapID) ([]reconciler.BackendID, bool, error) {
	h := &d.handles
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.m[svc]; ok {
		if t.id == id {
			if t.m == nil {
				return nil, false, nil
			}
			table, err := readChunks(t.m)
			return table, err == nil, err
		}
		if t.m != nil {
			t.m.Close()
		}
		delete(h.m, svc)
	}
	m, ok, err := d.openTable(svc, id)
	if err != nil || !ok {
		return nil, false, err
	}
	info, err := m.Info()
	if err != nil {
		m.Close()
		return nil, false, fmt.Errorf("read map info: %w", err)
	}
	if got, known := info.ID(); !known || got != id {
		// Swapped between the slot's read and the open: read it as
		// it is now, without keeping it.
		defer m.Close()
		if info.Name == tombstoneName {
			return nil, false, nil
		}
		table, err := readChunks(m)
		return table, err == nil, err
	}
	if h.m == nil {
		h.m = map[uint32]tableHandle{}
	}
	keep := len(h.m) < maxTableHandles
	if info.Name == tombstoneName {
		m.Close()
		if keep {
			h.m[svc] = tableHandle{id: id}
		}
		return nil, false, nil
	}
	table, err := readChunks(m)
	if keep {
		h.m[svc] = tableHandle{id: id, m: m}
	} else {
		m.Close()
	}
	return table, err == nil, err
}

// ReadServices implements reconciler.Reader. It also makes the datapath's
// own copy of the source ranges (rangeCache) what the trie holds, so that a
// SetService that repairs a service adds the prefixes someone deleted and
// deletes those someone added.
func (d *LB) ReadServices(want []reconciler.Expected) ([]reconciler.Found, error) {
	ranges, err := d.resyncRanges()
	if err != nil {
		return nil, err
	}
	out := make([]reconciler.Found, len(want))
	if err := d.compareTables(want, out); err != nil {
		return nil, err
	}
	for i := range want {
		if err := d.readService(&want[i], &out[i], ranges); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *LB) readService(w *reconciler.Expected, o *reconciler.Found, ranges map[uint32]map[bpf.LbSrcRangeKey]bool) error {
	if w.Frontend.Addr.IsValid() {
		k := svcKey(w.Frontend)
		var v bpf.LbSvcValue
		err := d.services.Lookup(&k, &v)
		found := err == nil
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("read service entry %s: %w", w.Frontend, err)
		}
		was := func() string {
			return reconciler.DescribeEntry(reconciler.ServiceID(v.Id), entryFromMap(k, v, keysOf(ranges[v.Id])))
		}
		switch {
		case !found && w.Entry != nil:
			o.EntryDrift, o.EntryWas = reconciler.MapServices, "no entry"
		case found && w.Entry == nil:
			o.EntryDrift, o.EntryWas = reconciler.MapServices, was()
		case found:
			exp, err := svcValue(w.ID, *w.Entry)
			if err != nil {
				return fmt.Errorf("encode the programmed entry of %s: %w", w.Frontend, err)
			}
			// The word is the datapath's own (filter.go), renewed by
			// every write.
			exp.SvcWord = v.SvcWord
			// The source-range flag is compared with the ranges, so
			// that a difference in it alone names src_ranges.
			flag := bpf.LbL4lbSvcFlagsL4LB_SVC_SOURCE_RANGES
			got, want := v, exp
			got.Flags &^= flag
			want.Flags &^= flag
			switch {
			case got != want:
				o.EntryDrift, o.EntryWas = reconciler.MapServices, was()
			case v.Flags&flag != exp.Flags&flag || !maps.Equal(ranges[v.Id], rangeKeys(w.ID, *w.Entry)):
				o.EntryDrift = reconciler.MapSourceRanges
				o.EntryWas = fmt.Sprintf("source ranges %v (flag %t)", rangePrefixes(keysOf(ranges[v.Id]), w.Frontend.Addr.Is4()), v.Flags&flag != 0)
			}
		}
	}

	if !o.TableSame {
		if err := d.readSlot(uint32(w.ID), o); err != nil {
			return err
		}
	}

	o.BackendWas = make([]string, len(w.Backends))
	for k, b := range w.Backends {
		id := uint32(b.ID)
		var v bpf.LbBackend
		if err := d.backends.Lookup(&id, &v); err != nil {
			return fmt.Errorf("read backend %d: %w", id, err)
		}
		switch {
		case v.Flags == 0:
			o.BackendWas[k] = "no entry"
		case v != backendValue(b.Backend):
			o.BackendWas[k] = reconciler.DescribeBackend(backendFromMap(v))
		}
	}
	return nil
}

// readSlot reads the table in Maglev slot key whole into o.
func (d *LB) readSlot(key uint32, o *reconciler.Found) error {
	var mid ebpf.MapID
	switch err := d.maglev.Lookup(&key, &mid); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
	case err != nil:
		return fmt.Errorf("read Maglev slot %d: %w", key, err)
	default:
		table, ok, err := d.readTableHandle(key, mid)
		if err != nil {
			return fmt.Errorf("read Maglev table of service id %d: %w", key, err)
		}
		o.HasTable, o.Table = ok, table
	}
	return nil
}

func keysOf(set map[bpf.LbSrcRangeKey]bool) []bpf.LbSrcRangeKey {
	out := make([]bpf.LbSrcRangeKey, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	return out
}

// resyncRanges reads every key of the source-range trie, makes the
// datapath's copy hold exactly them, and returns them by service id. Keys
// only: a trie's value says nothing.
func (d *LB) resyncRanges() (map[uint32]map[bpf.LbSrcRangeKey]bool, error) {
	d.ranges.mu.Lock()
	defer d.ranges.mu.Unlock()
	c := &rangeCache{bySvc: map[uint32]map[bpf.LbSrcRangeKey]bool{}}
	var cur, next bpf.LbSrcRangeKey
	first := true
	for n := uint32(0); ; n++ {
		var err error
		if first {
			err = d.srcRanges.NextKey(nil, &next)
			first = false
		} else {
			err = d.srcRanges.NextKey(&cur, &next)
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read source ranges map: %w", err)
		}
		if n > d.cfg.MaxSourceRanges {
			return nil, fmt.Errorf("read source ranges map: more than its %d keys; changing under the walk?", d.cfg.MaxSourceRanges)
		}
		c.add(next)
		cur = next
	}
	d.ranges.bySvc = c.bySvc
	// Copies, so that the caller reads them without the lock.
	out := make(map[uint32]map[bpf.LbSrcRangeKey]bool, len(c.bySvc))
	for id, set := range c.bySvc {
		out[id] = maps.Clone(set)
	}
	return out, nil
}

// ReadStrayTables implements reconciler.Reader. A slot holding the empty
// table DeleteTables leaves holds no table; a slot whose map l4lbd may not
// open (see openTable) is not reported: it cannot tell it from that empty
// table.
func (d *LB) ReadStrayTables(ids []reconciler.ServiceID) ([]reconciler.ServiceID, error) {
	var out []reconciler.ServiceID
	for _, id := range ids {
		key := uint32(id)
		var mid ebpf.MapID
		err := d.maglev.Lookup(&key, &mid)
		if errors.Is(err, ebpf.ErrKeyNotExist) || (err == nil && d.tombs.has(mid)) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read Maglev slot %d: %w", key, err)
		}
		m, ok, err := d.openTable(key, mid)
		if err != nil {
			return nil, fmt.Errorf("open the table in Maglev slot %d: %w", key, err)
		}
		if !ok {
			continue
		}
		info, err := m.Info()
		if err == nil && info.Name == tombstoneName {
			d.tombs.add(m)
			m.Close()
			continue
		}
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("read the info of the table in Maglev slot %d: %w", key, err)
		}
		out = append(out, id)
	}
	return out, nil
}

// backendWalk is the self-check's walk over the backend array: one batch
// lookup per range of ids, the cursor kept from one range to the next.
type backendWalk struct {
	mu   sync.Mutex
	cur  *ebpf.MapBatchCursor
	next uint32 // the key the cursor returns next
}

// ReadBackends implements reconciler.Reader. Consecutive ranges continue
// one walk of the array; any other range starts a new one.
func (d *LB) ReadBackends(lo, hi reconciler.BackendID) ([]reconciler.BackendEntry, error) {
	w := &d.beWalk
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil || uint32(lo) < w.next {
		w.cur, w.next = new(ebpf.MapBatchCursor), 0
	}
	end := min(uint32(hi), d.cfg.MaxBackends+1)
	var out []reconciler.BackendEntry
	for w.next < end {
		n := end - w.next
		keys := make([]uint32, n)
		vals := make([]bpf.LbBackend, n)
		got, err := d.backends.BatchLookup(w.cur, keys, vals, nil)
		for i := range got {
			if keys[i] >= uint32(lo) && vals[i].Flags != 0 {
				out = append(out, reconciler.BackendEntry{ID: reconciler.BackendID(keys[i]), Backend: backendFromMap(vals[i])})
			}
		}
		if got > 0 {
			w.next = keys[got-1] + 1
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			w.cur = nil
			break
		}
		if err != nil {
			w.cur = nil
			return nil, fmt.Errorf("read backends %d..%d: %w", lo, hi-1, err)
		}
	}
	return out, nil
}

// ScanEntries implements reconciler.Reader.
func (d *LB) ScanEntries() reconciler.EntryScan {
	return &entryScan{it: d.services.Iterate()}
}

type entryScan struct {
	it *ebpf.MapIterator
}

func (s *entryScan) Next(n int) ([]lb.Frontend, []reconciler.ServiceID, bool, error) {
	var (
		fes []lb.Frontend
		ids []reconciler.ServiceID
		k   bpf.LbSvcKey
		v   bpf.LbSvcValue
	)
	for len(fes) < n {
		if !s.it.Next(&k, &v) {
			if err := s.it.Err(); err != nil {
				return nil, nil, true, fmt.Errorf("read service map: %w", err)
			}
			return fes, ids, true, nil
		}
		fes = append(fes, frontendOf(k))
		ids = append(ids, reconciler.ServiceID(v.Id))
	}
	return fes, ids, false, nil
}

// frontendOf is the frontend a service map key stands for.
func frontendOf(k bpf.LbSvcKey) lb.Frontend {
	return lb.Frontend{Addr: netip.AddrFrom16(k.Addr).Unmap(), Port: ntohs(k.Port), Proto: lb.Protocol(k.Proto)}
}

// DeleteStrayEntry implements reconciler.Reader: the entry goes, and the
// CPUs' service caches with it; the filter, addresses, ranges and counters
// are the record's and stay.
func (d *LB) DeleteStrayEntry(fe lb.Frontend) error {
	k := svcKey(fe)
	if err := d.services.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete stray service entry %s: %w", fe, err)
	}
	return d.cache.bump()
}

var _ reconciler.DerivedChecker = (*LB)(nil)

// mapVIPFilter names the frontend filter in a Drift.
const mapVIPFilter = "vip_filter"

// CheckDerived implements reconciler.DerivedChecker: the words of the
// frontend filter (filter.go) are compared with the frontends the datapath
// wrote, and a word that differs is written again (a bit missing would
// hide a service from every packet; a bit too many costs those packets a
// lookup); then the other maps the datapath fills from its own records
// (ownedcheck.go).
func (d *LB) CheckDerived() []reconciler.Drift {
	drifts := d.filter.check()
	if d.words != nil {
		drifts = append(drifts, d.words.check()...)
	}
	drifts = append(drifts, d.nh.check()...)
	drifts = append(drifts, d.box.check()...)
	return append(drifts, d.txPorts.check()...)
}

// check reads every word of the filter and writes back those that differ
// from what its frontends make them.
func (f *vipFilter) check() []reconciler.Drift {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.mask + 1
	vals, err := readArray[uint64](f.m, n)
	if err != nil {
		return []reconciler.Drift{{Map: mapVIPFilter, Found: "a map that cannot be read", Want: fmt.Sprintf("%d words", n), Err: fmt.Errorf("read the frontend filter: %w", err)}}
	}
	var drifts []reconciler.Drift
	for k := range vals {
		i := uint32(k)
		want := f.word(i)
		if vals[k] == want {
			continue
		}
		d := reconciler.Drift{Map: mapVIPFilter, ID: i, Found: fmt.Sprintf("word %#x", vals[k]), Want: fmt.Sprintf("word %#x (%d frontends)", want, len(f.byWord[i]))}
		if err := f.m.Update(&i, want, ebpf.UpdateAny); err != nil {
			d.Err = fmt.Errorf("write frontend filter word %d: %w", i, err)
		}
		drifts = append(drifts, d)
	}
	return drifts
}
