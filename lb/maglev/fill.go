// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"math"
	"math/bits"
)

// The fill of the package documentation is done in two steps that give the
// same result as running it literally:
//
//   - schedule decides which backend makes each of the M claims. The
//     weighted round robin depends only on weights and quotas, never on
//     which slots are taken, so it can run first and write the claim order
//     into seq.
//   - claimAll walks seq and lets each backend take the first free slot of
//     its preference list. This is where the time goes, so it switches
//     between four ways of finding that slot as the table fills up.

// schedStrategy selects how schedule replays the rounds; both produce the
// same order.
type schedStrategy uint8

const (
	schedAuto schedStrategy = iota
	schedRounds
	schedSorted
)

// roundCostFactor chooses between the strategies. Replaying rounds costs
// about a nanosecond per backend per round while it is still filling;
// sorting the claims costs a few nanoseconds per slot whatever the weights.
// Measured with 1000 backends in 65537 slots, the two break even near two
// round steps per slot (weights 1..8 need 1.8).
const roundCostFactor = 2

// schedule writes the claim order into b.seq: len(seq) == m, and member i
// appears quota_i times.
func (b *Builder) schedule(m uint32) {
	var wmax uint32
	equal := true
	for i := range b.members {
		wmax = max(wmax, b.members[i].weight)
		equal = equal && b.members[i].weight == b.members[0].weight
	}
	if cap(b.seq) < int(m) {
		b.seq = make([]uint32, 0, m)
	}
	b.seq = b.seq[:0]
	strategy := b.forceStrategy
	if equal && strategy == schedAuto {
		b.scheduleEqual()
		return
	}
	if strategy == schedAuto {
		strategy = schedRounds
		// Backend i takes part in every round up to that of its last
		// claim, ceil(quota_i*wmax/w_i).
		var steps uint64
		limit := uint64(m) * roundCostFactor
		for i := range b.members {
			mb := &b.members[i]
			steps += (uint64(mb.quota)*uint64(wmax) + uint64(mb.weight) - 1) / uint64(mb.weight)
			if steps > limit {
				strategy = schedSorted
				break
			}
		}
	}
	if strategy == schedSorted {
		b.scheduleSorted(m, wmax)
	} else {
		b.scheduleRounds(wmax)
	}
}

// scheduleEqual is scheduleRounds for equal weights, where every backend
// claims once per round: full rounds of everyone, then one partial round of
// the backends that got a leftover slot, which are the first ones.
func (b *Builder) scheduleEqual() {
	seq := b.seq
	ms := b.members
	// Quotas differ by at most one, and the last backend never gets a
	// leftover slot (there are fewer leftovers than backends).
	floor := ms[len(ms)-1].quota
	for range floor {
		for i := range ms {
			seq = append(seq, uint32(i))
		}
	}
	for i := range ms {
		if ms[i].quota > floor {
			seq = append(seq, uint32(i))
		}
	}
	b.seq = seq
}

// scheduleRounds runs the rounds literally over the backends that still
// have slots to claim.
func (b *Builder) scheduleRounds(wmax uint32) {
	seq := b.seq
	active := b.active[:0]
	for i := range b.members {
		if b.members[i].quota > 0 {
			active = append(active, uint32(i))
		}
	}
	for len(active) > 0 {
		kept := active[:0]
		for _, pos := range active {
			mb := &b.members[pos]
			mb.credit += uint64(mb.weight)
			// credit < 2*wmax here and each claim removes wmax, so a
			// backend claims at most once per round.
			if mb.credit >= uint64(wmax) {
				mb.credit -= uint64(wmax)
				mb.filled++
				seq = append(seq, pos)
			}
			if mb.filled < mb.quota {
				kept = append(kept, pos)
			}
		}
		active = kept
	}
	b.active = active
	b.seq = seq
}

// scheduleSorted produces the order of scheduleRounds without visiting
// idle backends, at a cost that does not depend on the weights: backend
// i's k-th claim happens in round ceil(k*wmax/w_i), and the claims of one
// round go in canonical order, so listing every claim as (round, position)
// and sorting the list replays the rounds exactly. It keeps very uneven
// weights (say 1 and 10^9) from costing billions of empty rounds.
//
// Claims are packed as round<<20 | position. A backend with a slot to
// claim has quota_i <= M*w_i/W + 1, so its last round is at most
// M*wmax/W + wmax/w_i + 1 < 2^20 + 2^32 + 1 and the packed value stays
// below 2^54. Claims are generated in canonical order and the sort is
// stable, so only the round bits need sorting.
func (b *Builder) scheduleSorted(m, wmax uint32) {
	if cap(b.keys) < int(m) {
		b.keys = make([]uint64, 0, m)
		b.keysTmp = make([]uint64, m)
	}
	keys := b.keys[:0]
	var last uint64
	for i := range b.members {
		mb := &b.members[i]
		w := uint64(mb.weight)
		// round_k = ceil(k*wmax/w), kept as quotient and remainder of
		// k*wmax/w and stepped by those of wmax/w, to spare a division
		// per claim.
		stepQ, stepR := uint64(wmax)/w, uint64(wmax)%w
		var q, r, round uint64
		for range mb.quota {
			q += stepQ
			r += stepR
			if r >= w {
				r -= w
				q++
			}
			round = q
			if r != 0 {
				round++
			}
			keys = append(keys, round<<20|uint64(i))
		}
		mb.filled = mb.quota
		last = max(last, round)
	}
	keys = radixSort(keys, b.keysTmp[:len(keys)], &b.counts, 20, 20+uint(bits.Len64(last)))
	seq := b.seq
	for _, k := range keys {
		seq = append(seq, uint32(k&(1<<20-1)))
	}
	b.seq = seq
}

