// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
)

// MapMemory is the kernel memory one map of the datapath takes.
type MapMemory struct {
	Name string
	// Bytes is what the kernel charges for the map: at creation for a
	// preallocated map, when full for one that allocates on insert.
	Bytes uint64
	// Prealloc is true when the kernel takes all of it at creation.
	Prealloc bool
	// Pinned is true when a map of its name is pinned under the
	// configured bpffs directory already (a restart): Load adopts it, or
	// refuses it as incompatible, and allocates nothing for it.
	Pinned bool
}

// Kernel structure sizes on 64-bit Linux (kernel/bpf/hashtab.c and
// friends), which the estimate follows: struct htab_elem before its key,
// struct bucket, and a trie node before its key. The kernel's own figure
// (`memlock:` in /proc/PID/fdinfo) is what a test compares against.
const (
	htabElem = 48
	htabBkt  = 16
	trieNode = 40
	ptrSize  = 8
	mapHead  = 1024 // the map structure itself, rounded up
)

// EstimateMemory says how much kernel memory the datapath built from cfg
// will take, map by map, from the real map specs' key and value sizes and
// the sizes Load gives them, before anything is created. tables are the
// Maglev table sizes of the services that will be programmed; each takes a
// table of its own. Maps that allocate on insert (services, source
// ranges) are counted full. What the maps not yet pinned under
// cfg.PinPath take is what l4lbd compares with the memory the machine has
// before it starts: the pinned ones are charged already, and counting them
// again would refuse the restart of a daemon that runs fine.
func EstimateMemory(cfg Config, tables []uint32) ([]MapMemory, error) {
	if !cfg.EncapSource4.IsValid() {
		cfg.EncapSource4 = DefaultEncapSource4
	}
	if !cfg.EncapSource6.IsValid() {
		cfg.EncapSource6 = DefaultEncapSource6
	}
	spec, cpus, err := sizedSpec(withPolicyDefaults(withSNATDefaults(cfg)))
	if err != nil {
		return nil, err
	}
	var out []MapMemory
	for name, m := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // .rodata: a few hundred bytes
		}
		b, pre := mapBytes(m, cpus)
		out = append(out, MapMemory{Name: name, Bytes: b, Prealloc: pre, Pinned: isPinned(cfg.PinPath, m)})
	}
	var inner uint64
	for _, size := range tables {
		chunks := (uint64(size) + 1 + maglevChunk - 1) / maglevChunk
		inner += mapHead + chunks*maglevChunk*4
	}
	// The connection table's filters (ctfilter.go), never pinned: the
	// live one, and the one a rebuild fills beside it.
	words := uint64(spec.Maps[bpf.LbMapCtFilter].InnerMap.MaxEntries)
	out = append(out, MapMemory{Name: "conntrack filters", Bytes: 2 * (mapHead + words*8), Prealloc: true})
	if len(tables) > 0 {
		// Never Pinned: a restart rebuilds the tables of changed
		// services aside, so counting them all errs on the safe side.
		out = append(out, MapMemory{Name: "maglev tables", Bytes: inner})
	}
	slices.SortFunc(out, func(a, b MapMemory) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// isPinned reports whether m would be adopted from a pin under dir.
func isPinned(dir string, m *ebpf.MapSpec) bool {
	if dir == "" || m.Pinning != ebpf.PinByName {
		return false
	}
	_, err := os.Lstat(filepath.Join(dir, m.Name))
	return err == nil
}

func round8(n uint32) uint64 { return (uint64(n) + 7) &^ 7 }

func pow2(n uint32) uint64 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

// mapBytes is the kernel's charge for one map and whether it is taken at
// creation.
func mapBytes(m *ebpf.MapSpec, cpus int) (uint64, bool) {
	n, c := uint64(m.MaxEntries), uint64(cpus)
	k, v := round8(m.KeySize), round8(m.ValueSize)
	const noPrealloc = 1 // BPF_F_NO_PREALLOC
	switch m.Type {
	case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash:
		percpu := m.Type == ebpf.PerCPUHash || m.Type == ebpf.LRUCPUHash
		elem := htabElem + k + v
		if percpu {
			elem = htabElem + k + ptrSize
		}
		b := mapHead + htabBkt*pow2(m.MaxEntries) + elem*n
		if percpu {
			b += v * c * n
		}
		return b, m.Flags&noPrealloc == 0
	case ebpf.Array:
		return mapHead + v*n, true
	case ebpf.PerCPUArray:
		return mapHead + n*ptrSize + v*c*n, true
	case ebpf.ArrayOfMaps, ebpf.HashOfMaps, ebpf.ProgramArray:
		return mapHead + ptrSize*n, true
	case ebpf.LPMTrie:
		// A full trie has up to one intermediate node per entry.
		return mapHead + 2*n*(trieNode+uint64(m.KeySize)-4+uint64(m.ValueSize)), false
	case ebpf.DevMapHash, ebpf.DevMap:
		return mapHead + ptrSize*pow2(m.MaxEntries) + 64*n, false
	case ebpf.RingBuf:
		// max_entries bytes of data, its header and consumer pages, and
		// the data pages mapped twice (kernel/bpf/ringbuf.c).
		const page = 4096
		return mapHead + n + 3*page + 2*ptrSize*(n/page), true
	}
	return mapHead + (k+v)*n, true
}
