// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
)

// filterMul is L4LB_FILTER_MUL of bpf/include/types.h.
const filterMul = 0x9E3779B97F4A7C15

// filterWordsPerService sizes the frontend filter: with 16 bits per frontend
// and two bits set per frontend in one 64-bit word, about one packet in a
// hundred to a non-frontend destination still takes the service lookup at
// full capacity (max_services), far fewer below it.
const filterWordsPerService = 16.0 / 64

// filterWords is the filter's size for maxServices: a power of two, at
// least 64 words.
func filterWords(maxServices uint32) uint32 {
	n := uint32(float64(maxServices)*filterWordsPerService) + 1
	return max(64, uint32(1)<<bits.Len32(n-1))
}

// filterSlot is where a frontend sits in a filter of mask+1 words: the
// word and the two bits it sets, computed as vip_maybe (bpf/include/
// filter.h) does from the flow key's little-endian words.
func filterSlot(fe lb.Frontend, mask uint32) (word uint32, bitset uint64) {
	a := fe.Addr.As16()
	w := func(i int) uint64 { return uint64(binary.LittleEndian.Uint32(a[4*i:])) }
	x := (w(0)^w(2))<<32 | (w(1) ^ w(3))
	// The port as the packet carries it (network order), loaded as a
	// little-endian u16.
	x ^= uint64(htons(fe.Port))<<8 | uint64(fe.Proto)
	x *= filterMul
	return uint32(x>>32) & mask, 1<<(x>>20&63) | 1<<(x>>26&63)
}

// vipFilter is the frontend filter's control side: which frontends sit in
// which word, so that removing one clears only the bits no other frontend
// of the word needs. Bits are set before a service entry is written and
// cleared after it is deleted, so the filter never hides a frontend.
type vipFilter struct {
	m    *ebpf.Map
	mask uint32

	mu     sync.Mutex
	byWord map[uint32]map[lb.Frontend]uint64 // word -> frontend -> its bits
}

func newVIPFilter(m *ebpf.Map, mask uint32) *vipFilter {
	return &vipFilter{m: m, mask: mask, byWord: map[uint32]map[lb.Frontend]uint64{}}
}

// word is the value word i must hold.
func (f *vipFilter) word(i uint32) uint64 {
	var v uint64
	for _, b := range f.byWord[i] {
		v |= b
	}
	return v
}

// add records fe and writes its word when it gained bits.
func (f *vipFilter) add(fe lb.Frontend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, b := filterSlot(fe, f.mask)
	old := f.word(i)
	if f.byWord[i] == nil {
		f.byWord[i] = map[lb.Frontend]uint64{}
	}
	f.byWord[i][fe] = b
	if old|b == old {
		return nil
	}
	if err := f.m.Update(&i, old|b, ebpf.UpdateAny); err != nil {
		delete(f.byWord[i], fe)
		return fmt.Errorf("frontend filter: set the bits of %s: %w", fe, err)
	}
	return nil
}

// remove forgets fe and clears the bits of its word no other frontend uses.
func (f *vipFilter) remove(fe lb.Frontend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, _ := filterSlot(fe, f.mask)
	if _, ok := f.byWord[i][fe]; !ok {
		return nil
	}
	delete(f.byWord[i], fe)
	v := f.word(i)
	if len(f.byWord[i]) == 0 {
		delete(f.byWord, i)
	}
	if err := f.m.Update(&i, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("frontend filter: clear the bits of %s: %w", fe, err)
	}
	return nil
}

// rebuild makes the filter hold exactly the frontends of fes and writes
// every word, for a datapath that adopts pinned maps: the words of
// frontends deleted while no l4lbd ran are cleared, those of every
// programmed one set.
func (f *vipFilter) rebuild(fes []lb.Frontend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byWord = map[uint32]map[lb.Frontend]uint64{}
	for _, fe := range fes {
		i, b := filterSlot(fe, f.mask)
		if f.byWord[i] == nil {
			f.byWord[i] = map[lb.Frontend]uint64{}
		}
		f.byWord[i][fe] = b
	}
	n := f.mask + 1
	keys := make([]uint32, n)
	vals := make([]uint64, n)
	for i := range n {
		keys[i], vals[i] = i, f.word(i)
	}
	if _, err := f.m.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("frontend filter: write %d words: %w", n, err)
	}
	return nil
}

