// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// counting passes every call to the LB and counts the table calls, batch
// by batch.
type counting struct {
	*datapath.LB
	setTables, deleteTables []int // sizes of the batches
	setTable, deleteTable   int
}

func (c *counting) SetTable(svc reconciler.ServiceID, t []reconciler.BackendID) error {
	c.setTable++
	return c.LB.SetTable(svc, t)
}

func (c *counting) DeleteTable(svc reconciler.ServiceID) error {
	c.deleteTable++
	return c.LB.DeleteTable(svc)
}

func (c *counting) SetTables(svcs []reconciler.ServiceID, t [][]reconciler.BackendID) []error {
	c.setTables = append(c.setTables, len(svcs))
	return c.LB.SetTables(svcs, t)
}

func (c *counting) DeleteTables(svcs []reconciler.ServiceID) []error {
	c.deleteTables = append(c.deleteTables, len(svcs))
	return c.LB.DeleteTables(svcs)
}

func (c *counting) reset() { *c = counting{LB: c.LB} }

// tables returns the Maglev tables the kernel holds, by service id.
func tables(t testing.TB, d *datapath.LB) map[reconciler.ServiceID][]reconciler.BackendID {
	t.Helper()
	st, err := d.State()
	if err != nil {
		t.Fatalf("read datapath state: %v", err)
	}
	out := map[reconciler.ServiceID][]reconciler.BackendID{}
	for _, s := range st.Services {
		if s.HasTable {
			out[s.ID] = s.Table
		}
	}
	return out
}

