// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"slices"
	"time"
)

// LatencyRow is the connection latency through one system at one service
// count: connect to the VIP and read the backend's greeting, one
// connection after another.
type LatencyRow struct {
	System      string        `json:"system"`
	Services    int           `json:"services"`
	Connections int           `json:"connections"`
	Failed      int           `json:"failed"`
	P50         time.Duration `json:"p50_ns"`
	P99         time.Duration `json:"p99_ns"`
}

// latencyRounds interleave the systems and sizes, so that the machine's
// noise spreads over all of them alike.
const latencyRounds = 3

// latency measures connection setup through each system at each service
// count, the measured service last in kube-proxy's KUBE-SERVICES chain
// (the first packet of a connection walks that chain in order, so last is
// its worst case; l4lb looks every service up in one hash map).
func latency(ctx context.Context, r *rig, o options, p *progress) []LatencyRow {
	eps := r.serveOnly(7001)
	defer r.stopAll()
	type key struct {
		ipt bool
		n   int
	}
	took := map[key][]time.Duration{}
	failed := map[key]int{}
	per := max(o.latConns/latencyRounds, 1)
	for round := range latencyRounds {
		for _, n := range o.latServices {
			w := r.fillerWorkload(n, 1, eps)
			for _, ipt := range []bool{true, false} {
				sys := "l4lb"
				if ipt {
					sys = "iptables"
				}
				p.step("latency: %s, %d services, round %d of %d", sys, n, round+1, latencyRounds)
				if ipt {
					r.iptLoad(ctx, w)
					r.via(r.ipt)
				} else {
					r.l4Apply(r.l4Config(w, l4Conntrack))
					r.via(r.l4)
				}
				spec := loadSpec{Target: targetVIP.String(), Count: per, Timeout: time.Second, Abort: true}
				// Warm the path (neighbours, caches) before measuring.
				warm := spec
				warm.Count = 20
				if _, err := runLoad(ctx, r.tp.Client, warm); err != nil {
					r.t.Fatalf("latency: %v", err)
				}
				lr, err := runLoad(ctx, r.tp.Client, spec)
				if err != nil {
					r.t.Fatalf("latency: %v", err)
				}
				k := key{ipt, n}
				for _, c := range lr.Conns {
					if c.Result == resOK {
						took[k] = append(took[k], c.Took)
					} else {
						failed[k]++
					}
				}
			}
		}
	}
	var rows []LatencyRow
	for _, ipt := range []bool{true, false} {
		for _, n := range o.latServices {
			k := key{ipt, n}
			sys := "l4lb"
			if ipt {
				sys = "iptables"
			}
			rows = append(rows, LatencyRow{System: sys, Services: n, Connections: len(took[k]) + failed[k], Failed: failed[k],
				P50: percentile(took[k], 50), P99: percentile(took[k], 99)})
		}
	}
	return rows
}

func percentile(ds []time.Duration, pc int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*pc/100)]
}
