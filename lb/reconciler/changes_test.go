// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// TestChangesFollowProgrammed drives a reconciler through random passes
// (services added, changed, removed; datapath operations failing at
// random, maps filling up) and checks after each that the states Changes
// reported, applied over the ones reported before, are exactly what
// Programmed holds.
func TestChangesFollowProgrammed(t *testing.T) {
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(m.String()))))
			cfg := reconciler.Config{Seed: testSeed, MaxServices: 24, MaxBackends: 96}
			f := reconcilertest.NewFake()
			f.SetLimits(cfg.MaxServices, cfg.MaxBackends)
			var dp reconciler.Datapath = f
			if m == unbatched {
				dp = reconcilertest.Unbatched(f)
			}
			r := reconciler.New(cfg, dp, nil)
			known := map[lb.Frontend]reconciler.ServiceState{}
			desired := map[int]lb.Service{}
			for pass := range 300 {
				for range rng.IntN(4) + 1 {
					i := rng.IntN(30)
					switch rng.IntN(4) {
					case 0:
						delete(desired, i)
					default:
						var bs []lb.Backend
						for j := range rng.IntN(6) {
							bs = append(bs, be(fmt.Sprintf("10.9.%d.%d:80", i, j+rng.IntN(3))))
						}
						slices.SortFunc(bs, func(a, b lb.Backend) int { return a.Addr.Compare(b.Addr) })
						bs = slices.CompactFunc(bs, func(a, b lb.Backend) bool { return a.Addr == b.Addr })
						desired[i] = svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.0.0.%d", i+1), 80, bs...)
					}
				}
				fail := rng.IntN(5) == 0
				f.FailOn(func(reconcilertest.Op) error {
					if fail && rng.IntN(8) == 0 {
						return errors.New("injected")
					}
					return nil
				})
				var list []lb.Service
				for i := range 30 {
					if s, ok := desired[i]; ok {
						list = append(list, s)
					}
				}
				if rng.IntN(3) == 0 && len(list) > 0 {
					// A partial pass over some known services.
					_ = r.Update(list[:1+rng.IntN(len(list))])
				} else {
					_ = r.Reconcile(list)
				}
				changed, gone := r.Changes()
				for _, s := range changed {
					known[s.Service.Frontend] = s
				}
				for _, fe := range gone {
					delete(known, fe)
				}
				want := map[lb.Frontend]reconciler.ServiceState{}
				for _, s := range r.Programmed().Services {
					want[s.Service.Frontend] = s
				}
				if diff := cmp.Diff(want, known, cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{}, netip.Prefix{})); diff != "" {
					t.Fatalf("pass %d: the states Changes reported differ from Programmed (-want +got):\n%s", pass, diff)
				}
			}
		})
	}
}
