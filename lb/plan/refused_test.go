// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// TestMapFullRefusals: the refusals come from the reconciler's typed
// errors, read from a real reconcile over the fake datapath whose maps
// are too small: one service too many, one with too many backends.
func TestMapFullRefusals(t *testing.T) {
	rec := reconciler.New(reconciler.Config{Seed: maglev.Seed{1}, MaxServices: 2, MaxBackends: 3}, reconcilertest.NewFake(), slog.New(slog.DiscardHandler))
	svc := func(name, vip, source string, n int) lb.Service {
		s := lb.Service{Name: name, Source: source, Frontend: lb.Frontend{Addr: netip.MustParseAddr(vip), Port: 80, Proto: lb.TCP},
			Mode: lb.ModeSNAT, TableSize: 251}
		for i := range n {
			s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), 1}), 80), Weight: 1})
		}
		return s
	}
	desired := []lb.Service{svc("a", "10.0.0.1", "file:x", 1), svc("c", "10.0.0.2", "file:x", 3), svc("d", "10.0.0.3", "file:x", 1), svc("e", "10.0.0.4", "consul", 1)}
	err := rec.Reconcile(desired)
	if err == nil {
		t.Fatal("no error from a reconcile that cannot fit")
	}
	got := mapFull(err, desired)
	want := []metrics.Refusal{
		{Service: "c", Source: "file:x", Reason: metrics.RefusedMapFull},
		{Service: "e", Source: "consul", Reason: metrics.RefusedMapFull},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v (reconcile error: %v)", got, want, err)
	}
	if mapFull(nil, desired) != nil {
		t.Fatal("no error, no refusal")
	}
}
