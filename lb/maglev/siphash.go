// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"encoding/binary"
	"math/bits"
)

// SipHash24 returns the 64-bit SipHash-2-4 of msg under key. k0 is the
// little-endian uint64 of key[0:8] and k1 that of key[8:16], as in the
// reference implementation, so the result matches the published test vectors
// and the C datapath.
func SipHash24(key Seed, msg []byte) uint64 {
	k0 := binary.LittleEndian.Uint64(key[0:8])
	k1 := binary.LittleEndian.Uint64(key[8:16])
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573

	n := len(msg)
	for len(msg) >= 8 {
		m := binary.LittleEndian.Uint64(msg)
		v3 ^= m
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= m
		msg = msg[8:]
	}

	// The last block holds the message length (mod 256) in its top byte and
	// the 0..7 trailing message bytes, little endian, below it.
	last := uint64(n) << 56
	for i := len(msg) - 1; i >= 0; i-- {
		last |= uint64(msg[i]) << (8 * uint(i))
	}
	return sipFinish(v0, v1, v2, v3, last)
}

// sipFinish absorbs the length block and runs the four finalization rounds.
func sipFinish(v0, v1, v2, v3, last uint64) uint64 {
	v3 ^= last
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= last
	v2 ^= 0xff
	for range 4 {
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	}
	return v0 ^ v1 ^ v2 ^ v3
}

// sipRound is one SipRound: the add-rotate-xor mixing of the four state
// words, exactly as in the paper (rotations 13, 32, 16, 21, 17, 32).
func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}
