// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"testing"
)

func TestIsPrime(t *testing.T) {
	// Compare with a sieve over every n below the limit.
	const limit = 1 << 18
	composite := make([]bool, limit)
	for i := 2; i*i < limit; i++ {
		if !composite[i] {
			for j := i * i; j < limit; j += i {
				composite[j] = true
			}
		}
	}
	for n := range uint32(limit) {
		if want := n >= 2 && !composite[n]; IsPrime(n) != want {
			t.Fatalf("IsPrime(%d) = %v, want %v", n, !want, want)
		}
	}
	for _, tc := range []struct {
		n    uint32
		want bool
	}{
		{MaxTableSize, true},
		{1 << 20, false},
		{1048571, true}, // the prime before MaxTableSize
		{1048575, false},
		{4294967291, true}, // largest 32-bit prime
		{4294967295, false},
		{65537, true},
		{65521 * 65519, false}, // product of two primes near 2^16
	} {
		if got := IsPrime(tc.n); got != tc.want {
			t.Errorf("IsPrime(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestSizeConstants(t *testing.T) {
	for _, m := range append([]uint32{MinTableSize, MaxTableSize}, Ladder...) {
		if err := ValidateSize(m); err != nil {
			t.Errorf("ValidateSize(%d): %v", m, err)
		}
	}
	for i := 1; i < len(Ladder); i++ {
		if Ladder[i] <= Ladder[i-1] {
			t.Errorf("Ladder is not increasing at %d: %d after %d", i, Ladder[i], Ladder[i-1])
		}
	}
	// MaxTableSize is the largest prime below 2^20.
	for n := uint32(MaxTableSize + 1); n < 1<<20; n++ {
		if IsPrime(n) {
			t.Errorf("%d is prime and below 2^20, so MaxTableSize %d is not the largest", n, MaxTableSize)
		}
	}
}

func TestValidateSizeErrors(t *testing.T) {
	tests := []struct {
		m    uint32
		want string
	}{
		{0, "table size 0 is too small: want a prime of at least 3; nearest ladder size: 251"},
		{1, "table size 1 is too small: want a prime of at least 3; nearest ladder size: 251"},
		{2, "table size 2 is too small: want a prime of at least 3; nearest ladder size: 251"},
		{4, "table size 4 is not prime; nearest ladder size: 251"},
		{1000, "table size 1000 is not prime; nearest ladder sizes: 509, 1021"},
		{1021 * 3, "table size 3063 is not prime; nearest ladder sizes: 2039, 4093"},
		{65536, "table size 65536 is not prime; nearest ladder sizes: 65521, 131071"},
		{200000, "table size 200000 is not prime; nearest ladder size: 131071"},
		{1 << 20, "table size 1048576 is too large: want a prime of at most 1048573; nearest ladder size: 131071"},
		{4294967291, "table size 4294967291 is too large: want a prime of at most 1048573; nearest ladder size: 131071"},
	}
	for _, tt := range tests {
		err := ValidateSize(tt.m)
		if err == nil {
			t.Errorf("ValidateSize(%d) = nil, want %q", tt.m, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ValidateSize(%d):\n got %q\nwant %q", tt.m, err, tt.want)
		}
	}
}

func TestModHelpers(t *testing.T) {
	for _, m := range []uint32{3, 7, 251, 65521, 65537, MaxTableSize} {
		magic := fastModMagic(m)
		for _, a := range []uint64{0, 1, uint64(m) - 1, uint64(m), uint64(m) + 1, 8*uint64(m) - 1, 1<<40 - 1, uint64(m-1) * uint64(m-1)} {
			if got, want := fastMod(a, magic, uint64(m)), a%uint64(m); got != want {
				t.Errorf("fastMod(%d, m=%d) = %d, want %d", a, m, got, want)
			}
		}
		for _, x := range []uint32{1, 2, m / 2, m - 1} {
			if x == 0 {
				continue
			}
			inv := modInverse(x, m)
			if uint64(x)*uint64(inv)%uint64(m) != 1 {
				t.Errorf("modInverse(%d, %d) = %d, and %d*%d mod %d != 1", x, m, inv, x, inv, m)
			}
		}
		for _, c := range [][2]uint32{{0, 0}, {m - 1, 1}, {m - 1, m - 1}, {m / 2, m / 2}, {1, m - 2}} {
			if got, want := addMod(c[0], c[1], m), (c[0]+c[1])%m; got != want {
				t.Errorf("addMod(%d, %d, %d) = %d, want %d", c[0], c[1], m, got, want)
			}
		}
	}
}
