// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/selfcheck"
)

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSelfCheck times a whole self-check pass over n services of ten
// backends and 1021-slot tables (bench-control's shape; 1,000 services
// also with the default 16381), against State, the read-back of every map
// a restart does, in the same run:
//
//	state     State() (the baseline)
//	pass      one pass without rests: its cost, in CPU (cpu-ms/op) and time
//	paced     one pass as l4lbd runs it, resting at the default share
//	repair    a rotated table row found and rewritten by an unpaced pass
func BenchmarkSelfCheck(b *testing.B) {
	for _, sz := range []struct{ n, table int }{{1000, 1021}, {10000, 1021}, {1000, 16381}, {10000, 16381}} {
		n := sz.n
		b.Run(fmt.Sprintf("%d/table=%d", n, sz.table), func(b *testing.B) {
			e := newEnvWith(b, envOptions{maxServices: uint32(n), maxBackends: uint32(n * 10)})
			var svcs []lb.Service
			for i := range n {
				vip := netip.AddrFrom4([4]byte{192, 0, byte(2 + i/65536), byte(i >> 8)})
				vip = vip.Next()
				var bs []netip.Addr
				for j := range 10 {
					bs = append(bs, netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + j)}))
				}
				s := withDefaults(dsrService(fmt.Sprintf("s%d", i), vip, uint16(1+i%250), lb.TCP, bs...))
				s.TableSize = uint32(sz.table)
				for k := range s.Backends {
					s.Backends[k].Addr = netip.AddrPortFrom(s.Backends[k].Addr.Addr(), s.Frontend.Port)
				}
				svcs = append(svcs, s)
			}
			// Distinct frontends: i/250 picks the VIP, i%250 the port.
			for i := range svcs {
				svcs[i].Frontend.Addr = netip.AddrFrom4([4]byte{192, 0, byte(2 + i/250/256), byte(i / 250)})
			}
			e.reconcile(b, svcs...)
			cpu := func(b *testing.B, f func()) {
				c0 := cpuTime(b)
				b.ResetTimer()
				for b.Loop() {
					f()
				}
				b.ReportMetric(float64(cpuTime(b)-c0)/float64(b.N)/1e6, "cpu-ms/op")
			}
			b.Run("state", func(b *testing.B) {
				cpu(b, func() {
					if _, err := e.lb.State(); err != nil {
						b.Fatal(err)
					}
				})
			})
			b.Run("pass", func(b *testing.B) {
				cpu(b, func() {
					drifts, err := e.rec.NewCheck(e.lb).Run()
					if err != nil || len(drifts) > 0 {
						b.Fatalf("pass: %v, %v", drifts, err)
					}
				})
			})
			b.Run("paced", func(b *testing.B) {
				c := selfcheck.New(e.rec, e.lb, selfcheck.Options{})
				cpu(b, func() {
					if p, ok := c.Pass(context.Background(), true); !ok || p.Drifts > 0 {
						b.Fatalf("paced pass: %+v", p)
					}
				})
			})
			b.Run("repair", func(b *testing.B) {
				last := svcs[len(svcs)-1]
				st := e.state(b, last.Frontend)
				cpu(b, func() {
					b.StopTimer()
					// The last service's table, so the pass reads every
					// other one before it finds the change.
					table := append(st.Table[1:], st.Table[0])
					if err := e.lb.SetTable(st.ID, table); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					drifts, err := e.rec.NewCheck(e.lb).Run()
					if err != nil || len(drifts) != 1 || drifts[0].Err != nil {
						b.Fatalf("pass: %v, %v; want one repaired drift", drifts, err)
					}
				})
			})
		})
	}
}
