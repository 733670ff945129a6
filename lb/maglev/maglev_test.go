// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
)

var testSeed = Seed{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

// makeBackends returns n distinct backends with weight 1, alternating IPv4
// and IPv6 so both key encodings take part.
func makeBackends(n int) []Backend {
	bs := make([]Backend, n)
	for i := range bs {
		var a netip.Addr
		if i%2 == 0 {
			a = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		} else {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)})
		}
		bs[i] = Backend{Addr: netip.AddrPortFrom(a, uint16(8000+i%7)), Weight: 1}
	}
	return bs
}

// counts returns how many slots each backend index owns.
func counts(table []int32, n int) []int {
	c := make([]int, n)
	for _, idx := range table {
		c[idx]++
	}
	return c
}

// buildWithPermutations runs quotas and fill on members given directly, so a
// test can check the fill against a table worked out by hand without
// inverting SipHash. Members must be in canonical order.
func buildWithPermutations(m uint32, ms []member) []int32 {
	var b Builder
	b.members = append(b.members, ms...)
	b.assignQuotas(m)
	b.schedule(m)
	dst := make([]int32, m)
	for i := range dst {
		dst[i] = -1
	}
	b.claimAll(m, dst)
	return dst
}

// TestFillByHand checks the fill against tables derived on paper from the
// algorithm in the package documentation. Preference lists for M=7:
//
//	A: offset 3, skip 4 -> 3 0 4 1 5 2 6
//	B: offset 0, skip 2 -> 0 2 4 6 1 3 5
//	C: offset 3, skip 1 -> 3 4 5 6 0 1 2
func TestFillByHand(t *testing.T) {
	a := member{next: 3, skip: 4, idx: 0}
	b := member{next: 0, skip: 2, idx: 1}
	c := member{next: 3, skip: 1, idx: 2}
	w := func(m member, w uint32) member { m.weight = w; return m }
	tests := []struct {
		name string
		ms   []member
		want []int32
	}{{
		// Quotas 7/3: 2 each, the leftover slot to A (equal remainders,
		// first in canonical order).
		// Round 1: A 3, B 0, C 3 taken -> 4.
		// Round 2: A 0,4 taken -> 1; B 2; C 5.
		// Round 3: only A is short: 5,2 taken -> 6.
		name: "equal weights",
		ms:   []member{w(a, 1), w(b, 1), w(c, 1)},
		want: []int32{1, 0, 1, 0, 2, 2, 0},
	}, {
		// W=3, quotas floor(14/3)=4 rem 2 and floor(7/3)=2 rem 1, the
		// leftover to A (larger remainder): A 5, B 2. wmax=2.
		// Round 1: A claims 3; B credit 1.
		// Round 2: A 0; B credit 2: 0 taken -> 2.
		// Round 3: A 4; B credit 1.
		// Round 4: A 1; B credit 2: 4 taken -> 6. B full.
		// Round 5: A 5. A full.
		name: "weights 2 and 1",
		ms:   []member{w(a, 2), w(b, 1)},
		want: []int32{0, 0, 1, 0, 0, 0, 1},
	}, {
		// W=10, quotas floor(7/10)=0 rem 7 and floor(63/10)=6 rem 3: the
		// single leftover goes to A, so A 1, B 6. wmax=9.
		// Round 1: A credit 1; B claims 0.
		// Rounds 2-6: B 2 4 6 1 3; A credit 6.
		// Round 7: A credit 7; B full. Round 9: A credit 9, claims: 3 0 4
		// 1 taken -> 5.
		name: "light backend claims last",
		ms:   []member{w(a, 1), w(b, 9)},
		want: []int32{1, 1, 1, 1, 1, 0, 1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := buildWithPermutations(7, tt.ms)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCanonicalOrderAndIndexes checks that the table indexes the caller's
// slice while the computation follows canonical order.
func TestCanonicalOrderAndIndexes(t *testing.T) {
	bs := makeBackends(7)
	want, err := Build(testSeed, 251, bs)
	if err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(bs)
	slices.Reverse(rev)
	got, err := Build(testSeed, 251, rev)
	if err != nil {
		t.Fatal(err)
	}
	for s := range want {
		if bs[want[s]].Addr != rev[got[s]].Addr {
			t.Fatalf("slot %d: %v in caller order, %v in reversed order", s, bs[want[s]].Addr, rev[got[s]].Addr)
		}
	}
}

func TestOrderIndependence(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		m uint32
		n int
	}{{251, 1}, {251, 5}, {509, 17}, {4093, 40}, {65521, 300}} {
		t.Run(fmt.Sprintf("M=%d/N=%d", tc.m, tc.n), func(t *testing.T) {
			bs := makeBackends(tc.n)
			for i := range bs {
				bs[i].Weight = uint32(1 + rng.IntN(5))
			}
			bs[0].Weight = 0
			want, err := Build(testSeed, tc.m, bs)
			if err != nil {
				t.Fatal(err)
			}
			var b Builder
			var got []int32
			for range 5 {
				sh := slices.Clone(bs)
				rng.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
				got, err = b.Build(testSeed, tc.m, sh, got)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(want) {
					t.Fatalf("table length %d after shuffle, want %d", len(got), len(want))
				}
				for s := range want {
					if bs[want[s]].Addr != sh[got[s]].Addr {
						t.Fatalf("slot %d: %v before shuffle, %v after", s, bs[want[s]].Addr, sh[got[s]].Addr)
					}
				}
			}
		})
	}
}

func TestEqualWeightsShares(t *testing.T) {
	var b Builder
	var table []int32
	for _, m := range []uint32{7, 251, 509, 4093, 16381, 65521} {
		for _, n := range []int{1, 2, 3, 7, 10, 100, 1000} {
			if n > int(m) {
				continue
			}
			bs := makeBackends(n)
			var err error
			table, err = b.Build(testSeed, m, bs, table)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := int(m)/n, (int(m)+n-1)/n
			for i, c := range counts(table, n) {
				if c < lo || c > hi {
					t.Errorf("M=%d N=%d: backend %d owns %d slots, want %d or %d", m, n, i, c, lo, hi)
				}
			}
		}
	}
}

func TestWeightedShares(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(n int, maxW int) []uint32 {
		ws := make([]uint32, n)
		for i := range ws {
			ws[i] = uint32(1 + rng.IntN(maxW))
		}
		return ws
	}
	tests := []struct {
		name    string
		m       uint32
		weights []uint32
	}{
		{"1,2,3,10", 251, []uint32{1, 2, 3, 10}},
		{"1,2,3,10 large", 65521, []uint32{1, 2, 3, 10}},
		{"one zero", 509, []uint32{5, 0, 5, 1}},
		{"random 20", 4093, random(20, 100)},
		{"random 300", 65521, random(300, 1000)},
		{"huge spread", 65521, []uint32{1, 1 << 31, 3, 1 << 20}},
		{"extreme spread, largest table", MaxTableSize, append([]uint32{1<<32 - 1}, slices.Repeat([]uint32{1}, 999)...)},
		{"light backends with leftovers", 251, append([]uint32{1 << 30}, slices.Repeat([]uint32{1 << 22}, 99)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := makeBackends(len(tt.weights))
			var total uint64
			for i, w := range tt.weights {
				bs[i].Weight = w
				total += uint64(w)
			}
			table, err := Build(testSeed, tt.m, bs)
			if err != nil {
				t.Fatal(err)
			}
			tol := float64(tt.m) / 100
			for i, c := range counts(table, len(bs)) {
				exact := float64(tt.m) * float64(tt.weights[i]) / float64(total)
				if d := float64(c) - exact; d > tol || d < -tol {
					t.Errorf("backend %d (weight %d): %d slots, want %.1f ± %.1f", i, tt.weights[i], c, exact, tol)
				}
				// The quota rule is tighter than 1%: floor or floor+1.
				if d := float64(c) - exact; d <= -1 || d >= 1 {
					t.Errorf("backend %d (weight %d): %d slots, want floor or ceil of %.3f", i, tt.weights[i], c, exact)
				}
			}
		})
	}
}

// TestVariantsAgree builds the same inputs with every scheduling strategy
// and every way of searching for a free slot; which one runs is only a
// matter of speed, so the tables must be identical.
func TestVariantsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 150 {
		m := Ladder[rng.IntN(4)]
		n := 1 + rng.IntN(60)
		bs := makeBackends(n)
		maxW := []int{1, 3, 100, 1 << 30}[i%4]
		for j := range bs {
			bs[j].Weight = uint32(rng.IntN(maxW + 1))
		}
		compareVariants(t, testSeed, m, bs)
	}
	compareVariants(t, testSeed, 7, makeBackends(3))
	compareVariants(t, testSeed, 65521, makeBackends(1000))
}

// compareVariants fails if any build variant differs from the default one.
func compareVariants(t *testing.T, seed Seed, m uint32, bs []Backend) {
	t.Helper()
	want, err := Build(seed, m, bs)
	if err != nil {
		t.Fatal(err)
	}
	variants := []struct {
		name     string
		strategy schedStrategy
		phases   *phases
	}{
		{"rounds", schedRounds, nil},
		{"sorted", schedSorted, nil},
		{"probe1 only", schedAuto, &phases{0, 0, 0}},
		{"probe4 only", schedAuto, &phases{m, 0, 0}},
		{"probe8 only", schedAuto, &phases{m, m, 0}},
		{"probe1 then list", schedAuto, &phases{m / 2, m / 2, min(m/2, 2000)}},
	}
	if m < 1000 {
		variants = append(variants, struct {
			name     string
			strategy schedStrategy
			phases   *phases
		}{"list only", schedSorted, &phases{m, m, m}})
	}
	for _, v := range variants {
		b := Builder{forceStrategy: v.strategy, forcePhases: v.phases}
		got, err := b.Build(seed, m, bs, nil)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("M=%d, %d backends: variant %q differs from the default build (-default +variant):\n%s", m, len(bs), v.name, diff)
		}
	}
}

// TestBuildMatchesTextbook checks equal-weight builds against the naive
// textbook Maglev of bench_test.go, an independent implementation of the
// same algorithm.
func TestBuildMatchesTextbook(t *testing.T) {
	for _, tc := range []struct {
		m uint32
		n int
	}{{7, 3}, {251, 10}, {4093, 100}, {65521, 1000}} {
		bs := makeBackends(tc.n)
		got, err := Build(testSeed, tc.m, bs)
		if err != nil {
			t.Fatal(err)
		}
		sorted := slices.Clone(bs)
		SortBackends(sorted)
		want := textbookBuild(testSeed, tc.m, sorted)
		for s := range want {
			if bs[got[s]].Addr != sorted[want[s]].Addr {
				t.Fatalf("M=%d N=%d slot %d: Build picked %v, textbook %v", tc.m, tc.n, s, bs[got[s]].Addr, sorted[want[s]].Addr)
			}
		}
	}
}

func TestBuildEmpty(t *testing.T) {
	dst := make([]int32, 10, 300)
	for _, tc := range []struct {
		name string
		bs   []Backend
	}{
		{"no backends", nil},
		{"all weights zero", []Backend{{Addr: netip.MustParseAddrPort("10.0.0.1:80")}, {Addr: netip.MustParseAddrPort("10.0.0.2:80")}}},
	} {
		var b Builder
		got, err := b.Build(testSeed, 251, tc.bs, dst)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if len(got) != 0 || cap(got) != cap(dst) {
			t.Errorf("%s: got len %d cap %d, want dst[:0] (len 0 cap %d)", tc.name, len(got), cap(got), cap(dst))
		}
	}
}

func TestBuildErrors(t *testing.T) {
	ap := netip.MustParseAddrPort
	tests := []struct {
		name string
		m    uint32
		bs   []Backend
		want string
	}{
		{"size 0", 0, makeBackends(1), "table size 0 is too small: want a prime of at least 3; nearest ladder size: 251"},
		{"size 1", 1, makeBackends(1), "table size 1 is too small: want a prime of at least 3; nearest ladder size: 251"},
		{"not prime", 1000, makeBackends(1), "table size 1000 is not prime; nearest ladder sizes: 509, 1021"},
		{"too big", 2000003, makeBackends(1), "table size 2000003 is too large: want a prime of at most 1048573; nearest ladder size: 131071"},
		{"more backends than slots", 7, makeBackends(8), "8 backends with weight > 0 do not fit a table of 7 slots: use a prime table size of at least 8 (ideally 100 times the backend count, e.g. 1021)"},
		{"duplicate", 251, []Backend{{ap("10.0.0.1:80"), 1}, {ap("10.0.0.2:80"), 1}, {ap("10.0.0.1:80"), 0}},
			"backends 0 and 2 have the same address 10.0.0.1:80: list each backend once (IPv4 and IPv4-mapped IPv6 addresses are the same backend)"},
		{"duplicate mapped", 251, []Backend{{ap("[::ffff:10.0.0.1]:80"), 1}, {ap("10.0.0.1:80"), 1}},
			"backends 0 and 1 have the same address 10.0.0.1:80: list each backend once (IPv4 and IPv4-mapped IPv6 addresses are the same backend)"},
		{"invalid address", 251, []Backend{{ap("10.0.0.1:80"), 1}, {netip.AddrPort{}, 1}},
			"backend 1 (invalid AddrPort) has no valid IP address: every backend needs an address and port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Build(testSeed, tt.m, tt.bs)
			if err == nil {
				t.Fatalf("Build succeeded with %d slots, want error %q", len(got), tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %q\nwant %q", err, tt.want)
			}
		})
	}
}

// TestZeroWeightsDoNotCount checks that zero-weight backends do not
// count against the table size.
func TestZeroWeightsDoNotCount(t *testing.T) {
	bs := makeBackends(10)
	for i := 3; i < len(bs); i++ {
		bs[i].Weight = 0
	}
	table, err := Build(testSeed, 7, bs)
	if err != nil {
		t.Fatalf("3 weighted backends of 10 in a 7-slot table: %v", err)
	}
	for s, idx := range table {
		if idx < 0 || idx > 2 {
			t.Errorf("slot %d holds backend %d, which has weight 0", s, idx)
		}
	}
}

func TestBuilderReuseAllocations(t *testing.T) {
	bs := makeBackends(1000)
	weighted := makeBackends(50)
	for i := range weighted {
		weighted[i].Weight = uint32(1 + i%7)
	}
	skewed := makeBackends(500)
	skewed[0].Weight = 1000 // rounds would be mostly idle: sorted schedule
	var b Builder
	var table []int32
	for _, tc := range []struct {
		name string
		bs   []Backend
	}{{"equal", bs}, {"weighted", weighted}, {"skewed", skewed}} {
		var err error
		table, err = b.Build(testSeed, 65521, tc.bs, table)
		if err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(5, func() {
			table, err = b.Build(testSeed, 65521, tc.bs, table)
		})
		if err != nil {
			t.Fatal(err)
		}
		if allocs != 0 {
			t.Errorf("%s: %v allocations per warmed-up Build, want 0", tc.name, allocs)
		}
	}
}

func TestFromLB(t *testing.T) {
	ap := netip.MustParseAddrPort
	in := []lb.Backend{
		{Addr: ap("10.0.0.1:80"), Weight: 3, State: lb.Active},
		{Addr: ap("10.0.0.2:80"), Weight: 2, State: lb.Draining},
		{Addr: ap("10.0.0.3:80"), Weight: 1, State: lb.Disabled},
		{Addr: ap("10.0.0.4:80"), Weight: 0, State: lb.Active},
	}
	want := []Backend{{ap("10.0.0.1:80"), 3}, {ap("10.0.0.2:80"), 0}, {ap("10.0.0.3:80"), 0}, {ap("10.0.0.4:80"), 0}}
	if got := FromLB(nil, in); !slices.Equal(got, want) {
		t.Errorf("FromLB:\n got %v\nwant %v", got, want)
	}
}

func TestSortBackends(t *testing.T) {
	ap := netip.MustParseAddrPort
	bs := []Backend{
		{ap("[2001:db8::1]:80"), 1},
		{ap("10.0.0.2:80"), 1},
		{ap("10.0.0.1:443"), 1},
		{ap("10.0.0.1:80"), 1},
		{ap("[::1]:80"), 1},
	}
	SortBackends(bs)
	var got []string
	for _, b := range bs {
		got = append(got, b.Addr.String())
	}
	// ::1 sorts before ::ffff:0:0/96, which sorts before 2001:db8::/32.
	want := "[::1]:80 10.0.0.1:80 10.0.0.1:443 10.0.0.2:80 [2001:db8::1]:80"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("SortBackends order:\n got %s\nwant %s", s, want)
	}
}

