// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/plan"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Sync is one way of applying the rules with iptables, measured.
type Sync struct {
	// Time is the median over the changes measured (Samples): rule
	// generation plus iptables-restore. When Over, it is the budget the
	// restore ran past, a lower bound.
	Time    time.Duration `json:"time_ns"`
	Samples int           `json:"samples"`
	Lines   int           `json:"lines"`
	Bytes   int           `json:"bytes"`
	// Over is true when Time is a lower bound: this restore ran past its
	// budget and was stopped, or a smaller rule set applied the same way
	// already had and this one was not run (Note says which).
	Over bool `json:"over_budget,omitempty"`
	// Note says why a figure is a bound or missing.
	Note string `json:"note,omitempty"`
}

// measured reports whether s has a figure, exact or a lower bound.
func (s Sync) measured() bool { return s.Time > 0 }

// CPRow is one size of the control-plane scenario: the cost of one
// endpoint change (one endpoint of one service replaced by another) at that
// size, for each way of applying it.
type CPRow struct {
	Services int `json:"services"`
	Backends int `json:"backends_per_service"`
	// Load is the whole rule set restored into empty tables (iptables-
	// restore without --noflush), as at a start of kube-proxy.
	Load Sync `json:"iptables_load"`
	// Full is kube-proxy's full sync, Partial kube-proxy 1.28+'s partial
	// sync, each after one endpoint change.
	Full    Sync `json:"iptables_full_sync"`
	Partial Sync `json:"iptables_partial_sync"`
	// L4LBLoad is the first reconcile of every service, for scale.
	L4LBLoad time.Duration `json:"l4lb_load_ns"`
	// L4LB is the pass l4lbd runs for a source's snapshot with the
	// change (merge, then lb/plan's pass over the changed service), on
	// the real BPF maps; the median of L4LBSamples changes.
	L4LB        time.Duration `json:"l4lb_change_ns"`
	L4LBSamples int           `json:"l4lb_samples"`
	// L4LBOps counts the datapath operations of one change, by kind.
	L4LBOps map[string]int `json:"l4lb_ops"`
	// L4LBTableSlots is the size of the Maglev table the change rebuilt.
	L4LBTableSlots uint32 `json:"l4lb_table_slots"`
}

// Ratio is s.Time / l4lb, 0 without both figures.
func (s Sync) Ratio(l4lb time.Duration) float64 {
	if !s.measured() || l4lb == 0 {
		return 0
	}
	return float64(s.Time) / float64(l4lb)
}

// counting passes every datapath call through to the real BPF datapath and
// counts it, so the figure is what one change really issues.
type counting struct {
	dp  *datapath.LB
	ops map[string]int
}

func (c *counting) SetBackend(id reconciler.BackendID, b reconciler.Backend) error {
	c.ops["backend_write"]++
	return c.dp.SetBackend(id, b)
}

func (c *counting) DeleteBackend(id reconciler.BackendID) error {
	c.ops["backend_clear"]++
	return c.dp.DeleteBackend(id)
}

func (c *counting) SetTable(svc reconciler.ServiceID, table []reconciler.BackendID) error {
	c.ops["table_swap"]++
	return c.dp.SetTable(svc, table)
}

func (c *counting) DeleteTable(svc reconciler.ServiceID) error {
	c.ops["table_delete"]++
	return c.dp.DeleteTable(svc)
}

func (c *counting) SetService(id reconciler.ServiceID, svc lb.Service) error {
	c.ops["service_write"]++
	return c.dp.SetService(id, svc)
}

func (c *counting) DeleteService(id reconciler.ServiceID, fe lb.Frontend) error {
	c.ops["service_delete"]++
	return c.dp.DeleteService(id, fe)
}

func (c *counting) SetTables(svcs []reconciler.ServiceID, tables [][]reconciler.BackendID) []error {
	c.ops["table_swap"] += len(svcs)
	return c.dp.SetTables(svcs, tables)
}

func (c *counting) DeleteTables(svcs []reconciler.ServiceID) []error {
	c.ops["table_delete"] += len(svcs)
	return c.dp.DeleteTables(svcs)
}

