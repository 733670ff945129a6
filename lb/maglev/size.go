// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"fmt"
	"strconv"
	"strings"
)

// Table size limits. M must be prime so that every skip in [1, M-1] is
// coprime with M and each backend's preference list visits every slot.
const (
	// MinTableSize is the smallest prime for which M-1 > 1, so skips can
	// differ between backends.
	MinTableSize = 3
	// MaxTableSize is the largest prime below 2^20. It bounds the memory of
	// one table (4 MiB of 32-bit slots) and keeps every intermediate
	// product of the quota computation far from 64-bit overflow.
	MaxTableSize = 1048573
)

// Ladder is the list of recommended table sizes, each the largest prime
// below a power of two. Maglev spreads load evenly when M is at least about
// 100 times the backend count, so operators pick the first rung above
// 100×N; error messages suggest rungs near a rejected size.
var Ladder = []uint32{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}

// ValidateSize reports whether m can be a Maglev table size: a prime in
// [MinTableSize, MaxTableSize]. The error names the nearest Ladder sizes.
func ValidateSize(m uint32) error {
	switch {
	case m < MinTableSize:
		return fmt.Errorf("table size %d is too small: want a prime of at least %d; %s", m, MinTableSize, nearestLadder(m))
	case m > MaxTableSize:
		return fmt.Errorf("table size %d is too large: want a prime of at most %d; %s", m, MaxTableSize, nearestLadder(m))
	case !IsPrime(m):
		return fmt.Errorf("table size %d is not prime; %s", m, nearestLadder(m))
	}
	return nil
}

// nearestLadder names the Ladder rungs just below and above m (one of them
// when m is outside the ladder), for error messages.
func nearestLadder(m uint32) string {
	var below, above uint32
	for _, l := range Ladder {
		if l <= m {
			below = l
		}
		if l > m && above == 0 {
			above = l
		}
	}
	var s []string
	for _, l := range []uint32{below, above} {
		if l != 0 {
			s = append(s, strconv.FormatUint(uint64(l), 10))
		}
	}
	if len(s) == 1 {
		return "nearest ladder size: " + s[0]
	}
	return "nearest ladder sizes: " + strings.Join(s, ", ")
}

// IsPrime reports whether n is prime. Trial division by 6k±1 is exact and
// needs at most ~22k divisions for any uint32, far below the cost of the
// table build it guards.
func IsPrime(n uint32) bool {
	if n < 4 {
		return n >= 2
	}
	if n%2 == 0 || n%3 == 0 {
		return false
	}
	for d := uint64(5); d*d <= uint64(n); d += 6 {
		if uint64(n)%d == 0 || uint64(n)%(d+2) == 0 {
			return false
		}
	}
	return true
}
