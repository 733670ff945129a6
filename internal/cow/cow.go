// SPDX-License-Identifier: Apache-2.0

// Package cow has the immutable collections the control plane publishes its
// views in. A view is read by API and metrics goroutines while the control
// loop builds the next one, so a view is never modified; but copying a
// whole list or map of 100,000 services to change one of them would make
// every change cost as much as the largest box. A Slice or Map is stored in
// fixed-size pieces, and a changed version copies only the pieces it
// touches plus a small table of pointers, sharing every other piece with
// the versions before it.
package cow

import (
	"hash/maphash"
	"iter"
)

// chunkLen is the number of elements in one piece of a Slice. A change
// copies one piece and the table of piece pointers: at 100,000 elements
// that is 256 elements and 391 pointers.
const chunkLen = 256

// Slice is an immutable sequence. The zero value is empty.
type Slice[T any] struct {
	chunks []*[chunkLen]T
	n      int
}

// SliceOf returns a Slice holding a copy of s.
func SliceOf[T any](s []T) Slice[T] {
	out := Slice[T]{n: len(s)}
	for i := 0; i < len(s); i += chunkLen {
		c := new([chunkLen]T)
		copy(c[:], s[i:])
		out.chunks = append(out.chunks, c)
	}
	return out
}

// Len is the number of elements.
func (s Slice[T]) Len() int { return s.n }

// At returns element i; it panics when i is out of range, as an index
// expression does.
func (s Slice[T]) At(i int) T {
	if i < 0 || i >= s.n {
		panic("cow: index out of range")
	}
	return s.chunks[i/chunkLen][i%chunkLen]
}

// All yields the index and value of every element, in order.
func (s Slice[T]) All() iter.Seq2[int, T] {
	return func(yield func(int, T) bool) {
		for i := range s.n {
			if !yield(i, s.chunks[i/chunkLen][i%chunkLen]) {
				return
			}
		}
	}
}

// With returns a Slice whose element i is v and whose other elements are
// s's; s is unchanged.
func (s Slice[T]) With(i int, v T) Slice[T] {
	if i < 0 || i >= s.n {
		panic("cow: index out of range")
	}
	chunks := make([]*[chunkLen]T, len(s.chunks))
	copy(chunks, s.chunks)
	c := *chunks[i/chunkLen]
	c[i%chunkLen] = v
	chunks[i/chunkLen] = &c
	return Slice[T]{chunks: chunks, n: s.n}
}

// shardCount is the number of pieces of a Map. A change copies one shard
// and the array of shard pointers: at 100,000 keys a shard holds about
// 200 of them.
const shardCount = 512

// Map is an immutable map. The zero value is empty; build one with MapOf
// or an Editor.
type Map[K comparable, V any] struct {
	shards *[shardCount]map[K]V
	seed   maphash.Seed
	n      int
}

// MapOf returns a Map holding a copy of m.
func MapOf[K comparable, V any](m map[K]V) Map[K, V] {
	e := Map[K, V]{}.Edit()
	for k, v := range m {
		e.Set(k, v)
	}
	return e.Map()
}

func (m Map[K, V]) shard(k K) int {
	return int(maphash.Comparable(m.seed, k) % shardCount)
}

// Len is the number of keys.
func (m Map[K, V]) Len() int { return m.n }

// Get returns the value of k and whether m holds k.
func (m Map[K, V]) Get(k K) (V, bool) {
	if m.shards == nil {
		var zero V
		return zero, false
	}
	v, ok := m.shards[m.shard(k)][k]
	return v, ok
}

// All yields every key and value, in no particular order.
func (m Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		if m.shards == nil {
			return
		}
		for _, sh := range m.shards {
			for k, v := range sh {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// Edit starts a new version of m; m itself never changes.
func (m Map[K, V]) Edit() *Editor[K, V] {
	e := &Editor[K, V]{m: m}
	if m.shards == nil {
		e.m.seed = maphash.MakeSeed()
		e.m.shards = new([shardCount]map[K]V)
		e.owned = new([shardCount]bool)
		return e
	}
	shards := *m.shards
	e.m.shards = &shards
	return e
}

// Editor builds a new version of a Map. Each shard it changes is copied
// once, on its first change.
type Editor[K comparable, V any] struct {
	m     Map[K, V]
	owned *[shardCount]bool
}

func (e *Editor[K, V]) own(i int) map[K]V {
	if e.owned == nil {
		e.owned = new([shardCount]bool)
	}
	sh := e.m.shards[i]
	if !e.owned[i] {
		c := make(map[K]V, len(sh)+1)
		for k, v := range sh {
			c[k] = v
		}
		sh = c
		e.m.shards[i] = sh
		e.owned[i] = true
	}
	return sh
}

// Set makes k map to v.
func (e *Editor[K, V]) Set(k K, v V) {
	sh := e.own(e.m.shard(k))
	if _, ok := sh[k]; !ok {
		e.m.n++
	}
	sh[k] = v
}

// Delete removes k.
func (e *Editor[K, V]) Delete(k K) {
	i := e.m.shard(k)
	if _, ok := e.m.shards[i][k]; !ok {
		return
	}
	delete(e.own(i), k)
	e.m.n--
}

// Get returns the value of k in the version being built.
func (e *Editor[K, V]) Get(k K) (V, bool) { return e.m.Get(k) }

// Map returns the version built so far. The Editor must not be used after.
func (e *Editor[K, V]) Map() Map[K, V] {
	m := e.m
	*e = Editor[K, V]{}
	return m
}
