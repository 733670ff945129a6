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

// TestViewIsProgrammed drives a reconciler through random passes (services
// added, changed, removed; datapath operations failing at random, maps
// filling up) and checks after each that View holds what Programmed holds,
// and that every service whose state moved since the last View is among
// the frontends View says changed.
func TestViewIsProgrammed(t *testing.T) {
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
			var prev reconciler.State
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
				_ = r.Reconcile(list)
				got, changed := r.View()
				want := r.Programmed()
				if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{}, netip.Prefix{})); diff != "" {
					t.Fatalf("pass %d: View differs from Programmed (-want +got):\n%s", pass, diff)
				}
				moved := map[lb.Frontend]bool{}
				for _, fe := range changed {
					moved[fe] = true
				}
				before := map[lb.Frontend]reconciler.ServiceState{}
				for _, s := range prev.Services {
					before[s.Service.Frontend] = s
				}
				for _, s := range got.Services {
					if old, ok := before[s.Service.Frontend]; (!ok || !cmp.Equal(old, s, cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{}, netip.Prefix{}))) && !moved[s.Service.Frontend] {
						t.Fatalf("pass %d: %s changed but View did not say so", pass, s.Service.Frontend)
					}
					delete(before, s.Service.Frontend)
				}
				for fe := range before {
					if !moved[fe] {
						t.Fatalf("pass %d: %s is gone but View did not say so", pass, fe)
					}
				}
				prev = want
			}
		})
	}
}