const radixBits = 11

// radixSort sorts keys stably by bits [lo, hi) with an LSD radix sort, using
// tmp (same length) as scratch, and returns whichever of the two holds the
// result.
func radixSort(keys, tmp []uint64, counts *[1 << radixBits]int, lo, hi uint) []uint64 {
	const mask = 1<<radixBits - 1
	for shift := lo; shift < hi; shift += radixBits {
		clear(counts[:])
		for _, k := range keys {
			counts[k>>shift&mask]++
		}
		sum := 0
		for d, c := range counts {
			counts[d] = sum
			sum += c
		}
		for _, k := range keys {
			d := k >> shift & mask
			tmp[counts[d]] = k
			counts[d]++
		}
		keys, tmp = tmp, keys
	}
	return keys
}

// phases says how many slots are still free when claimAll switches to the
// next way of searching. With F slots free a search visits about M/F
// preferences, most of them taken:
//
//   - F > batch4At: one preference at a time. The first one is nearly
//     always free, so anything more is wasted work.
//   - batch8At < F <= batch4At: four at a time, with one branch per four.
//     Whether a given slot is taken is now a coin toss that the branch
//     predictor loses, so testing several before branching is cheaper.
//   - listAt < F <= batch8At: eight at a time.
//   - F <= listAt: the endgame. Probing would cost M/F steps; instead each
//     free slot's distance along the preference list is computed directly,
//     F steps per claim, so the switch belongs near F = sqrt(M).
//
// The thresholds were tuned with BenchmarkBuild on a 2-core AMD EPYC VM;
// any choice gives the same table.
type phases struct {
	batch4At, batch8At, listAt uint32
}

func phasesFor(m uint32) phases {
	var p phases
	p.listAt = uint32(math.Sqrt(float64(m)))
	p.batch8At = max(m/8*3, p.listAt)   // table 5/8 full
	p.batch4At = max(m/4*3, p.batch8At) // table 1/4 full
	return p
}

// claimAll lets every claim of b.seq take its backend's first free
// preference, filling dst.
func (b *Builder) claimAll(m uint32, dst []int32) {
	words := (int(m) + 63) / 64
	if cap(b.taken) < words {
		b.taken = make([]uint64, words)
	}
	b.taken = b.taken[:words]
	clear(b.taken)
	b.magic = fastModMagic(m)
	for i := range b.members {
		mb := &b.members[i]
		mb.inv = 0
		mb.skip2 = addMod(mb.skip, mb.skip, m)
		mb.skip4 = addMod(mb.skip2, mb.skip2, m)
	}
	ph := phasesFor(m)
	if b.forcePhases != nil {
		ph = *b.forcePhases
	}

	taken, ms, seq, magic := b.taken, b.members, b.seq, b.magic
	t := 0
	// Each phase is its own loop so that the search is inlined and no claim
	// pays for a phase test. See phases for why the searches differ.
	for end := int(m - ph.batch4At); t < end; t++ {
		mb := &ms[seq[t]]
		p, s := mb.next, mb.skip
		for taken[p>>6]&(1<<(p&63)) != 0 {
			p = addMod(p, s, m)
		}
		taken[p>>6] |= 1 << (p & 63)
		dst[p] = mb.idx
		mb.next = addMod(p, s, m)
	}
	for end := int(m - ph.batch8At); t < end; t++ {
		mb := &ms[seq[t]]
		p0, s1, s2 := mb.next, mb.skip, mb.skip2
		var p uint32
		for {
			p1 := addMod(p0, s1, m)
			p2 := addMod(p0, s2, m)
			p3 := addMod(p1, s2, m)
			used := taken[p0>>6]>>(p0&63)&1 |
				taken[p1>>6]>>(p1&63)&1<<1 |
				taken[p2>>6]>>(p2&63)&1<<2 |
				taken[p3>>6]>>(p3&63)&1<<3
			if used != 0xf {
				// The k-th preference from p0, k = the first zero bit.
				k := uint64(bits.TrailingZeros64(^used))
				p = uint32(fastMod(uint64(p0)+k*uint64(s1), magic, uint64(m)))
				break
			}
			p0 = addMod(p2, s2, m)
		}
		taken[p>>6] |= 1 << (p & 63)
		dst[p] = mb.idx
		mb.next = addMod(p, s1, m)
	}
	for end := int(m - ph.listAt); t < end; t++ {
		mb := &ms[seq[t]]
		p0, s1, s2, s4 := mb.next, mb.skip, mb.skip2, mb.skip4
		var p uint32
		for {
			p1 := addMod(p0, s1, m)
			p2 := addMod(p0, s2, m)
			p3 := addMod(p1, s2, m)
			p4 := addMod(p0, s4, m)
			p5 := addMod(p1, s4, m)
			p6 := addMod(p2, s4, m)
			p7 := addMod(p3, s4, m)
			used := taken[p0>>6]>>(p0&63)&1 |
				taken[p1>>6]>>(p1&63)&1<<1 |
				taken[p2>>6]>>(p2&63)&1<<2 |
				taken[p3>>6]>>(p3&63)&1<<3 |
				taken[p4>>6]>>(p4&63)&1<<4 |
				taken[p5>>6]>>(p5&63)&1<<5 |
				taken[p6>>6]>>(p6&63)&1<<6 |
				taken[p7>>6]>>(p7&63)&1<<7
			if used != 0xff {
				k := uint64(bits.TrailingZeros64(^used))
				p = uint32(fastMod(uint64(p0)+k*uint64(s1), magic, uint64(m)))
				break
			}
			p0 = addMod(p4, s4, m)
		}
		taken[p>>6] |= 1 << (p & 63)
		dst[p] = mb.idx
		mb.next = addMod(p, s1, m)
	}
	if t < int(m) {
		b.collectFree(m)
		for ; t < int(m); t++ {
			b.claimFromList(&ms[seq[t]], m, dst)
		}
	}
}

