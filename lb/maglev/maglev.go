// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/lb"
)

// Backend is one input of a table build: where the backend listens and its
// relative share of slots. Weight 0 keeps the backend out of the table
// (draining, disabled or unhealthy) while leaving its index valid.
type Backend struct {
	Addr   netip.AddrPort
	Weight uint32
}

// FromLB appends one Backend per element of bs to dst, at the same
// positions, so table entries index bs as well. Only Active backends keep
// their weight: draining and disabled ones get no new flows, so they get
// weight 0 (their established flows live in the connection table, not here).
func FromLB(dst []Backend, bs []lb.Backend) []Backend {
	for _, b := range bs {
		w := b.Weight
		if b.State != lb.Active {
			w = 0
		}
		dst = append(dst, Backend{Addr: b.Addr, Weight: w})
	}
	return dst
}

// BackendKey returns the 18-byte canonical key of a backend address: the
// address as 16 bytes (IPv4 as IPv4-mapped IPv6, zone dropped) followed by
// the port, big endian. It is both the hash input that places the backend
// and its sort key; see the package documentation (MUST NOT CHANGE).
func BackendKey(a netip.AddrPort) [18]byte {
	var k [18]byte
	ip := a.Addr().As16()
	copy(k[:16], ip[:])
	binary.BigEndian.PutUint16(k[16:], a.Port())
	return k
}

// SortBackends sorts bs into canonical order, by BackendKey bytes. Build
// does not need it (it orders internally); it is for output that should
// list backends the way the table was computed.
func SortBackends(bs []Backend) {
	slices.SortStableFunc(bs, func(a, b Backend) int {
		ka, kb := BackendKey(a.Addr), BackendKey(b.Addr)
		return bytes.Compare(ka[:], kb[:])
	})
}

// keyed is a backend reduced to its canonical key, split into integers so
// that sorting compares words instead of bytes. Comparing (hi, lo, port) as
// unsigned integers is the same order as comparing the 18 key bytes.
type keyed struct {
	hi, lo uint64
	port   uint16
	idx    int32 // position in the caller's slice
}

func compareKeyed(a, b keyed) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(a.lo, b.lo); c != 0 {
		return c
	}
	return cmp.Compare(a.port, b.port)
}

// member is the state of one eligible backend during a build.
type member struct {
	// Claiming: the preference list and where the next search starts.
	next  uint32
	skip  uint32
	skip2 uint32 // 2*skip mod M, for batched probing
	skip4 uint32 // 4*skip mod M
	inv   uint32 // skip⁻¹ mod M for the endgame, 0 until needed
	idx   int32  // position in the caller's slice

	// Scheduling: how many slots, how many so far, and the round-robin
	// credit of the package documentation.
	weight uint32
	quota  uint32
	filled uint32
	credit uint64
}

// remainder orders backends for the leftover slots.
type remainder struct {
	rem uint64
	pos uint32 // canonical position
}

// Builder computes Maglev tables and keeps its scratch buffers between
// builds, so rebuilding tables of similar sizes allocates nothing. The zero
// value is ready to use. A Builder is not safe for concurrent use; give each
// goroutine its own.
type Builder struct {
	sorted  []keyed
	members []member
	rems    []remainder
	active  []uint32
	keys    []uint64 // scheduleSorted's claims
	keysTmp []uint64
	counts  [1 << radixBits]int
	seq     []uint32 // claim order: seq[t] is the member making claim t
	taken   []uint64 // bitset of claimed slots
	free    []uint32 // free slots, during the endgame
	magic   uint64   // fastModMagic(M)

	// Tests force the scheduling strategy and the claim phases to check
	// that every variant builds the same table.
	forceStrategy schedStrategy
	forcePhases   *phases
}

// Build fills dst with the table of size m for backends under seed and
// returns it. dst is reused when its capacity allows and grown otherwise;
// slot s holds the index into backends of the backend that owns s. Only
// backends with Weight > 0 get slots; if there is none, Build returns
// dst[:0] and no error. The result depends only on seed, m and the set of
// (address, weight) pairs, not on the order of backends.
//
// Build fails when m is not a valid size (see ValidateSize), when two
// backends share an address (see BackendKey), when an address is invalid,
// or when more backends have a weight than the table has slots.
func (b *Builder) Build(seed Seed, m uint32, backends []Backend, dst []int32) ([]int32, error) {
	if err := ValidateSize(m); err != nil {
		return dst[:0], err
	}
	if len(backends) > 1<<31-1 {
		return dst[:0], fmt.Errorf("%d backends exceed the %d a table can index", len(backends), 1<<31-1)
	}
	if err := b.prepare(seed, m, backends); err != nil {
		return dst[:0], err
	}
	if len(b.members) == 0 {
		return dst[:0], nil
	}
	b.assignQuotas(m)
	b.schedule(m)
	if cap(dst) < int(m) {
		dst = make([]int32, m)
	}
	dst = dst[:m]
	b.claimAll(m, dst)
	return dst, nil
}

