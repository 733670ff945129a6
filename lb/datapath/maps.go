// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// maglevChunk is MAGLEV_CHUNK of bpf/include/types.h; a test checks it
// against the inner map's value size.
const maglevChunk = 16

var (
	_ reconciler.Datapath     = (*LB)(nil)
	_ reconciler.TableBatcher = (*LB)(nil)
)

// tombstoneName names the empty inner map DeleteTables leaves in the slots
// it clears; State recognises it by this name, also after a restart.
const tombstoneName = "maglev_deleted"

// htons converts a port to the network-order value a __be16 field holds.
func htons(p uint16) uint16 { return bits.ReverseBytes16(p) }

// ntohs is the inverse of htons.
func ntohs(p uint16) uint16 { return bits.ReverseBytes16(p) }

func seedKeys(s maglev.Seed) (k0, k1 uint64) {
	return binary.LittleEndian.Uint64(s[0:8]), binary.LittleEndian.Uint64(s[8:16])
}

// encapSource4 returns the base address (as the __be32 bytes) and the host
// mask of an IPv4 encapsulation prefix.
func encapSource4(p netip.Prefix) (base, mask uint32, err error) {
	if !p.Addr().Is4() {
		return 0, 0, fmt.Errorf("datapath: IPv4 encapsulation source %s is not an IPv4 prefix", p)
	}
	p = p.Masked()
	a := p.Addr().As4()
	host := 32 - p.Bits()
	if host > 0 {
		mask = uint32(1)<<host - 1
	}
	return binary.NativeEndian.Uint32(a[:]), mask, nil
}

// encapSource6 returns the base address and the host mask (over the low 32
// bits) of an IPv6 encapsulation prefix.
func encapSource6(p netip.Prefix) (base [16]byte, mask uint32, err error) {
	if !p.Addr().Is6() || p.Addr().Is4In6() {
		return base, 0, fmt.Errorf("datapath: IPv6 encapsulation source %s is not an IPv6 prefix", p)
	}
	p = p.Masked()
	host := min(128-p.Bits(), 32)
	if host == 32 {
		mask = ^uint32(0)
	} else if host > 0 {
		mask = uint32(1)<<host - 1
	}
	return p.Addr().As16(), mask, nil
}

func svcKey(fe lb.Frontend) bpf.LbSvcKey {
	return bpf.LbSvcKey{Addr: fe.Addr.As16(), Port: htons(fe.Port), Proto: uint8(fe.Proto)}
}

// Supported reports whether this datapath can forward svc as configured;
// the daemon checks it before a service reaches the reconciler so an
// unsupported combination is refused with a clear error up front.
// (*LB).Supported adds what depends on the loaded datapath's settings.
func Supported(svc lb.Service) error {
	mode := svc.ModeFor(svc.Frontend.Proto)
	switch mode {
	case lb.ModeSNAT:
		// Needs a SNAT address of the VIP's family: (*LB).Supported.
	case lb.ModeDSR:
		switch svc.Dispatch {
		case lb.DispatchIPIP, lb.DispatchGeneve:
			// The packet reaches the backend unchanged: it must listen
			// on the VIP's port. Sources other than the file (Consul,
			// Kubernetes) inherit dispatch defaults too, so the rule is
			// enforced here, on the effective dispatch.
			for _, b := range svc.Backends {
				if b.Addr.Port() != svc.Frontend.Port {
					return fmt.Errorf("backend %s: DSR dispatch %q delivers the packet unchanged, so the backend must listen on port %d; use dispatch opt or mode snat to translate ports",
						b.Addr, svc.Dispatch, svc.Frontend.Port)
				}
			}
		case lb.DispatchOpt:
		default:
			return fmt.Errorf("DSR dispatch %q is not supported by this datapath (use ipip, geneve or opt)", svc.Dispatch)
		}
	default:
		return fmt.Errorf("mode %q for %s is not supported by this datapath (use snat, dsr or hybrid)", mode, svc.Frontend.Proto)
	}
	if svc.Affinity.ClientIP && svc.Affinity.Timeout <= 0 {
		return fmt.Errorf("session affinity needs a positive affinity_timeout, not %s", svc.Affinity.Timeout)
	}
	return checkSourceRanges(svc)
}