// TestBatchedTables programs, changes and removes many services in one pass
// each, so that their tables go through SetTables and DeleteTables, and
// checks that packets follow the tables and that the kernel holds exactly
// what the reconciler recorded.
func TestBatchedTables(t *testing.T) {
	e := newEnv(t)
	c := &counting{LB: e.lb}
	cfg := reconciler.Config{Seed: testSeed, MaxServices: 64, MaxBackends: 256}
	e.rec = reconciler.New(cfg, c, nil)

	var svcs []lb.Service
	for _, fam := range families {
		for port := uint16(80); port < 84; port++ {
			svcs = append(svcs, dsrService(fmt.Sprintf("tcp%d-%s", port, fam.name), fam.vip, port, lb.TCP, fam.backends...))
		}
		svcs = append(svcs, dsrService("dns-"+fam.name, fam.vip, 53, lb.UDP, fam.backends[:3]...))
	}

	// checkForwarding sends new flows (drawn from seed) to every service
	// in svcs and checks each lands on the backend Go computes from the
	// service alone. Each step uses its own seed: the connection table
	// rightly keeps a flow seen before on its backend.
	checkForwarding := func(t *testing.T, seed uint64, svcs []lb.Service) {
		t.Helper()
		for _, svc := range svcs {
			for i, f := range randomFlows(svc.Frontend, 8, seed) {
				in := e.frame(t, packet(f, true, false, []byte("batched")))
				got := e.checkTX(t, in, e.run(t, in))
				if want := mustPick(t, svc, f); got != want {
					t.Errorf("%s flow %d: sent to %s, want %s", svc.Name, i, got, want)
				}
			}
		}
	}
	// checkKernel compares the kernel's tables with the reconciler's view.
	checkKernel := func(t *testing.T) {
		t.Helper()
		want := map[reconciler.ServiceID][]reconciler.BackendID{}
		for _, s := range e.rec.Programmed().Services {
			if s.HasTable {
				want[s.ID] = s.Table
			}
		}
		if diff := cmp.Diff(want, tables(t, e.lb)); diff != "" {
			t.Errorf("kernel tables (-reconciler +kernel):\n%s", diff)
		}
	}

	t.Run("add", func(t *testing.T) {
		e.reconcile(t, svcs...)
		if !slices.Equal(c.setTables, []int{len(svcs)}) || c.setTable != 0 {
			t.Errorf("tables went in as batches %v and %d single swaps, want one batch of %d", c.setTables, c.setTable, len(svcs))
		}
		checkKernel(t)
		checkForwarding(t, 1, svcs)
	})

	// Every service loses its first backend and reweights another: every
	// table changes, in one batch over the tables in place.
	changed := make([]lb.Service, len(svcs))
	for i, s := range svcs {
		s = s.Clone()
		s.Backends = s.Backends[1:]
		s.Backends[0].Weight = 3
		changed[i] = s
	}
	t.Run("change", func(t *testing.T) {
		c.reset()
		e.reconcile(t, changed...)
		if !slices.Equal(c.setTables, []int{len(svcs)}) || c.setTable != 0 {
			t.Errorf("tables went in as batches %v and %d single swaps, want one batch of %d", c.setTables, c.setTable, len(svcs))
		}
		checkKernel(t)
		checkForwarding(t, 2, changed)
	})

	// Half the services go: their tables leave in one batch, the others
	// keep forwarding, and packets to the removed ones reach the stack.
	var kept, removed []lb.Service
	for i, s := range changed {
		if i%2 == 0 {
			kept = append(kept, s)
		} else {
			removed = append(removed, s)
		}
	}
	t.Run("remove", func(t *testing.T) {
		c.reset()
		e.reconcile(t, kept...)
		if !slices.Equal(c.deleteTables, []int{len(removed)}) || c.deleteTable != 0 {
			t.Errorf("tables left as batches %v and %d single deletes, want one batch of %d", c.deleteTables, c.deleteTable, len(removed))
		}
		checkKernel(t)
		checkForwarding(t, 3, kept)
		for _, svc := range removed {
			f := randomFlows(svc.Frontend, 1, 4)[0]
			in := e.frame(t, packet(f, true, false, nil))
			before := e.reasons(t)
			if r := e.run(t, in); r.verdict != xdpPass {
				t.Errorf("%s after removal: verdict %s, want XDP_PASS", svc.Name, verdictName(r.verdict))
			}
			e.expectReasons(t, before, map[string]uint64{"pass_not_service": 1})
		}
	})

	// What the kernel holds after batches restores cleanly: the emptied
	// slots are not mistaken for orphaned tables.
	t.Run("restore", func(t *testing.T) {
		st, err := e.lb.State()
		if err != nil {
			t.Fatal(err)
		}
		c.reset()
		r, err := reconciler.NewFromState(cfg, c, nil, st)
		if err != nil {
			t.Fatalf("NewFromState: %v", err)
		}
		in := make([]lb.Service, len(kept))
		for i, s := range kept {
			in[i] = withDefaults(s)
		}
		if err := r.Reconcile(in); err != nil {
			t.Fatal(err)
		}
		if c.setTable+c.deleteTable+len(c.setTables)+len(c.deleteTables) != 0 {
			t.Errorf("restored reconciler touched tables: %+v", *c)
		}
		// A removed service's id is free again, and its new table
		// replaces the empty one left in the slot.
		e.rec = r
		e.reconcile(t, append(kept, removed[0])...)
		checkForwarding(t, 5, append(kept, removed[0]))
	})
}

