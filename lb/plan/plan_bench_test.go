// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// BenchmarkOverridePass is the control loop's share of one runtime
// override (drain, then enable, one backend of one service) at 1,000 and
// 100,000 services of 10 backends, into the fake datapath: what the pass
// over a few services costs besides the BPF writes. Its time per
// operation should not grow with the number of services.
func BenchmarkOverridePass(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			hm := health.New(health.Options{Log: slog.New(slog.DiscardHandler)})
			defer hm.Stop()
			d := newTestPlan(b, "[datapath]\ninterfaces = [\"lo\"]\nmode = \"snat\"\n[maglev]\ntable_size = 31\n", reconcilertest.NewFake(), hm)
			d.rec = reconciler.New(reconciler.Config{Seed: d.cfg.Maglev.Seed, MaxServices: uint32(n), MaxBackends: uint32(10 * n)}, reconcilertest.NewFake(), slog.New(slog.DiscardHandler))
			d.SetDatapath(d.rec, nil)
			svcs := reconcilertest.Many(n, 10)
			d.merger.Update(discovery.Snapshot{Source: "file:bench.toml", Services: svcs})
			if err := d.apply(); err != nil {
				b.Fatalf("first pass: %v", err)
			}
			name := svcs[n/2].Name
			k := Key{Service: name, Backend: svcs[n/2].Backends[3].Addr}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for i := range b.N {
				st := lb.Draining
				if i%2 == 1 {
					st = lb.Active
				}
				d.overrides[k] = Override{Key: k, State: st, Since: time.Now()}
				if !d.applyServices([]string{name}, nil) {
					b.Fatal("the pass over one service declined")
				}
			}
			b.StopTimer()
			// What a pass leaves behind: the heap must not grow with the
			// number of passes.
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(d)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "heap-B/op")
			b.ReportMetric(float64(after.HeapAlloc)/(1<<20), "heap-MiB")
		})
	}
}