// sumOps is the number of datapath operations in ops.
func sumOps(ops map[string]int) int {
	n := 0
	for _, v := range ops {
		n += v
	}
	return n
}

// cpSize is one size of the scenario.
type cpSize struct{ services, backends int }

// lines is about how many lines the size's rule set has: what orders the
// sizes by cost.
func (c cpSize) lines() int { return c.services * (3*c.backends + 2) }

// cpRepeat bounds the time spent repeating one measurement: a change is
// measured again (up to o.cpChanges times) only while the ones before took
// less than this together. A restore of many seconds varies little
// against the ratios the table shows, and repeating it would make the run
// far longer.
const cpRepeat = 5 * time.Second

// controlPlane measures one endpoint change at each size: iptables in a
// namespace of its own, then l4lb on a fresh datapath. Sizes run smallest
// rule set first, so that a way of applying that already ran past its
// budget is not started again on a bigger rule set.
func controlPlane(ctx context.Context, t *testnet.Script, o options, p *progress) []CPRow {
	var sizes []cpSize
	for _, b := range o.cpBackends {
		for _, n := range o.cpServices {
			sizes = append(sizes, cpSize{n, b})
		}
	}
	order := slices.Clone(sizes)
	slices.SortStableFunc(order, func(a, b cpSize) int { return a.lines() - b.lines() })
	over := map[string]int{} // way of applying -> lines of the smallest rule set over budget
	rows := map[cpSize]CPRow{}
	for _, sz := range order {
		p.step("control plane: %d services x %d backends", sz.services, sz.backends)
		row := CPRow{Services: sz.services, Backends: sz.backends}
		cpIPTables(ctx, t, o, &row, over)
		checkCtx(t, ctx)
		cpL4LB(t, o, &row)
		p.done("iptables: load %s, full sync %s, partial sync %s; l4lb %s (%d datapath ops)",
			syncCell(row.Load), syncCell(row.Full), syncCell(row.Partial), us(row.L4LB), sumOps(row.L4LBOps))
		rows[sz] = row
	}
	out := make([]CPRow, 0, len(sizes))
	for _, sz := range sizes {
		out = append(out, rows[sz])
	}
	return out
}

// changeTarget is the endpoint that change k replaces: spread over the
// services and endpoints, each change to a new address.
func changeTarget(n, b, k int) (svc, ep int, to netip.AddrPort) {
	svc = (k * 7919) % n
	ep = k % b
	to = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 245, byte(k >> 8), byte(k)}), 8080)
	return svc, ep, to
}

