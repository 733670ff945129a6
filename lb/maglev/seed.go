// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"encoding/hex"
	"fmt"
)

// Seed is the 16-byte SipHash key shared by every LB box of a deployment
// (config key maglev.hash_seed). It decides both where backends sit in the
// table and which slot a flow hashes to, so boxes with different seeds send
// the same flow to different backends.
type Seed [16]byte

// seedHexLen is the length of a seed written as hex.
const seedHexLen = 2 * len(Seed{})

// ParseSeed parses a seed written as exactly 32 hex digits (upper or lower
// case), seed byte 0 first, e.g. the output of `openssl rand -hex 16`.
func ParseSeed(s string) (Seed, error) {
	var seed Seed
	if s == "" {
		return seed, fmt.Errorf("hash seed is empty: want %d hex digits (16 bytes), e.g. from `openssl rand -hex 16`", seedHexLen)
	}
	// Check characters before the length so that "0x…" or a stray quote
	// is reported as what it is rather than as a length problem.
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return seed, fmt.Errorf("hash seed has invalid character %q at position %d: want exactly %d hex digits (0-9, a-f), without prefix or separators", rune(s[i]), i+1, seedHexLen)
		}
	}
	if len(s) != seedHexLen {
		return seed, fmt.Errorf("hash seed has %d hex digits, want exactly %d (16 bytes), e.g. from `openssl rand -hex 16`", len(s), seedHexLen)
	}
	if _, err := hex.Decode(seed[:], []byte(s)); err != nil {
		// Unreachable after the checks above; kept so a future change to
		// them cannot silently produce a zero seed.
		return Seed{}, fmt.Errorf("hash seed %q: %w", s, err)
	}
	return seed, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// String returns the seed as 32 lower-case hex digits, the form ParseSeed
// reads. Callers that log it should remember that the seed is the only secret
// protecting backend placement from being predicted by clients; prefer
// Fingerprint in logs and status output.
func (s Seed) String() string {
	return hex.EncodeToString(s[:])
}

// IsZero reports whether the seed is all zeros, which is what an unset seed
// looks like; the daemon refuses to start with it outside development mode.
func (s Seed) IsZero() bool {
	return s == Seed{}
}
