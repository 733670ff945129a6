// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// withoutSysAdmin runs f on a thread whose effective capabilities lack
// CAP_SYS_ADMIN, as l4lbd runs under systemd/l4lb.service; capabilities
// are per thread, and the BPF syscalls f makes run on the calling one.
func withoutSysAdmin(t *testing.T, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatalf("capget: %v", err)
	}
	saved := data
	data[unix.CAP_SYS_ADMIN/32].Effective &^= 1 << (unix.CAP_SYS_ADMIN % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		t.Fatalf("capset without CAP_SYS_ADMIN: %v", err)
	}
	defer func() {
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			// The thread stays locked and dies with the goroutine.
			t.Errorf("restore capabilities: %v", err)
			runtime.Goexit()
		}
	}()
	f()
}

// TestStateWithoutSysAdmin restarts a datapath without CAP_SYS_ADMIN, the
// way the systemd unit runs l4lbd: the kernel opens an inner map by id only
// for CAP_SYS_ADMIN, so the Maglev tables are read back through their pins.
// A deleted table leaves no pin behind, and a table whose pin is missing
// (one written by a version that did not pin) reads as no table, which the
// reconciler writes again, rather than failing the start.
func TestStateWithoutSysAdmin(t *testing.T) {
	dir := pinDir(t, "tables")
	opts := envOptions{pinPath: dir}
	e := newEnvWith(t, opts)
	fam := families[0]
	a := dsrService("a", fam.vip, 80, lb.TCP, fam.backends[:3]...)
	b := dsrService("b", fam.vip, 443, lb.TCP, fam.backends[1:3]...)
	c := dsrService("c", fam.vip, 53, lb.UDP, fam.backends[:2]...)
	e.reconcile(t, a, b, c)
	want := map[lb.Frontend]reconciler.ServiceState{}
	for _, s := range []lb.Service{a, b, c} {
		want[s.Frontend] = e.state(t, s.Frontend)
	}
	// c goes: its slot holds the shared empty table, and its pin goes.
	e.reconcile(t, a, b)
	pins, err := os.ReadDir(filepath.Join(dir, "maglev_tables"))
	if err != nil {
		t.Fatalf("read pinned tables: %v", err)
	}
	if len(pins) != 2 {
		t.Errorf("%d pinned tables after deleting one of three, want 2: %v", len(pins), pins)
	}
	// b's pin goes missing, as after a version that did not pin.
	bID := want[b.Frontend].ID
	if err := os.Remove(filepath.Join(dir, "maglev_tables", strconv.FormatUint(uint64(bID), 10))); err != nil {
		t.Fatalf("remove b's pin: %v", err)
	}

	// Loading enters the test's namespace, which needs CAP_SYS_ADMIN;
	// l4lbd runs in its own and loads without.
	lbd, err := datapath.Load(e.config(opts))
	if err != nil {
		t.Fatalf("load datapath over the pins: %v", err)
	}
	t.Cleanup(func() { lbd.Close() })
	e.lb.Close()
	var st reconciler.State
	withoutSysAdmin(t, func() {
		if st, err = lbd.State(); err != nil {
			t.Fatalf("read state without CAP_SYS_ADMIN: %v", err)
		}
	})
	got := map[lb.Frontend]reconciler.ServiceState{}
	for _, s := range st.Services {
		got[s.Service.Frontend] = s
	}
	if s := got[a.Frontend]; !s.HasTable || !slices.Equal(s.Table, want[a.Frontend].Table) {
		t.Errorf("a: table read back %v (%d slots), want the %d slots written", s.HasTable, len(s.Table), len(want[a.Frontend].Table))
	}
	if s := got[b.Frontend]; s.HasTable || !s.HasEntry {
		t.Errorf("b (pin removed): HasTable %v HasEntry %v, want no table but its entry", s.HasTable, s.HasEntry)
	}
	if s, ok := got[c.Frontend]; ok && s.HasTable {
		t.Errorf("c (deleted): read back with a table")
	}
}

