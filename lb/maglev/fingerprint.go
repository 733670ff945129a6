// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
)

// fingerprintTag separates these digests from any other SHA-256 use of the
// seed and names the algorithm version, so a future table algorithm cannot
// produce a matching fingerprint by accident.
const fingerprintTag = "l4lb maglev table v1\x00"

// Fingerprint returns 16 hex digits identifying the table that seed, m and
// backends produce, so operators can compare LB boxes (status output,
// metrics) without exposing the seed: the seed only enters a SHA-256 digest,
// which cannot be reversed to it.
//
// Only what decides the table goes in: the seed, m, and the backends with
// Weight > 0 with their weights, in canonical order. Boxes that list
// backends in different orders, or that also list a zero-weight backend,
// get the same fingerprint because they route every flow alike. Equal
// fingerprints mean equal tables; the converse does not hold for weights
// that differ only by a common factor (1,2 and 2,4 give one table and two
// fingerprints).
func Fingerprint(seed Seed, m uint32, backends []Backend) string {
	type entry struct {
		key    [18]byte
		weight uint32
	}
	es := make([]entry, 0, len(backends))
	for _, b := range backends {
		if b.Weight > 0 {
			es = append(es, entry{BackendKey(b.Addr), b.Weight})
		}
	}
	slices.SortFunc(es, func(a, b entry) int {
		return bytes.Compare(a.key[:], b.key[:])
	})

	h := sha256.New()
	h.Write([]byte(fingerprintTag))
	h.Write(seed[:])
	var buf [22]byte
	binary.BigEndian.PutUint32(buf[:4], m)
	binary.BigEndian.PutUint32(buf[4:8], uint32(len(es)))
	h.Write(buf[:8])
	for _, e := range es {
		copy(buf[:18], e.key[:])
		binary.BigEndian.PutUint32(buf[18:], e.weight)
		h.Write(buf[:])
	}
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:8])
}
