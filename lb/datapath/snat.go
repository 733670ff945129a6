// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"github.com/cilium/ebpf"

	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
)

// MaxSNATAddresses is how many SNAT addresses of each family the datapath
// holds (SNAT_ADDRS_MAX in bpf/include/config.h).
const MaxSNATAddresses = 16

// Default SNAT source port range: Linux's default ephemeral range.
const (
	DefaultSNATPortMin = 16384
	DefaultSNATPortMax = 32767
)

// SNATTimeouts are the idle times after which a SNAT binding is dead and
// its port free for another flow.
type SNATTimeouts struct {
	// TCP applies to established TCP flows.
	TCP time.Duration
	// TCPClosing applies to TCP flows after a FIN or RST in either
	// direction, and to flows whose backend has not answered (or, for a
	// SYN, whose client has not acknowledged the answer) yet.
	TCPClosing time.Duration
	// UDP applies to UDP flows.
	UDP time.Duration
}

// DefaultSNATTimeouts are the timeouts a zero field takes. TCP outlives
// the 2h default TCP keepalive interval, so a quiet connection that keeps
// itself alive never loses its binding.
var DefaultSNATTimeouts = SNATTimeouts{TCP: 6 * time.Hour, TCPClosing: 10 * time.Second, UDP: 60 * time.Second}

// withSNATDefaults fills the SNAT settings a caller left at zero.
func withSNATDefaults(cfg Config) Config {
	if cfg.SNATPortMin == 0 && cfg.SNATPortMax == 0 {
		cfg.SNATPortMin, cfg.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if cfg.SNATMax == 0 {
		cfg.SNATMax = cfg.ConntrackMax
	}
	t := &cfg.SNATTimeouts
	if t.TCP == 0 {
		t.TCP = DefaultSNATTimeouts.TCP
	}
	if t.TCPClosing == 0 {
		t.TCPClosing = DefaultSNATTimeouts.TCPClosing
	}
	if t.UDP == 0 {
		t.UDP = DefaultSNATTimeouts.UDP
	}
	return cfg
}

// snatAddresses splits the configured SNAT addresses by family, in order,
// without duplicates.
func snatAddresses(addrs []netip.Addr) (v4, v6 []netip.Addr, err error) {
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "":
			return nil, nil, fmt.Errorf("datapath: SNAT address %q is not a unicast address without zone: fix datapath.snat_addresses", a)
		case a.Is4() && !slices.Contains(v4, a):
			v4 = append(v4, a)
		case a.Is6() && !slices.Contains(v6, a):
			v6 = append(v6, a)
		}
	}
	if len(v4) > MaxSNATAddresses || len(v6) > MaxSNATAddresses {
		return nil, nil, fmt.Errorf("datapath: %d IPv4 and %d IPv6 SNAT addresses, at most %d of each family fit: shorten datapath.snat_addresses", len(v4), len(v6), MaxSNATAddresses)
	}
	return v4, v6, nil
}

// snatVars returns the SNAT load-time constants of cfg (defaults applied).
func snatVars(cfg Config) (map[string]any, error) {
	v4, v6, err := snatAddresses(cfg.SNATAddresses)
	if err != nil {
		return nil, err
	}
	if cfg.SNATPortMin == 0 || cfg.SNATPortMin > cfg.SNATPortMax {
		return nil, fmt.Errorf("datapath: SNAT port range %d-%d is empty or starts at 0: fix datapath.snat_port_range", cfg.SNATPortMin, cfg.SNATPortMax)
	}
	t := cfg.SNATTimeouts
	if t.TCP < time.Second || t.TCPClosing < time.Second || t.UDP < time.Second {
		return nil, fmt.Errorf("datapath: SNAT timeouts tcp %s, tcp_closing %s, udp %s: each must be at least 1s", t.TCP, t.TCPClosing, t.UDP)
	}
	var a4 [MaxSNATAddresses]uint32
	for i, a := range v4 {
		b := a.As4()
		a4[i] = binary.NativeEndian.Uint32(b[:])
	}
	var a6 [MaxSNATAddresses * 16]byte
	for i, a := range v6 {
		b := a.As16()
		copy(a6[i*16:], b[:])
	}
	return map[string]any{
		bpf.LbVarCfgSnatAddr4:        a4,
		bpf.LbVarCfgSnatAddr4Count:   uint32(len(v4)),
		bpf.LbVarCfgSnatAddr6:        a6,
		bpf.LbVarCfgSnatAddr6Count:   uint32(len(v6)),
		bpf.LbVarCfgSnatPortMin:      cfg.SNATPortMin,
		bpf.LbVarCfgSnatPortMax:      cfg.SNATPortMax,
		bpf.LbVarCfgSnatTcpNs:        uint64(t.TCP),
		bpf.LbVarCfgSnatTcpClosingNs: uint64(t.TCPClosing),
		bpf.LbVarCfgSnatUdpNs:        uint64(t.UDP),
	}, nil
}

// snatOverflowMax is the size of each SNAT overflow table (bindings made
// over datapath.flow_insert_rate): a quarter of the main tables, at least
// 1024.
func snatOverflowMax(snatMax uint32) uint32 { return max(1024, snatMax/4) }

// perCPURound is what the kernel makes of n entries for an LRU map with
// per-CPU lists: a multiple of the CPU count. Asking for that size up front
// lets a restarted l4lbd adopt the pinned map, whose size it compares.
func perCPURound(n uint32, cpus int) uint32 {
	c := uint32(max(cpus, 1))
	return (n + c - 1) / c * c
}

// Supported is the package-level Supported plus what depends on this
// datapath's configuration: a SNAT service needs a SNAT address of its
// VIP's family.
func (d *LB) Supported(svc lb.Service) error {
	if err := Supported(svc); err != nil {
		return err
	}
	return d.snatReady(svc)
}

