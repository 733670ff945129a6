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

// Companion is the backend-side program of DSR (`l4lbd backend`): attached
// at tc ingress of a backend's interface, it removes the IPIP / IPv6-in-IPv6
// header of packets whose inner destination is one of its VIPs, so the
// backend needs no tunnel module or tunnel device.
type Companion struct {
	log   *slog.Logger
	coll  *ebpf.Collection
	prog  *ebpf.Program
	vips  *ebpf.Map
	stats *ebpf.Map
	link  link.Link
	names []string
	cpus  int
}

// LoadCompanion loads the companion program. With a pinPath its maps are
// pinned there (default /sys/fs/bpf/l4lb-backend); empty pins nothing.
func LoadCompanion(pinPath string, log *slog.Logger) (*Companion, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	spec, err := bpf.LoadBackend()
	if err != nil {
		return nil, fmt.Errorf("companion: read embedded object: %w", err)
	}
	names, err := enumNames(spec.Types, "l4lb_backend_reason", "L4LB_B_")
	if err != nil {
		return nil, err
	}
	coll, err := newCollection("companion", spec, pinPath, "")
	if err != nil {
		return nil, err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		coll.Close()
		return nil, err
	}
	return &Companion{
		log:   log,
		coll:  coll,
		prog:  coll.Programs[bpf.BackendProgL4lbBackendIngress],
		vips:  coll.Maps[bpf.BackendMapVips],
		stats: coll.Maps[bpf.BackendMapBackendReasons],
		names: names,
		cpus:  cpus,
	}, nil
}

// Program is the tc program, for packet tests.
func (c *Companion) Program() *ebpf.Program { return c.prog }

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

// Attach attaches the program at tc ingress (tcx) of iface.
func (c *Companion) Attach(iface string) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("companion: %w", err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Program: c.prog, Attach: ebpf.AttachTCXIngress, Interface: ifc.Index})
	if err != nil {
		return fmt.Errorf("companion: attach to tc ingress of %s: %w", iface, err)
	}
	c.link = l
	c.log.Info("backend companion attached", "interface", iface)
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

// Close detaches the program and releases everything; the pinned maps are
// removed too, since the companion keeps no state worth adopting.
func (c *Companion) Close(pinPath string) error {
	var errs []error
	if c.link != nil {
		errs = append(errs, c.link.Close())
	}
	c.coll.Close()
	if pinPath != "" {
		for _, name := range []string{bpf.BackendMapVips, bpf.BackendMapBackendReasons} {
			if err := os.Remove(filepath.Join(pinPath, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		_ = os.Remove(pinPath)
	}
	return errors.Join(errs...)
}
