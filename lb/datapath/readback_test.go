// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// pinned opens a map the datapath pinned under dir, as bpftool would.
func pinned(t *testing.T, dir string, name ...string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(append([]string{dir}, name...)...), nil)
	if err != nil {
		t.Fatalf("open pinned map %v: %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// misrouted counts the SYNs of flows to fe, from fresh source ports, that
// the datapath sends to another backend than svc's Maglev table picks, or
// does not send out at all.
func (e *env) misrouted(t *testing.T, svc lb.Service, sport uint16) int {
	t.Helper()
	n := 0
	for i := range 32 {
		f := flowTo(svc.Frontend, families[0].client, sport+uint16(i))
		in := e.frame(t, packet(f, true, false, nil))
		r := e.run(t, in)
		if r.verdict != xdpTX {
			n++
			continue
		}
		if got := checkEncap(t, in, r.out); got != mustPick(t, svc, f) {
			n++
		}
	}
	return n
}

// TestSelfCheckRepairsTampering changes the pinned maps the way an operator
// with bpftool would (a Maglev table row, a backend entry, a service entry,
// a source range, a deleted entry) and checks that one self-check pass
// finds each change, names its map and says what it found, writes the
// programmed state back, and leaves the maps the programs own alone.
func TestSelfCheckRepairsTampering(t *testing.T) {
	dir := pinDir(t, "selfcheck")
	e := newEnvWith(t, envOptions{pinPath: dir})
	fam := families[0]
	a := withDefaults(dsrService("a", fam.vip, 80, lb.TCP, fam.backends[:3]...))
	b := withDefaults(dsrService("b", fam.vip, 443, lb.TCP, fam.backends[1:3]...))
	b.SourceRanges = []netip.Prefix{netip.PrefixFrom(fam.client, 32), netip.MustParsePrefix("198.51.100.0/24")}
	e.reconcile(t, a, b)
	aID := e.state(t, a.Frontend).ID
	bID := e.state(t, b.Frontend).ID
	aKey := bpf.LbSvcKey{Addr: a.Frontend.Addr.As16(), Port: htons(a.Frontend.Port), Proto: uint8(lb.TCP)}
	services := pinned(t, dir, bpf.LbMapServices)
	backends := pinned(t, dir, bpf.LbMapBackends)
	ranges := pinned(t, dir, bpf.LbMapSrcRanges)

	if n := e.misrouted(t, a, 1000); n != 0 {
		t.Fatalf("%d of 32 flows misrouted before any change", n)
	}
	want, err := e.lb.State()
	if err != nil {
		t.Fatal(err)
	}

	for i, tc := range []struct {
		name   string
		tamper func(t *testing.T)
		maps   []string
		// misroutes: the change sends some of a's flows elsewhere.
		misroutes bool
	}{
		{
			name: "Maglev table row rotated",
			tamper: func(t *testing.T) {
				table := pinned(t, dir, "maglev_tables", strconv.FormatUint(uint64(aID), 10))
				var row [16]uint32
				key := uint32(1)
				if err := table.Lookup(&key, &row); err != nil {
					t.Fatal(err)
				}
				rotated := append(row[1:], row[0])
				copy(row[:], rotated)
				if err := table.Update(&key, &row, ebpf.UpdateExist); err != nil {
					t.Fatal(err)
				}
			},
			maps: []string{reconciler.MapMaglev},
		},
		{
			name: "Maglev table rewritten whole",
			tamper: func(t *testing.T) {
				table := pinned(t, dir, "maglev_tables", strconv.FormatUint(uint64(aID), 10))
				ids := e.state(t, a.Frontend).Backends
				for key := uint32(0); key < table.MaxEntries(); key++ {
					var row [16]uint32
					for s := range row {
						if key == 0 && s == 0 {
							row[s] = testTableSize
						} else {
							row[s] = uint32(ids[0].ID)
						}
					}
					if err := table.Update(&key, &row, ebpf.UpdateExist); err != nil {
						t.Fatal(err)
					}
				}
			},
			maps:      []string{reconciler.MapMaglev},
			misroutes: true,
		},
		{
			name: "backend entry rewritten",
			tamper: func(t *testing.T) {
				key := uint32(e.state(t, a.Frontend).Backends[0].ID)
				var v bpf.LbBackend
				if err := backends.Lookup(&key, &v); err != nil {
					t.Fatal(err)
				}
				v.Addr = fam.backends[3].As16()
				if err := backends.Update(&key, &v, ebpf.UpdateExist); err != nil {
					t.Fatal(err)
				}
			},
			maps:      []string{reconciler.MapBackends},
			misroutes: true,
		},
		{
			name: "backend entry cleared",
			tamper: func(t *testing.T) {
				key := uint32(e.state(t, a.Frontend).Backends[1].ID)
				var zero bpf.LbBackend
				if err := backends.Update(&key, &zero, ebpf.UpdateExist); err != nil {
					t.Fatal(err)
				}
			},
			maps:      []string{reconciler.MapBackends},
			misroutes: true,
		},
		{
			name: "service entry rewritten",
			tamper: func(t *testing.T) {
				var v bpf.LbSvcValue
				if err := services.Lookup(&aKey, &v); err != nil {
					t.Fatal(err)
				}
				v.Flags |= bpf.LbL4lbSvcFlagsL4LB_SVC_RANDOM
				if err := services.Update(&aKey, &v, ebpf.UpdateExist); err != nil {
					t.Fatal(err)
				}
			},
			// The CPUs' service caches keep the entry they copied
			// until a write of l4lbd's renews them: the change
			// reaches no packet yet, but the check sees it.
			maps: []string{reconciler.MapServices},
		},
		{
			name: "service entry deleted",
			tamper: func(t *testing.T) {
				if err := services.Delete(&aKey); err != nil {
					t.Fatal(err)
				}
			},
			maps: []string{reconciler.MapServices},
		},
		{
			name: "stray service entry",
			tamper: func(t *testing.T) {
				var v bpf.LbSvcValue
				if err := services.Lookup(&aKey, &v); err != nil {
					t.Fatal(err)
				}
				k := aKey
				k.Port = htons(8080)
				if err := services.Update(&k, &v, ebpf.UpdateNoExist); err != nil {
					t.Fatal(err)
				}
			},
			maps: []string{reconciler.MapServices},
		},
		{
			name: "source range deleted",
			tamper: func(t *testing.T) {
				p := netip.MustParsePrefix("198.51.100.0/24")
				k := bpf.LbSrcRangeKey{Prefixlen: uint32(32 + 96 + p.Bits()), SvcId: uint32(bID), Addr: p.Addr().As16()}
				if err := ranges.Delete(&k); err != nil {
					t.Fatal(err)
				}
			},
			maps: []string{reconciler.MapSourceRanges},
		},
		{
			name: "source range added",
			tamper: func(t *testing.T) {
				p := netip.MustParsePrefix("0.0.0.0/0")
				k := bpf.LbSrcRangeKey{Prefixlen: uint32(32 + 96 + p.Bits()), SvcId: uint32(bID), Addr: p.Addr().As16()}
				if err := ranges.Update(&k, uint8(1), ebpf.UpdateNoExist); err != nil {
					t.Fatal(err)
				}
			},
			maps: []string{reconciler.MapSourceRanges},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sport := uint16(2000 + 100*i)
			tc.tamper(t)
			if tc.misroutes {
				if n := e.misrouted(t, a, sport); n == 0 {
					t.Fatalf("the change misroutes none of 32 flows; the test does not test the repair")
				}
			}
			ct, err := e.lb.ConntrackEntries()
			if err != nil {
				t.Fatal(err)
			}
			ctrs, err := e.lb.ServiceCounters(aID)
			if err != nil {
				t.Fatal(err)
			}

			drifts, err := e.rec.NewCheck(e.lb).Run()
			if err != nil {
				t.Fatalf("self-check: %v", err)
			}
			var got []string
			for _, d := range drifts {
				got = append(got, d.Map)
				t.Logf("drift: %v", d)
				if d.Err != nil {
					t.Errorf("repair failed: %v", d)
				}
			}
			if !slices.Equal(got, tc.maps) {
				t.Errorf("drifts in %v, want %v", got, tc.maps)
			}
			if n := e.misrouted(t, a, sport+50); n != 0 {
				t.Errorf("%d of 32 flows misrouted after the repair", n)
			}
			now, err := e.lb.State()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, now, cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{}, netip.Prefix{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("maps after the repair (-before the change +after):\n%s", diff)
			}
			// The check itself wrote nothing into the programs' maps:
			// the packets above are the only change.
			ct2, _ := e.lb.ConntrackEntries()
			ctrs2, _ := e.lb.ServiceCounters(aID)
			if ct2 < ct || ctrs2.Packets < ctrs.Packets {
				t.Errorf("the check cleared datapath-owned state: %d connection entries before, %d after; %d service packets before, %d after", ct, ct2, ctrs.Packets, ctrs2.Packets)
			}
			again, err := e.rec.NewCheck(e.lb).Run()
			if err != nil || len(again) > 0 {
				t.Errorf("second pass: %v, %v; want nothing", again, err)
			}
		})
	}
}

// TestSelfCheckQuietOnDeletedTables deletes services in one batch (their
// slots then hold the shared empty table) and restarts the datapath over
// the pins: neither is a drift.
func TestSelfCheckQuietOnDeletedTables(t *testing.T) {
	dir := pinDir(t, "selfcheck-quiet")
	opts := envOptions{pinPath: dir}
	e := newEnvWith(t, opts)
	fam := families[0]
	var svcs []lb.Service
	for i := range 4 {
		svcs = append(svcs, withDefaults(dsrService(fmt.Sprintf("s%d", i), fam.vip, uint16(80+i), lb.TCP, fam.backends[:2]...)))
	}
	e.reconcile(t, svcs...)
	e.reconcile(t, svcs[0])
	quiet := func(when string) {
		t.Helper()
		drifts, err := e.rec.NewCheck(e.lb).Run()
		if err != nil || len(drifts) > 0 {
			t.Errorf("%s: check found %v, %v; want nothing", when, drifts, err)
		}
	}
	quiet("after deleting three services")
	e.reload(t, opts, svcs[0])
	quiet("after a restart")
	e.reconcile(t, svcs...)
	quiet("after adding them again")
}

// TestSelfCheckRepairsFrontendFilter clears the frontend filter's words
// through the pin: every packet to the VIP then passes to the stack as if
// no service were there, until one pass writes the words back.
func TestSelfCheckRepairsFrontendFilter(t *testing.T) {
	dir := pinDir(t, "selfcheck-filter")
	e := newEnvWith(t, envOptions{pinPath: dir})
	fam := families[0]
	a := withDefaults(dsrService("a", fam.vip, 80, lb.TCP, fam.backends[:3]...))
	e.reconcile(t, a)
	filter := pinned(t, dir, bpf.LbMapVipFilter)
	cleared := 0
	for i := uint32(0); i < filter.MaxEntries(); i++ {
		var w uint64
		if err := filter.Lookup(&i, &w); err != nil {
			t.Fatal(err)
		}
		if w != 0 {
			if err := filter.Update(&i, uint64(0), ebpf.UpdateExist); err != nil {
				t.Fatal(err)
			}
			cleared++
		}
	}
	if cleared == 0 {
		t.Fatal("the filter holds no bit for the service")
	}
	if n := e.misrouted(t, a, 3000); n != 32 {
		t.Fatalf("%d of 32 flows misrouted with the filter cleared, want all", n)
	}
	drifts, err := e.rec.NewCheck(e.lb).Run()
	if err != nil {
		t.Fatal(err)
	}
	if len(drifts) != cleared {
		t.Errorf("%d drifts, want one per cleared word (%d): %v", len(drifts), cleared, drifts)
	}
	for _, d := range drifts {
		if d.Map != "vip_filter" || d.Err != nil {
			t.Errorf("drift %v, want a repaired vip_filter word", d)
		}
	}
	if n := e.misrouted(t, a, 3100); n != 0 {
		t.Errorf("%d of 32 flows misrouted after the repair", n)
	}
}

// TestTablesComparedInKernel checks the self-check's kernel-side table
// comparison (digest.go, bpf/digest.c): a slot holding the record's table
// is found the same without being read, for sizes around the chunk
// boundaries and the default size; a slot holding anything else (one slot
// changed, another size, a word past the table's end changed behind
// l4lbd's back, no table, the empty table a delete leaves) is read whole,
// and what it holds comes back.
func TestTablesComparedInKernel(t *testing.T) {
	dir := pinDir(t, "digest")
	e := newEnvWith(t, envOptions{pinPath: dir})
	table := func(n int) []reconciler.BackendID {
		out := make([]reconciler.BackendID, n)
		for i := range out {
			out[i] = reconciler.BackendID(1 + i*7%5)
		}
		return out
	}
	ask := func(id reconciler.ServiceID, want []reconciler.BackendID) reconciler.Found {
		t.Helper()
		f, err := e.lb.ReadServices([]reconciler.Expected{{ID: id, HasTable: true, Table: want}})
		if err != nil || len(f) != 1 {
			t.Fatalf("ReadServices(slot %d): %v, %v", id, f, err)
		}
		return f[0]
	}
	var id reconciler.ServiceID = 1
	for _, n := range []int{1, 14, 15, 16, 17, 31, 127, 128, 129, 251, 16381} {
		want := table(n)
		if err := e.lb.SetTable(id, want); err != nil {
			t.Fatal(err)
		}
		if f := ask(id, want); !f.TableSame || f.HasTable {
			t.Errorf("%d slots, the same table: %+v, want TableSame and nothing read", n, f)
		}
		changed := slices.Clone(want)
		changed[n-1]++
		if f := ask(id, changed); f.TableSame || !slices.Equal(f.Table, want) {
			t.Errorf("%d slots, last slot differs: TableSame %t, read %d slots; want the table read", n, f.TableSame, len(f.Table))
		}
		if f := ask(id, want[:n-1]); f.TableSame || !slices.Equal(f.Table, want) {
			t.Errorf("%d slots, asked for one slot fewer: TableSame %t; want the table read", n, f.TableSame)
		}
		id++
	}

	// A word past the table's end, which no packet reads, written
	// through the pin: not the same, but reads back as the same table.
	want := table(20)
	if err := e.lb.SetTable(id, want); err != nil {
		t.Fatal(err)
	}
	inner := pinned(t, dir, "maglev_tables", strconv.Itoa(int(id)))
	var chunk [datapath.MaglevChunk]uint32
	key := uint32(1)
	if err := inner.Lookup(&key, &chunk); err != nil {
		t.Fatal(err)
	}
	chunk[datapath.MaglevChunk-1] = 99
	if err := inner.Update(&key, &chunk, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	if f := ask(id, want); f.TableSame || !f.HasTable || !slices.Equal(f.Table, want) {
		t.Errorf("padding changed: %+v; want the table read whole and equal", f)
	}

	// A slot with no table, and one with the empty table a delete leaves.
	id++
	if f := ask(id, want); f.TableSame || f.HasTable {
		t.Errorf("no table: %+v, want none found", f)
	}
	if err := e.lb.SetTable(id, want); err != nil {
		t.Fatal(err)
	}
	if err := e.lb.DeleteTable(id); err != nil {
		t.Fatal(err)
	}
	if f := ask(id, want); f.TableSame || f.HasTable {
		t.Errorf("deleted table: %+v, want none found", f)
	}
}