// TestTableRewriteInPlace changes a service's backends without changing
// its table's size: the new table is written into the inner map the slot
// already holds (no swap, so no RCU grace period), with the swap time
// stamped as for a swap, and packets follow the new table. A change of
// size, and a table after a delete, still swap in a new map; the empty
// table deleted slots share is never written. The rewrite works through
// the pin without CAP_SYS_ADMIN, as l4lbd runs.
func TestTableRewriteInPlace(t *testing.T) {
	e := newEnvWith(t, envOptions{pinPath: pinDir(t, "inplace")})
	outer := e.lb.Maps()["maglev"]
	swapped := e.lb.Maps()["maglev_swapped"]
	slot := func(t *testing.T, id reconciler.ServiceID) uint32 {
		t.Helper()
		var inner uint32
		if err := outer.Lookup(uint32(id), &inner); err != nil {
			t.Fatalf("look up the Maglev slot of service id %d: %v", id, err)
		}
		return inner
	}
	stamp := func(t *testing.T, id reconciler.ServiceID) uint64 {
		t.Helper()
		var ns uint64
		if err := swapped.Lookup(uint32(id), &ns); err != nil {
			t.Fatalf("look up maglev_swapped[%d]: %v", id, err)
		}
		return ns
	}
	fam := families[0]
	a := withDefaults(dsrService("a", fam.vip, 80, lb.TCP, fam.backends[:3]...))
	gone := withDefaults(dsrService("gone", fam.vip, 81, lb.TCP, fam.backends[:1]...))
	e.reconcile(t, a, gone)
	id := e.state(t, a.Frontend).ID
	first := slot(t, id)
	if stamp(t, id) != 0 {
		t.Fatalf("a's first table is stamped as a swap")
	}
	// gone leaves the shared empty table in its slot.
	e.reconcile(t, a)

	checkFlows := func(t *testing.T, svc lb.Service, seed uint64) {
		t.Helper()
		for i, f := range randomFlows(svc.Frontend, 16, seed) {
			in := e.frame(t, packet(f, true, false, []byte("in place")))
			if got, want := e.checkTX(t, in, e.run(t, in)), mustPick(t, svc, f); got != want {
				t.Errorf("flow %d: sent to %s, want %s", i, got, want)
			}
		}
	}
	checkKernel := func(t *testing.T) {
		t.Helper()
		if got, want := tables(t, e.lb)[id], e.state(t, a.Frontend).Table; !slices.Equal(got, want) {
			t.Errorf("kernel table of a differs from the reconciler's (%d vs %d slots)", len(got), len(want))
		}
	}

	t.Run("same size", func(t *testing.T) {
		b := a.Clone()
		b.Backends = append(b.Backends[1:], lb.Backend{Addr: netip.AddrPortFrom(fam.backends[3], 80), Weight: 2})
		withoutSysAdmin(t, func() { e.reconcile(t, b) })
		if got := slot(t, id); got != first {
			t.Errorf("the slot holds map %d after a same-size change, want the same map %d rewritten", got, first)
		}
		if stamp(t, id) == 0 {
			t.Errorf("a rewrite in place left maglev_swapped unstamped: a handshake would lose its backend")
		}
		checkKernel(t)
		checkFlows(t, b, 1)
		a = b
	})
	t.Run("new size", func(t *testing.T) {
		b := a.Clone()
		b.TableSize = 509
		if a.TableSize == 509 {
			b.TableSize = 1021
		}
		e.reconcile(t, b)
		if got := slot(t, id); got == first {
			t.Errorf("the slot still holds map %d after the table's size changed, want a new map", got)
		}
		checkKernel(t)
		checkFlows(t, b, 2)
		a = b
	})
	t.Run("after delete", func(t *testing.T) {
		again := withDefaults(dsrService("gone", fam.vip, 81, lb.TCP, fam.backends[:1]...))
		e.reconcile(t, a, again)
		st := e.state(t, again.Frontend)
		if !st.HasTable || len(st.Table) == 0 {
			t.Fatalf("gone came back without a table")
		}
		if got := tables(t, e.lb)[st.ID]; !slices.Equal(got, st.Table) {
			t.Errorf("gone's kernel table differs from the reconciler's")
		}
		checkFlows(t, again, 3)
	})
}
