// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/internal/testnet"
)

// benchPrimitives times the operations paths are made of (bpf/floor.c:
// each program is the empty one plus one operation) and prints each one's
// cost over the empty program's, so that a path's figure can be read as
// the sum of what it does on this machine.
func benchPrimitives(t *testnet.Script, r *rig, fl *floorSet, frame []byte, rounds, runs int) {
	o := &fl.objs[0]
	// The lookups hit: the key each program reads from the frame is in
	// its map.
	for _, m := range []*ebpf.Map{o.PrimHash16, o.PrimHash40, o.PrimLru40} {
		k := frame[14 : 14+m.KeySize()]
		if err := m.Put(k, make([]byte, m.ValueSize())); err != nil {
			t.Fatalf("primitive map: %v", err)
		}
	}
	one := func(name string, p *ebpf.Program) path {
		return path{name: name, hook: hookXDP, prog: p, next: func(int) []byte { return frame }, kind: ""}
	}
	paths := []path{
		one("empty program", fl.hooks[hookXDP].pass),
		one("+ a per-CPU counter (in every primitive below)", o.L4lbPrimCount),
		one("+ a BPF-to-BPF call (a __noinline function)", o.L4lbPrimCall),
		one("+ a helper call (bpf_ktime_get_coarse_ns)", o.L4lbPrimHelper),
		one("+ an inlined helper (bpf_jiffies64)", o.L4lbPrimJiffies),
		one("+ bpf_xdp_adjust_head", o.L4lbPrimAdjustHead),
		one("+ hash lookup, 16-byte key", o.L4lbPrimHash16),
		one("+ hash lookup, 40-byte key", o.L4lbPrimHash40),
		one("+ LRU hash lookup, 40-byte key", o.L4lbPrimLru40),
		fl.paths(hookXDP, frame)[1],
	}
	res := r.measure(t, paths, rounds, runs)
	fmt.Printf("\nprimitives, XDP: what one operation adds to the empty program (ns, same method)\n")
	fmt.Printf("  %-50s %7s %13s %7s\n", "program", "ns", "min-max", "net")
	for i, p := range paths {
		fmt.Printf("  %-50s %7d %6d-%-6d %7d\n", p.name, res[i].med.Nanoseconds(), res[i].lo.Nanoseconds(),
			res[i].hi.Nanoseconds(), (res[i].med - res[0].med).Nanoseconds())
	}
}
