// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ConnRateRound is one round of the connection-rate scenario: new TCP
// connections (connect, read the greeting, close) from several client
// processes at once, back to back, through l4lbd's datapath in SNAT mode
// (so the replies go through the LB as well), one service of two
// backends.
type ConnRateRound struct {
	Workers     int           `json:"workers"`
	Connections int           `json:"connections"`
	Failed      int           `json:"failed"`
	Took        time.Duration `json:"took_ns"`
	// PerSecond is what the client got: ok connections over the wall
	// time. On a small machine the client, the backends and the LB share
	// the CPUs, so this is a floor of what the LB sustains.
	PerSecond float64 `json:"conns_per_second"`
	// LBRuntime and LBPackets are what the LB's XDP program spent and ran
	// over the round, from the kernel's BPF run-time statistics.
	LBRuntime time.Duration `json:"lb_runtime_ns"`
	LBPackets uint64        `json:"lb_packets"`
}

// LBNsPerConn is the LB program's CPU per ok connection (every packet of
// it, both directions).
func (c ConnRateRound) LBNsPerConn() float64 {
	ok := c.Connections - c.Failed
	if ok <= 0 {
		return 0
	}
	return float64(c.LBRuntime.Nanoseconds()) / float64(ok)
}

// PerLBCore is how many connections per second one CPU running nothing
// but the LB's program would set up: a second over LBNsPerConn.
func (c ConnRateRound) PerLBCore() float64 {
	if ns := c.LBNsPerConn(); ns > 0 {
		return 1e9 / ns
	}
	return 0
}

// connRateRounds is how many rounds the scenario runs; the report gives
// their median and range.
const connRateRounds = 3

// connRate measures new connections per second through l4lbd: the rate
// the client reached, and the LB datapath's own CPU per connection, read
// from the kernel's per-program run-time statistics (kernel.bpf_stats:
// turned on for the rounds only, since it adds two clock reads to every
// BPF program run on the machine). The per-core figure leaves out what the
// kernel spends around the program (the veth's receive, the redirect),
// which is the same for any XDP program on this topology.
func connRate(ctx context.Context, r *rig, o options, p *progress) []ConnRateRound {
	eps := r.serveOnly(7002)
	defer r.stopAll()
	r.l4Apply(r.l4Config(r.fillerWorkload(1, 1, eps), l4Conntrack))
	r.via(r.l4)
	prog, err := r.xdpProgram()
	if err != nil {
		r.t.Fatalf("connection rate: %v", err)
	}
	defer prog.Close()
	warm := loadSpec{Target: targetVIP.String(), Count: 50, Timeout: time.Second, Abort: true}
	if _, err := runLoad(ctx, r.tp.Client, warm); err != nil {
		r.t.Fatalf("connection rate: %v", err)
	}
	per := max(o.crConns/o.crWorkers, 1)
	var rounds []ConnRateRound
	for round := range connRateRounds {
		p.step("connection rate: round %d of %d, %d client processes x %d connections", round+1, connRateRounds, o.crWorkers, per)
		rounds = append(rounds, r.connRateRound(ctx, prog, o.crWorkers, per))
	}
	return rounds
}

// connRateRound runs workers load generators of n connections each at
// once, with BPF run-time statistics on.
func (r *rig) connRateRound(ctx context.Context, prog *ebpf.Program, workers, n int) ConnRateRound {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		r.t.Fatalf("connection rate: turning on BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	before, err := prog.Stats()
	if err != nil {
		r.t.Fatalf("connection rate: reading lb2's XDP program's statistics: %v", err)
	}
	spec := loadSpec{Target: targetVIP.String(), Count: n, Timeout: 2 * time.Second, Abort: true}
	results := make([]loadResult, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		wg.Go(func() { results[i], errs[i] = runLoad(ctx, r.tp.Client, spec) })
	}
	wg.Wait()
	took := time.Since(start)
	after, err := prog.Stats()
	if err != nil {
		r.t.Fatalf("connection rate: reading lb2's XDP program's statistics: %v", err)
	}
	row := ConnRateRound{Workers: workers, Took: took, LBRuntime: after.Runtime - before.Runtime, LBPackets: after.RunCount - before.RunCount}
	for i, lr := range results {
		if errs[i] != nil {
			r.t.Fatalf("connection rate: %v", errs[i])
		}
		for _, c := range lr.Conns {
			row.Connections++
			if c.Result != resOK {
				row.Failed++
			}
		}
	}
	row.PerSecond = float64(row.Connections-row.Failed) / took.Seconds()
	return row
}

// xdpProgram is the XDP program l4lbd attached to lb2's eth0, as iproute2
// reports it.
func (r *rig) xdpProgram() (*ebpf.Program, error) {
	out, err := r.l4.NS.Command("ip", "-j", "link", "show", "dev", "eth0").Output()
	if err != nil {
		return nil, fmt.Errorf("lb2: ip link show eth0: %v", err)
	}
	var links []struct {
		XDP struct {
			Prog struct {
				ID uint32 `json:"id"`
			} `json:"prog"`
		} `json:"xdp"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return nil, fmt.Errorf("lb2: ip -j link show eth0: unexpected output (%v): %s", err, out)
	}
	id := links[0].XDP.Prog.ID
	if id == 0 {
		return nil, fmt.Errorf("lb2: no XDP program on eth0 (l4lbd attaches at xdp in this rig): %s", out)
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return nil, fmt.Errorf("lb2: opening XDP program %d: %v", id, err)
	}
	return prog, nil
}

// connRateSummary is the median round by the per-core figure, and the
// range of that figure and of the client's rate over the rounds.
func connRateSummary(rounds []ConnRateRound) (median ConnRateRound, coreLo, coreHi, wallLo, wallHi float64) {
	s := slices.Clone(rounds)
	slices.SortFunc(s, func(a, b ConnRateRound) int {
		switch x, y := a.PerLBCore(), b.PerLBCore(); {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	median = s[len(s)/2]
	coreLo, coreHi = s[0].PerLBCore(), s[len(s)-1].PerLBCore()
	wallLo, wallHi = s[0].PerSecond, s[0].PerSecond
	for _, x := range s {
		wallLo, wallHi = min(wallLo, x.PerSecond), max(wallHi, x.PerSecond)
	}
	return median, coreLo, coreHi, wallLo, wallHi
}
