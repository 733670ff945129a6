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

// OpenPinned opens the datapath pinned under pinPath read-only, without
// loading a program or creating anything: what the kernel forwards while
// no l4lbd runs (`l4lbctl --offline`). The result answers State, the
// counters (ServiceCounters, BackendCounters, Reasons) and the connection
// table (ConntrackEntriesWithin, ConntrackCapacity); Close releases it.
// Everything else of an LB is for a loaded datapath and must not be
// called. A missing pin is an error naming it: nothing is pinned there, or
// by another version of l4lbd.
func OpenPinned(pinPath string) (*LB, error) {
	spec, err := lbSpec(nil)
	if err != nil {
		return nil, err
	}
	pinRenamed(spec)
	names, err := enumNames(spec.Types, "l4lb_reason", "L4LB_R_")
	if err != nil {
		return nil, err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("datapath: count CPUs: %w", err)
	}
	d := &LB{cfg: Config{PinPath: pinPath}, reasonNames: names, cpus: cpus}
	var opened []*ebpf.Map
	for name, into := range map[string]**ebpf.Map{
		bpf.LbMapServices:     &d.services,
		bpf.LbMapBackends:     &d.backends,
		bpf.LbMapMaglev:       &d.maglev,
		bpf.LbMapConntrack:    &d.conntrack,
		bpf.LbMapSrcRanges:    &d.srcRanges,
		bpf.LbMapSvcStats:     &d.svcStats,
		bpf.LbMapBackendStats: &d.backendStats,
		bpf.LbMapReasons:      &d.reasons,
	} {
		path := filepath.Join(pinPath, spec.Maps[name].Name)
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			for _, m := range opened {
				m.Close()
			}
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("no pinned datapath under %s (%s is missing): l4lbd never ran with this daemon.bpffs, or --cleanup removed it", pinPath, path)
			}
			return nil, fmt.Errorf("open pinned map %s: %w", path, err)
		}
		*into = m
		opened = append(opened, m)
	}
	// The SNAT reverse tables give SNAT flows their state; a datapath
	// pinned before they existed, or without SNAT in use, lists its
	// flows without it.
	for name, into := range map[string]**ebpf.Map{bpf.LbMapSnatRev: &d.snatRev, bpf.LbMapSnatRevOvf: &d.snatRevOvf} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, spec.Maps[name].Name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err == nil {
			*into = m
			opened = append(opened, m)
		}
	}
	d.offline = opened
	return d, nil
}
