// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
)

// The SNAT overflow mark (snat_ovf_seen, bpf/include/snatovf.h) lets a new
// SNAT flow skip the overflow tables while they can hold no live binding.
// Every program of this version keeps it whenever it makes or uses an
// overflow binding, so across restarts between such programs it needs
// nothing. A program that does not keep it (an l4lbd from before the mark,
// or one an operator downgraded to) may have made bindings the mark does
// not cover, and may still make them until the new programs replace it.
// For that window the mark is set to ovfMarkUnknown (look always); Retire,
// once no such program runs, brings it down to now, which covers every
// binding made until then.

const (
	// ovfMarkUnknown is the mark's "look always" value: ahead of any
	// clock.
	ovfMarkUnknown = ^uint64(0)
	// ovfMarkLate is how far the datapath lets the mark fall behind a
	// binding's last use (SNAT_OVF_MARK_NS), plus a tick of clock skew.
	ovfMarkLate = 2 * time.Second
)

// ovfPinsBefore reports, before Load creates the collection, whether the
// mark was pinned and whether overflow tables were (these maps are pinned
// under their own names).
func ovfPinsBefore(pinPath string) (mark, tables bool) {
	return pinnedBefore(pinPath, bpf.LbMapSnatOvfSeen),
		pinnedBefore(pinPath, bpf.LbMapSnatFwdOvf) || pinnedBefore(pinPath, bpf.LbMapSnatRevOvf)
}

// guardOverflowMark runs in Load, before this datapath's programs run:
// the mark becomes ovfMarkUnknown when an earlier program may have made
// overflow bindings without keeping it (see above).
func (d *LB) guardOverflowMark(markPinned, tablesPinned bool) error {
	if !tablesPinned {
		return nil
	}
	mark, err := d.overflowMark()
	if err != nil {
		return err
	}
	if markPinned && mark == ovfMarkUnknown {
		return nil
	}
	unmarked := !markPinned
	if !unmarked {
		if unmarked, err = d.unmarkedOverflow(mark); err != nil {
			return err
		}
	}
	if !unmarked {
		return nil
	}
	d.log.Info("an earlier program may have made SNAT overflow bindings without marking them: new SNAT flows look in the overflow tables until the longest SNAT timeout after this datapath runs everywhere")
	return d.setOverflowMark(ovfMarkUnknown)
}

// settleOverflowMark runs in Retire, once only this datapath's programs
// run: an unknown mark, or one a binding outlives, becomes now.
func (d *LB) settleOverflowMark() error {
	mark, err := d.overflowMark()
	if err != nil {
		return err
	}
	settle := mark == ovfMarkUnknown
	if !settle {
		if settle, err = d.unmarkedOverflow(mark); err != nil {
			return err
		}
	}
	if !settle {
		return nil
	}
	now, err := kernelNow()
	if err != nil {
		return fmt.Errorf("datapath: settle the SNAT overflow mark: %w", err)
	}
	return d.setOverflowMark(now)
}

// unmarkedOverflow reports whether an overflow binding that may still be
// alive was used later than mark allows: one a program that does not keep
// the mark made or used.
func (d *LB) unmarkedOverflow(mark uint64) (bool, error) {
	now, err := kernelNow()
	if err != nil {
		return false, fmt.Errorf("datapath: check the SNAT overflow mark: %w", err)
	}
	t := d.cfg.SNATTimeouts
	longest := max(t.TCP, t.TCPClosing, t.UDP)
	unmarked := func(seen uint64) bool {
		return age(now, seen) <= longest+ovfMarkLate && seen > mark && seen-mark > uint64(ovfMarkLate)
	}
	var hit bool
	err = walk(d.coll.Maps[bpf.LbMapSnatFwdOvf], func(_ *bpf.LbFlowKey, v *bpf.LbSnatFwdValue) bool {
		hit = unmarked(v.LastSeen)
		return !hit
	})
	if err == nil && !hit {
		err = walk(d.coll.Maps[bpf.LbMapSnatRevOvf], func(_ *bpf.LbSnatRevKey, v *bpf.LbSnatRevValue) bool {
			hit = unmarked(v.LastSeen)
			return !hit
		})
	}
	if err != nil {
		return false, fmt.Errorf("datapath: check the SNAT overflow mark: %w", err)
	}
	return hit, nil
}

// overflowMark reads the mark.
func (d *LB) overflowMark() (uint64, error) {
	var zero uint32
	var v uint64
	if err := d.coll.Maps[bpf.LbMapSnatOvfSeen].Lookup(&zero, &v); err != nil {
		return 0, fmt.Errorf("datapath: read the SNAT overflow mark: %w", err)
	}
	return v, nil
}

// setOverflowMark writes the mark.
func (d *LB) setOverflowMark(v uint64) error {
	var zero uint32
	if err := d.coll.Maps[bpf.LbMapSnatOvfSeen].Update(&zero, &v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("datapath: write the SNAT overflow mark: %w", err)
	}
	return nil
}
