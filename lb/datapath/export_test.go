// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"time"

	"github.com/cilium/ebpf"
)

// Exported for the packet tests in package datapath_test only: they check
// the loaded maps' layouts against the generated Go types.

// MaglevChunk is maglevChunk.
const MaglevChunk = maglevChunk

// Maps returns the loaded LB maps by name.
func (d *LB) Maps() map[string]*ebpf.Map { return d.coll.Maps }

// Maps returns the loaded companion maps by name.
func (c *Companion) Maps() map[string]*ebpf.Map { return c.coll.Maps }

// RebuildConntrackFilter rebuilds the connection table's presence filter
// from the table now, as the maintenance loop does when it is too full.
func (d *LB) RebuildConntrackFilter() error { return d.ctf.rebuild() }

// ConntrackFilterFill is the fraction of the live filter's bits set.
func (d *LB) ConntrackFilterFill() float64 { return d.ctf.fillRatio() }

// SetConntrackFilterCheck sets how often the filter's fill is checked from
// the next install on.
func (d *LB) SetConntrackFilterCheck(every time.Duration) {
	d.ctf.mu.Lock()
	defer d.ctf.mu.Unlock()
	d.ctf.checkEvery = every
}

// MarkConntrackFilter sets the bits of hashes in the live filter, as
// entries that have since left the table would have.
func (d *LB) MarkConntrackFilter(hashes []uint64) {
	d.ctf.mu.Lock()
	defer d.ctf.mu.Unlock()
	for _, h := range hashes {
		d.ctf.live.set(h)
	}
}