// The model's modes and dispatches as the service map stores them; dump.go
// reads them back through the same tables.
var (
	modes = map[lb.Mode]bpf.LbL4lbMode{
		lb.ModeDSR:  bpf.LbL4lbModeL4LB_MODE_DSR,
		lb.ModeSNAT: bpf.LbL4lbModeL4LB_MODE_SNAT,
	}
	dispatches = map[lb.Dispatch]bpf.LbL4lbDispatch{
		lb.DispatchIPIP:   bpf.LbL4lbDispatchL4LB_DISPATCH_IPIP,
		lb.DispatchGeneve: bpf.LbL4lbDispatchL4LB_DISPATCH_GENEVE,
		lb.DispatchOpt:    bpf.LbL4lbDispatchL4LB_DISPATCH_OPT,
	}
)

func svcValue(id reconciler.ServiceID, svc lb.Service) (bpf.LbSvcValue, error) {
	if err := Supported(svc); err != nil {
		return bpf.LbSvcValue{}, fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	v := bpf.LbSvcValue{Id: uint32(id), TableSize: svc.TableSize}
	v.Mode = modes[svc.ModeFor(svc.Frontend.Proto)]
	v.Dispatch = dispatches[svc.Dispatch]
	if svc.Algorithm == lb.Random {
		v.Flags |= bpf.LbL4lbSvcFlagsL4LB_SVC_RANDOM
	}
	if svc.Affinity.ClientIP {
		v.Flags |= bpf.LbL4lbSvcFlagsL4LB_SVC_AFFINITY
	}
	// Stored whatever the flag says, so State reads back exactly this.
	v.AffinityNs = uint64(svc.Affinity.Timeout)
	if len(svc.SourceRanges) > 0 {
		v.Flags |= bpf.LbL4lbSvcFlagsL4LB_SVC_SOURCE_RANGES
	}
	return v, nil
}

// SetService writes the service entry for svc.Frontend, make-before-break
// with its source ranges: prefixes the service lacks first, then the entry
// (whose flag makes them count, or with an empty list no longer), then the
// prefixes it no longer has. While it runs, a client of either list is let
// in, never one of neither.
func (d *LB) SetService(id reconciler.ServiceID, svc lb.Service) error {
	v, err := svcValue(id, svc)
	if err != nil {
		return err
	}
	if err := d.snatReady(svc); err != nil {
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	keys := rangeKeys(id, svc)
	d.ranges.mu.Lock()
	defer d.ranges.mu.Unlock()
	added, err := d.addRanges(id, keys)
	if err != nil {
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	// The filter first: it must never hide a frontend that has an entry.
	if err := d.filter.add(svc.Frontend); err != nil {
		d.undoRanges(added)
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	// The VIP is one of the box's addresses before any packet can reach
	// the service: no client may use it as its source.
	if err := d.box.addFrontend(svc.Frontend.Addr, svc.Frontend.String()); err != nil {
		d.undoRanges(added)
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	v.SvcWord = d.words.next(uint32(id), v.Mode, v.Dispatch)
	k := svcKey(svc.Frontend)
	if err := d.services.Update(&k, &v, ebpf.UpdateAny); err != nil {
		d.undoRanges(added)
		if isFull(err) {
			return fmt.Errorf("service map full (max_services = %d): raise datapath.max_services: %w", d.cfg.MaxServices, err)
		}
		return fmt.Errorf("write service entry %s: %w", svc.Frontend, err)
	}
	// The CPUs' service caches (bpf/include/svccache.h) drop their copy
	// of the old entry before the prefixes only it allowed go: with the
	// copy, an entry losing its source ranges would meanwhile let no
	// client in.
	if err := d.cache.bump(); err != nil {
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	if err := d.pruneRanges(id, keys); err != nil {
		// The entry is written; the next pass prunes again.
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	// Last: the new word (the entry carries it already, for new flows)
	// sends every established flow of the service once through the full
	// path, which checks it against the entry just written (mode,
	// dispatch, source ranges).
	if err := d.words.set(uint32(id), v.SvcWord); err != nil {
		return fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	return nil
}

// DeleteService removes the entry of fe, then its source ranges, and
// zeroes the counters of id, so a later service that gets the id starts
// from zero.
func (d *LB) DeleteService(id reconciler.ServiceID, fe lb.Frontend) error {
	k := svcKey(fe)
	if err := d.services.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete service entry %s: %w", fe, err)
	}
	// Its flows' entries no longer pass the fast path's check.
	if err := d.words.retire(uint32(id)); err != nil {
		return fmt.Errorf("service %s: %w", fe, err)
	}
	if err := d.filter.remove(fe); err != nil {
		return fmt.Errorf("service %s: %w", fe, err)
	}
	if err := d.box.removeFrontend(fe.Addr, fe.String()); err != nil {
		return fmt.Errorf("service %s: %w", fe, err)
	}
	d.ranges.mu.Lock()
	err := d.pruneRanges(id, nil)
	d.ranges.mu.Unlock()
	if err != nil {
		return fmt.Errorf("service %s: %w", fe, err)
	}
	if err := d.zeroStats(d.svcStats, uint32(id)); err != nil {
		return err
	}
	return d.zeroReplies(uint32(id))
}

// SetBackend writes the backend entry at id.
func (d *LB) SetBackend(id reconciler.BackendID, b reconciler.Backend) error {
	if uint32(id) == 0 || uint32(id) > d.cfg.MaxBackends {
		return fmt.Errorf("backend id %d out of range 1..%d", id, d.cfg.MaxBackends)
	}
	v := backendValue(b)
	// Its route before the entry that makes it reachable.
	d.nh.add(uint32(id), b.Addr.Addr())
	key := uint32(id)
	if err := d.backends.Update(&key, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write backend %d (%s): %w", id, b.Addr, err)
	}
	return d.cache.bump()
}

// backendValue is the backend map's value for b.
func backendValue(b reconciler.Backend) bpf.LbBackend {
	v := bpf.LbBackend{
		Addr:  b.Addr.Addr().As16(),
		Port:  htons(b.Addr.Port()),
		SvcId: uint32(b.Service),
		Flags: bpf.LbL4lbBackendFlagsL4LB_BACKEND_ACTIVE,
	}
	v.Family = 6
	if b.Addr.Addr().Is4() {
		v.Family = 4
	}
	switch b.State {
	case lb.Draining:
		v.Flags |= bpf.LbL4lbBackendFlagsL4LB_BACKEND_DRAINING
	case lb.Disabled:
		// In use (flags not 0), but without ACTIVE no connection-table
		// hit is honoured, so its flows move; DRAINING keeps session
		// affinity away from it; no Maglev table names it.
		v.Flags = bpf.LbL4lbBackendFlagsL4LB_BACKEND_DRAINING
	}
	return v
}

// DeleteBackend clears the backend entry at id (an array slot cannot be
// deleted; flags 0 marks it unused) and zeroes its counters.
func (d *LB) DeleteBackend(id reconciler.BackendID) error {
	key := uint32(id)
	var zero bpf.LbBackend
	if err := d.backends.Update(&key, &zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("clear backend %d: %w", id, err)
	}
	if err := d.cache.bump(); err != nil {
		return err
	}
	d.nh.remove(uint32(id))
	return d.zeroStats(d.backendStats, key)
}

// SetTable writes the service's Maglev table: over the one in place when
// both have the same size (rewriteInPlace), else built in a new inner map
// and swapped into the outer map in one update.
func (d *LB) SetTable(svc reconciler.ServiceID, table []reconciler.BackendID) error {
	if d.rewriteInPlace(uint32(svc), table) {
		return nil
	}
	inner, err := d.newTable(fmt.Sprintf("maglev_%d", svc), svc, table)
	if err != nil {
		return err
	}
	defer inner.Close()
	key := uint32(svc)
	if err := d.swaps.before([]uint32{key}); err != nil {
		return fmt.Errorf("swap in Maglev table for service id %d: %w", svc, err)
	}
	d.handles.drop(key)
	if err := d.maglev.Update(&key, inner, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("swap in Maglev table for service id %d: %w", svc, err)
	}
	d.swaps.after([]uint32{key}, nil, true)
	d.pinTable(key, inner)
	return nil
}

// rewriteInPlace writes table over the table slot key holds when that table
// has the same size, and reports whether it did. A swap would do too, but
// the kernel waits for an RCU grace period (about 9 ms) after every write to
// a map of maps, which is most of what one endpoint change costs; a write
// into the inner map does not wait.
//
// A packet reads one slot of one chunk, and every slot is an aligned
// 32-bit word the kernel copies whole, so a packet that runs during the
// write sees its slot's old backend or its new one, as it would across a
// swap: the reconciler has written every backend of both tables before
// this call and deletes none until it returns. The table's size, in chunk
// 0, is the same before and after, so no index moves. The swap time is
// stamped first, as for a swap, so that a handshake whose SYN saw the old
// slot keeps its backend.
//
// Anything it cannot prove (a slot without a table, the shared empty table
// DeleteTables leaves, a size that differs, a table it cannot open or
// read) leaves the table alone and answers false: the caller swaps. If
// the write itself fails half way, the table holds a mix of two valid
// tables until the swap that follows replaces it whole.
func (d *LB) rewriteInPlace(key uint32, table []reconciler.BackendID) bool {
	if len(table) == 0 {
		// An empty table has the empty one's size; never write into
		// a map that may be shared.
		return false
	}
	var id ebpf.MapID
	if err := d.maglev.Lookup(&key, &id); err != nil {
		return false
	}
	m, ok, err := d.openTable(key, id)
	if err != nil || !ok {
		return false
	}
	defer m.Close()
	keys, vals := tableChunks(table)
	if m.MaxEntries() != uint32(len(keys)) {
		return false
	}
	var head [maglevChunk]uint32
	if err := m.Lookup(&keys[0], &head); err != nil || head[0] != vals[0][0] {
		return false
	}
	if err := d.swaps.before([]uint32{key}); err != nil {
		return false
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		d.log.Warn("could not rewrite a Maglev table in place; swapping in a new one", "service_id", key, "error", err)
		return false
	}
	d.swaps.after([]uint32{key}, nil, true)
	return true
}

// tableChunks lays table out as the inner map holds it: slot 0 of chunk 0
// is the size, slot s+1 is table[s].
func tableChunks(table []reconciler.BackendID) ([]uint32, [][maglevChunk]uint32) {
	n := len(table) + 1
	chunks := (n + maglevChunk - 1) / maglevChunk
	keys := make([]uint32, chunks)
	vals := make([][maglevChunk]uint32, chunks)
	for i := range keys {
		keys[i] = uint32(i)
	}
	vals[0][0] = uint32(len(table))
	for i, id := range table {
		s := i + 1
		vals[s/maglevChunk][s%maglevChunk] = uint32(id)
	}
	return keys, vals
}

// newTable creates an inner map named name holding table, ready to be
// swapped in for svc.
func (d *LB) newTable(name string, svc reconciler.ServiceID, table []reconciler.BackendID) (*ebpf.Map, error) {
	keys, vals := tableChunks(table)
	spec := d.inner.Copy()
	spec.MaxEntries = uint32(len(keys))
	spec.Name = name
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create Maglev table for service id %d (%d slots): %w", svc, len(table), err)
	}
	if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
		inner.Close()
		return nil, fmt.Errorf("fill Maglev table for service id %d: %w", svc, err)
	}
	return inner, nil
}

// SetTables rewrites in place each table whose size its slot's table has
// (rewriteInPlace), builds the others each in its own inner map, then swaps
// those into the outer map with one BPF_MAP_UPDATE_BATCH. The kernel waits
// for an RCU grace period after every write to a map-in-map but only once
// per batch, so n new tables cost about what one SetTable costs, plus the
// builds. A table whose inner map cannot be built fails alone; the others
// still go in.
func (d *LB) SetTables(svcs []reconciler.ServiceID, tables [][]reconciler.BackendID) []error {
	errs := make([]error, len(svcs))
	if len(tables) != len(svcs) {
		for i := range errs {
			errs[i] = fmt.Errorf("swap in Maglev tables: %d service ids for %d tables (a reconciler bug)", len(svcs), len(tables))
		}
		return errs
	}
	var (
		at     []int
		keys   []uint32
		inners []*ebpf.Map
	)
	defer func() {
		// The outer map holds its own references to the tables it took.
		for _, m := range inners {
			m.Close()
		}
	}()
	for i, svc := range svcs {
		if d.rewriteInPlace(uint32(svc), tables[i]) {
			continue
		}
		inner, err := d.newTable(fmt.Sprintf("maglev_%d", svc), svc, tables[i])
		if err != nil {
			errs[i] = err
			continue
		}
		at = append(at, i)
		keys = append(keys, uint32(svc))
		inners = append(inners, inner)
	}
	swapped := d.swapIn(keys, inners, true)
	for k, err := range swapped {
		if err != nil {
			errs[at[k]] = fmt.Errorf("swap in Maglev table for service id %d: %w", keys[k], err)
		}
	}
	d.pinTables(keys, inners, swapped)
	return errs
}

// DeleteTables removes several tables for the price of one. The kernel has
// no batch delete for map-in-maps (BPF_MAP_DELETE_BATCH answers ENOTSUPP on
// an array of maps, after waiting for a grace period all the same), so it
// points their slots at one shared empty table in one batch update instead.
// The program reads an empty table as it reads a missing one (no backend),
// the old tables are freed as with a delete, and State reports the slots as
// holding no table.
func (d *LB) DeleteTables(svcs []reconciler.ServiceID) []error {
	errs := make([]error, len(svcs))
	tomb, err := d.newTable(tombstoneName, 0, nil)
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("delete Maglev table of service id %d: build the empty table that replaces it: %w", svcs[i], err)
		}
		return errs
	}
	defer tomb.Close()
	d.tombs.add(tomb)
	keys := make([]uint32, len(svcs))
	inners := make([]*ebpf.Map, len(svcs))
	for i, svc := range svcs {
		keys[i], inners[i] = uint32(svc), tomb
	}
	for i, err := range d.swapIn(keys, inners, false) {
		if err != nil {
			errs[i] = fmt.Errorf("delete Maglev table of service id %d: %w", svcs[i], err)
			continue
		}
		errs[i] = d.unpinTable(keys[i])
	}
	return errs
}

// swapIn points the outer map's slot keys[k] at inners[k] for every k with
// one batch update, and returns one error per slot. tables says whether
// inners are tables or the empty one that stands for none (tableSwaps).
//
// The kernel applies a batch entry by entry and stops at the first it
// cannot apply; the count it returns says how far it got, except when it
// failed before the first entry, where the count is left as it was passed.
// So after a failure every slot is read back: a slot holding its new map is
// done whatever the count says, any other slot was not changed (a single
// entry is applied whole or not at all).
func (d *LB) swapIn(keys []uint32, inners []*ebpf.Map, tables bool) []error {
	errs := make([]error, len(keys))
	if len(keys) == 0 {
		return errs
	}
	if err := d.swaps.before(keys); err != nil {
		for k := range errs {
			errs[k] = err
		}
		return errs
	}
	defer func() { d.swaps.after(keys, errs, tables) }()
	d.handles.drop(keys...)
	fds := make([]uint32, len(inners))
	for k, m := range inners {
		fds[k] = uint32(m.FD())
	}
	n, err := d.maglev.BatchUpdate(keys, fds, nil)
	if err == nil {
		return errs
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		// A kernel without batch updates on a map of maps: one grace
		// period per slot, as SetTable pays.
		for k := range keys {
			if e := d.maglev.Update(&keys[k], inners[k], ebpf.UpdateAny); e != nil {
				errs[k] = e
			}
		}
		return errs
	}
	for k := range keys {
		done, rerr := d.holds(keys[k], inners[k])
		switch {
		case rerr != nil:
			errs[k] = fmt.Errorf("batch update of %d slots failed (%w) and reading slot %d back failed too (%v), so whether it changed is unknown", len(keys), err, keys[k], rerr)
		case done:
		case k == n:
			errs[k] = err
		case n < k:
			errs[k] = fmt.Errorf("not applied: the batch update stopped at slot %d before reaching it: %w", keys[n], err)
		default:
			errs[k] = fmt.Errorf("not applied: the batch update of %d slots failed: %w", len(keys), err)
		}
	}
	return errs
}

// holds reports whether the outer map's slot key points at m.
func (d *LB) holds(key uint32, m *ebpf.Map) (bool, error) {
	info, err := m.Info()
	if err != nil {
		return false, fmt.Errorf("read inner map info: %w", err)
	}
	want, ok := info.ID()
	if !ok {
		return false, errors.New("the kernel does not report map ids")
	}
	var got ebpf.MapID
	if err := d.maglev.Lookup(&key, &got); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, err
	}
	return got == want, nil
}

// DeleteTable removes the service's table.
func (d *LB) DeleteTable(svc reconciler.ServiceID) error {
	key := uint32(svc)
	if err := d.swaps.before([]uint32{key}); err != nil {
		return fmt.Errorf("delete Maglev table of service id %d: %w", svc, err)
	}
	d.handles.drop(key)
	if err := d.maglev.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete Maglev table of service id %d: %w", svc, err)
	}
	d.swaps.after([]uint32{key}, nil, false)
	return d.unpinTable(key)
}

func (d *LB) zeroStats(m *ebpf.Map, key uint32) error {
	zeros := make([]bpf.LbLbStats, d.cpus)
	if err := m.Update(&key, zeros, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset counters %s[%d]: %w", m, key, err)
	}
	return nil
}

// zeroReplies resets service id's SNAT reply counters.
func (d *LB) zeroReplies(id uint32) error {
	if d.svcReplies == nil {
		return nil
	}
	if err := d.svcReplies.Update(&id, make([]bpf.LbReplyStats, d.cpus), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset counters %s[%d]: %w", d.svcReplies, id, err)
	}
	return nil
}

// isFull reports a hash map at capacity (the kernel answers E2BIG).
func isFull(err error) bool { return errors.Is(err, unix.E2BIG) }

// adoptServices reads the service entries an earlier l4lbd left (none on a
// fresh start) and makes the frontend filter and the service words agree
// with them, before any program of this datapath runs.
func (d *LB) adoptServices() error {
	var (
		k bpf.LbSvcKey
		v bpf.LbSvcValue
	)
	var fes []lb.Frontend
	live := map[uint32]bpf.LbSvcValue{}
	keys := map[uint32]bpf.LbSvcKey{}
	it := d.services.Iterate()
	for it.Next(&k, &v) {
		fes = append(fes, frontendOf(k))
		live[v.Id] = v
		keys[v.Id] = k
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read service map: %w", err)
	}
	words, err := readSVCWords(d.svcGen, d.cache)
	if err != nil {
		return fmt.Errorf("datapath: %w", err)
	}
	ids, err := words.ensure(live)
	if err != nil {
		return fmt.Errorf("datapath: %w", err)
	}
	// Entries whose word is not svc_gen's (an earlier l4lbd's, or one
	// ensure renewed) get it, or their new flows would stamp entries the
	// fast path never accepts.
	rewritten := false
	for id, sv := range live {
		if sv.SvcWord == ids[id] {
			continue
		}
		sv.SvcWord = ids[id]
		k := keys[id]
		if err := d.services.Update(&k, &sv, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("datapath: write the word of adopted service id %d: %w", id, err)
		}
		rewritten = true
	}
	// A program still running from the earlier l4lbd may hold copies of
	// the entries just rewritten (service caches, svccache.h).
	if rewritten {
		if err := d.cache.bump(); err != nil {
			return fmt.Errorf("datapath: %w", err)
		}
	}
	d.words = words
	for _, fe := range fes {
		if err := d.box.addFrontend(fe.Addr, fe.String()); err != nil {
			return fmt.Errorf("datapath: adopted service %s: %w", fe, err)
		}
	}
	d.filter = newVIPFilter(d.coll.Maps[bpf.LbMapVipFilter], filterWords(d.cfg.MaxServices)-1)
	if err := d.filter.rebuild(fes); err != nil {
		return fmt.Errorf("datapath: %w", err)
	}
	return nil
}

// adoptBackends resolves the routes of the backends an earlier l4lbd
// programmed (none on a fresh start): the reconciler adopts them without
// writing them again, and their next hops must follow the kernel all the
// same.
func (d *LB) adoptBackends() error {
	var (
		k uint32
		v bpf.LbBackend
	)
	it := d.backends.Iterate()
	for it.Next(&k, &v) {
		if v.Flags != 0 {
			d.nh.add(k, netip.AddrFrom16(v.Addr).Unmap())
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read backend map: %w", err)
	}
	d.nh.settle()
	return nil
}
