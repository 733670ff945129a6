// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// State reads back what the maps hold, in the form the reconciler adopts
// after a restart (reconciler.NewFromState). Service names are not stored
// in the kernel; the daemon fills them from its configuration. A Maglev
// slot cleared by DeleteTables holds no table.
func (d *LB) State() (reconciler.State, error) {
	byID := map[reconciler.ServiceID]*reconciler.ServiceState{}
	get := func(id reconciler.ServiceID) *reconciler.ServiceState {
		s, ok := byID[id]
		if !ok {
			s = &reconciler.ServiceState{ID: id}
			byID[id] = s
		}
		return s
	}

	ranges, err := d.readRangesByID()
	if err != nil {
		return reconciler.State{}, err
	}
	var (
		k bpf.LbSvcKey
		v bpf.LbSvcValue
	)
	it := d.services.Iterate()
	for it.Next(&k, &v) {
		s := get(reconciler.ServiceID(v.Id))
		s.HasEntry = true
		s.Service = entryFromMap(k, v, ranges[v.Id])
	}
	if err := it.Err(); err != nil {
		return reconciler.State{}, fmt.Errorf("read service map: %w", err)
	}

	var (
		bk uint32
		bv bpf.LbBackend
	)
	bit := d.backends.Iterate()
	for bit.Next(&bk, &bv) {
		if bv.Flags == 0 {
			continue
		}
		s := get(reconciler.ServiceID(bv.SvcId))
		s.Backends = append(s.Backends, reconciler.BackendEntry{ID: reconciler.BackendID(bk), Backend: backendFromMap(bv)})
	}
	if err := bit.Err(); err != nil {
		return reconciler.State{}, fmt.Errorf("read backend map: %w", err)
	}

	var (
		mk  uint32
		mid ebpf.MapID
	)
	mit := d.maglev.Iterate()
	for mit.Next(&mk, &mid) {
		table, ok, err := d.readTable(mk, mid)
		if err != nil {
			return reconciler.State{}, fmt.Errorf("read Maglev table of service id %d: %w", mk, err)
		}
		if !ok {
			continue
		}
		s := get(reconciler.ServiceID(mk))
		s.HasTable = true
		s.Table = table
	}
	if err := mit.Err(); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return reconciler.State{}, fmt.Errorf("read Maglev outer map: %w", err)
	}

	var st reconciler.State
	for _, s := range byID {
		slices.SortFunc(s.Backends, func(a, b reconciler.BackendEntry) int { return a.Addr.Compare(b.Addr) })
		st.Services = append(st.Services, *s)
	}
	slices.SortFunc(st.Services, func(a, b reconciler.ServiceState) int {
		if c := a.Service.Frontend.Compare(b.Service.Frontend); c != 0 {
			return c
		}
		return int(a.ID) - int(b.ID)
	})
	return st, nil
}

// entryFromMap is the service entry k -> v in the form of reconciler.Entry;
// ranges are the src_ranges keys under its id, which count only while the
// entry's flag says so.
func entryFromMap(k bpf.LbSvcKey, v bpf.LbSvcValue, ranges []bpf.LbSrcRangeKey) lb.Service {
	addr := netip.AddrFrom16(k.Addr).Unmap()
	s := lb.Service{
		Frontend:  lb.Frontend{Addr: addr, Port: ntohs(k.Port), Proto: lb.Protocol(k.Proto)},
		TableSize: v.TableSize,
		Affinity: lb.Affinity{
			ClientIP: v.Flags&bpf.LbL4lbSvcFlagsL4LB_SVC_AFFINITY != 0,
			Timeout:  time.Duration(v.AffinityNs),
		},
	}
	if v.Flags&bpf.LbL4lbSvcFlagsL4LB_SVC_SOURCE_RANGES != 0 {
		s.SourceRanges = rangePrefixes(ranges, addr.Is4())
	}
	for m, bm := range modes {
		if bm == v.Mode {
			s.Mode = m
		}
	}
	for d, bd := range dispatches {
		if bd == v.Dispatch {
			s.Dispatch = d
		}
	}
	if v.Flags&bpf.LbL4lbSvcFlagsL4LB_SVC_RANDOM != 0 {
		s.Algorithm = lb.Random
	}
	return s
}

func backendFromMap(v bpf.LbBackend) reconciler.Backend {
	addr := netip.AddrFrom16(v.Addr)
	if v.Family == 4 {
		addr = addr.Unmap()
	}
	b := reconciler.Backend{
		Addr:    netip.AddrPortFrom(addr, ntohs(v.Port)),
		Service: reconciler.ServiceID(v.SvcId),
		State:   lb.Active,
	}
	switch {
	case v.Flags&bpf.LbL4lbBackendFlagsL4LB_BACKEND_ACTIVE == 0:
		b.State = lb.Disabled // see SetBackend
	case v.Flags&bpf.LbL4lbBackendFlagsL4LB_BACKEND_DRAINING != 0:
		b.State = lb.Draining
	}
	return b
}

// readTable reads the inner map id in slot svc. ok is false for the empty
// table that DeleteTables leaves behind (that slot holds no table) and for
// a table l4lbd may not open (see openTable).
func (d *LB) readTable(svc uint32, id ebpf.MapID) (table []reconciler.BackendID, ok bool, err error) {
	m, ok, err := d.openTable(svc, id)
	if err != nil || !ok {
		return nil, false, err
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return nil, false, fmt.Errorf("read map info: %w", err)
	}
	if info.Name == tombstoneName {
		return nil, false, nil
	}
	table, err = readChunks(m)
	return table, err == nil, err
}

// readChunks reads the table inner map m holds.
func readChunks(m *ebpf.Map) ([]reconciler.BackendID, error) {
	// One batch read per table rather than one lookup per chunk: a
	// restart reads back every service's table.
	n := m.MaxEntries()
	chunks, err := readArray[[maglevChunk]uint32](m, n)
	if err != nil {
		return nil, err
	}
	if len(chunks) != int(n) {
		return nil, fmt.Errorf("read %d of the table's %d chunks", len(chunks), n)
	}
	flat := make([]uint32, 0, int(n)*maglevChunk)
	for i := range chunks {
		flat = append(flat, chunks[i][:]...)
	}
	if len(flat) == 0 {
		return nil, errors.New("empty table map")
	}
	size := int(flat[0])
	if size+1 > len(flat) {
		return nil, fmt.Errorf("table claims %d slots but holds %d", size, len(flat)-1)
	}
	out := make([]reconciler.BackendID, size)
	for i := range out {
		out[i] = reconciler.BackendID(flat[i+1])
	}
	return out, nil
}
