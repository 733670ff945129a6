// SPDX-License-Identifier: Apache-2.0

// Package discoverytest is test support for the discovery sources' latency
// tests: the control plane after a source (merge, defaults, reconcile into
// one datapath), timed from a change in what the source watches to the
// datapath's state. No l4lb program imports it.
package discoverytest

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Pipeline is merge, defaults and reconcile into one datapath.
type Pipeline struct {
	Name     string
	Merger   *discovery.Merger
	Rec      *reconciler.Reconciler
	State    func() (reconciler.State, error)
	Defaults lb.Defaults
	// Lat collects what the caller times.
	Lat []time.Duration
}

// Apply runs snap through the pipeline and checks that the datapath then
// holds backend addr of the frontend fe (as an entry in its table) exactly
// when want says so.
func (p *Pipeline) Apply(t testing.TB, snap discovery.Snapshot, fe lb.Frontend, addr netip.AddrPort, want bool) {
	t.Helper()
	p.Merger.Update(snap)
	merged, conflicts := p.Merger.Desired()
	if len(conflicts) > 0 {
		t.Fatalf("%s: conflicts %v", p.Name, conflicts)
	}
	desired := make([]lb.Service, len(merged))
	for i, s := range merged {
		desired[i] = s.WithDefaults(p.Defaults)
	}
	if err := p.Rec.Reconcile(desired); err != nil {
		t.Fatalf("%s: reconcile: %v", p.Name, err)
	}
	st, err := p.State()
	if err != nil {
		t.Fatalf("%s: read state: %v", p.Name, err)
	}
	if got := InTable(st, fe, addr); got != want {
		t.Fatalf("%s: backend %s programmed = %v after reconcile, want %v", p.Name, addr, got, want)
	}
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
