// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/l4lb/l4lb/bpf"
)

// CheckPinPath tells, before anything is created, whether dir can hold the
// datapath's pins: dir, or its nearest parent that exists, must be a
// directory on a bpffs mount. A path elsewhere would otherwise be created
// first and fail later, leaving directories behind.
func CheckPinPath(dir string) error {
	p := filepath.Clean(dir)
	for {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("bpffs directory %s: %s is not a directory", dir, p)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("bpffs directory %s: %w", dir, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	if err := checkBPFFS(p); err != nil {
		if p != filepath.Clean(dir) {
			return fmt.Errorf("bpffs directory %s cannot be created: %w", dir, err)
		}
		return err
	}
	return nil
}

// Removed is what Cleanup took away, for `l4lbd --cleanup` to report.
type Removed struct {
	// Links are the programs detached, by interface and hook.
	Links []PinnedLink
	// Pins are the pinned maps removed, by name.
	Pins []string
	// Neighbours are the managed neighbour entries deleted ("IP dev IF").
	Neighbours []string
}

// Empty reports whether nothing was there to remove.
func (r Removed) Empty() bool {
	return len(r.Links) == 0 && len(r.Pins) == 0 && len(r.Neighbours) == 0
}

// Cleanup detaches every link pinned under pinPath, deletes the managed
// neighbour entries of the pinned backends' next hops (see
// RemoveManagedNeighbours), and removes every pin and the directory itself:
// `l4lbd --cleanup`. It is safe to run when nothing is there.
func Cleanup(pinPath string) (Removed, error) {
	var r Removed
	if pinPath == "" {
		return r, errors.New("datapath: cleanup needs the bpffs directory")
	}
	var errs []error
	neigh, err := RemoveManagedNeighbours(pinPath)
	r.Neighbours = neigh
	if err != nil {
		errs = append(errs, err)
	}
	for _, hook := range []struct{ prefix, name string }{{"xdp-", "xdp"}, {"tcx-", "tc"}, {"hc-", "hc"}} {
		paths, _ := filepath.Glob(filepath.Join(pinPath, linkDir, hook.prefix+"*"))
		for _, p := range paths {
			l, err := link.LoadPinnedLink(p, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("load pinned link %s: %w", p, err))
				continue
			}
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin %s: %w", p, err))
			}
			// Detach even while a running l4lbd (--force) holds the
			// link open; closing the last reference to an unpinned
			// link would detach it only once that process exits.
			if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				errs = append(errs, fmt.Errorf("detach %s: %w", p, err))
			}
			l.Close()
			r.Links = append(r.Links, PinnedLink{Interface: strings.TrimPrefix(filepath.Base(p), hook.prefix), Hook: hook.name})
		}
	}
	entries, err := os.ReadDir(pinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("read %s: %w", pinPath, err))
	}
	for _, e := range entries {
		if !e.IsDir() {
			r.Pins = append(r.Pins, e.Name())
		}
	}
	if err := os.RemoveAll(pinPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", pinPath, err))
	}
	return r, errors.Join(errs...)
}

// RemoveManagedNeighbours deletes the managed neighbour entries (see
// neighbours) of the next hops of the backends pinned under pinPath, as
// l4lbd installed them, and returns them as "IP dev IF". It reads the
// pinned backend map, so it runs before the pins are removed. An entry
// the kernel marks permanent (an operator's static one) is never touched.
func RemoveManagedNeighbours(pinPath string) ([]string, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, bpf.LbMapBackends), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pinned backends to find their managed neighbours: %w", err)
	}
	defer m.Close()
	var (
		k     uint32
		v     bpf.LbBackend
		addrs []netip.Addr
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v.Flags != 0 {
			addrs = append(addrs, backendFromMap(v).Addr.Addr())
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read pinned backend map: %w", err)
	}
	type nh struct {
		link int
		ip   netip.Addr
	}
	var hops []nh
	for _, a := range addrs {
		routes, err := netlink.RouteGet(net.IP(a.AsSlice()))
		if err != nil || len(routes) == 0 || routes[0].LinkIndex == 0 {
			continue
		}
		h := nh{link: routes[0].LinkIndex, ip: a}
		if gw, ok := netip.AddrFromSlice(routes[0].Gw); ok && routes[0].Gw != nil {
			h.ip = gw.Unmap()
		}
		if !slices.Contains(hops, h) {
			hops = append(hops, h)
		}
	}
	var (
		out  []string
		errs []error
	)
	for _, h := range hops {
		list, err := netlink.NeighList(h.link, family(h.ip))
		if err != nil {
			continue
		}
		for _, e := range list {
			ip, ok := netip.AddrFromSlice(e.IP)
			if !ok || ip.Unmap() != h.ip || e.FlagsExt&netlink.NTF_EXT_MANAGED == 0 || e.State&netlink.NUD_PERMANENT != 0 {
				continue
			}
			name := fmt.Sprint(h.link)
			if l, err := netlink.LinkByIndex(h.link); err == nil {
				name = l.Attrs().Name
			}
			if err := netlink.NeighDel(&e); err != nil {
				errs = append(errs, fmt.Errorf("delete managed neighbour %s dev %s: %w", h.ip, name, err))
				continue
			}
			out = append(out, fmt.Sprintf("%s dev %s", h.ip, name))
		}
	}
	return out, errors.Join(errs...)
}
