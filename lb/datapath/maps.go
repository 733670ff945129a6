// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// maglevChunk is MAGLEV_CHUNK of bpf/include/types.h; a test checks it
// against the inner map's value size.
const maglevChunk = 16

var _ reconciler.Datapath = (*LB)(nil)

// htons converts a port to the network-order value a __be16 field holds.
func htons(p uint16) uint16 { return bits.ReverseBytes16(p) }

// ntohs is the inverse of htons.
func ntohs(p uint16) uint16 { return bits.ReverseBytes16(p) }

func seedKeys(s maglev.Seed) (k0, k1 uint64) {
	return binary.LittleEndian.Uint64(s[0:8]), binary.LittleEndian.Uint64(s[8:16])
}

// encapSource4 returns the base address (as the __be32 bytes) and the host
// mask of an IPv4 encapsulation prefix.
func encapSource4(p netip.Prefix) (base, mask uint32, err error) {
	if !p.Addr().Is4() {
		return 0, 0, fmt.Errorf("datapath: IPv4 encapsulation source %s is not an IPv4 prefix", p)
	}
	p = p.Masked()
	a := p.Addr().As4()
	host := 32 - p.Bits()
	if host > 0 {
		mask = uint32(1)<<host - 1
	}
	return binary.NativeEndian.Uint32(a[:]), mask, nil
}

// encapSource6 returns the base address and the host mask (over the low 32
// bits) of an IPv6 encapsulation prefix.
func encapSource6(p netip.Prefix) (base [16]byte, mask uint32, err error) {
	if !p.Addr().Is6() || p.Addr().Is4In6() {
		return base, 0, fmt.Errorf("datapath: IPv6 encapsulation source %s is not an IPv6 prefix", p)
	}
	p = p.Masked()
	host := min(128-p.Bits(), 32)
	if host == 32 {
		mask = ^uint32(0)
	} else if host > 0 {
		mask = uint32(1)<<host - 1
	}
	return p.Addr().As16(), mask, nil
}

func svcKey(fe lb.Frontend) bpf.LbSvcKey {
	return bpf.LbSvcKey{Addr: fe.Addr.As16(), Port: htons(fe.Port), Proto: uint8(fe.Proto)}
}

// Supported reports whether this datapath can forward svc as configured;
// the daemon checks it before a service reaches the reconciler so an
// unsupported combination is refused with a clear error up front.
func Supported(svc lb.Service) error {
	mode := svc.ModeFor(svc.Frontend.Proto)
	switch mode {
	case lb.ModeDSR:
		if svc.Dispatch != lb.DispatchIPIP {
			return fmt.Errorf("DSR dispatch %q is not supported by this datapath yet (use ipip)", svc.Dispatch)
		}
	default:
		return fmt.Errorf("mode %q for %s is not supported by this datapath yet (use dsr with ipip)", mode, svc.Frontend.Proto)
	}
	if svc.Affinity.ClientIP {
		return errors.New("session affinity is not supported by this datapath yet")
	}
	if len(svc.SourceRanges) > 0 {
		return errors.New("source_ranges are not supported by this datapath yet")
	}
	return nil
}

func svcValue(id reconciler.ServiceID, svc lb.Service) (bpf.LbSvcValue, error) {
	if err := Supported(svc); err != nil {
		return bpf.LbSvcValue{}, fmt.Errorf("service %s: %w", svc.Frontend, err)
	}
	v := bpf.LbSvcValue{Id: uint32(id), TableSize: svc.TableSize}
	switch svc.ModeFor(svc.Frontend.Proto) {
	case lb.ModeDSR:
		v.Mode = bpf.LbL4lbModeL4LB_MODE_DSR
	case lb.ModeSNAT:
		v.Mode = bpf.LbL4lbModeL4LB_MODE_SNAT
	}
	switch svc.Dispatch {
	case lb.DispatchIPIP:
		v.Dispatch = bpf.LbL4lbDispatchL4LB_DISPATCH_IPIP
	case lb.DispatchGeneve:
		v.Dispatch = bpf.LbL4lbDispatchL4LB_DISPATCH_GENEVE
	case lb.DispatchOpt:
		v.Dispatch = bpf.LbL4lbDispatchL4LB_DISPATCH_OPT
	}
	if svc.Algorithm == lb.Random {
		v.Flags |= bpf.LbL4lbSvcFlagsL4LB_SVC_RANDOM
	}
	return v, nil
}

