// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/l4lb/l4lb/bpf"
)

// Companion is the backend side of DSR (`l4lbd backend`). At tc ingress of
// a backend's interface it removes the IPIP / IPv6-in-IPv6 or Geneve headers
// of packets whose inner destination is one of its VIPs, so the backend needs
// no tunnel module or tunnel device; for the opt dispatch it records which
// frontend a flow's option names, and at tc egress gives that flow's replies
// the VIP and frontend port as their source.
type Companion struct {
	log      *slog.Logger
	coll     *ebpf.Collection
	prog     *ebpf.Program
	progOut  *ebpf.Program
	vips     *ebpf.Map
	stats    *ebpf.Map
	links    []link.Link
	names    []string
	cpus     int
	maxFlows uint32
	pinPath  string
}

// DefaultCompanionMaxFlows is the default capacity of the companion's opt
// flow table: one entry per client flow that arrived by the opt dispatch.
const DefaultCompanionMaxFlows = 262144

// CompanionConfig is what the companion is loaded with.
type CompanionConfig struct {
	// PinPath is the bpffs directory for its maps (`l4lbd backend
	// --bpffs`, default /sys/fs/bpf/l4lb-backend); empty pins nothing.
	PinPath string
	// MaxFlows is the capacity of the opt flow table (LRU); 0 means
	// DefaultCompanionMaxFlows. A TCP connection whose entry is evicted
	// loses its reply path, so size it above the connections the backend
	// holds at once over the opt dispatch.
	MaxFlows uint32
	// Log receives the companion's messages; nil discards them.
	Log *slog.Logger
}

// LoadCompanion loads the companion's programs and maps.
func LoadCompanion(cfg CompanionConfig) (*Companion, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxFlows == 0 {
		cfg.MaxFlows = DefaultCompanionMaxFlows
	}
	spec, err := bpf.LoadBackend()
	if err != nil {
		return nil, fmt.Errorf("companion: read embedded object: %w", err)
	}
	names, err := enumNames(spec.Types, "l4lb_backend_reason", "L4LB_B_")
	if err != nil {
		return nil, err
	}
	spec.Maps[bpf.BackendMapOptFlows].MaxEntries = cfg.MaxFlows
	coll, err := newCollection("companion", spec, cfg.PinPath, "")
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// A companion keeps no state worth adopting: say what to remove.
		return nil, fmt.Errorf("companion: maps pinned under %s come from another --max-flows or a companion that did not stop cleanly; "+
			"remove that directory (or pick another --bpffs) and start again: %w", cfg.PinPath, err)
	}
	if err != nil {
		return nil, err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		coll.Close()
		return nil, err
	}
	return &Companion{
		log:      log,
		coll:     coll,
		prog:     coll.Programs[bpf.BackendProgL4lbBackendIngress],
		progOut:  coll.Programs[bpf.BackendProgL4lbBackendEgress],
		vips:     coll.Maps[bpf.BackendMapVips],
		stats:    coll.Maps[bpf.BackendMapBackendReasons],
		names:    names,
		cpus:     cpus,
		maxFlows: cfg.MaxFlows,
		pinPath:  cfg.PinPath,
	}, nil
}

// Program is the tc ingress program, for packet tests.
func (c *Companion) Program() *ebpf.Program { return c.prog }

// ProgramEgress is the tc egress program (opt replies), for packet tests.
func (c *Companion) ProgramEgress() *ebpf.Program { return c.progOut }

// SetVIPs makes the VIP set exactly vips.
func (c *Companion) SetVIPs(vips []netip.Addr) error {
	want := map[[16]byte]bool{}
	for _, v := range vips {
		// As16 of an IPv4 address is its IPv4-mapped form, the key the
		// program looks up.
		want[v.Unmap().As16()] = true
	}
	var (
		k   [16]byte
		val uint8
		del [][16]byte
	)
	it := c.vips.Iterate()
	for it.Next(&k, &val) {
		if !want[k] {
			del = append(del, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("companion: list VIPs: %w", err)
	}
	for _, k := range del {
		if err := c.vips.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("companion: remove VIP: %w", err)
		}
	}
	for k := range want {
		one := uint8(1)
		if err := c.vips.Update(&k, &one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("companion: add VIP %s: %w", netip.AddrFrom16(k).Unmap(), err)
		}
	}
	return nil
}

// Attach attaches the programs at tc ingress and egress (tcx) of iface.
// Replies of opt flows are rewritten only when they leave through iface.
func (c *Companion) Attach(iface string) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("companion: %w", err)
	}
	for _, at := range []struct {
		prog *ebpf.Program
		typ  ebpf.AttachType
		name string
	}{
		{c.prog, ebpf.AttachTCXIngress, "ingress"},
		{c.progOut, ebpf.AttachTCXEgress, "egress"},
	} {
		l, err := link.AttachTCX(link.TCXOptions{Program: at.prog, Attach: at.typ, Interface: ifc.Index})
		if err != nil {
			return fmt.Errorf("companion: attach to tc %s of %s: %w", at.name, iface, err)
		}
		c.links = append(c.links, l)
	}
	c.log.Info("backend companion attached", "interface", iface, "max_flows", c.maxFlows)
	return nil
}

// Counters returns the companion's counters by reason name.
func (c *Companion) Counters() (map[string]ReasonCounters, error) {
	out := map[string]ReasonCounters{}
	for i, name := range c.names {
		key := uint32(i)
		var per []bpf.BackendReasonStats
		if err := c.stats.Lookup(&key, &per); err != nil {
			return nil, fmt.Errorf("companion: read counter %s: %w", name, err)
		}
		var rc ReasonCounters
		for _, s := range per {
			rc.Packets += s.Packets
			rc.Bytes += s.Bytes
		}
		out[name] = rc
	}
	return out, nil
}

// Close detaches the programs and releases everything; the pinned maps are
// removed too. The VIPs come back from the command line; the opt flow table
// would be stale by the time a new companion runs, since replies sent while
// none is attached already left with the backend's address.
func (c *Companion) Close() error {
	pinPath := c.pinPath
	var errs []error
	for _, l := range c.links {
		errs = append(errs, l.Close())
	}
	c.links = nil
	c.coll.Close()
	if pinPath != "" {
		for _, name := range []string{bpf.BackendMapVips, bpf.BackendMapBackendReasons, bpf.BackendMapOptFlows} {
			if err := os.Remove(filepath.Join(pinPath, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		_ = os.Remove(pinPath)
	}
	return errors.Join(errs...)
}