// TestSlotsAreBuildsCounts: Slots predicts, per backend, exactly how many
// slots Build gives it, starved backends (0 slots) included, whatever the
// seed.
func TestSlotsAreBuildsCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 33))
	cases := [][]uint32{
		{1, 4294967295},
		{1, 5000, 5000},
		{1, 1, 1},
		{0, 3, 7},
	}
	for range 40 {
		n := 1 + r.IntN(12)
		ws := make([]uint32, n)
		for i := range ws {
			ws[i] = uint32(r.IntN(3)) * uint32(1+r.IntN(100000))
		}
		cases = append(cases, ws)
	}
	for _, ws := range cases {
		for _, m := range []uint32{251, 1021} {
			bs := makeBackends(len(ws))
			for i, w := range ws {
				bs[i].Weight = w
			}
			slots, err := Slots(m, bs)
			if err != nil {
				t.Fatal(err)
			}
			seed := Seed{byte(len(ws)), byte(m)}
			table, err := Build(seed, m, bs)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]uint32, len(bs))
			for _, i := range table {
				got[i]++
			}
			if !slices.Equal(got, slots) {
				t.Errorf("weights %v, m %d: Build gave %v slots, Slots says %v", ws, m, got, slots)
			}
		}
	}
	slots, _ := Slots(251, []Backend{{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1}, {Addr: netip.MustParseAddrPort("10.0.0.2:80"), Weight: 4294967295}})
	if slots[0] != 0 || slots[1] != 251 {
		t.Errorf("1 next to 4294967295: %v, want [0 251]", slots)
	}
	if _, err := Slots(250, nil); err == nil {
		t.Error("Slots accepted a table size that is not prime")
	}
}