// SetService writes the service entry for svc.Frontend.
func (d *LB) SetService(id reconciler.ServiceID, svc lb.Service) error {
	v, err := svcValue(id, svc)
	if err != nil {
		return err
	}
	k := svcKey(svc.Frontend)
	if err := d.services.Update(&k, &v, ebpf.UpdateAny); err != nil {
		if isFull(err) {
			return fmt.Errorf("service map full (max_services = %d): raise datapath.max_services: %w", d.cfg.MaxServices, err)
		}
		return fmt.Errorf("write service entry %s: %w", svc.Frontend, err)
	}
	return nil
}

// DeleteService removes the entry of fe and zeroes the counters of id, so a
// later service that gets the id starts from zero.
func (d *LB) DeleteService(id reconciler.ServiceID, fe lb.Frontend) error {
	k := svcKey(fe)
	if err := d.services.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete service entry %s: %w", fe, err)
	}
	return d.zeroStats(d.svcStats, uint32(id))
}

// SetBackend writes the backend entry at id.
func (d *LB) SetBackend(id reconciler.BackendID, b reconciler.Backend) error {
	if uint32(id) == 0 || uint32(id) > d.cfg.MaxBackends {
		return fmt.Errorf("backend id %d out of range 1..%d", id, d.cfg.MaxBackends)
	}
	v := bpf.LbBackend{
		Addr:  b.Addr.Addr().As16(),
		Port:  htons(b.Addr.Port()),
		SvcId: uint32(b.Service),
		Flags: bpf.LbL4lbBackendFlagsL4LB_BACKEND_ACTIVE,
	}
	v.Family = 6
	if b.Addr.Addr().Is4() {
		v.Family = 4
	}
	if b.State == lb.Draining {
		v.Flags |= bpf.LbL4lbBackendFlagsL4LB_BACKEND_DRAINING
	}
	if d.neigh != nil {
		d.neigh.add(uint32(id), b.Addr.Addr())
	}
	key := uint32(id)
	if err := d.backends.Update(&key, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write backend %d (%s): %w", id, b.Addr, err)
	}
	return nil
}

// DeleteBackend clears the backend entry at id (an array slot cannot be
// deleted; flags 0 marks it unused) and zeroes its counters.
func (d *LB) DeleteBackend(id reconciler.BackendID) error {
	key := uint32(id)
	var zero bpf.LbBackend
	if err := d.backends.Update(&key, &zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("clear backend %d: %w", id, err)
	}
	if d.neigh != nil {
		d.neigh.remove(uint32(id))
	}
	return d.zeroStats(d.backendStats, key)
}

// SetTable builds the service's Maglev table in a new inner map and swaps
// it into the outer map in one update.
func (d *LB) SetTable(svc reconciler.ServiceID, table []reconciler.BackendID) error {
	n := len(table) + 1
	chunks := (n + maglevChunk - 1) / maglevChunk
	spec := d.inner.Copy()
	spec.MaxEntries = uint32(chunks)
	spec.Name = fmt.Sprintf("maglev_%d", svc)
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("create Maglev table for service id %d (%d slots): %w", svc, len(table), err)
	}
	defer inner.Close()

	keys := make([]uint32, chunks)
	vals := make([][maglevChunk]uint32, chunks)
	for i := range keys {
		keys[i] = uint32(i)
	}
	vals[0][0] = uint32(len(table))
	for i, id := range table {
		s := i + 1
		vals[s/maglevChunk][s%maglevChunk] = uint32(id)
	}
	if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("fill Maglev table for service id %d: %w", svc, err)
	}
	key := uint32(svc)
	if err := d.maglev.Update(&key, inner, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("swap in Maglev table for service id %d: %w", svc, err)
	}
	return nil
}

// DeleteTable removes the service's table.
func (d *LB) DeleteTable(svc reconciler.ServiceID) error {
	key := uint32(svc)
	if err := d.maglev.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete Maglev table of service id %d: %w", svc, err)
	}
	return nil
}

func (d *LB) zeroStats(m *ebpf.Map, key uint32) error {
	zeros := make([]bpf.LbLbStats, d.cpus)
	if err := m.Update(&key, zeros, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset counters %s[%d]: %w", m, key, err)
	}
	return nil
}

// isFull reports a hash map at capacity (the kernel answers E2BIG).
func isFull(err error) bool { return errors.Is(err, unix.E2BIG) }
