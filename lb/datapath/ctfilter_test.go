// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// other is the backend of svc that Maglev does not pick for f.
func other(t *testing.T, svc lb.Service, f maglev.Flow) netip.Addr {
	t.Helper()
	picked := mustPick(t, svc, f)
	for _, b := range svc.Backends {
		if b.Addr.Addr() != picked {
			return b.Addr.Addr()
		}
	}
	t.Fatalf("service %s has no backend besides %s", svc.Name, picked)
	return netip.Addr{}
}

// putEntry writes f's connection-table entry naming backend to from here,
// as an earlier l4lb's program or a migration would: without the
// filter's bit.
func (e *env) putEntry(t *testing.T, svc lb.Service, f maglev.Flow, backend netip.Addr) {
	t.Helper()
	id, ids := e.backendIDs(t, svc.Frontend)
	key := maglev.FlowKey(f)
	v := bpf.LbCtValue{BackendId: uint32(ids[backend]), SvcId: uint32(id), LastSeen: uint64(bpftest.KernelNow()),
		Hash: uint32(maglev.FlowHash(testSeed, f))}
	if err := e.lb.Maps()[bpf.LbMapConntrack].Put(key[:], &v); err != nil {
		t.Fatal(err)
	}
}

// synTo sends f's SYN and returns the backend it went to.
func (e *env) synTo(t *testing.T, f maglev.Flow) netip.Addr {
	t.Helper()
	in := e.frame(t, packet(f, true, false, nil))
	return e.checkTX(t, in, e.run(t, in))
}

// TestConntrackFilter checks the connection table's presence filter
// (bpf/include/ctfilter.h), by the one thing it may change: whether a SYN
// finds its tuple's entry. A SYN must follow an entry (a client reusing a
// tuple the table holds); the filter lets it skip the lookup only for
// tuples whose bit is clear. So an entry written without its bit is
// invisible to SYNs while a filter is live (which shows the filter is in
// use), and visible again after a rebuild; one the datapath added is
// always visible; and a datapath over pinned maps uses no filter until
// Retire, when only its own programs write the table.
func TestConntrackFilter(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := newEnv(t)
			web := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
			e.reconcile(t, web)
			flows := randomFlows(web.Frontend, 24, 31)

			// Entries the datapath added carry their bits: a SYN of
			// the tuple finds the entry, even one moved to the other
			// backend behind the datapath's back.
			opened := e.open(t, web, flows[:8])
			for _, c := range opened {
				to := other(t, web, c.flow)
				e.putEntry(t, web, c.flow, to)
				if got := e.synTo(t, c.flow); got != to {
					t.Errorf("SYN reusing flow %v went to %s, want its entry's %s", c.flow, got, to)
				}
			}

			// An entry written without its bit is not looked up: the
			// SYN goes by Maglev. A rebuild takes it in.
			for _, f := range flows[8:16] {
				e.putEntry(t, web, f, other(t, web, f))
			}
			skipped := 0
			for _, f := range flows[8:16] {
				if e.synTo(t, f) == mustPick(t, web, f) {
					skipped++
				}
			}
			// A bit another flow set may take the lookup for one or
			// two; not for all of them.
			if skipped < 6 {
				t.Errorf("%d of 8 SYNs skipped entries written without their filter bits; want most: is the filter in use?", skipped)
			}
			if err := e.lb.RebuildConntrackFilter(); err != nil {
				t.Fatal(err)
			}
			for _, f := range flows[8:16] {
				if got, want := e.synTo(t, f), other(t, web, f); got != want {
					t.Errorf("after the rebuild, SYN reusing flow %v went to %s, want its entry's %s", f, got, want)
				}
			}

			// Tuples the table does not hold go by Maglev, and set no
			// bit: a SYN creates no entry.
			fill := e.lb.ConntrackFilterFill()
			for _, f := range flows[16:] {
				if got, want := e.synTo(t, f), mustPick(t, web, f); got != want {
					t.Errorf("SYN of new flow %v went to %s, want Maglev's %s", f, got, want)
				}
			}
			if after := e.lb.ConntrackFilterFill(); after != fill {
				t.Errorf("filter fill %v after SYNs of new flows, want %v as before", after, fill)
			}

			// Entries that left the table leave their bits until a
			// rebuild.
			gone := maglev.FlowKey(flows[0])
			if err := e.lb.Maps()[bpf.LbMapConntrack].Delete(gone[:]); err != nil {
				t.Fatal(err)
			}
			if err := e.lb.RebuildConntrackFilter(); err != nil {
				t.Fatal(err)
			}
			if after := e.lb.ConntrackFilterFill(); after >= fill {
				t.Errorf("filter fill %v after an entry left and a rebuild, want below %v", after, fill)
			}
		})
	}
}

