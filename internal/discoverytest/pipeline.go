// SPDX-License-Identifier: Apache-2.0

// Package discoverytest is test support for the discovery sources' tests:
// the control plane after a source (the merger and l4lbd's own pipeline,
// lb/plan, into a datapath), so that a test can time a change in what the
// source watches until the datapath holds it, into the fake datapath and,
// as root, into the real BPF maps; and helpers to read snapshots. No l4lb
// program imports it.
package discoverytest

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/plan"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// Pipeline is the merger and l4lbd's pipeline (lb/plan) into one
// datapath.
type Pipeline struct {
	Name   string
	Merger *discovery.Merger
	Plan   *plan.Plan
	State  func() (reconciler.State, error)
}

// newPipeline is a pipeline named name into dp, with the services'
// defaults defs.
func newPipeline(name string, rcfg reconciler.Config, dp reconciler.Datapath, defs lb.Defaults, state func() (reconciler.State, error)) *Pipeline {
	m := discovery.NewMerger()
	p := plan.New(plan.Config{Seed: rcfg.Seed, Rec: reconciler.New(rcfg, dp, nil), Merger: m})
	p.SetDefaults(defs)
	return &Pipeline{Name: name, Merger: m, Plan: p, State: state}
}

// Pipelines returns a pipeline into the fake datapath and, as root, one
// into real BPF maps (loaded, not attached, unpinned, closed when the test
// ends), both with the services' defaults defs. Without root only the
// fake one is returned, and the test log says so.
func Pipelines(t testing.TB, defs lb.Defaults) []*Pipeline {
	t.Helper()
	seed := maglev.Seed{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	rcfg := reconciler.Config{Seed: seed, MaxServices: 64, MaxBackends: 256}
	fake := reconcilertest.NewFake()
	pipes := []*Pipeline{newPipeline("fake datapath", rcfg, fake, defs, func() (reconciler.State, error) { return fake.State(), nil })}
	if os.Geteuid() != 0 || testing.Short() {
		t.Log("not root, or -short: timing the fake datapath only")
		return pipes
	}
	dp, err := datapath.Load(datapath.Config{Seed: seed, MaxServices: 64, MaxBackends: 256, ConntrackMax: 4096,
		// SNAT needs a source address; it is only stored, no packet is sent.
		SNATAddresses: []netip.Addr{netip.MustParseAddr("198.18.0.1")},
		Log:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("load the datapath: %v", err)
	}
	t.Cleanup(func() { dp.Close() })
	return append(pipes, newPipeline("BPF maps", rcfg, dp, defs, dp.State))
}

// Apply runs snap through the pipeline as l4lbd's control loop does (the
// pass its changes need, plan.Plan.Pass) and checks that the datapath then
// holds backend addr of the frontend fe (as an entry in its table) exactly
// when want says so. It returns how long merge and pass took, until the
// datapath was written; reading it back to check is not counted.
func (p *Pipeline) Apply(t testing.TB, snap discovery.Snapshot, fe lb.Frontend, addr netip.AddrPort, want bool) time.Duration {
	t.Helper()
	start := time.Now()
	p.Merger.Update(snap)
	res := p.Plan.Pass(start)
	took := time.Since(start)
	if res.Err != nil {
		t.Fatalf("%s: reconcile: %v", p.Name, res.Err)
	}
	if v := p.Plan.View(); len(v.Conflicts) > 0 || len(v.Rejected) > 0 {
		t.Fatalf("%s: conflicts %v, rejected %v", p.Name, v.Conflicts, v.Rejected)
	}
	st, err := p.State()
	if err != nil {
		t.Fatalf("%s: read state: %v", p.Name, err)
	}
	if got := InTable(st, fe, addr); got != want {
		t.Fatalf("%s: backend %s programmed = %v after reconcile, want %v", p.Name, addr, got, want)
	}
	return took
}

// InTable reports whether backend addr of fe has slots in its table.
func InTable(st reconciler.State, fe lb.Frontend, addr netip.AddrPort) bool {
	for _, s := range st.Services {
		if s.Service.Frontend != fe {
			continue
		}
		for _, b := range s.Backends {
			if b.Addr == addr && slices.Contains(s.Table, b.ID) {
				return true
			}
		}
	}
	return false
}

// Percentile is the p-quantile (0..1) of ds, nearest rank.
func Percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Summary is "median M, p99 P" of ds, rounded to microseconds.
func Summary(ds []time.Duration) string {
	return "median " + Percentile(ds, 0.5).Round(time.Microsecond).String() + ", p99 " + Percentile(ds, 0.99).Round(time.Microsecond).String()
}

// Find returns the service called name.
func Find(svcs []lb.Service, name string) (lb.Service, bool) {
	i := slices.IndexFunc(svcs, func(s lb.Service) bool { return s.Name == name })
	if i < 0 {
		return lb.Service{}, false
	}
	return svcs[i], true
}

// Dump renders services one a line, "name frontend: addr/wN/state …", for
// failure messages and comparisons.
func Dump(svcs []lb.Service) string {
	var b strings.Builder
	for _, s := range svcs {
		fmt.Fprintf(&b, "  %s %s:", s.Name, s.Frontend)
		for _, be := range s.Backends {
			fmt.Fprintf(&b, " %s/w%d/%s", be.Addr, be.Weight, be.State)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
