// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
)

// A pinned map's layout never changes in place: a map whose value layout
// or type changed is pinned under a new name, and the entries of the map
// an earlier l4lbd pinned under the old name are moved into it, so an
// upgrade keeps every established flow and SNAT binding.
//
// The move happens twice: when the new datapath loads (before any of its
// programs runs), and again in Retire, once every interface runs the new
// programs, for what the old program added in between. An entry already in
// the new map is never overwritten: the new program's is the newer.
type layoutVersion struct {
	// pin is the name the map is pinned under now; olds the names it had
	// before, any of which an earlier l4lbd may have left.
	pin  string
	olds []string
	// convert turns an old value into the new layout (nil: the same
	// bytes); for a layout that only gained fields or changed map flags.
	convert func(old []byte) []byte
	// counters marks a per-CPU array of counters: its values are copied
	// once, at load (what the old program counts until Retire is lost:
	// milliseconds of counting), key by key.
	counters bool
}

// renamed lists the maps of the LB object pinned under a new name, by the
// name of their C variable.
var renamed = map[string]layoutVersion{
	// Shared LRUs now, not per-CPU lists; values unchanged (ct_value's
	// svc_word was a pad that version 1 kept 0, which never matches a
	// word: such entries take the full path once).
	bpf.LbMapConntrack: {pin: "conntrack_v2", olds: []string{"conntrack"}},
	bpf.LbMapSnatFwd:   {pin: "snat_fwd_v2", olds: []string{"snat_fwd"}},
	bpf.LbMapSnatRev:   {pin: "snat_rev_v2", olds: []string{"snat_rev"}},
	// The enum of reasons grew, and the map is sized by it: v2 with the
	// validation of what is forwarded, v3 with the refusals of frames not
	// for the box, martian and local sources, and AH.
	bpf.LbMapReasons: {pin: "reasons_v3", olds: []string{"reasons_v2", "reasons"}, counters: true},
}

// pinRenamed sets the pin names of renamed maps on spec.
func pinRenamed(spec *ebpf.CollectionSpec) {
	for name, lv := range renamed {
		spec.Maps[name].Name = lv.pin
	}
}

// legacyMap is a map an earlier l4lbd pinned under an old name.
type legacyMap struct {
	name string // C variable name of its successor
	old  string // the name it is pinned under
	path string
	m    *ebpf.Map
	lv   layoutVersion
}

// migrate moves the entries of every old-named pinned map into its
// successor and keeps the old maps open for Retire.
func (d *LB) migrate() error {
	if d.cfg.PinPath == "" {
		return nil
	}
	for name, lv := range renamed {
		for _, old := range lv.olds {
			path := filepath.Join(d.cfg.PinPath, old)
			if _, err := os.Stat(path); err != nil {
				continue
			}
			m, err := ebpf.LoadPinnedMap(path, nil)
			if err != nil {
				return fmt.Errorf("datapath: open the map an earlier l4lbd pinned at %s: %w", path, err)
			}
			l := legacyMap{name: name, old: old, path: path, m: m, lv: lv}
			n, err := d.moveEntries(l)
			if err != nil {
				m.Close()
				return err
			}
			d.log.Info("moving a map to its new layout", "map", old, "to", lv.pin, "entries", n)
			d.legacy = append(d.legacy, l)
		}
	}
	return nil
}

// moveEntries copies l's entries into its successor, never replacing one.
func (d *LB) moveEntries(l legacyMap) (int, error) {
	dst := d.coll.Maps[l.name]
	if l.lv.counters {
		return copyCounters(l.m, dst)
	}
	key := make([]byte, l.m.KeySize())
	val := make([]byte, l.m.ValueSize())
	n := 0
	it := l.m.Iterate()
	for it.Next(key, val) {
		v := val
		if l.lv.convert != nil {
			v = l.lv.convert(val)
		}
		if err := dst.Update(key, v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return n, fmt.Errorf("datapath: move an entry of %s into %s: %w", l.old, l.lv.pin, err)
		}
		n++
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("datapath: read %s: %w", l.path, err)
	}
	return n, nil
}

// copyCounters copies the per-CPU reason counters of src into dst, key by
// key, for the keys both have.
func copyCounters(src, dst *ebpf.Map) (int, error) {
	n := min(src.MaxEntries(), dst.MaxEntries())
	for k := range n {
		var per []bpf.LbReasonStats
		if err := src.Lookup(&k, &per); err != nil {
			return int(k), fmt.Errorf("datapath: read counter %d of the old map: %w", k, err)
		}
		if err := dst.Put(&k, per); err != nil {
			return int(k), fmt.Errorf("datapath: copy counter %d: %w", k, err)
		}
	}
	return int(n), nil
}

// Retire finishes moving maps to new layouts once every interface runs
// this datapath's programs (the daemon calls it after attaching): what the
// previous programs added meanwhile is moved too, then the old maps are
// unpinned. It also settles the SNAT overflow mark (snatovf.go) and
// installs the connection table's filter over a pinned table
// (ctfilter.go), which only this version's programs keep exact.
func (d *LB) Retire() error {
	var errs []error
	if err := d.settleOverflowMark(); err != nil {
		errs = append(errs, err)
	}
	for _, l := range d.legacy {
		var n int
		if !l.lv.counters {
			var err error
			if n, err = d.moveEntries(l); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := l.m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("datapath: unpin %s: %w", l.path, err))
			continue
		}
		l.m.Close()
		d.log.Info("moved a map to its new layout", "map", l.old, "to", l.lv.pin, "late_entries", n)
	}
	d.legacy = nil
	// Only this version's programs write the connection table now, and
	// they set the filter's bits.
	if err := d.ctf.install(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
