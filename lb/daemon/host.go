// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
)

// HostFacts gathers what the config checks need to know of this machine
// (config.Host): its addresses, what exists at the daemon's paths, whether
// bpffs is there, the kernel memory the datapath maps would take (from the
// real map specs) and the memory the machine has, and the kernel's
// ephemeral port range. l4lbd calls it at start and on every reload;
// `l4lbctl config check` calls it too, so both judge a file alike.
func HostFacts() *config.Host {
	ifs, addrs := hostInterfaces()
	return &config.Host{
		Addresses:  addrs,
		Interfaces: ifs,
		Lstat: func(path string) (fs.FileMode, bool) {
			fi, err := os.Lstat(path)
			if err != nil {
				return 0, false
			}
			return fi.Mode(), true
		},
		Stat: func(path string) (fs.FileMode, bool) {
			fi, err := os.Stat(path)
			if err != nil {
				return 0, false
			}
			return fi.Mode(), true
		},
		PinPath:         datapath.CheckPinPath,
		MapMemory:       MapMemory,
		MemoryAvailable: memoryAvailable(),
		EphemeralPorts:  ephemeralPorts(),
	}
}

// MapMemory is the kernel memory the datapath of cfg takes, as
// datapath.EstimateMemory computes it for the maps l4lbd would create,
// and the part of it not pinned under daemon.bpffs yet.
func MapMemory(cfg *config.Config) (config.MapMemory, error) {
	maps, err := datapath.EstimateMemory(datapathConfig(cfg, nil), cfg.TableSizes())
	if err != nil {
		return config.MapMemory{}, err
	}
	var n config.MapMemory
	for _, m := range maps {
		n.Total += m.Bytes
		if !m.Pinned {
			n.New += m.Bytes
		}
	}
	return n, nil
}

// hostInterfaces lists the names of the interfaces of l4lbd's network
// namespace and their addresses.
func hostInterfaces() ([]string, []config.HostAddr) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, nil
	}
	var (
		names []string
		out   []config.HostAddr
	)
	for _, ifc := range ifs {
		names = append(names, ifc.Name)
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			bits, _ := ipn.Mask.Size()
			ip = ip.Unmap()
			if ip.Is4() && bits > 32 {
				bits -= 96
			}
			out = append(out, config.HostAddr{Prefix: netip.PrefixFrom(ip, bits), Interface: ifc.Name})
		}
	}
	return names, out
}

// memoryAvailable is MemAvailable of /proc/meminfo, lowered to what the
// process's memory cgroup still allows when it has a limit (a unit's
// MemoryMax=): BPF maps are charged to that cgroup. 0 when unknown.
func memoryAvailable() uint64 {
	avail := meminfo("MemAvailable")
	if limit, used := cgroupMemory(); limit > 0 {
		left := uint64(0)
		if limit > used {
			left = limit - used
		}
		if avail == 0 || left < avail {
			avail = left
		}
	}
	return avail
}

func meminfo(key string) uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0
		}
		return n << 10
	}
	return 0
}

// cgroupMemory reads the memory limit and usage of the process's cgroup
// (v2, or v1's memory controller); a limit of 0 means none.
func cgroupMemory() (limit, used uint64) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, 0
	}
	read := func(path string) uint64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0 // "max": no limit
		}
		return n
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir := filepath.Join("/sys/fs/cgroup", parts[2])
			if lim := read(filepath.Join(dir, "memory.max")); lim > 0 {
				return lim, read(filepath.Join(dir, "memory.current"))
			}
		case parts[1] == "memory":
			// v1 shows a container its own cgroup as the root.
			for _, dir := range []string{filepath.Join("/sys/fs/cgroup/memory", parts[2]), "/sys/fs/cgroup/memory"} {
				lim := read(filepath.Join(dir, "memory.limit_in_bytes"))
				if lim > 0 && lim < 1<<62 {
					return lim, read(filepath.Join(dir, "memory.usage_in_bytes"))
				}
			}
		}
	}
	return 0, 0
}

func ephemeralPorts() [2]uint16 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return [2]uint16{}
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return [2]uint16{}
	}
	lo, err1 := strconv.ParseUint(f[0], 10, 16)
	hi, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil {
		return [2]uint16{}
	}
	return [2]uint16{uint16(lo), uint16(hi)}
}
