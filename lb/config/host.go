// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/l4lb/l4lb/lb"
)

// Host is what the checks that depend on the machine know of it. Parse
// stays a function of its input: these facts are part of that input.
// Options.Host nil checks the file alone (a config written for another
// box, the examples); l4lbd, at start and on every reload, and `l4lbctl
// config check` pass the facts of the box they run on (lb/daemon
// HostFacts). Each fact left at its zero value skips its check.
type Host struct {
	// Addresses are the box's own addresses with their prefixes, by
	// interface: a VIP equal to one would take over that address's
	// ports (ssh included) for every client.
	Addresses []HostAddr
	// Lstat says what exists at a path, without following a final
	// symbolic link; ok is false when nothing does.
	Lstat func(path string) (mode fs.FileMode, ok bool)
	// PinPath checks that daemon.bpffs can hold pins (on bpffs).
	PinPath func(dir string) error
	// MapMemory estimates the kernel memory the datapath maps of cfg
	// take (lb/datapath computes it from the map specs).
	MapMemory func(cfg *Config) (MapMemory, error)
	// MemoryAvailable is how much memory the machine can give the maps,
	// in bytes.
	MemoryAvailable uint64
	// EphemeralPorts is the kernel's net.ipv4.ip_local_port_range.
	EphemeralPorts [2]uint16
	// Stat says what the mode of the file at path is, following
	// symbolic links; ok is false when it cannot be read. The config
	// file's own mode is checked with it: it holds the secret seed and
	// decides what the box serves.
	Stat func(path string) (mode fs.FileMode, ok bool)
	// Interfaces are the names of the box's network interfaces (in
	// l4lbd's network namespace): datapath.interfaces must name some.
	Interfaces []string
}

// MapMemory is the kernel memory of the datapath maps, in bytes.
type MapMemory struct {
	// Total is what all of them take.
	Total uint64
	// New is what starting l4lbd allocates: the maps already pinned
	// under daemon.bpffs (a restart) are adopted and charged already.
	New uint64
}

// HostAddr is one address of the box.
type HostAddr struct {
	Prefix    netip.Prefix
	Interface string
}

// Linux's default ephemeral port range, for a Host that does not say.
var defaultEphemeral = [2]uint16{32768, 60999}

// host runs the checks that need the machine's facts. Problems that would
// only show once l4lbd touches the kernel are errors; a setting that works
// but harms the box is a warning.
func (c *checker) host(raw *rawFile, cfg *Config, h *Host) {
	if h == nil {
		return
	}
	ds := scope{c: c}.sub("daemon")
	if h.Lstat != nil {
		if mode, ok := h.Lstat(cfg.Daemon.AdminSocket); ok && mode&fs.ModeSocket == 0 {
			ds.errorf("admin_socket", "daemon.admin_socket = %q exists and is not a socket (%s): l4lbd would have to delete it; use a path that is free or holds l4lbd's old socket", cfg.Daemon.AdminSocket, kindName(mode))
		}
	}
	if h.PinPath != nil {
		switch err := h.PinPath(cfg.Daemon.BPFFS); {
		case errors.Is(err, fs.ErrPermission):
			// /sys/fs/bpf is root's (0700): an operator checking a
			// file as themselves cannot see into it.
			line := c.line("daemon.bpffs")
			if line == 0 {
				line = c.line("daemon")
			}
			c.warn(line, "daemon.bpffs %s could not be checked as this user (%v): run config check as root to check it", cfg.Daemon.BPFFS, err)
		case err != nil:
			ds.errorf("bpffs", "daemon.bpffs: %v", err)
		}
	}
	c.hostAddresses(raw, cfg, h)
	c.hostDatapath(cfg, h)
	c.fileMode(cfg, h)
	c.hostPools(raw, h)
	// The estimate of a file with errors would be of defaults it did not mean.
	if h.MapMemory != nil && len(c.errs) == 0 {
		mem, err := h.MapMemory(cfg)
		switch {
		case err != nil:
			c.warn(c.line("datapath"), "cannot estimate the kernel memory of the datapath maps: %v", err)
		default:
			cfg.MapMemory = mem
			if h.MemoryAvailable > 0 && mem.New > h.MemoryAvailable {
				pinned := ""
				if mem.New < mem.Total {
					pinned = fmt.Sprintf(" more (%s are pinned under %s already)", mib(mem.Total-mem.New), cfg.Daemon.BPFFS)
				}
				scope{c: c}.errorf("datapath", "the datapath maps need ≈ %s%s of kernel memory but the machine has %s available: lower datapath.conntrack_max, snat_max, max_services or max_backends",
					mib(mem.New), pinned, mib(h.MemoryAvailable))
			}
		}
	}
	eph := h.EphemeralPorts
	if eph == [2]uint16{} {
		eph = defaultEphemeral
	}
	dp := cfg.Datapath
	if dp.SNATPortMin <= eph[1] && eph[0] <= dp.SNATPortMax {
		line := c.line("datapath.snat_port_range")
		if line == 0 {
			line = c.line("datapath")
		}
		c.warn(line, "datapath.snat_port_range %d-%d overlaps the kernel's ephemeral ports %d-%d (net.ipv4.ip_local_port_range): SNAT bindings can take the replies of the box's own connections; pick a range outside it",
			dp.SNATPortMin, dp.SNATPortMax, eph[0], eph[1])
	}
}

