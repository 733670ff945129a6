// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

func TestMain(m *testing.M) {
	// The test binary is also the client's load generator (loadgen.go).
	if spec := os.Getenv(loadgenEnv); spec != "" {
		os.Exit(loadgenMain(spec))
	}
	os.Exit(m.Run())
}

// TestCompareFast runs every scenario of `make compare` with small counts
// and checks what each system did, never how fast: timings depend on the
// machine, behaviour must not.
func TestCompareFast(t *testing.T) {
	testnet.RequireRoot(t)
	dir := t.TempDir()
	if err := topo.BuildBinaries("../..", dir); err != nil {
		t.Fatal(err)
	}
	o := fast()
	o.command = "go test ./tests/compare -run TestCompareFast"
	o.l4lbd, o.l4lbctl = filepath.Join(dir, "l4lbd"), filepath.Join(dir, "l4lbctl")
	o.scenarios = map[string]bool{}
	for _, s := range allScenarios {
		o.scenarios[s] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := run(ctx, o, &progress{start: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.write(&out)
	t.Log("\n" + out.String())

	if len(rep.ControlPlane) != len(o.cpServices)*len(o.cpBackends) {
		t.Errorf("control plane: %d rows, want %d", len(rep.ControlPlane), len(o.cpServices)*len(o.cpBackends))
	}
	for _, c := range rep.ControlPlane {
		for name, s := range map[string]Sync{"load": c.Load, "full sync": c.Full, "partial sync": c.Partial} {
			if !s.measured() || s.Lines == 0 {
				t.Errorf("control plane %dx%d: iptables %s has no figure: %+v", c.Services, c.Backends, name, s)
			}
		}
		if c.Partial.Lines >= c.Full.Lines {
			t.Errorf("control plane %dx%d: a partial sync wrote %d lines, a full one %d", c.Services, c.Backends, c.Partial.Lines, c.Full.Lines)
		}
		// One endpoint replaced: the new backend's entry, the service's
		// table, the old entry cleared; nothing else.
		want := map[string]int{"backend_write": 1, "table_swap": 1, "backend_clear": 1}
		if !maps.Equal(c.L4LBOps, want) || c.L4LB <= 0 {
			t.Errorf("control plane %dx%d: l4lb did %v in %s for one endpoint change, want %v", c.Services, c.Backends, c.L4LBOps, c.L4LB, want)
		}
	}

	rows := map[string]RolloutRow{}
	for _, x := range rep.Rollout.Rows {
		rows[x.System] = x
	}
	want := o.roRate * int(o.roDuration/time.Second)
	for _, name := range []string{"iptables, kube-proxy partial syncs (1.28+)", "iptables, kube-proxy full syncs (before 1.28)", "l4lb, same procedure", "l4lb, drain, remove, stop"} {
		x, ok := rows[name]
		if !ok {
			t.Errorf("rolling update: no row %q", name)
			continue
		}
		if x.Connections != want || x.Changes == 0 {
			t.Errorf("rolling update, %s: %d connections and %d changes, want %d and some", name, x.Connections, x.Changes, want)
		}
	}
	if x := rows["l4lb, drain, remove, stop"]; x.Failed != 0 || !x.RolledOver {
		t.Errorf("rolling update through l4lb, drain, remove, stop: %d of %d connections failed (%v, %v), rolled over %v; want none failed",
			x.Failed, x.Connections, x.FailedByKind, x.Errors, x.RolledOver)
	}

	ct := rep.Conntrack
	if ct == nil || len(ct.Rows) != 2 {
		t.Fatalf("conntrack exhaustion: %+v", ct)
	}
	ipt, l4 := ct.Rows[0], ct.Rows[1]
	if ipt.Connections != o.ctConns || ipt.Netfilter == nil {
		t.Errorf("conntrack exhaustion, iptables: %d connections, counters %v", ipt.Connections, ipt.Netfilter)
	}
	// The premise of the scenario: netfilter's table did fill.
	if ipt.Netfilter["drop"] == 0 {
		t.Errorf("conntrack exhaustion, iptables: conntrack -S counted no drop with %d entries of room (%v)", o.ctFree, ipt.Netfilter)
	}
	if l4.Failed != 0 || l4.Connections != o.ctConns {
		t.Errorf("conntrack exhaustion, l4lb: %d of %d connections failed (%v, %v), want none", l4.Failed, l4.Connections, l4.FailedByKind, l4.Errors)
	}
	if l4.L4LB == nil || l4.L4LB.Capacity != uint32(o.ctFree) || !strings.HasPrefix(l4.L4LBLine, "entries ") {
		t.Errorf("conntrack exhaustion, l4lb: l4lbctl conntrack stats said %q (%+v), want a table of %d", l4.L4LBLine, l4.L4LB, o.ctFree)
	}

	// The timeline -plot draws accounts for every failure of each row.
	for _, x := range rep.Rollout.Rows {
		checkPerSecond(t, "rolling update, "+x.System, x.Outcome)
	}
	for _, x := range ct.Rows {
		checkPerSecond(t, "conntrack exhaustion, "+x.System, x.Outcome)
	}
	plot := filepath.Join(dir, "compare.svg")
	if err := writePlotFile(rep, plot); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if lines, _ := parsePlot(t, f); len(lines) != len(rep.Rollout.Rows)+len(ct.Rows) {
		t.Errorf("plot has %d lines, want one per row of the rolling update and the exhaustion (%d)", len(lines), len(rep.Rollout.Rows)+len(ct.Rows))
	}

	if len(rep.Latency) != 2*len(o.latServices) {
		t.Errorf("latency: %d rows, want %d", len(rep.Latency), 2*len(o.latServices))
	}
	for _, x := range rep.Latency {
		if x.Failed != 0 || x.P50 <= 0 || x.P99 < x.P50 {
			t.Errorf("latency, %s at %d services: %d failed, p50 %s, p99 %s", x.System, x.Services, x.Failed, x.P50, x.P99)
		}
	}

	if len(rep.ConnRate) != connRateRounds {
		t.Errorf("connection rate: %d rounds, want %d", len(rep.ConnRate), connRateRounds)
	}
	for i, x := range rep.ConnRate {
		// SNAT: at least the client's SYN, ACK and RST and the backend's
		// SYN-ACK and greeting go through the LB's program.
		ok := uint64(x.Connections - x.Failed)
		if x.Failed != 0 || x.Connections != o.crWorkers*(o.crConns/o.crWorkers) || x.LBPackets < 5*ok || x.LBRuntime <= 0 {
			t.Errorf("connection rate, round %d: %+v", i+1, x)
		}
	}
}

func checkPerSecond(t *testing.T, row string, o Outcome) {
	t.Helper()
	sum := 0
	for _, v := range o.FailedPerSecond {
		sum += v
	}
	if sum != o.Failed || len(o.FailedPerSecond) == 0 {
		t.Errorf("%s: %d failures over %d seconds in the timeline, %d in all", row, sum, len(o.FailedPerSecond), o.Failed)
	}
}