// svcWords hands out the words of svc_gen (see bpf/include/types.h): a new
// generation for every write of a service entry, never reused for an id,
// and kept (with mode 0) when the entry is deleted.
type svcWords struct {
	m     *ebpf.Map
	cache *cacheGen // bumped after every write (flowcache.go)

	mu  sync.Mutex
	gen map[uint32]uint32 // service id -> latest generation written
	// word is what svc_gen holds at each id not 0, as written or adopted:
	// the self-check's record (check.go).
	word map[uint32]uint32
}

const wordGenShift = 8

func svcWord(gen uint32, mode bpf.LbL4lbMode, dispatch bpf.LbL4lbDispatch) uint32 {
	return gen<<wordGenShift | uint32(dispatch)&0xf<<4 | uint32(mode)&0xf
}

// readSVCWords loads the generations an earlier l4lbd wrote.
func readSVCWords(m *ebpf.Map, cache *cacheGen) (*svcWords, error) {
	w := &svcWords{m: m, cache: cache, gen: map[uint32]uint32{}, word: map[uint32]uint32{}}
	var (
		k, v uint32
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			w.gen[k] = v >> wordGenShift
			w.word[k] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read service words: %w", err)
	}
	return w, nil
}

// nextLocked is the word for a new write of id's entry; w.mu is held.
func (w *svcWords) nextLocked(id uint32, mode bpf.LbL4lbMode, dispatch bpf.LbL4lbDispatch) uint32 {
	g := (w.gen[id] + 1) & (1<<(32-wordGenShift) - 1)
	if g == 0 {
		g = 1
	}
	w.gen[id] = g
	return svcWord(g, mode, dispatch)
}

// next is the word of a new generation for id's entry, in its mode and
// dispatch: the service entry carries it (svc_value.svc_word), then set
// writes it to svc_gen.
func (w *svcWords) next(id uint32, mode bpf.LbL4lbMode, dispatch bpf.LbL4lbDispatch) uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nextLocked(id, mode, dispatch)
}

// set writes word, from next, as id's word.
func (w *svcWords) set(id, word uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.m.Update(&id, &word, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write the word of service id %d: %w", id, err)
	}
	w.word[id] = word
	return w.cache.bump()
}

// retire marks id as holding no service, keeping its generation.
func (w *svcWords) retire(id uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	word := w.gen[id] << wordGenShift
	if err := w.m.Update(&id, &word, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("retire the word of service id %d: %w", id, err)
	}
	w.word[id] = word
	return w.cache.bump()
}

// ensure gives every (id, mode, dispatch) of live a word that carries
// them, for entries written by an l4lbd that had no svc_gen (their flows
// would otherwise never take the fast path), retires words of ids without
// an entry, and returns the word of every id of live, which its entry
// must carry too (svc_value.svc_word).
func (w *svcWords) ensure(live map[uint32]bpf.LbSvcValue) (map[uint32]uint32, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var (
		k, v uint32
	)
	cur := map[uint32]uint32{}
	it := w.m.Iterate()
	for it.Next(&k, &v) {
		cur[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read service words: %w", err)
	}
	words := map[uint32]uint32{}
	for id, sv := range live {
		word := cur[id]
		if word>>wordGenShift != 0 && word&0xff == svcWord(0, sv.Mode, sv.Dispatch) {
			words[id] = word
			continue
		}
		word = w.nextLocked(id, sv.Mode, sv.Dispatch)
		if err := w.m.Update(&id, &word, ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("write the word of service id %d: %w", id, err)
		}
		w.word[id] = word
		words[id] = word
	}
	for id, word := range cur {
		if _, ok := live[id]; ok || word&0xf == 0 {
			continue
		}
		word &^= 0xff
		if err := w.m.Update(&id, &word, ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("retire the word of service id %d: %w", id, err)
		}
		w.word[id] = word
	}
	// Whatever was written, nothing cached may outlive it.
	return words, w.cache.bump()
}
