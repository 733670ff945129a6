// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
)

// DefaultHandshakeHold is how long after a service's Maglev table is
// replaced its TCP packets without a connection entry still follow the
// backend their SYN went to (Config.HandshakeHold). It outlasts a client's
// SYN retries (Linux gives up after about 127 s) plus a backend's SYN-ACK
// retries (about 63 s): a handshake that takes longer has failed anyway.
const DefaultHandshakeHold = 4 * time.Minute

// tableSwaps keeps maglev_swapped: for each service id, when its Maglev
// table last replaced another. The datapath follows a SYN's choice in the
// handshakes map only within Config.HandshakeHold of that time
// (handshakes_matter in bpf/include/conntrack.h); otherwise the table
// picks what the SYN picked, and the bucket is not read. The time is
// written before the swap, so no packet can see the new table with the old
// time. A service's first table replaces nothing and writes no time: no
// handshake can have gone by another table of it.
type tableSwaps struct {
	m *ebpf.Map

	mu sync.Mutex
	// held says whether a slot of the outer Maglev map holds a table, for
	// the slots this datapath has written.
	held map[uint32]bool
	// unknown is true when the slots this datapath has not written may
	// hold tables an earlier l4lbd swapped (pinned maps): they are taken
	// as holding one.
	unknown bool
}

// tablesPinnedBefore reports whether the outer Maglev map is pinned under
// pinPath before Load creates or adopts it: a restart, whose tables'
// history this datapath does not know.
func tablesPinnedBefore(pinPath string) bool {
	return pinnedBefore(pinPath, bpf.LbMapMaglev)
}

// pinnedBefore reports whether a map called name is pinned under pinPath
// ("" pins nothing): asked before Load creates or adopts the maps, it tells
// a restart over an earlier l4lbd's maps from a first start.
func pinnedBefore(pinPath, name string) bool {
	if pinPath == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(pinPath, name))
	return err == nil
}

// newTableSwaps runs in Load, before this datapath's programs run. After a
// restart, every service id is stamped with the time of the load: a table
// the earlier l4lbd swapped just before it stopped may have handshakes in
// flight.
func newTableSwaps(m *ebpf.Map, restart bool) (*tableSwaps, error) {
	s := &tableSwaps{m: m, held: map[uint32]bool{}, unknown: restart}
	if !restart {
		return s, nil
	}
	now, err := kernelNow()
	if err != nil {
		return nil, err
	}
	n := m.MaxEntries()
	keys := make([]uint32, n)
	vals := make([]uint64, n)
	for i := range keys {
		keys[i], vals[i] = uint32(i), now
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		return nil, fmt.Errorf("datapath: stamp the Maglev tables adopted from pins as just replaced: %w", err)
	}
	return s, nil
}

// before stamps, with the current time, the slots among keys that hold a
// table: they are about to be replaced (or deleted). It returns an error
// when the time could not be written, and then no table may be swapped.
func (s *tableSwaps) before(keys []uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var stamp []uint32
	for _, k := range keys {
		held, ok := s.held[k]
		if held || (!ok && s.unknown) {
			stamp = append(stamp, k)
		}
	}
	if len(stamp) == 0 {
		return nil
	}
	now, err := kernelNow()
	if err != nil {
		return err
	}
	vals := make([]uint64, len(stamp))
	for i := range vals {
		vals[i] = now
	}
	if _, err := s.m.BatchUpdate(stamp, vals, nil); err != nil {
		return fmt.Errorf("record the time of the swap in maglev_swapped (service ids %v): %w", stamp, err)
	}
	return nil
}

// after records what the slots keys[k] hold once their swap succeeded
// (errs[k] nil): a table when tables is true, none after a delete.
func (s *tableSwaps) after(keys []uint32, errs []error, tables bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, key := range keys {
		if errs == nil || errs[k] == nil {
			s.held[key] = tables
		}
	}
}