// TestTableBatchEntryFailures calls SetTables and DeleteTables directly with
// a service id the outer map has no slot for: the kernel stops the batch
// there, the entries before it are done and the ones after it are not.
func TestTableBatchEntryFailures(t *testing.T) {
	testnet.RequireRoot(t)
	d, err := datapath.Load(datapath.Config{Seed: testSeed, MaxServices: 8, MaxBackends: 16, ConntrackMax: 64})
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	defer d.Close()
	const noSlot = 4096
	table := func(id reconciler.BackendID) []reconciler.BackendID {
		return []reconciler.BackendID{id, id, id, id, id, id, id}
	}
	checkErrs := func(t *testing.T, errs []error, want []string) {
		t.Helper()
		if len(errs) != len(want) {
			t.Fatalf("%d results, want %d", len(errs), len(want))
		}
		for i, err := range errs {
			switch {
			case want[i] == "" && err != nil:
				t.Errorf("entry %d: %v, want success", i, err)
			case want[i] != "" && (err == nil || !strings.Contains(err.Error(), want[i])):
				t.Errorf("entry %d: %v, want an error containing %q", i, err, want[i])
			}
		}
	}
	ids := func() []reconciler.ServiceID {
		return slices.Sorted(func(yield func(reconciler.ServiceID) bool) {
			for id := range tables(t, d) {
				if !yield(id) {
					return
				}
			}
		})
	}

	errs := d.SetTables([]reconciler.ServiceID{1, 2, noSlot, 3}, [][]reconciler.BackendID{table(1), table(2), table(9), table(3)})
	checkErrs(t, errs, []string{"", "", "swap in Maglev table for service id 4096", "service id 3: not applied: the batch update stopped at slot 4096"})
	if got := tables(t, d); !slices.Equal(ids(), []reconciler.ServiceID{1, 2}) || !slices.Equal(got[2], table(2)) {
		t.Errorf("tables after a batch stopped at its third entry: %v, want 1 and 2", got)
	}

	errs = d.DeleteTables([]reconciler.ServiceID{1, noSlot, 2})
	checkErrs(t, errs, []string{"", "delete Maglev table of service id 4096", "service id 2: not applied: the batch update stopped at slot 4096"})
	if got := ids(); !slices.Equal(got, []reconciler.ServiceID{2}) {
		t.Errorf("tables after a delete batch stopped at its second entry: %v, want 2", got)
	}

	// Clearing a slot that holds no table, or only an emptied one, is not
	// an error.
	checkErrs(t, d.DeleteTables([]reconciler.ServiceID{1, 2, 5}), []string{"", "", ""})
	if got := ids(); len(got) != 0 {
		t.Errorf("tables left: %v", got)
	}
	if err := d.SetTable(1, table(4)); err != nil {
		t.Fatal(err)
	}
	if got := tables(t, d); !slices.Equal(got[1], table(4)) {
		t.Errorf("table 1 after SetTable over an emptied slot: %v", got[1])
	}
}

// TestTableBatchTiming logs how long 200 services take to add, change and
// remove with batched table swaps and without. It asserts only that both
// paths end in the same maps; the times are for the log (and the report),
// not for a threshold.
func TestTableBatchTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the unbatched half takes seconds (one RCU grace period per table)")
	}
	testnet.RequireRoot(t)
	const n = 200
	svcs := make([]lb.Service, n)
	for i := range svcs {
		vip := netip.AddrFrom4([4]byte{192, 0, 2 + byte(i/250), byte(1 + i%250)})
		var bs []netip.Addr
		for j := range 3 {
			bs = append(bs, netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j + 1)}))
		}
		svcs[i] = withDefaults(dsrService(fmt.Sprintf("svc%d", i), vip, 80, lb.TCP, bs...))
	}
	changed := make([]lb.Service, n)
	for i, s := range svcs {
		s = s.Clone()
		s.Backends = append(s.Backends[1:], lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i), 1}), 80), Weight: 1})
		changed[i] = s
	}

	type step struct {
		name    string
		desired []lb.Service
	}
	steps := []step{{"add", svcs}, {"change", changed}, {"remove", nil}}
	dumps := map[string][]string{}
	for _, batched := range []bool{true, false} {
		name := map[bool]string{true: "batched", false: "unbatched"}[batched]
		d, err := datapath.Load(datapath.Config{
			Seed: testSeed, MaxServices: 256, MaxBackends: 1024, ConntrackMax: 64,
			Log: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatalf("load datapath: %v", err)
		}
		var dp reconciler.Datapath = d
		if !batched {
			dp = reconcilertest.Unbatched(d)
		}
		r := reconciler.New(reconciler.Config{Seed: testSeed, MaxServices: 256, MaxBackends: 1024}, dp, nil)
		for _, s := range steps {
			start := time.Now()
			if err := r.Reconcile(slices.Clone(s.desired)); err != nil {
				t.Fatalf("%s %s: %v", name, s.name, err)
			}
			took := time.Since(start)
			t.Logf("%d services, %-6s %-9s %8.1f ms", n, s.name, name, float64(took.Microseconds())/1000)
			tabs := tables(t, d)
			dumps[s.name] = append(dumps[s.name], fmt.Sprint(len(tabs), tabs))
		}
		d.Close()
	}
	for _, s := range steps {
		if got := dumps[s.name]; got[0] != got[1] {
			t.Errorf("after %s the batched and unbatched datapaths hold different tables", s.name)
		}
	}
}