// Build is Builder.Build with a fresh Builder and a new table, for callers
// that build rarely (l4lbctl, tests).
func Build(seed Seed, m uint32, backends []Backend) ([]int32, error) {
	var b Builder
	return b.Build(seed, m, backends, nil)
}

// prepare validates backends and leaves b.members holding the eligible ones
// in canonical order with their permutations.
func (b *Builder) prepare(seed Seed, m uint32, backends []Backend) error {
	b.sorted = b.sorted[:0]
	for i, be := range backends {
		if !be.Addr.Addr().IsValid() {
			return fmt.Errorf("backend %d (%v) has no valid IP address: every backend needs an address and port", i, be.Addr)
		}
		k := BackendKey(be.Addr)
		b.sorted = append(b.sorted, keyed{
			hi:   binary.BigEndian.Uint64(k[0:8]),
			lo:   binary.BigEndian.Uint64(k[8:16]),
			port: be.Addr.Port(),
			idx:  int32(i),
		})
	}
	slices.SortFunc(b.sorted, compareKeyed)

	b.members = b.members[:0]
	for i, k := range b.sorted {
		if i > 0 && compareKeyed(b.sorted[i-1], k) == 0 {
			first, second := b.sorted[i-1].idx, k.idx
			if first > second {
				first, second = second, first
			}
			return fmt.Errorf("backends %d and %d have the same address %v: list each backend once (IPv4 and IPv4-mapped IPv6 addresses are the same backend)",
				first, second, backends[k.idx].Addr)
		}
		w := backends[k.idx].Weight
		if w == 0 {
			continue
		}
		var key [18]byte
		binary.BigEndian.PutUint64(key[0:8], k.hi)
		binary.BigEndian.PutUint64(key[8:16], k.lo)
		binary.BigEndian.PutUint16(key[16:18], k.port)
		offset, skip := permutation(seed, m, key)
		b.members = append(b.members, member{next: offset, skip: skip, weight: w, idx: k.idx})
	}
	if n := len(b.members); n > int(m) {
		return fmt.Errorf("%d backends with weight > 0 do not fit a table of %d slots: use a prime table size of at least %d (ideally 100 times the backend count, e.g. %d)",
			n, m, n, suggestSize(n))
	}
	return nil
}

// suggestSize returns the first Ladder rung of at least 100*n, or the largest
// rung that still holds n backends.
func suggestSize(n int) uint32 {
	best := uint32(MaxTableSize)
	for _, l := range Ladder {
		if int(l) >= n {
			best = l
			if int(l) >= 100*n {
				return l
			}
		}
	}
	return best
}

// permutation returns where a backend's preference list starts and its
// stride, from the backend's key (package documentation, MUST NOT CHANGE).
func permutation(seed Seed, m uint32, key [18]byte) (offset, skip uint32) {
	h := SipHash24(seed, key[:])
	offset = uint32((h >> 32) % uint64(m))
	skip = uint32((h&0xffffffff)%uint64(m-1)) + 1
	return offset, skip
}

// assignQuotas sets every member's quota: the floor of its exact share, plus
// one leftover slot for the largest remainders.
func (b *Builder) assignQuotas(m uint32) {
	ms := b.members
	var total uint64
	equal := true
	for i := range ms {
		total += uint64(ms[i].weight)
		equal = equal && ms[i].weight == ms[0].weight
	}
	var given uint64
	for i := range ms {
		// m < 2^20 and weight < 2^32, so the product cannot overflow.
		ms[i].quota = uint32(uint64(m) * uint64(ms[i].weight) / total)
		ms[i].filled = 0
		ms[i].credit = 0
		given += uint64(ms[i].quota)
	}
	left := int(uint64(m) - given) // < len(ms): each floor loses less than one slot
	if left == 0 {
		return
	}
	if equal {
		// All remainders are equal, so the tie-break alone decides.
		for i := range left {
			ms[i].quota++
		}
		return
	}
	b.rems = b.rems[:0]
	for i := range ms {
		b.rems = append(b.rems, remainder{rem: uint64(m) * uint64(ms[i].weight) % total, pos: uint32(i)})
	}
	slices.SortFunc(b.rems, func(x, y remainder) int {
		if c := cmp.Compare(y.rem, x.rem); c != 0 {
			return c
		}
		return cmp.Compare(x.pos, y.pos)
	})
	for _, r := range b.rems[:left] {
		ms[r.pos].quota++
	}
}

// Slots returns how many of the m slots each backend gets, at the
// positions of backends: the quotas Build fills, which depend on the
// weights and addresses alone, not on the seed. A backend with a weight
// whose quota is 0 (a weight far below the others' in a small table) never
// gets a new flow; config validation refuses such weights with this count.
// It fails as Build does.
func Slots(m uint32, backends []Backend) ([]uint32, error) {
	if err := ValidateSize(m); err != nil {
		return nil, err
	}
	var b Builder
	if err := b.prepare(Seed{}, m, backends); err != nil {
		return nil, err
	}
	out := make([]uint32, len(backends))
	if len(b.members) == 0 {
		return out, nil
	}
	b.assignQuotas(m)
	for _, mb := range b.members {
		out[mb.idx] = mb.quota
	}
	return out, nil
}
