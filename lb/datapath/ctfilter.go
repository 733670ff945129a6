// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
)

// The control side of the connection table's presence filter
// (bpf/include/ctfilter.h): a bit array indexed by a mix of the flow key that lets
// a SYN skip the connection-table lookup when no entry can exist for its
// tuple. The datapath sets a flow's bit before it inserts the flow's
// entry; this side installs a filter only when it holds the bit of every
// entry already in the table, and rebuilds it when entries that left the
// table have set too many bits.

const (
	// Slots of the ct_filter map (CT_FILTER_LIVE, CT_FILTER_NEXT).
	ctFilterLive uint32 = 0
	ctFilterNext uint32 = 1

	// ctFilterBitsPerEntry sizes the filter: eight bits per entry of
	// capacity make a full table set about 12% of them (1 - e^-1/8), so
	// about one SYN in eight to a tuple the table does not hold still
	// takes the lookup.
	ctFilterBitsPerEntry = 8

	// ctFilterMaxFill is the fraction of set bits past which the filter is
	// rebuilt from the table's entries: bits of entries that left the
	// table (evicted, expired, flushed) are never cleared in place.
	ctFilterMaxFill = 0.25

	// ctFilterCheckEvery is how often the fill is checked. A rebuild reads
	// the whole table (BenchmarkConntrackFilterRebuild).
	ctFilterCheckEvery = 30 * time.Second
)

// ctFilterWords is the size of a filter in 64-bit words for a connection
// table of conntrackMax entries: a power of two, at least 64.
func ctFilterWords(conntrackMax uint32) uint32 {
	n := uint64(conntrackMax) * ctFilterBitsPerEntry / 64
	if n <= 64 {
		return 64
	}
	return uint32(1) << bits.Len64(n-1)
}

// ctFilter installs and rebuilds the filters in the ct_filter map.
type ctFilter struct {
	log       *slog.Logger
	outer     *ebpf.Map
	conntrack *ebpf.Map
	inner     *ebpf.MapSpec

	mu   sync.Mutex
	live *filterMap // the filter in CT_FILTER_LIVE, nil while there is none
	// stop ends the maintenance loop, done says it has ended; nil
	// before the first install.
	stop, done chan struct{}
	// checkEvery is ctFilterCheckEvery but in tests.
	checkEvery time.Duration
}

// filterMap is one filter: its map and a shared mapping of its words.
type filterMap struct {
	m     *ebpf.Map
	mem   []byte
	words []uint64
}

func newFilterMap(spec *ebpf.MapSpec) (*filterMap, error) {
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("datapath: create a connection-table filter (%d words): %w", spec.MaxEntries, err)
	}
	size := (int(spec.MaxEntries)*8 + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1)
	mem, err := unix.Mmap(m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("datapath: map the connection-table filter into memory: %w", err)
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), spec.MaxEntries)
	return &filterMap{m: m, mem: mem, words: words}, nil
}

func (f *filterMap) close() {
	unix.Munmap(f.mem)
	f.m.Close()
}

// filterMix is what indexes the filter for a 40-byte flow key: the same
// multiplicative mix of its five little-endian words as flow_key_mix in
// bpf/include/ctfilter.h.
func filterMix(k *[40]byte) uint64 {
	m := func(i int) uint64 { return binary.LittleEndian.Uint64(k[8*i:]) }
	x := (m(0) ^ m(1) ^ m(2)<<1 ^ m(3)<<1) * 0x9e3779b97f4a7c15
	return (x ^ m(4)) * 0xff51afd7ed558ccd
}

// set sets the bit of a key's mix, as ct_filter_set does in the datapath:
// an atomic OR, so that neither side loses the other's bits.
func (f *filterMap) set(mix uint64) {
	w := &f.words[uint32(mix>>32)&uint32(len(f.words)-1)]
	if bit := uint64(1) << (mix >> 58); atomic.LoadUint64(w)&bit == 0 {
		atomic.OrUint64(w, bit)
	}
}

// fill is the fraction of its bits set.
func (f *filterMap) fill() float64 {
	set := 0
	for i := range f.words {
		set += bits.OnesCount64(atomic.LoadUint64(&f.words[i]))
	}
	return float64(set) / float64(len(f.words)*64)
}

