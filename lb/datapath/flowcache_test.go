// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"net"
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
// (flow_cache_gen), and the flow's next packet is balanced by the table
// again.
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

// TestFlowCacheFollowsChanges checks that flows forwarded from the flow
// cache see a control-plane change on their next packet, as they would
// from the maps: a disabled backend's flows move, a drained one's stay,
// and a backend's new neighbour MAC is used from the first packet after
// the next-hop cache has it, never the old one again.
func TestFlowCacheFollowsChanges(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			// The caches are per CPU: every packet on the same one.
			onOneCPU(t)
			e := newEnv(t)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			conns := e.open(t, svc, randomFlows(svc.Frontend, 48, 11))
			e.expectSticky(t, svc, conns) // fills the cache
			e.expectSticky(t, svc, conns) // from the cache

			// Draining keeps the flows, disabling moves them.
			svc.Backends[0].State = lb.Draining
			e.reconcile(t, svc)
			e.expectSticky(t, svc, conns)
			svc.Backends[0].State = lb.Disabled
			e.reconcile(t, svc)
			var kept []established
			moved := 0
			for i, c := range e.send(t, svc, flowsOf(conns)) {
				if conns[i].backend != b[0] {
					kept = append(kept, conns[i])
					continue
				}
				moved++
				if c.backend == b[0] {
					t.Errorf("flow %+v still went to disabled backend %s", c.flow, b[0])
				}
			}
			if moved == 0 {
				t.Fatalf("no flow was on %s: pick more flows", b[0])
			}
			e.expectSticky(t, svc, kept)

			// A new MAC for b[1]: once a packet leaves with it, none
			// leaves with the old one.
			var in []byte
			for _, c := range kept {
				if c.backend == b[1] {
					in = e.frame(t, packet(c.flow, false, true, []byte("x")))
					break
				}
			}
			if in == nil {
				t.Fatalf("no flow kept on %s: pick more flows", b[1])
			}
			want := net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 9}
			start := time.Now()
			e.ns.Run(t, "ip", "neigh", "replace", b[1].String(), "lladdr", want.String(), "dev", "lb0", "nud", "permanent")
			e.waitFor(t, hookXDP, in, start, "new MAC", func(v uint32, mac net.HardwareAddr) bool {
				return v == xdpTX && bytes.Equal(mac, want)
			})
			for range 20 {
				if v, mac := e.sendMAC(t, hookXDP, in); v != xdpTX || !bytes.Equal(mac, want) {
					t.Fatalf("after the change a packet went to %s (verdict %s), want %s", mac, verdictName(v), want)
				}
			}
		})
	}
}

// TestServiceEntryCarriesWord checks that every service entry carries its
// svc_gen word (svc_value.svc_word), which new flows stamp on their
// connection entries without reading svc_gen: after a write, and after a
// restart that adopts entries an earlier l4lbd wrote without one.
func TestServiceEntryCarriesWord(t *testing.T) {
	dir := pinDir(t, "words")
	opts := envOptions{pinPath: dir}
	e := newEnvWith(t, opts)
	fam := families[0]
	svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
	e.reconcile(t, svc)
	check := func(what string) uint32 {
		t.Helper()
		var (
			k    bpf.LbSvcKey
			v    bpf.LbSvcValue
			word uint32
			n    int
		)
		it := e.lb.Maps()[bpf.LbMapServices].Iterate()
		for it.Next(&k, &v) {
			n++
			if err := e.lb.Maps()[bpf.LbMapSvcGen].Lookup(v.Id, &word); err != nil {
				t.Fatal(err)
			}
			if v.SvcWord == 0 || v.SvcWord != word {
				t.Errorf("%s: service id %d carries word %#x, svc_gen holds %#x", what, v.Id, v.SvcWord, word)
			}
		}
		if err := it.Err(); err != nil || n != 1 {
			t.Fatalf("%s: %d service entries (%v), want 1", what, n, err)
		}
		return word
	}
	check("after the write")

	// As an earlier l4lbd left it: no word in the entry.
	m := e.lb.Maps()[bpf.LbMapServices]
	var (
		k bpf.LbSvcKey
		v bpf.LbSvcValue
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		v.SvcWord = 0
		if err := m.Update(&k, &v, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
	}
	e.reload(t, opts, svc)
	word := check("after a restart")

	// New flows' entries carry it, so their next packets take the fast path.
	ct := e.lb.Maps()[bpf.LbMapConntrack]
	for _, c := range e.open(t, svc, randomFlows(svc.Frontend, 8, 13)) {
		key := maglev.FlowKey(c.flow)
		var cv bpf.LbCtValue
		if err := ct.Lookup(key[:], &cv); err != nil {
			t.Fatalf("entry of flow %+v: %v", c.flow, err)
		}
		if cv.SvcWord != word {
			t.Errorf("flow %+v: entry stamped with word %#x, want the service's %#x", c.flow, cv.SvcWord, word)
		}
	}
}
