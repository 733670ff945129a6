// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// cachedFlows returns how many slots of the CPUs' flow caches hold a flow
// (bpf/include/flowcache.h).
func (e *env) cachedFlows(t testing.TB) int {
	t.Helper()
	n := 0
	e.eachCacheSlot(t, func(s *bpf.LbFlowCacheEntry) bool {
		if s.BackendId != 0 {
			n++
		}
		return false
	})
	return n
}

// eachCacheSlot calls fn on every CPU's copy of every flow-cache slot and
// writes the slot back when fn says it changed it.
func (e *env) eachCacheSlot(t testing.TB, fn func(*bpf.LbFlowCacheEntry) bool) {
	t.Helper()
	m := e.lb.Maps()[bpf.LbMapFlowCache]
	for i := uint32(0); i < m.MaxEntries(); i++ {
		var per []bpf.LbFlowCacheEntry
		if err := m.Lookup(i, &per); err != nil {
			t.Fatalf("read flow-cache slot %d: %v", i, err)
		}
		changed := false
		for c := range per {
			if fn(&per[c]) {
				changed = true
			}
		}
		if changed {
			if err := m.Update(i, per, ebpf.UpdateExist); err != nil {
				t.Fatalf("write flow-cache slot %d: %v", i, err)
			}
		}
	}
}

// TestFlowCacheFlush checks that a flushed flow is not forwarded from a
// CPU's copy of its deleted entry: the flush empties the flow caches
// (ct_gen), and the flow's next packet is balanced by the table again.
func TestFlowCacheFlush(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			// The caches are per CPU: every packet on the same one.
			onOneCPU(t)
			e := newEnv(t)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1])
			e.reconcile(t, svc)
			conns := e.open(t, svc, randomFlows(svc.Frontend, 64, 7))
			// The second packet of each flow finds its entry and fills
			// the cache; the third is forwarded from there.
			e.expectSticky(t, svc, conns)
			if n := e.cachedFlows(t); n == 0 {
				t.Fatalf("no flow-cache slot filled by %d established flows", len(conns))
			}

			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			m := moved(t, svc, conns)
			if len(m) == 0 {
				t.Fatalf("no established flow's slot moved to %s: pick more flows", b[2])
			}
			e.expectSticky(t, svc, conns)

			if _, err := e.lb.FlushFlows(datapath.FlowFilter{}); err != nil {
				t.Fatal(err)
			}
			if n := e.conntrackEntries(t); n != 0 {
				t.Fatalf("%d connection-table entries after a flush of all", n)
			}
			for _, c := range e.send(t, svc, flowsOf(m)) {
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Errorf("flushed flow %+v went to %s (its old entry's backend), want the table's %s", c.flow, c.backend, want)
				}
			}
			if n := e.conntrackEntries(t); n != len(m) {
				t.Errorf("%d flushed flows sent a packet each and left %d entries, want one each", len(m), n)
			}
		})
	}
}

// TestFlowCacheRefreshesEntry checks that a flow forwarded from the flow
// cache still refreshes its connection-table entry: once the cached copy
// is a second old, the next packet reads the entry again and renews its
// last_seen, so the control plane never sees a busy flow as idle.
func TestFlowCacheRefreshesEntry(t *testing.T) {
	const tick = 50 * time.Millisecond // more than a tick at any HZ
	// The caches are per CPU: every packet on the same one.
	onOneCPU(t)
	fam := families[0]
	e := newEnv(t)
	svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
	e.reconcile(t, svc)
	flows := randomFlows(svc.Frontend, 8, 3)
	e.open(t, svc, flows)
	e.send(t, svc, flows) // fills the cache
	if n := e.cachedFlows(t); n == 0 {
		t.Fatalf("no flow-cache slot filled by %d established flows", len(flows))
	}

	ct := e.lb.Maps()[bpf.LbMapConntrack]
	idle := uint64(bpftest.KernelNow() - 20*time.Second)
	for _, f := range flows {
		key := maglev.FlowKey(f)
		var v bpf.LbCtValue
		if err := ct.Lookup(key[:], &v); err != nil {
			t.Fatalf("entry of flow %+v: %v", f, err)
		}
		v.LastSeen = idle
		if err := ct.Put(key[:], &v); err != nil {
			t.Fatal(err)
		}
	}
	// Every filled slot as if filled two seconds ago.
	e.eachCacheSlot(t, func(s *bpf.LbFlowCacheEntry) bool {
		if s.BackendId == 0 {
			return false
		}
		s.Filled -= uint64(2 * time.Second)
		return true
	})
	before := bpftest.KernelNow()
	e.send(t, svc, flows)
	after := bpftest.KernelNow()
	for _, f := range flows {
		key := maglev.FlowKey(f)
		var v bpf.LbCtValue
		if err := ct.Lookup(key[:], &v); err != nil {
			t.Fatalf("entry of flow %+v: %v", f, err)
		}
		if got := time.Duration(v.LastSeen); got < before-tick || got > after {
			t.Errorf("flow %+v: last_seen %s after a packet on a 2 s old cached copy, want the kernel's time between %s and %s (less a tick)",
				f, got, before, after)
		}
	}
}

// TestFlowCacheCloseReachesEntry checks that a client's FIN or RST, and a
// SYN reusing the tuple, are not forwarded from the flow cache alone: they
// reach the connection-table entry, whose closing flag they set and clear.
func TestFlowCacheCloseReachesEntry(t *testing.T) {
	// The caches are per CPU: every packet on the same one.
	onOneCPU(t)
	fam := families[0]
	e := newEnv(t)
	svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
	e.reconcile(t, svc)
	conns := e.open(t, svc, randomFlows(svc.Frontend, 2, 5))
	e.expectSticky(t, svc, conns) // fills the cache
	state := func(c established) datapath.FlowState {
		t.Helper()
		return e.flows(t, datapath.FlowFilter{})[clientOf(c.flow)].State
	}
	for i, c := range conns {
		p := packet(c.flow, false, true, nil)
		p.FIN, p.RST = i == 0, i == 1
		in := e.frame(t, p)
		if got := e.checkTX(t, in, e.run(t, in)); got != c.backend {
			t.Errorf("FIN/RST of flow %+v went to %s, want its backend %s", c.flow, got, c.backend)
		}
		if s := state(c); s != datapath.FlowClosing {
			t.Errorf("flow %+v after its client's FIN/RST, its established packets cached: %s, want closing", c.flow, s)
		}
	}
	e.expectSticky(t, svc, conns)
	c := conns[0]
	in := e.frame(t, packet(c.flow, true, false, nil))
	if got := e.checkTX(t, in, e.run(t, in)); got != c.backend {
		t.Errorf("SYN reusing flow %+v went to %s, want its entry's %s", c.flow, got, c.backend)
	}
	if s := state(c); s != datapath.FlowEstablished {
		t.Errorf("flow %+v reopened by a SYN: %s, want established", c.flow, s)
	}
}
