// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"net/netip"
	"testing"
)

// fuzzSizes are the table sizes FuzzBuild picks from: tiny primes where
// every backend fights for slots, and ladder sizes.
var fuzzSizes = []uint32{3, 5, 7, 11, 13, 31, 251, 509, 1021, 4093}

// FuzzBuild decodes a size, a seed byte and a list of backends from the
// input and checks the invariants every table must hold.
//
// Input: byte 0 picks the size, byte 1 the seed, then 5 bytes per backend:
// last address byte, port byte, and a 3-byte weight whose top bits select
// ranges from 0 to 2^24 so that zero, equal and wildly uneven weights all
// occur.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{2, 0, 1, 80, 1, 0, 0, 2, 80, 1, 0, 0, 3, 80, 1, 0, 0})
	f.Add([]byte{6, 9, 1, 80, 0, 0, 10, 2, 80, 0, 0, 1, 3, 81, 0, 0, 0, 4, 80, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 1, 1, 1, 1, 0, 0, 2, 2, 1, 0, 0, 3, 3, 1, 0, 0, 4, 4, 1, 0, 0})
	f.Add([]byte{9, 3, 7, 7, 0x80, 0, 1, 7, 7, 0x80, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		m := fuzzSizes[int(data[0])%len(fuzzSizes)]
		var seed Seed
		for i := range seed {
			seed[i] = data[1] + byte(i)*37
		}
		var bs []Backend
		for rest := data[2:]; len(rest) >= 5 && len(bs) < 300; rest = rest[5:] {
			var a netip.Addr
			if rest[0]&1 == 0 {
				a = netip.AddrFrom4([4]byte{10, 0, 0, rest[0]})
			} else {
				a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: rest[0]})
			}
			w := uint32(rest[2])<<16 | uint32(rest[3])<<8 | uint32(rest[4])
			w >>= uint(rest[2]>>6) * 7 // spread: up to 2^24, 2^17, 2^10 or 2^3
			bs = append(bs, Backend{Addr: netip.AddrPortFrom(a, uint16(rest[1])), Weight: w})
		}

		table, err := Build(seed, m, bs)
		dup, eligible := false, 0
		seen := map[netip.AddrPort]bool{}
		for _, b := range bs {
			dup = dup || seen[b.Addr]
			seen[b.Addr] = true
			if b.Weight > 0 {
				eligible++
			}
		}
		switch {
		case dup || eligible > int(m):
			if err == nil {
				t.Fatalf("Build accepted %d backends (duplicates: %v, eligible %d) for M=%d", len(bs), dup, eligible, m)
			}
			return
		case err != nil:
			t.Fatalf("Build(M=%d, %d backends): %v", m, len(bs), err)
		case eligible == 0:
			if len(table) != 0 {
				t.Fatalf("no eligible backend, but the table has %d slots", len(table))
			}
			return
		}

		if len(table) != int(m) {
			t.Fatalf("table has %d slots, want %d", len(table), m)
		}
		got := make([]int, len(bs))
		for s, idx := range table {
			if idx < 0 || int(idx) >= len(bs) || bs[idx].Weight == 0 {
				t.Fatalf("slot %d holds %d, which is not an eligible backend index", s, idx)
			}
			got[idx]++
		}
		want := referenceQuotas(m, bs)
		for i := range bs {
			if got[i] != want[i] {
				t.Fatalf("backend %d (weight %d) owns %d slots, want quota %d (all weights %v)", i, bs[i].Weight, got[i], want[i], weightsOf(bs))
			}
		}
		if m <= 1021 {
			compareVariants(t, seed, m, bs)
		}
	})
}

// referenceQuotas recomputes the quota rule from the package documentation
// by the most direct route, in caller order: floor shares, then one extra
// slot each for the largest remainders, ties to the smaller BackendKey.
func referenceQuotas(m uint32, bs []Backend) []int {
	var total uint64
	for _, b := range bs {
		total += uint64(b.Weight)
	}
	q := make([]int, len(bs))
	left := int(m)
	for i, b := range bs {
		q[i] = int(uint64(m) * uint64(b.Weight) / total)
		left -= q[i]
	}
	taken := make([]bool, len(bs))
	for range left {
		best := -1
		for i, b := range bs {
			if b.Weight == 0 || taken[i] {
				continue
			}
			if best < 0 || better(m, total, b, bs[best]) {
				best = i
			}
		}
		taken[best] = true
		q[best]++
	}
	return q
}

// better reports whether a comes before b for a leftover slot.
func better(m uint32, total uint64, a, b Backend) bool {
	ra := uint64(m) * uint64(a.Weight) % total
	rb := uint64(m) * uint64(b.Weight) % total
	if ra != rb {
		return ra > rb
	}
	ka, kb := BackendKey(a.Addr), BackendKey(b.Addr)
	return string(ka[:]) < string(kb[:])
}

func weightsOf(bs []Backend) []uint32 {
	ws := make([]uint32, len(bs))
	for i, b := range bs {
		ws[i] = b.Weight
	}
	return ws
}
