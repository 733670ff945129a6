// SPDX-License-Identifier: Apache-2.0

package reconciler

// idQueue hands out ids 1..max first-in first-out. A released id joins the
// back of the queue, so it comes back as late as possible: a connection-track
// entry that still names it will most likely have expired by then instead of
// finding a stranger under an old id.
//
// The queue is [next..max] followed by freed, so memory grows with the ids
// released, not with max.
type idQueue struct {
	max   uint32
	next  uint32   // lowest id never handed out; > max when all were
	freed []uint32 // released ids, oldest first, from head on
	head  int
}

func newIDQueue(limit uint32) idQueue {
	return idQueue{max: limit, next: 1}
}

// rebuild makes a queue in which the ids in used are taken. Ids above the
// highest used one come first (allocation grows upwards, so they are the least
// likely to have been used recently), then the gaps below it in ascending
// order. used must hold distinct ids in 1..max.
func rebuildIDQueue(limit uint32, used []uint32) idQueue {
	q := newIDQueue(limit)
	var top uint32
	taken := make(map[uint32]bool, len(used))
	for _, id := range used {
		taken[id] = true
		top = max(top, id)
	}
	for id := uint32(1); id < top; id++ {
		if !taken[id] {
			q.freed = append(q.freed, id)
		}
	}
	q.next = top + 1
	return q
}

// len returns how many ids are free.
func (q *idQueue) len() int {
	n := len(q.freed) - q.head
	if q.next <= q.max {
		n += int(q.max - q.next + 1)
	}
	return n
}

// pop takes the id at the front of the queue; ok is false when none is free.
func (q *idQueue) pop() (id uint32, ok bool) {
	if q.next <= q.max {
		id = q.next
		q.next++
		return id, true
	}
	if q.head == len(q.freed) {
		return 0, false
	}
	id = q.freed[q.head]
	q.head++
	if q.head == len(q.freed) {
		q.freed, q.head = q.freed[:0], 0
	} else if q.head > 64 && q.head*2 > len(q.freed) {
		n := copy(q.freed, q.freed[q.head:])
		q.freed, q.head = q.freed[:n], 0
	}
	return id, true
}

// push releases id to the back of the queue.
func (q *idQueue) push(id uint32) {
	q.freed = append(q.freed, id)
}

// order returns the free ids front first; tests use it to check FIFO reuse.
func (q *idQueue) order() []uint32 {
	var out []uint32
	for id := uint64(q.next); id <= uint64(q.max); id++ {
		out = append(out, uint32(id))
	}
	return append(out, q.freed[q.head:]...)
}