func cpIPTables(ctx context.Context, t *testnet.Script, o options, row *CPRow, over map[string]int) {
	ns := testnet.NewNS(t, "cpipt")
	// The rule sets of the largest sizes hold hundreds of MB in the
	// kernel: give them back before the next size.
	defer ns.Close()
	w := newWorkload(row.Services, row.Backends)

	// restore applies r within budget and records it in s under the name
	// way; it returns false when the rules were not applied.
	restore := func(way string, s *Sync, r *kpRuleset, budget time.Duration) (time.Duration, bool) {
		s.Lines, s.Bytes = r.lines, r.buf.Len()
		if lim, ok := over[way]; ok && r.lines >= lim {
			s.Time, s.Over = budget, true
			s.Note = fmt.Sprintf("not run: a rule set of %d lines already ran past the %s budget", lim, budget)
			return 0, false
		}
		c, cancel := context.WithTimeout(ctx, budget)
		took, err := kpRestore(c, ns, r)
		cancel()
		if errors.Is(err, errTimeout) {
			checkCtx(t, ctx)
			over[way] = r.lines
			s.Time, s.Over = budget, true
			s.Note = fmt.Sprintf("ran past the %s budget and was stopped", budget)
			return 0, false
		}
		if err != nil {
			t.Fatalf("control plane, %d services x %d backends: %v", row.Services, row.Backends, err)
		}
		return took, true
	}

	start := time.Now()
	if _, ok := restore("load", &row.Load, kpSync(kpWhole, w.svcs, nil, nil), o.loadBudget()); !ok {
		// Without the rules in, no change can be measured.
		for _, s := range []*Sync{&row.Full, &row.Partial} {
			s.Note = "not run: the rules could not be loaded within the budget"
		}
		return
	}
	row.Load.Time, row.Load.Samples = time.Since(start), 1

	// Changes not yet in the kernel, because the restore that carried
	// them was stopped, go into the next sync, as in kube-proxy.
	changed, gone := map[int]bool{}, []string(nil)
	k := 0
	for _, m := range []kpMode{kpFull, kpPartial} {
		s := map[kpMode]*Sync{kpFull: &row.Full, kpPartial: &row.Partial}[m]
		var times []time.Duration
		var spent time.Duration
		for len(times) < o.cpChanges && spent < cpRepeat {
			i, j, to := changeTarget(row.Services, row.Backends, k)
			k++
			changed[i] = true
			gone = append(gone, w.replaceEndpoint(i, j, to))
			start := time.Now()
			r := kpSync(m, w.svcs, changed, gone)
			if _, ok := restore(m.String(), s, r, o.syncBudget); !ok {
				break
			}
			took := time.Since(start)
			times = append(times, took)
			spent += took
			changed, gone = map[int]bool{}, nil
		}
		if len(times) > 0 {
			if s.Over {
				s.Note = fmt.Sprintf("change %d %s; the figure is the median of the others", len(times)+1, s.Note)
			}
			s.Time, s.Samples, s.Over = median(times), len(times), false
		}
	}
}

func cpL4LB(t *testnet.Script, o options, row *CPRow) {
	w := newWorkload(row.Services, row.Backends)
	total := uint32(row.Services*row.Backends + o.cpChanges + 1)
	d, err := datapath.Load(datapath.Config{
		Seed: seed, MaxServices: uint32(row.Services), MaxBackends: total,
		ConntrackMax: 1 << 16, SNATAddresses: []netip.Addr{netip.MustParseAddr("10.100.0.12")},
		Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("control plane: load datapath: %v", err)
	}
	defer d.Close()
	dp := &counting{dp: d, ops: map[string]int{}}
	merger := discovery.NewMerger()
	p := plan.New(plan.Config{Seed: seed, Rec: reconciler.New(reconciler.Config{Seed: seed, MaxServices: uint32(row.Services), MaxBackends: total}, dp, nil), Merger: merger})
	svcs := w.lbServices()
	start := time.Now()
	merger.Update(discovery.Snapshot{Source: "compare", Services: svcs})
	if res := p.Pass(start); res.Err != nil || len(res.View.Rejected) > 0 {
		t.Fatalf("control plane: program %d services: %v %v", row.Services, res.Err, res.View.Rejected)
	}
	row.L4LBLoad = time.Since(start)
	var lat []time.Duration
	for k := range o.cpChanges {
		i, j, to := changeTarget(row.Services, row.Backends, k)
		svcs[i].Backends = slices.Clone(svcs[i].Backends)
		svcs[i].Backends[j].Addr = to
		dp.ops = map[string]int{}
		start := time.Now()
		merger.Update(discovery.Snapshot{Source: "compare", Services: svcs})
		if res := p.Pass(start); res.Err != nil || res.View == nil || res.Full {
			t.Fatalf("control plane: a change to one service: error %v, or not a pass over it", res.Err)
		}
		lat = append(lat, time.Since(start))
		row.L4LBOps = dp.ops
		row.L4LBTableSlots = svcs[i].TableSize
	}
	row.L4LB, row.L4LBSamples = median(lat), len(lat)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// checkCtx aborts the run when it was interrupted.
func checkCtx(t *testnet.Script, ctx context.Context) {
	if ctx.Err() != nil {
		t.Fatalf("interrupted")
	}
}

func secs(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return ms(d)
}

func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f ms", float64(d)/1e6)
}

func us(d time.Duration) string {
	if d >= 10*time.Millisecond {
		return ms(d)
	}
	return fmt.Sprintf("%.0f µs", float64(d)/1e3)
}
