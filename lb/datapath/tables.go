// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
)

// tableDir is the sub directory of the pin path where every service's
// current Maglev table is pinned under its service id. The outer map alone
// would do for the datapath, but a restarted l4lbd reads the tables back to
// adopt them, and the kernel opens an inner map by id only for
// CAP_SYS_ADMIN, which the systemd unit does not grant; a pinned map opens
// by path with the capabilities l4lbd runs with.
const tableDir = "maglev_tables"

// pinTable pins inner as svc's table, replacing the pin of the table it
// took over from: a pin keeps its map alive, so the old one must go. A
// table that could not be pinned still forwards; a restart without
// CAP_SYS_ADMIN writes it again, so a failure is logged, not returned.
func (d *LB) pinTable(svc uint32, inner *ebpf.Map) {
	if d.cfg.PinPath == "" {
		return
	}
	dir := filepath.Join(d.cfg.PinPath, tableDir)
	final := filepath.Join(dir, strconv.FormatUint(uint64(svc), 10))
	// bpffs refuses names with a dot.
	tmp := final + "_new"
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		_ = os.Remove(tmp)
		if err = inner.Pin(tmp); err != nil {
			err = fmt.Errorf("pin %s: %w", tmp, err)
		}
	}
	if err == nil {
		// The rename replaces the old pin in one step.
		if err = os.Rename(tmp, final); err != nil {
			_ = os.Remove(tmp)
		}
	}
	if err != nil {
		d.log.Warn("could not pin a Maglev table; it forwards, but a restart without CAP_SYS_ADMIN rewrites it", "service_id", svc, "path", final, "error", err)
	}
}

// unpinTable drops the pin of svc's table once its slot no longer holds it.
func (d *LB) unpinTable(svc uint32) error {
	if d.cfg.PinPath == "" {
		return nil
	}
	err := os.Remove(filepath.Join(d.cfg.PinPath, tableDir, strconv.FormatUint(uint64(svc), 10)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin Maglev table of service id %d: %w", svc, err)
	}
	return nil
}

// openTable opens the inner map the outer map's slot svc points at (id):
// through its pin when the pin is that very map, else by id. ok is false
// when it cannot be opened at all, which only happens without
// CAP_SYS_ADMIN for a slot whose pin is missing or stale (a table written
// by a version that did not pin, or a crash between swap and pin, or the
// empty table DeleteTables leaves): the caller then reports no table and
// the reconciler writes it again.
func (d *LB) openTable(svc uint32, id ebpf.MapID) (m *ebpf.Map, ok bool, err error) {
	if d.cfg.PinPath != "" {
		p := filepath.Join(d.cfg.PinPath, tableDir, strconv.FormatUint(uint64(svc), 10))
		pinned, err := ebpf.LoadPinnedMap(p, nil)
		if err == nil {
			info, ierr := pinned.Info()
			if ierr == nil {
				if got, hasID := info.ID(); hasID && got == id {
					return pinned, true, nil
				}
			}
			pinned.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, false, fmt.Errorf("open pinned Maglev table %s: %w", p, err)
		}
	}
	m, err = ebpf.NewMapFromID(id)
	if errors.Is(err, os.ErrPermission) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return m, true, nil
}

// pinTables pins the tables the outer map took (errs[k] nil) for keys[k].
func (d *LB) pinTables(keys []uint32, inners []*ebpf.Map, errs []error) {
	for k := range keys {
		if errs[k] == nil {
			d.pinTable(keys[k], inners[k])
		}
	}
}