// collectFree lists the free slots for the endgame.
func (b *Builder) collectFree(m uint32) {
	b.free = b.free[:0]
	for w, used := range b.taken {
		for free := ^used; free != 0; free &= free - 1 {
			s := uint32(w*64 + bits.TrailingZeros64(free))
			if s >= m {
				break
			}
			b.free = append(b.free, s)
		}
	}
}

// claimFromList gives mb the free slot it would reach first by probing.
// Every slot mb's search has walked past is taken for good, so no free slot
// lies behind mb.next, and the first free slot is the one at the smallest
// distance (f - next) * skip⁻¹ mod M along the preference list.
func (b *Builder) claimFromList(mb *member, m uint32, dst []int32) {
	if mb.inv == 0 {
		mb.inv = modInverse(mb.skip, m)
	}
	m64, next, inv, magic := uint64(m), uint64(mb.next), uint64(mb.inv), b.magic
	best := ^uint64(0)
	for i, f := range b.free {
		x := uint64(f) + m64 - next
		if x >= m64 {
			x -= m64
		}
		// Distances are distinct and below 2^20, as are list indexes, so
		// packing both makes the minimum unique and branch-free.
		best = min(best, fastMod(x*inv, magic, m64)<<20|uint64(i))
	}
	i := int(best & (1<<20 - 1))
	f := b.free[i]
	b.free[i] = b.free[len(b.free)-1]
	b.free = b.free[:len(b.free)-1]

	b.taken[f>>6] |= 1 << (f & 63)
	dst[f] = mb.idx
	mb.next = addMod(f, mb.skip, m)
}

// addMod returns (a + s) mod m for a, s < m <= MaxTableSize. It has no
// branch on purpose: whether a preference list wraps is random at every
// step, and the compiler turns the obvious if-version into a jump that the
// branch predictor misses half the time.
func addMod(a, s, m uint32) uint32 {
	x := a + s - m
	return x + m&uint32(int32(x)>>31)
}

// modInverse returns x⁻¹ mod m for 0 < x < m, m prime (extended Euclid).
func modInverse(x, m uint32) uint32 {
	r0, r1 := int64(m), int64(x)
	t0, t1 := int64(0), int64(1)
	for r1 != 0 {
		q := r0 / r1
		r0, r1 = r1, r0-q*r1
		t0, t1 = t1, t0-q*t1
	}
	if t0 < 0 {
		t0 += int64(m)
	}
	return uint32(t0)
}

// fastModMagic returns the constant fastMod needs for divisor m.
func fastModMagic(m uint32) uint64 {
	return ^uint64(0)/uint64(m) + 1
}

// fastMod returns a % m without a division (Lemire, Kaser and Kurz, "Faster
// remainder by direct computation", 2019). It is exact when
// a < 2^(64 - bits.Len(m)); callers pass a < 2^40 with m < 2^20.
func fastMod(a, magic, m uint64) uint64 {
	hi, _ := bits.Mul64(magic*a, m)
	return hi
}
