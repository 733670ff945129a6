// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// The self-check compares every service's Maglev table with the record.
// Reading a table out of the kernel (one batch lookup) costs a copy per
// 16-slot chunk, about 0.3 ms for a 16,381-slot table, which made a pass at
// 10,000 services cost seconds of CPU. bpf/digest.c hashes the tables in
// the kernel instead, a lookup per chunk, and hands back four 64-bit
// hashes per table; tableDigest computes the same from the record, and only
// a table whose hashes differ is read whole (to say how it differs, and
// whether the slot holds the empty table DeleteTables leaves).

// digestBatch is how many tables one run of the digest program reads: the
// records fill most of the page a test run's packet gets (DIGEST_MAX).
const digestBatch = 64

// digestLanes is DIGEST_LANES.
const digestLanes = 4

// FNV-1a's 64-bit constants, as bpf/digest.c uses them.
const (
	digestBasis = 0xcbf29ce484222325
	digestPrime = 0x100000001b3
)

// tableDigester loads the digest program the first time a check needs it,
// with the LB's maglev map in place of the object's own.
type tableDigester struct {
	once sync.Once
	prog *ebpf.Program
	err  error
	// failed logs once that the program could not be loaded.
	failed sync.Once

	// mu guards the scratch a comparison reuses: the run's packet, the
	// ids asked for and where they came from, the answers.
	mu  sync.Mutex
	buf []byte
	ids []uint32
	idx []int
	got []bpf.DigestTableDigest
}

func (t *tableDigester) load(maglev *ebpf.Map) (*ebpf.Program, error) {
	t.once.Do(func() {
		spec, err := bpf.LoadDigest()
		if err != nil {
			t.err = fmt.Errorf("read the embedded digest object: %w", err)
			return
		}
		spec.Maps[bpf.DigestMapMaglev].MaxEntries = maglev.MaxEntries()
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
			MapReplacements: map[string]*ebpf.Map{bpf.DigestMapMaglev: maglev},
		})
		if err != nil {
			t.err = fmt.Errorf("load the Maglev digest program: %w", err)
			return
		}
		t.prog = coll.DetachProgram(bpf.DigestProgL4lbTableDigest)
		coll.Close()
	})
	return t.prog, t.err
}

func (t *tableDigester) close() {
	if t.prog != nil {
		t.prog.Close()
	}
}

// xdpPass is XDP_PASS, what the digest program returns.
const xdpPass = 2

// digestRecord is the wire size of struct table_digest.
const digestRecord = 8 + 8*digestLanes

// compareTables sets out[i].TableSame for each want[i] whose slot holds
// the record's table, hashed in the kernel. A table it cannot prove the
// same is left to readService, which reads it whole; without the digest
// program (a kernel that refuses it), every table is.
func (d *LB) compareTables(want []reconciler.Expected, out []reconciler.Found) error {
	t := &d.digest
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ids, t.idx = t.ids[:0], t.idx[:0]
	for i := range want {
		if w := &want[i]; w.HasTable && len(w.Table) > 0 {
			t.ids = append(t.ids, uint32(w.ID))
			t.idx = append(t.idx, i)
		}
	}
	if len(t.ids) == 0 {
		return nil
	}
	prog, err := t.load(d.maglev)
	if err != nil {
		t.failed.Do(func() {
			d.log.Warn("the self-check cannot hash Maglev tables in the kernel; it reads each table whole, which costs about ten times the CPU", "error", err)
		})
		return nil
	}
	if cap(t.got) < len(t.ids) {
		t.got = make([]bpf.DigestTableDigest, len(t.ids))
	}
	t.got = t.got[:len(t.ids)]
	if err := t.run(prog, t.ids, t.got); err != nil {
		return err
	}
	for k, i := range t.idx {
		chunks, lanes := tableDigest(want[i].Table)
		if g := &t.got[k]; g.Id == t.ids[k] && g.Chunks == chunks && g.Lane == lanes {
			out[i].TableSame = true
		}
	}
	return nil
}

// run hashes the tables in the Maglev slots ids in the kernel: out[i] is
// what the slot ids[i] holds (Chunks 0 when it holds no map). The caller
// holds t.mu.
func (t *tableDigester) run(prog *ebpf.Program, ids []uint32, out []bpf.DigestTableDigest) error {
	for lo := 0; lo < len(ids); lo += digestBatch {
		hi := min(lo+digestBatch, len(ids))
		n := (hi - lo) * digestRecord
		if cap(t.buf) < n {
			t.buf = make([]byte, digestBatch*digestRecord)
		}
		buf := t.buf[:n]
		clear(buf)
		for i, id := range ids[lo:hi] {
			binary.NativeEndian.PutUint32(buf[i*digestRecord:], id)
		}
		ret, err := prog.Run(&ebpf.RunOptions{Data: buf, DataOut: buf})
		if err != nil {
			return fmt.Errorf("run the Maglev digest program over slots %d..%d: %w", ids[lo], ids[hi-1], err)
		}
		if ret != xdpPass {
			return fmt.Errorf("the Maglev digest program answered %d, not XDP_PASS", ret)
		}
		for i := range hi - lo {
			r := buf[i*digestRecord:]
			o := &out[lo+i]
			o.Id = binary.NativeEndian.Uint32(r)
			o.Chunks = binary.NativeEndian.Uint32(r[4:])
			for j := range digestLanes {
				o.Lane[j] = binary.NativeEndian.Uint64(r[8+8*j:])
			}
		}
	}
	return nil
}

// tableDigest is what the digest program answers for a slot holding table,
// laid out as tableChunks lays it out: chunk count, and the four lanes over
// the words (size, slots, zeros to the chunk's end) taken in pairs.
func tableDigest(table []reconciler.BackendID) (chunks uint32, lanes [digestLanes]uint64) {
	words := len(table) + 1
	chunks = uint32((words + maglevChunk - 1) / maglevChunk)
	for j := range lanes {
		lanes[j] = digestBasis
	}
	// Words 2p and 2p+1 make pair p: the size and slot 0 the first,
	// slots 2p-1 and 2p after, zeros past the table's end.
	mix := func(p int, v uint64) {
		l := &lanes[p%digestLanes]
		*l = (*l ^ v) * digestPrime
	}
	n := len(table)
	first := uint64(uint32(n))
	if n > 0 {
		first |= uint64(table[0]) << 32
	}
	mix(0, first)
	pairs := int(chunks) * maglevChunk / 2
	p := 1
	// The loop the time goes in: every pair in the table, four lanes
	// at a time so that each lane's multiplies chain on their own.
	for ; p+3 < pairs && 2*(p+3) < n; p += 4 {
		t := table[2*p-1 : 2*p+7]
		lanes[p%4] = (lanes[p%4] ^ (uint64(t[0]) | uint64(t[1])<<32)) * digestPrime
		lanes[(p+1)%4] = (lanes[(p+1)%4] ^ (uint64(t[2]) | uint64(t[3])<<32)) * digestPrime
		lanes[(p+2)%4] = (lanes[(p+2)%4] ^ (uint64(t[4]) | uint64(t[5])<<32)) * digestPrime
		lanes[(p+3)%4] = (lanes[(p+3)%4] ^ (uint64(t[6]) | uint64(t[7])<<32)) * digestPrime
	}
	for ; p < pairs; p++ {
		var v uint64
		if w := 2*p - 1; w < n {
			v = uint64(table[w])
		}
		if w := 2 * p; w < n {
			v |= uint64(table[w]) << 32
		}
		mix(p, v)
	}
	return chunks, lanes
}
