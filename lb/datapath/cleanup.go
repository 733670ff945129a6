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
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
)

// CheckPinPath tells, before anything is created, whether dir can hold the
// datapath's pins: dir, or its nearest parent that exists, must be a
// directory on a bpffs mount. A path elsewhere would otherwise be created
// first and fail later, leaving directories behind. dir itself must not be
// the root of a bpffs mount: l4lbd's directory is its own, and a mount
// root holds every other BPF program's pins too.
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
	if p == filepath.Clean(dir) && isMountRoot(p) {
		return fmt.Errorf("bpffs directory %s is the root of a bpffs mount, shared with every other BPF program's pins: "+
			"give l4lbd a directory of its own under it, such as %s", dir, filepath.Join(p, "l4lb"))
	}
	return nil
}

// isMountRoot reports whether dir is the root of a mount: its parent is
// on another device (or it is / itself).
func isMountRoot(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Join(dir, ".."), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino
}

// Removed is what Cleanup took away, for `l4lbd --cleanup` to report, and
// what it could not or would not take away.
type Removed struct {
	// Links are the programs detached, by interface and hook.
	Links []PinnedLink
	// Pins are the pinned maps removed from the bpffs directory, by name.
	Pins []string
	// Tables is how many pinned Maglev tables (one per service, under
	// maglev_tables/) were removed.
	Tables int
	// Neighbours are the managed neighbour entries deleted ("IP dev IF").
	Neighbours []string
	// Failed are the pins, links and directories of l4lbd that could not
	// be removed or detached, each with its error; they are still there.
	Failed []string
	// Foreign are the entries of the bpffs directory that l4lbd did not
	// create (by name), left in place, relative to the directory.
	Foreign []string
	// DirRemoved is set when the bpffs directory itself was removed
	// (only ever when it was left empty).
	DirRemoved bool
}

// Empty reports whether nothing was there to remove.
func (r Removed) Empty() bool {
	return len(r.Links) == 0 && len(r.Pins) == 0 && r.Tables == 0 && len(r.Neighbours) == 0
}

// ownedNames are the names l4lbd pins maps under, directly in its bpffs
// directory: every pinned map of the LB object under its current name, and
// the old names of the maps whose layout changed (migrate.go), which an
// earlier version left and this one adopts.
func ownedNames() (map[string]bool, error) {
	spec, err := lbSpec(nil)
	if err != nil {
		return nil, err
	}
	pinRenamed(spec)
	names := map[string]bool{}
	for _, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			names[m.Name] = true
		}
	}
	for _, lv := range renamed {
		for _, old := range lv.olds {
			names[old] = true
		}
	}
	return names, nil
}

// linkHooks are the prefixes of the links l4lbd pins under linkDir, with
// the hook each names.
var linkHooks = []struct{ prefix, name string }{{"xdp-", "xdp"}, {"tcx-", "tc"}, {"hc-", "hc"}}

// ownedTable reports whether name is one of l4lbd's Maglev table pins
// under tableDir: a service id, or its temporary "_new" (tables.go).
func ownedTable(name string) bool {
	id := strings.TrimSuffix(name, "_new")
	if id == "" {
		return false
	}
	for _, c := range id {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Cleanup detaches every link l4lbd pinned under pinPath, deletes the
// managed neighbour entries of the pinned backends' next hops (see
// RemoveManagedNeighbours), and removes the pins l4lbd creates there, by
// name: its maps, its links, its Maglev tables. Anything else under pinPath
// is not l4lbd's and stays, reported in Foreign; a sub directory or pinPath
// itself is removed only once empty, never recursively. Whatever could not
// be removed is in Failed (and in the error), never in Pins or Links. It is
// safe to run when nothing is there.
func Cleanup(pinPath string) (Removed, error) {
	var r Removed
	if pinPath == "" {
		return r, errors.New("datapath: cleanup needs the bpffs directory")
	}
	if _, err := os.Stat(pinPath); errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	var errs []error
	fail := func(what string, err error) {
		r.Failed = append(r.Failed, fmt.Sprintf("%s (%v)", what, err))
		errs = append(errs, fmt.Errorf("%s: %w", what, err))
	}
	neigh, err := RemoveManagedNeighbours(pinPath)
	r.Neighbours = neigh
	if err != nil {
		errs = append(errs, err)
	}
	owned, err := ownedNames()
	if err != nil {
		// Without the names nothing can be told apart: remove nothing.
		return r, fmt.Errorf("datapath: cleanup cannot tell l4lbd's pins from others, so it removed none: %w", err)
	}

	// Links first: detaching stops forwarding before the maps go.
	links := filepath.Join(pinPath, linkDir)
	for _, name := range readNames(links, &errs) {
		rel := filepath.Join(linkDir, name)
		var pl PinnedLink
		for _, h := range linkHooks {
			if ifc, ok := strings.CutPrefix(name, h.prefix); ok && ifc != "" {
				pl = PinnedLink{Interface: ifc, Hook: h.name}
				break
			}
		}
		if pl.Hook == "" {
			r.Foreign = append(r.Foreign, rel)
			continue
		}
		p := filepath.Join(pinPath, rel)
		l, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			fail("load pinned link "+p, err)
			continue
		}
		// Detach even while a running l4lbd (--force) holds the link
		// open; closing the last reference to an unpinned link would
		// detach it only once that process exits.
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			l.Close()
			fail("detach "+p, err)
			continue
		}
		err = l.Unpin()
		l.Close()
		if err != nil {
			fail("unpin "+p, err)
			continue
		}
		r.Links = append(r.Links, pl)
	}
	removeDirIfEmpty(links, fail)

	tables := filepath.Join(pinPath, tableDir)
	for _, name := range readNames(tables, &errs) {
		rel := filepath.Join(tableDir, name)
		if !ownedTable(name) {
			r.Foreign = append(r.Foreign, rel)
			continue
		}
		if removePin(filepath.Join(pinPath, rel), fail) {
			r.Tables++
		}
	}
	removeDirIfEmpty(tables, fail)

	for _, name := range readNames(pinPath, &errs) {
		switch {
		case name == linkDir || name == tableDir:
			// Handled above; still there only when not empty.
		case owned[name]:
			if removePin(filepath.Join(pinPath, name), fail) {
				r.Pins = append(r.Pins, name)
			}
		default:
			if fi, err := os.Lstat(filepath.Join(pinPath, name)); err == nil && fi.IsDir() {
				name += "/"
			}
			r.Foreign = append(r.Foreign, name)
		}
	}
	if len(r.Foreign) == 0 && len(r.Failed) == 0 {
		if err := os.Remove(pinPath); err == nil {
			r.DirRemoved = true
		} else if !errors.Is(err, os.ErrNotExist) {
			fail("remove directory "+pinPath, err)
		}
	}
	return r, errors.Join(errs...)
}

// readNames lists dir's entries, sorted by name; a dir that does not exist has
// none, and one that cannot be read is an error in errs.
func readNames(dir string, errs *[]error) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			*errs = append(*errs, fmt.Errorf("read %s: %w", dir, err))
		}
		return nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// removePin removes one pin and reports whether it is gone; os.Remove
// never empties a directory, so a directory someone made under one of
// l4lbd's names fails (and is reported) rather than losing its content.
func removePin(path string, fail func(string, error)) bool {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		fail("remove "+path, err)
		return false
	}
	return true
}

// removeDirIfEmpty removes l4lbd's sub directory dir when nothing is left
// in it; with something left (foreign or failed) it stays, already
// reported.
func removeDirIfEmpty(dir string, fail func(string, error)) {
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) > 0 {
		return
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fail("remove directory "+dir, err)
	}
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