func (d *LB) snatReady(svc lb.Service) error {
	if svc.ModeFor(svc.Frontend.Proto) != lb.ModeSNAT {
		return nil
	}
	fam := "IPv6"
	if svc.Frontend.Addr.Is4() {
		fam = "IPv4"
	}
	for _, a := range d.cfg.SNATAddresses {
		if a.Unmap().Is4() == svc.Frontend.Addr.Is4() {
			return nil
		}
	}
	return fmt.Errorf("SNAT to %s needs an %s source address and the datapath has none: "+
		"add one to datapath.snat_addresses, or give an interface of datapath.interfaces an %s address and restart l4lbd",
		svc.Frontend, fam, fam)
}

// SNATAddresses are the SNAT source addresses the datapath uses.
func (d *LB) SNATAddresses() []netip.Addr { return slices.Clone(d.cfg.SNATAddresses) }

// SNATEntries counts the entries of the SNAT tables, main and overflow
// together, by walking them: flows in the forward tables (client flows with
// a binding) and ports in the reverse tables (claimed source tuples). A
// binding past its timeout counts until a flow reuses its port or the LRU
// evicts it. Poll sparingly.
func (d *LB) SNATEntries() (flows, ports int, err error) { return d.SNATEntriesWithin(0) }

// SNATEntriesWithin is SNATEntries accepting counts at most maxAge old
// (see ConntrackEntriesWithin).
func (d *LB) SNATEntriesWithin(maxAge time.Duration) (flows, ports int, err error) {
	fwd := func(m *ebpf.Map) (int, error) {
		return d.counts.count(m, maxAge, func(cur *ebpf.MapBatchCursor) (int, error) {
			var (
				k [countBatch]bpf.LbFlowKey
				v [countBatch]bpf.LbSnatFwdValue
			)
			return m.BatchLookup(cur, k[:], v[:], nil)
		})
	}
	rev := func(m *ebpf.Map) (int, error) {
		return d.counts.count(m, maxAge, func(cur *ebpf.MapBatchCursor) (int, error) {
			var (
				k [countBatch]bpf.LbSnatRevKey
				v [countBatch]bpf.LbSnatRevValue
			)
			return m.BatchLookup(cur, k[:], v[:], nil)
		})
	}
	var errs [4]error
	var n [4]int
	n[0], errs[0] = fwd(d.snatFwd)
	n[1], errs[1] = fwd(d.coll.Maps[bpf.LbMapSnatFwdOvf])
	n[2], errs[2] = rev(d.snatRev)
	n[3], errs[3] = rev(d.coll.Maps[bpf.LbMapSnatRevOvf])
	return n[0] + n[1], n[2] + n[3], errors.Join(errs[:]...)
}

// SNATCapacity is the size of each main SNAT table (datapath.snat_max),
// shared by all CPUs. The overflow tables, which hold bindings made over
// datapath.flow_insert_rate, have SNATOverflowCapacity each.
func (d *LB) SNATCapacity() uint32 { return d.snatFwd.MaxEntries() }

// SNATOverflowCapacity is the size of each SNAT overflow table.
func (d *LB) SNATOverflowCapacity() uint32 { return d.coll.Maps[bpf.LbMapSnatFwdOvf].MaxEntries() }

// InterfaceAddresses returns the primary address of each family on each
// of ifaces, in order and without duplicates: the SNAT addresses when
// datapath.snat_addresses is empty. Primary means the first global unicast
// address the kernel lists that is not secondary, temporary, deprecated or
// still being checked for duplicates.
func InterfaceAddresses(ifaces []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, name := range ifaces {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("read addresses of %s: %w (is datapath.interfaces right?)", name, err)
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			addrs, err := netlink.AddrList(l, fam)
			if err != nil {
				return nil, fmt.Errorf("read addresses of %s: %w", name, err)
			}
			if a, ok := primary(addrs); ok && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

func primary(addrs []netlink.Addr) (netip.Addr, bool) {
	const skip = unix.IFA_F_SECONDARY | unix.IFA_F_TEMPORARY | unix.IFA_F_DEPRECATED | unix.IFA_F_TENTATIVE | unix.IFA_F_DADFAILED
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.Scope != unix.RT_SCOPE_UNIVERSE || a.Flags&skip != 0 {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
			continue
		}
		return ip, true
	}
	return netip.Addr{}, false
}

// resolveSNATAddresses fills cfg.SNATAddresses from cfg.SNATInterfaces
// when none are configured. An interface it cannot read is only logged:
// attaching to it fails next with the better error, and a family left
// without an address makes Supported refuse that family's SNAT services.
func resolveSNATAddresses(cfg Config) Config {
	if len(cfg.SNATAddresses) > 0 || len(cfg.SNATInterfaces) == 0 {
		return cfg
	}
	for _, name := range cfg.SNATInterfaces {
		addrs, err := InterfaceAddresses([]string{name})
		if err != nil {
			cfg.Log.Warn("no SNAT address from this interface", "interface", name, "error", err)
			continue
		}
		for _, a := range addrs {
			if !slices.Contains(cfg.SNATAddresses, a) {
				cfg.SNATAddresses = append(cfg.SNATAddresses, a)
			}
		}
	}
	if len(cfg.SNATAddresses) == 0 {
		cfg.Log.Warn("no SNAT address: the interfaces have no global address, so SNAT services are refused; set datapath.snat_addresses", "interfaces", cfg.SNATInterfaces)
	} else {
		cfg.Log.Info("SNAT addresses taken from the interfaces", "addresses", cfg.SNATAddresses)
	}
	return cfg
}
