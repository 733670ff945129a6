// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
)

// pollEvery is how often the datapath is read while a change is awaited.
const pollEvery = 100 * time.Microsecond

// changeTimeout bounds the wait for one change to reach the datapath: a
// change that has not arrived by then fails the run.
const changeTimeout = 30 * time.Second

// dpReader reads what l4lbd has programmed from its pinned maps, read
// only: the service map, the backend map and the Maglev tables
// (lb/datapath, bpf/include/maps.h). It never writes them.
type dpReader struct {
	services, backends, maglev *ebpf.Map
	// inner is the Maglev table last read, by map id: a table rewritten
	// in place keeps its id, a swapped-in one gets a new one.
	innerID uint32
	inner   *ebpf.Map
}

func openDatapath(pinDir string) (*dpReader, error) {
	r := &dpReader{}
	for _, m := range []struct {
		name string
		into **ebpf.Map
	}{{"services", &r.services}, {"backends", &r.backends}, {"maglev", &r.maglev}} {
		var err error
		*m.into, err = ebpf.LoadPinnedMap(filepath.Join(pinDir, m.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", m.name, err)
		}
	}
	return r, nil
}

func (r *dpReader) Close() {
	for _, m := range []*ebpf.Map{r.services, r.backends, r.maglev, r.inner} {
		if m != nil {
			m.Close()
		}
	}
}

// mapByIDReadOnly opens the map with id read only (BPF_MAP_GET_FD_BY_ID
// with BPF_F_RDONLY; ebpf.NewMapFromID asks for read and write).
func mapByIDReadOnly(id uint32) (*ebpf.Map, error) {
	attr := struct{ id, next, flags uint32 }{id: id, flags: unix.BPF_F_RDONLY}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_GET_FD_BY_ID, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return nil, fmt.Errorf("BPF_MAP_GET_FD_BY_ID %d: %w", id, errno)
	}
	return ebpf.NewMapFromFD(int(fd))
}

// errNoService means the frontend is not in the service map.
var errNoService = errors.New("no such service")

// table returns the backends the Maglev table of frontend vip:port/tcp
// names, as the backend map holds them: each must be active and belong to
// the service (svc_id), or the read fails.
func (r *dpReader) table(vip netip.Addr, port uint16) (map[netip.AddrPort]bool, error) {
	key := bpf.LbSvcKey{Addr: vip.As16(), Port: htons(port), Proto: unix.IPPROTO_TCP}
	var svc bpf.LbSvcValue
	if err := r.services.Lookup(&key, &svc); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, errNoService
		}
		return nil, err
	}
	var innerID uint32
	if err := r.maglev.Lookup(svc.Id, &innerID); err != nil {
		return nil, fmt.Errorf("maglev[%d]: %w", svc.Id, err)
	}
	if innerID != r.innerID || r.inner == nil {
		if r.inner != nil {
			r.inner.Close()
			r.inner = nil
		}
		m, err := mapByIDReadOnly(innerID)
		if err != nil {
			return nil, err
		}
		r.inner, r.innerID = m, innerID
	}
	ids := map[uint32]bool{}
	var chunk [16]uint32
	var size uint32
	for k := uint32(0); k < r.inner.MaxEntries(); k++ {
		if err := r.inner.Lookup(k, &chunk); err != nil {
			return nil, fmt.Errorf("maglev table of service %d, chunk %d: %w", svc.Id, k, err)
		}
		first := 0
		if k == 0 {
			size, first = chunk[0], 1 // id 0 holds the table's size
		}
		for i := first; i < len(chunk) && k*16+uint32(i) <= size; i++ {
			ids[chunk[i]] = true
		}
	}
	out := map[netip.AddrPort]bool{}
	for id := range ids {
		var be bpf.LbBackend
		if err := r.backends.Lookup(id, &be); err != nil {
			return nil, fmt.Errorf("backend %d: %w", id, err)
		}
		if be.SvcId != svc.Id || be.Flags&bpf.LbL4lbBackendFlagsL4LB_BACKEND_ACTIVE == 0 {
			return nil, fmt.Errorf("backend %d in the table of service %d: svc_id %d, flags %#x", id, svc.Id, be.SvcId, be.Flags)
		}
		out[netip.AddrPortFrom(netip.AddrFrom16(be.Addr).Unmap(), ntohs(be.Port))] = true
	}
	return out, nil
}

// waitTable polls the datapath every pollEvery until the Maglev table of
// vip:port names exactly want, and returns when it saw that. It returns an
// error, with what it saw last, after timeout.
func (r *dpReader) waitTable(vip netip.Addr, port uint16, want []netip.AddrPort, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	var last map[netip.AddrPort]bool
	var lastErr error
	for {
		got, err := r.table(vip, port)
		now := time.Now()
		if err == nil && sameSet(got, want) {
			return now, nil
		}
		last, lastErr = got, err
		if now.After(deadline) {
			return now, fmt.Errorf("the datapath did not hold the change to %s:%d within %s: want %s, have %s (%v)",
				vip, port, timeout, setString(want), setString(slices.Collect(maps.Keys(last))), lastErr)
		}
		time.Sleep(pollEvery)
	}
}

func sameSet(got map[netip.AddrPort]bool, want []netip.AddrPort) bool {
	if len(got) != len(want) {
		return false
	}
	for _, a := range want {
		if !got[a] {
			return false
		}
	}
	return true
}

func setString(s []netip.AddrPort) string {
	slices.SortFunc(s, func(a, b netip.AddrPort) int { return a.Compare(b) })
	var b strings.Builder
	for i, a := range s {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.String())
	}
	return "[" + b.String() + "]"
}

func htons(p uint16) uint16 { return p<<8 | p>>8 }
func ntohs(p uint16) uint16 { return htons(p) }
