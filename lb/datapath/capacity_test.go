// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/lb"
)

// TestCapacityOnOneCPU fills the connection table and the SNAT tables from
// the one CPU a test run uses: each holds the capacity it was given, not a
// per-CPU share of it (with per-CPU lists a 2-CPU box got half). The kernel
// keeps up to lruLocalFree free entries in each other CPU's local list,
// which one CPU alone may not reach. Each part runs pinned to one CPU: a
// run that moved to the other CPU part way would leave a list's worth of
// free entries behind on the first, and the second CPU's first refill from
// a nearly full table evicts live entries to make up its list (seen in CI:
// 3853 reverse bindings of 4096).
func TestCapacityOnOneCPU(t *testing.T) {
	const capacity = 4096
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	least := capacity - lruLocalFree*(cpus-1)
	full := func(n int) bool { return n >= least && n <= capacity }
	fam := families[0]
	t.Run("conntrack", func(t *testing.T) {
		onOneCPU(t)
		e := newEnvWith(t, envOptions{conntrackMax: capacity})
		svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[:3]...)
		e.reconcile(t, svc)
		flows := randomFlows(svc.Frontend, capacity, 11)
		frames := make([][]byte, len(flows))
		for i, f := range flows {
			frames[i] = e.frame(t, packet(f, false, true, nil))
		}
		for i, r := range e.runAll(t, frames) {
			if r.verdict != xdpTX {
				t.Fatalf("flow %d: verdict %s, want XDP_TX", i, verdictName(r.verdict))
			}
		}
		if n := e.conntrackEntries(t); !full(n) {
			t.Errorf("after %d new flows on one CPU the %d-entry connection table holds %d, want %d or more", capacity, capacity, n, least)
		}
	})
	t.Run("snat", func(t *testing.T) {
		onOneCPU(t)
		e := newSNATEnv(t, envOptions{snatMax: capacity})
		svc := snatService("nat", fam.vip, 80, lb.TCP, fam.backends[:3]...)
		e.reconcile(t, svc)
		flows := randomFlows(svc.Frontend, capacity, 12)
		frames := make([][]byte, len(flows))
		for i, f := range flows {
			frames[i] = e.frame(t, clientPacket(f, false, true))
		}
		for i, r := range e.runAll(t, frames) {
			if r.verdict != xdpTX {
				t.Fatalf("flow %d: verdict %s, want XDP_TX", i, verdictName(r.verdict))
			}
		}
		if fwd, rev := e.snatEntries(t); !full(fwd) || !full(rev) {
			t.Errorf("after %d new flows on one CPU the %d-entry SNAT tables hold %d forward and %d reverse bindings, want %d or more", capacity, capacity, fwd, rev, least)
		}
	})
}

// lruLocalFree is the kernel's LOCAL_FREE_TARGET (kernel/bpf/bpf_lru_list.h):
// the free entries a shared LRU hands each CPU at a time.
const lruLocalFree = 128

// TestSNATFillsItsRange binds as many flows to one backend as the port
// range has ports: every port is found (the probe covers a range this
// small whole), and with every binding answered the flow after them is
// refused.
func TestSNATFillsItsRange(t *testing.T) {
	const lo, hi = 40000, 40063
	fam := families[0]
	e := newSNATEnv(t, envOptions{snatPortMin: lo, snatPortMax: hi})
	svc := snatService("nat", fam.vip, 80, lb.UDP, fam.backends[0])
	e.reconcile(t, svc)
	ports := map[netip.AddrPort]bool{}
	be := netip.AddrPortFrom(fam.backends[0], snatBackendPort)
	for i := range hi - lo + 1 {
		f := flowTo(svc.Frontend, fam.client, uint16(20000+i))
		snat := e.sendSNAT(t, hookXDP, svc, f, clientPacket(f, false, false))
		ports[snat] = true
		// Answered: open, so not for a new flow to take.
		e.replySNAT(t, hookXDP, f, be, snat, false, false)
	}
	if len(ports) != hi-lo+1 {
		t.Fatalf("%d flows got %d distinct SNAT ports, want one each", hi-lo+1, len(ports))
	}
	before := e.reasons(t)
	f := flowTo(svc.Frontend, fam.client, 30000)
	r := e.runOn(t, hookXDP, e.frame(t, clientPacket(f, false, false)))
	if r.verdict != hookXDP.drop() {
		t.Fatalf("flow %d of a %d-port range: verdict %s, want a drop", hi-lo+2, hi-lo+1, hookXDP.verdictName(r.verdict))
	}
	e.expectReasons(t, before, map[string]uint64{"drop_snat_exhausted": 1})
}
