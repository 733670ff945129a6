// SPDX-License-Identifier: Apache-2.0

package reconciler

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestIDQueueFIFO(t *testing.T) {
	q := newIDQueue(3)
	var got []uint32
	for range 3 {
		id, ok := q.pop()
		if !ok {
			t.Fatal("pop failed with free ids left")
		}
		got = append(got, id)
	}
	if _, ok := q.pop(); ok || q.len() != 0 {
		t.Fatalf("pop succeeded on an exhausted queue (len %d)", q.len())
	}
	q.push(2)
	q.push(3)
	q.push(1)
	for range 3 {
		id, _ := q.pop()
		got = append(got, id)
	}
	if want := []uint32{1, 2, 3, 2, 3, 1}; !slices.Equal(got, want) {
		t.Errorf("pop order %v, want %v", got, want)
	}
}

func TestRebuildIDQueue(t *testing.T) {
	tests := []struct {
		max  uint32
		used []uint32
		want []uint32
	}{
		{max: 6, used: nil, want: []uint32{1, 2, 3, 4, 5, 6}},
		{max: 6, used: []uint32{2, 5}, want: []uint32{6, 1, 3, 4}},
		{max: 3, used: []uint32{3, 1, 2}, want: nil},
		{max: 4, used: []uint32{4}, want: []uint32{1, 2, 3}},
	}
	for _, tt := range tests {
		q := rebuildIDQueue(tt.max, tt.used)
		if got := q.order(); !slices.Equal(got, tt.want) {
			t.Errorf("rebuildIDQueue(%d, %v) order %v, want %v", tt.max, tt.used, got, tt.want)
		}
		if q.len() != len(tt.want) {
			t.Errorf("rebuildIDQueue(%d, %v) len %d, want %d", tt.max, tt.used, q.len(), len(tt.want))
		}
	}
}

// The queue compacts its buffer as it goes; compare it with a plain slice
// through a long random sequence of pops and pushes.
func TestIDQueueAgainstModel(t *testing.T) {
	const max = 50
	rng := rand.New(rand.NewPCG(1, 2))
	q := newIDQueue(max)
	var model []uint32
	for id := uint32(1); id <= max; id++ {
		model = append(model, id)
	}
	var held []uint32
	for step := range 20000 {
		if len(held) > 0 && (len(model) == 0 || rng.IntN(2) == 0) {
			i := rng.IntN(len(held))
			id := held[i]
			held = slices.Delete(held, i, i+1)
			q.push(id)
			model = append(model, id)
			continue
		}
		id, ok := q.pop()
		if !ok || id != model[0] {
			t.Fatalf("step %d: pop = %d, %v; want %d", step, id, ok, model[0])
		}
		model = model[1:]
		held = append(held, id)
		if q.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, q.len(), len(model))
		}
	}
}
