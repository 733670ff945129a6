// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
)

// The control side of the connection table's presence filter
// (bpf/include/ctfilter.h): a bit array indexed by the flow hash that lets
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

	// ctFilterCheckEvery is how often the fill is checked. A rebuild walks
	// the table in the kernel (about 100 ms per million entries).
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
	log   *slog.Logger
	outer *ebpf.Map
	inner *ebpf.MapSpec
	fill  *ebpf.Program

	mu   sync.Mutex
	live *ebpf.Map // the filter in CT_FILTER_LIVE, nil while there is none
	// stop ends the maintenance loop, done says it has ended; nil
	// before the first install.
	stop, done chan struct{}
}

func newCTFilter(log *slog.Logger, coll *ebpf.Collection, spec *ebpf.CollectionSpec) *ctFilter {
	return &ctFilter{
		log:   log,
		outer: coll.Maps[bpf.LbMapCtFilter],
		inner: spec.Maps[bpf.LbMapCtFilter].InnerMap.Copy(),
		fill:  coll.Programs[bpf.LbProgL4lbCtFilterFill],
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
	go f.maintain(f.stop, f.done)
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
	m, err := ebpf.NewMap(f.inner)
	if err != nil {
		return fmt.Errorf("datapath: create a connection-table filter (%d words): %w", f.inner.MaxEntries, err)
	}
	// The kernel returns from a write to a map-in-map only once no program
	// runs that read the slot before it: every insert from here on sets
	// its bit in m as well.
	if err := f.outer.Put(ctFilterNext, m); err != nil {
		m.Close()
		return fmt.Errorf("datapath: install the connection-table filter being built: %w", err)
	}
	if err := f.fillNext(); err != nil {
		m.Close()
		return errors.Join(err, f.outer.Delete(ctFilterNext))
	}
	if err := f.outer.Put(ctFilterLive, m); err != nil {
		m.Close()
		return errors.Join(fmt.Errorf("datapath: install the connection-table filter: %w", err), f.outer.Delete(ctFilterNext))
	}
	if err := f.outer.Delete(ctFilterNext); err != nil {
		// Harmless: inserts keep setting the same bits twice.
		f.log.Warn("could not clear the connection-table filter's build slot", "error", err)
	}
	if f.live != nil {
		f.live.Close()
	}
	f.live = m
	return nil
}

// fillNext sets the bit of every entry of the table in the filter in
// CT_FILTER_NEXT, with the datapath's own hash and atomic operation
// (l4lb_ct_filter_fill in bpf/lb.c).
func (f *ctFilter) fillNext() error {
	// XDP's test run wants a frame of at least an Ethernet header; the
	// program does not read it.
	ret, err := f.fill.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		return fmt.Errorf("datapath: fill the connection-table filter: %w", err)
	}
	if ret != 2 { // XDP_PASS
		return fmt.Errorf("datapath: fill the connection-table filter: program returned %d", ret)
	}
	return nil
}

// fillRatio is the fraction of the live filter's bits that are set, 0
// when there is no filter.
func (f *ctFilter) fillRatio() (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live == nil {
		return 0, nil
	}
	var (
		set  int
		word uint64
		it   = f.live.Iterate()
		key  uint32
	)
	for it.Next(&key, &word) {
		set += bits.OnesCount64(word)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("datapath: read the connection-table filter: %w", err)
	}
	return float64(set) / float64(uint64(f.inner.MaxEntries)*64), nil
}

// maintain rebuilds the filter whenever more than ctFilterMaxFill of its
// bits are set.
func (f *ctFilter) maintain(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(ctFilterCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		fill, err := f.fillRatio()
		if err != nil {
			f.log.Warn("could not check the connection-table filter", "error", err)
			continue
		}
		if fill <= ctFilterMaxFill {
			continue
		}
		if err := f.rebuild(); err != nil {
			f.log.Warn("could not rebuild the connection-table filter; SYNs take the table lookup more often", "fill", fill, "error", err)
			continue
		}
		after, _ := f.fillRatio()
		f.log.Debug("rebuilt the connection-table filter", "fill_before", fill, "fill_after", after)
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
		f.live.Close()
		f.live = nil
	}
	f.mu.Unlock()
}