func newCTFilter(log *slog.Logger, coll *ebpf.Collection, spec *ebpf.CollectionSpec) *ctFilter {
	return &ctFilter{
		log:        log,
		outer:      coll.Maps[bpf.LbMapCtFilter],
		conntrack:  coll.Maps[bpf.LbMapConntrack],
		inner:      spec.Maps[bpf.LbMapCtFilter].InnerMap.Copy(),
		checkEvery: ctFilterCheckEvery,
	}
}

// clear empties both slots, so that every SYN looks its entry up: what
// Load does with a pinned table, whose entries an earlier l4lb may have
// added without their bits, until install.
func (f *ctFilter) clear() error {
	for _, slot := range []uint32{ctFilterNext, ctFilterLive} {
		if err := f.outer.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("datapath: clear the connection-table filter (slot %d): %w", slot, err)
		}
	}
	return nil
}

// install builds a filter from the table and starts the loop that rebuilds
// it; it must run only once no program that does not set the filter's bits
// runs on the connection table. Once installed, it does nothing.
func (f *ctFilter) install() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stop != nil {
		return nil
	}
	if err := f.rebuildLocked(); err != nil {
		return err
	}
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	go f.maintain(f.stop, f.done, f.checkEvery)
	return nil
}

// rebuild replaces the live filter with one built from the table's entries
// now.
func (f *ctFilter) rebuild() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rebuildLocked()
}

func (f *ctFilter) rebuildLocked() error {
	next, err := newFilterMap(f.inner)
	if err != nil {
		return err
	}
	// The kernel returns from a write to a map-in-map only once no program
	// runs that read the slot before it: every insert from here on sets
	// its bit in next as well.
	if err := f.outer.Put(ctFilterNext, next.m); err != nil {
		next.close()
		return fmt.Errorf("datapath: install the connection-table filter being built: %w", err)
	}
	if err := f.fillFrom(next); err != nil {
		next.close()
		return errors.Join(err, f.outer.Delete(ctFilterNext))
	}
	if err := f.outer.Put(ctFilterLive, next.m); err != nil {
		next.close()
		return errors.Join(fmt.Errorf("datapath: install the connection-table filter: %w", err), f.outer.Delete(ctFilterNext))
	}
	if err := f.outer.Delete(ctFilterNext); err != nil {
		// Harmless: inserts keep setting the same bits twice.
		f.log.Warn("could not clear the connection-table filter's build slot", "error", err)
	}
	if f.live != nil {
		f.live.close()
	}
	f.live = next
	return nil
}

// fillFrom sets the bit of every entry of the table in next, by the mix of
// its key the datapath computes.
// The table is read in batches: nothing in the kernel runs for long, and
// entries the datapath adds meanwhile set their own bits.
func (f *ctFilter) fillFrom(next *filterMap) error {
	err := walk(f.conntrack, func(k *[40]byte, _ *bpf.LbCtValue) bool {
		next.set(filterMix(k))
		return true
	})
	if err != nil {
		return fmt.Errorf("datapath: read the connection table to fill its filter: %w", err)
	}
	return nil
}

// fillRatio is the fraction of the live filter's bits that are set, 0
// when there is no filter.
func (f *ctFilter) fillRatio() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live == nil {
		return 0
	}
	return f.live.fill()
}

// maintain rebuilds the filter whenever more than ctFilterMaxFill of its
// bits are set.
func (f *ctFilter) maintain(stop, done chan struct{}, every time.Duration) {
	defer close(done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		fill := f.fillRatio()
		if fill <= ctFilterMaxFill {
			continue
		}
		if err := f.rebuild(); err != nil {
			f.log.Warn("could not rebuild the connection-table filter; SYNs take the table lookup more often", "fill", fill, "error", err)
			continue
		}
		f.log.Debug("rebuilt the connection-table filter", "fill_before", fill, "fill_after", f.fillRatio())
	}
}

// close stops the maintenance loop. The filter stays installed: the
// programs, which may outlive the daemon, keep it exact on their own.
func (f *ctFilter) close() {
	f.mu.Lock()
	stop, done := f.stop, f.done
	f.stop, f.done = nil, nil
	f.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	f.mu.Lock()
	if f.live != nil {
		f.live.close()
		f.live = nil
	}
	f.mu.Unlock()
}
