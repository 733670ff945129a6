// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"math/rand/v2"
	"testing"

	"github.com/l4lb/l4lb/lb/reconciler"
)

// naiveDigest is the hash of bpf/digest.c taken word by word over the
// chunks tableChunks writes, the way the kernel program reads them.
func naiveDigest(table []reconciler.BackendID) (uint32, [digestLanes]uint64) {
	_, vals := tableChunks(table)
	var lanes [digestLanes]uint64
	for j := range lanes {
		lanes[j] = digestBasis
	}
	p := 0
	for _, c := range vals {
		for k := 0; k < maglevChunk; k += 2 {
			v := uint64(c[k]) | uint64(c[k+1])<<32
			lanes[p%digestLanes] = (lanes[p%digestLanes] ^ v) * digestPrime
			p++
		}
	}
	return uint32(len(vals)), lanes
}

// TestTableDigestLayout checks tableDigest's unrolled loop against the
// word-by-word hash of the chunks, for every table length around the
// chunk and unroll boundaries and for the default size.
func TestTableDigestLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range append(seq(0, 70), 251, 1021, 16381) {
		table := make([]reconciler.BackendID, n)
		for i := range table {
			table[i] = reconciler.BackendID(r.Uint32())
		}
		gotC, gotL := tableDigest(table)
		wantC, wantL := naiveDigest(table)
		if gotC != wantC || gotL != wantL {
			t.Errorf("%d slots: tableDigest = %d chunks %x, the chunks hash to %d %x", n, gotC, gotL, wantC, wantL)
		}
	}
}

func seq(lo, hi int) []int {
	var out []int
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// TestTableDigestSeesOneSlot checks that changing any one slot, or the
// size, changes the digest: each step of a lane is a bijection.
func TestTableDigestSeesOneSlot(t *testing.T) {
	table := make([]reconciler.BackendID, 97)
	for i := range table {
		table[i] = reconciler.BackendID(i % 7)
	}
	_, base := tableDigest(table)
	for i := range table {
		changed := append([]reconciler.BackendID(nil), table...)
		changed[i]++
		if _, l := tableDigest(changed); l == base {
			t.Errorf("slot %d changed, digest the same", i)
		}
	}
	if _, l := tableDigest(table[:96]); l == base {
		t.Error("one slot fewer (same chunk count), digest the same")
	}
}