// hostAddresses refuses VIPs that are the box's own addresses or the
// broadcast address of one of its IPv4 subnets.
func (c *checker) hostAddresses(raw *rawFile, cfg *Config, h *Host) {
	if len(h.Addresses) == 0 {
		return
	}
	for i, svc := range cfg.Services {
		if i >= len(raw.Service) || !svc.Frontend.Addr.IsValid() {
			continue
		}
		if format, args := vipHostProblem(svc.Frontend, h); format != "" {
			sc := scope{c: c, path: indexPath("service", i), service: serviceLabel(&raw.Service[i], i)}
			sc.errorf("vip", format, args...)
		}
	}
}

// vipHostProblem says why the box cannot serve fe's VIP, as a message
// format and its arguments; "" when it can.
func vipHostProblem(fe lb.Frontend, h *Host) (string, []any) {
	vip := fe.Addr
	for _, a := range h.Addresses {
		switch {
		case a.Prefix.Addr().Unmap() == vip:
			return "vip %s is an address of this box (%s): l4lb would take over %s on it for every client, ssh included; use an address the box does not hold (l4lb answers for a VIP without it being configured)",
				[]any{vip, a.Interface, fe.Proto.String() + " port " + fmt.Sprint(fe.Port)}
		case vip.Is4() && a.Prefix.Addr().Is4() && a.Prefix.Bits() < 31 && vip == broadcast(a.Prefix):
			return "vip %s is the broadcast address of %s on %s: use a unicast address", []any{vip, a.Prefix.Masked(), a.Interface}
		}
	}
	return "", nil
}

// hostDatapath refuses interfaces the box does not have and SNAT addresses
// it does not hold: l4lbd would fail to attach to the one, and the replies
// to the other would be routed to whoever holds it (or nowhere).
func (c *checker) hostDatapath(cfg *Config, h *Host) {
	s := scope{c: c}.sub("datapath")
	if len(h.Interfaces) > 0 {
		for i, name := range cfg.Datapath.Interfaces {
			if !slices.Contains(h.Interfaces, name) {
				key := indexPath("interfaces", i)
				s.errorf(key, "%s: this box has no interface %q (it has %s): l4lbd could not attach to it; name one of them (`ip link` lists them)",
					s.name(key), name, strings.Join(h.Interfaces, ", "))
			}
		}
	}
	if len(h.Addresses) > 0 {
		for i, a := range cfg.Datapath.SNATAddresses {
			if _, ok := boxAddress(a, h.Addresses); !ok {
				key := indexPath("snat_addresses", i)
				s.errorf(key, "%s: %s is not an address of this box: replies to SNAT-ed connections would be routed to whoever holds it, not back here; add it to an interface (ip addr add) or use one the box holds", s.name(key), a)
			}
		}
	}
}

