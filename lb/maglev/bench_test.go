// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"fmt"
	"net/netip"
	"testing"
)

// textbookBuild is Maglev as the paper's pseudocode writes it, equal weights
// only: preferences recomputed with a modulo per probe, a fresh []bool and
// table per build, backends taken in the order given. It is the baseline of
// BenchmarkBuild and, given backends in canonical order, an independent
// check of Build (TestBuildMatchesTextbook).
func textbookBuild(seed Seed, m uint32, backends []Backend) []int32 {
	n := len(backends)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	next := make([]uint64, n)
	for i, b := range backends {
		k := BackendKey(b.Addr)
		h := SipHash24(seed, k[:])
		offset[i] = (h >> 32) % uint64(m)
		skip[i] = (h&0xffffffff)%uint64(m-1) + 1
	}
	entry := make([]int32, m)
	used := make([]bool, m)
	filled := uint32(0)
	for {
		for i := range n {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for used[c] {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			entry[c] = int32(i)
			used[c] = true
			next[i]++
			filled++
			if filled == m {
				return entry
			}
		}
	}
}

var benchCases = []struct {
	m uint32
	n int
}{{16381, 100}, {65537, 1000}, {131071, 5000}}

func BenchmarkBuild(b *testing.B) {
	for _, tc := range benchCases {
		bs := makeBackends(tc.n)
		b.Run(fmt.Sprintf("M=%d/N=%d", tc.m, tc.n), func(b *testing.B) {
			var bld Builder
			table, err := bld.Build(testSeed, tc.m, bs, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				table, _ = bld.Build(testSeed, tc.m, bs, table)
			}
		})
	}
	// Weighted backends: 1..8 is a plausible spread of machine sizes and
	// replays rounds; one backend 1000 times heavier than the rest makes
	// rounds mostly idle, so the claims are sorted instead.
	weighted := []struct {
		name   string
		weight func(i int) uint32
	}{
		{"weights=1..8", func(i int) uint32 { return uint32(1 + i%8) }},
		{"weights=1000,1,1,...", func(i int) uint32 {
			if i == 0 {
				return 1000
			}
			return 1
		}},
	}
	for _, wc := range weighted {
		bs := makeBackends(1000)
		for i := range bs {
			bs[i].Weight = wc.weight(i)
		}
		b.Run("M=65537/N=1000/"+wc.name, func(b *testing.B) {
			var bld Builder
			table, err := bld.Build(testSeed, 65537, bs, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				table, _ = bld.Build(testSeed, 65537, bs, table)
			}
		})
	}
}

func BenchmarkBuildTextbook(b *testing.B) {
	for _, tc := range benchCases {
		bs := makeBackends(tc.n)
		SortBackends(bs)
		b.Run(fmt.Sprintf("M=%d/N=%d", tc.m, tc.n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				textbookBuild(testSeed, tc.m, bs)
			}
		})
	}
}

var sinkHash uint64

func BenchmarkFlowHash(b *testing.B) {
	flows := []struct {
		name string
		f    Flow
	}{
		{"IPv4", Flow{Src: netip.MustParseAddr("192.0.2.10"), Dst: netip.MustParseAddr("198.51.100.1"), SrcPort: 40000, DstPort: 443, Proto: 6}},
		{"IPv6", Flow{Src: netip.MustParseAddr("2001:db8::10"), Dst: netip.MustParseAddr("2001:db8:1::1"), SrcPort: 40000, DstPort: 443, Proto: 6}},
	}
	for _, fl := range flows {
		b.Run(fl.name, func(b *testing.B) {
			f := fl.f
			b.ReportAllocs()
			for b.Loop() {
				sinkHash += FlowHash(testSeed, f)
				f.SrcPort++
			}
		})
	}
}