// TestConntrackFilterPinned: over pinned maps, which an earlier l4lb's
// programs may still write without setting bits, SYNs look every entry up
// until Retire installs a filter built from the table.
func TestConntrackFilterPinned(t *testing.T) {
	fam := families[0]
	o := envOptions{pinPath: pinDir(t, "ctfilter")}
	e := newEnvWith(t, o)
	web := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
	e.reconcile(t, web)
	flows := randomFlows(web.Frontend, 16, 32)

	for _, f := range flows[:8] {
		e.putEntry(t, web, f, other(t, web, f))
		if got, want := e.synTo(t, f), other(t, web, f); got != want {
			t.Errorf("before Retire, SYN reusing flow %v went to %s, want its entry's %s", f, got, want)
		}
	}
	if fill := e.lb.ConntrackFilterFill(); fill != 0 {
		t.Errorf("filter fill before Retire: %v, want no filter", fill)
	}
	if err := e.lb.Retire(); err != nil {
		t.Fatal(err)
	}
	for _, f := range flows[:8] {
		if got, want := e.synTo(t, f), other(t, web, f); got != want {
			t.Errorf("after Retire, SYN reusing flow %v went to %s, want its entry's %s", f, got, want)
		}
	}
	// The filter is live now: an entry written without its bit is
	// skipped by most SYNs.
	skipped := 0
	for _, f := range flows[8:] {
		e.putEntry(t, web, f, other(t, web, f))
		if e.synTo(t, f) == mustPick(t, web, f) {
			skipped++
		}
	}
	if skipped < 6 {
		t.Errorf("after Retire, %d of 8 SYNs skipped entries written without their bits; want most: no filter installed?", skipped)
	}

	// A restart clears the filter until its Retire.
	e.reload(t, o, web)
	for _, f := range flows[8:] {
		if got, want := e.synTo(t, f), other(t, web, f); got != want {
			t.Errorf("after a restart, SYN reusing flow %v went to %s, want its entry's %s", f, got, want)
		}
	}
}

// TestConntrackFilterMaintain: bits of entries that left the table pile
// up; once more than a quarter of the filter is set, the maintenance loop
// rebuilds it from the table, and the entries still there keep theirs.
func TestConntrackFilterMaintain(t *testing.T) {
	fam := families[0]
	e := newEnvWith(t, envOptions{pinPath: pinDir(t, "ctfilter-maintain")})
	web := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
	e.reconcile(t, web)
	e.lb.SetConntrackFilterCheck(20 * time.Millisecond)
	if err := e.lb.Retire(); err != nil {
		t.Fatal(err)
	}
	opened := e.open(t, web, randomFlows(web.Frontend, 8, 33))
	fresh := e.lb.ConntrackFilterFill()

	// Stale bits: about 40% of the filter.
	rng := rand.New(rand.NewPCG(1, 2))
	stale := make([]uint64, 20000)
	for i := range stale {
		stale[i] = rng.Uint64()
	}
	e.lb.MarkConntrackFilter(stale)
	if fill := e.lb.ConntrackFilterFill(); fill <= 0.25 {
		t.Fatalf("filter fill %v after marking stale bits, want over 0.25 to test the rebuild", fill)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.lb.ConntrackFilterFill() > 0.25 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if fill := e.lb.ConntrackFilterFill(); fill != fresh {
		t.Fatalf("filter fill %v 10s after passing a quarter, want %v (rebuilt from the table)", fill, fresh)
	}
	for _, c := range opened {
		to := other(t, web, c.flow)
		e.putEntry(t, web, c.flow, to)
		if got := e.synTo(t, c.flow); got != to {
			t.Errorf("after the rebuild, SYN reusing flow %v went to %s, want its entry's %s", c.flow, got, to)
		}
	}
}