// fileMode checks who may change or read the config file: whoever can
// write it decides what the box serves at the next reload (world-writable:
// an error; group-writable: a warning, a group of operators may be meant),
// and whoever can read the hash seed can predict which backend every flow
// gets on every box (readable by others with a seed: a warning).
func (c *checker) fileMode(cfg *Config, h *Host) {
	if h.Stat == nil || c.file == "" {
		return
	}
	mode, ok := h.Stat(c.file)
	if !ok {
		return
	}
	perm := mode.Perm()
	switch {
	case perm&0o002 != 0:
		c.add(0, "", "", "the file is writable by every user (mode %#o): anyone could change what l4lbd serves, and its seed, at the next reload; chmod o-w it (the package installs it 0640 root:root)", perm)
	case perm&0o020 != 0:
		c.warn(0, "the file is writable by its group (mode %#o): every member can change what l4lbd serves at the next reload; chmod g-w it unless that group is meant to", perm)
	}
	if perm&0o004 != 0 && !cfg.Maglev.Seed.IsZero() && !cfg.Maglev.DevSeed {
		line := c.line("maglev.hash_seed")
		c.warn(line, "maglev.hash_seed is readable by every user (mode %#o): whoever reads it can predict which backend each flow gets on every box; chmod o-r the file", perm)
	}
}

// hostPools refuses Kubernetes pools that hold one of the box's own
// addresses: the allocation is the same on every box, so a Service would
// sooner or later be given it, and this box would refuse to serve it.
func (c *checker) hostPools(raw *rawFile, h *Host) {
	if raw.Discovery == nil || raw.Discovery.Kubernetes == nil || len(h.Addresses) == 0 {
		return
	}
	r := raw.Discovery.Kubernetes
	s := scope{c: c}.sub("discovery").sub("kubernetes")
	check := func(s scope, key string, v any) {
		list, _ := v.([]any)
		for i, e := range list {
			str, _ := e.(string)
			p, err := netip.ParsePrefix(str)
			if err != nil {
				continue // refused by the file's own checks
			}
			for _, a := range h.Addresses {
				if own := a.Prefix.Addr().Unmap(); p.Contains(own) {
					s.errorf(indexPath(key, i), "%s[%d] = %q holds %s, an address of this box (%s): a Service would be given it and this box would refuse to serve it; leave it out (split the pool around it)",
						s.name(key), i, str, own, a.Interface)
					break
				}
			}
		}
	}
	check(s, "pools", r.Pools)
	np := s.sub("named_pools")
	for _, name := range slices.Sorted(maps.Keys(r.NamedPools)) {
		check(np, name, r.NamedPools[name])
	}
}

// broadcast is the last address of an IPv4 prefix.
func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	for i := 3; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		a[i] |= byte(1<<n - 1)
		host -= n
	}
	return netip.AddrFrom4(a)
}

func kindName(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a socket"
}

// mib formats a byte count the way operators size memory.
func mib(n uint64) string {
	if n >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", (n+(1<<20)-1)>>20)
}

// MiB formats a byte count as config check prints it ("310 MiB").
func MiB(n uint64) string { return mib(n) }

// TableSizes are the Maglev table sizes of the file's services, defaults
// resolved: each programmed service takes a table of this many slots.
func (c *Config) TableSizes() []uint32 {
	out := make([]uint32, 0, len(c.Services))
	for _, s := range c.Services {
		out = append(out, s.WithDefaults(c.Defaults()).TableSize)
	}
	return out
}
