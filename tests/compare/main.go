// SPDX-License-Identifier: Apache-2.0

// Command compare is `make compare`: it shows, side by side on one
// machine, the two failure modes of kube-proxy-style forwarding that l4lb
// removes (README "Why"), against a real iptables baseline: Debian's
// iptables-nft and conntrack, rules laid out as kube-proxy's iptables mode
// lays them out and applied with iptables-restore as it does.
//
//  1. The control-plane cost of one endpoint change at 100 to 10,000
//     services: the rule set rewritten by iptables-restore against one
//     reconcile of l4lb's real reconciler into real BPF maps.
//  2. A rolling update under a steady rate of new connections, through
//     both, on one topology: failed connections and the longest failure
//     window.
//  3. Conntrack exhaustion: short connections through a box whose
//     netfilter connection table has little room left, against l4lb's own
//     connection table at the same size.
//  4. Connection latency at 100 and 10,000 services.
//  5. New connections per second through l4lbd, and the LB datapath's
//     CPU per connection (what one LB core sustains).
//
// Everything runs inside network namespaces the run creates and removes
// (internal/testnet, tests/topo); iptables only ever runs inside them. It
// needs root. Progress goes to stderr, the tables (or -o json) to stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/maglev"
)

// seed is the Maglev seed of every l4lb datapath of a run.
var seed = maglev.Seed{0x4c, 0x34, 0x4c, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

// options size the scenarios. defaults() is `make compare`; fast() is the
// test's run, small enough for `make test`.
type options struct {
	l4lbd, l4lbctl string
	scenarios      map[string]bool
	// command is what reproduces the run, for the report.
	command string

	// control plane
	cpServices []int
	cpBackends []int
	cpChanges  int
	// syncBudget is the most one iptables-restore of a sync may take
	// before it is stopped and shown as a lower bound; a load of the
	// whole rule set gets loadBudget().
	syncBudget time.Duration

	// rolling update
	roServices int
	roBackends int
	roRate     int
	roDuration time.Duration

	// conntrack exhaustion
	ctFree     int
	ctConns    int
	ctDuration time.Duration

	// latency
	latServices []int
	latConns    int

	// connection rate
	crConns, crWorkers int
}

func defaults() options {
	return options{
		cpServices: []int{100, 1000, 5000, 10000}, cpBackends: []int{10, 50}, cpChanges: 3, syncBudget: 20 * time.Second,
		roServices: 1000, roBackends: 10, roRate: 500, roDuration: 30 * time.Second,
		ctFree: 4096, ctConns: 20000, ctDuration: 20 * time.Second,
		latServices: []int{100, 10000}, latConns: 2000,
		crConns: 30000, crWorkers: 4,
	}
}

func fast() options {
	return options{
		cpServices: []int{10, 100}, cpBackends: []int{4}, cpChanges: 1, syncBudget: 60 * time.Second,
		roServices: 20, roBackends: 3, roRate: 200, roDuration: 6 * time.Second,
		ctFree: 1024, ctConns: 3000, ctDuration: 3 * time.Second,
		latServices: []int{10, 100}, latConns: 200,
		crConns: 600, crWorkers: 2,
	}
}

// loadBudget is the most the load of a whole rule set may take: several
// syncs' worth, so that the syncs of the larger sizes can be measured at
// all.
func (o options) loadBudget() time.Duration { return 4 * o.syncBudget }

var allScenarios = []string{"controlplane", "rollout", "conntrack", "latency", "connrate"}

func main() {
	if spec := os.Getenv(loadgenEnv); spec != "" {
		os.Exit(loadgenMain(spec))
	}
	o := defaults()
	out := flag.String("o", "table", "output: table or json")
	plot := flag.String("plot", "", "also draw the failed connections per second of the rolling update and the conntrack exhaustion into this SVG file")
	isFast := flag.Bool("fast", false, "small counts (what the test in `make test` runs)")
	only := flag.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run, comma-separated")
	flag.StringVar(&o.l4lbd, "l4lbd", "bin/l4lbd", "l4lbd binary")
	flag.StringVar(&o.l4lbctl, "l4lbctl", "bin/l4lbctl", "l4lbctl binary")
	budget := flag.Duration("sync-budget", 0, "most time one iptables-restore of a sync may take in the control-plane scenario, four times that for the load of a whole rule set (default 20s)")
	flag.Parse()
	if *isFast {
		f := fast()
		f.l4lbd, f.l4lbctl = o.l4lbd, o.l4lbctl
		o = f
	}
	if *budget > 0 {
		o.syncBudget = *budget
	}
	o.command = "make compare"
	var set []string
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "l4lbd" && f.Name != "l4lbctl" && f.Name != "o" && f.Name != "plot" {
			set = append(set, "-"+f.Name+"="+f.Value.String())
		}
	})
	if len(set) > 0 {
		o.command += fmt.Sprintf(" COMPARE_FLAGS=%q", strings.Join(set, " "))
	}
	if *out != "table" && *out != "json" {
		fail("-o %q: want table or json", *out)
	}
	var err error
	if o.scenarios, err = parseScenarios(*only); err != nil {
		fail("%v", err)
	}
	if *plot != "" && !o.scenarios["rollout"] && !o.scenarios["conntrack"] {
		fail("-plot draws the rollout and conntrack scenarios, and -scenarios has neither")
	}
	if os.Geteuid() != 0 {
		fail("needs root (network namespaces, BPF, iptables inside them); run: sudo make compare")
	}
	for _, b := range []*string{&o.l4lbd, &o.l4lbctl} {
		if *b, err = filepath.Abs(*b); err != nil {
			fail("%v", err)
		}
		if _, err := os.Stat(*b); err != nil {
			fail("%v (run make first)", err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o, &progress{start: time.Now()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
	if *out == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fail("%v", err)
		}
	} else {
		rep.write(os.Stdout)
	}
	if *plot != "" {
		if err := writePlotFile(rep, *plot); err != nil {
			fail("-plot: %v", err)
		}
		fmt.Fprintf(os.Stderr, "compare: failed connections over time drawn in %s\n", *plot)
	}
}

func parseScenarios(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		ok := false
		for _, a := range allScenarios {
			ok = ok || a == f
		}
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q (want some of %s)", f, strings.Join(allScenarios, ","))
		}
		out[f] = true
	}
	return out, nil
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "compare: "+format+"\n", a...)
	os.Exit(2)
}

// run runs the chosen scenarios and returns the report. Every namespace,
// process and pin it made is gone when it returns, even on failure.
func run(ctx context.Context, o options, p *progress) (*Report, error) {
	rep := &Report{Command: o.command, Machine: machine(), Started: time.Now()}
	t := &testnet.Script{}
	err := t.Run(func() {
		if o.scenarios["controlplane"] {
			rep.ControlPlane = controlPlane(ctx, t, o, p)
		}
		if !o.scenarios["rollout"] && !o.scenarios["conntrack"] && !o.scenarios["latency"] && !o.scenarios["connrate"] {
			return
		}
		r := newRig(t, o, p)
		if o.scenarios["rollout"] {
			rep.Rollout = rollout(ctx, r, o, p)
		}
		if o.scenarios["latency"] {
			rep.Latency = latency(ctx, r, o, p)
		}
		if o.scenarios["conntrack"] {
			rep.Conntrack = exhaustion(ctx, r, o, p)
		}
		if o.scenarios["connrate"] {
			rep.ConnRate = connRate(ctx, r, o, p)
		}
	})
	rep.Took = time.Since(rep.Started)
	rep.Machine.LoadEnd = loadAverage()
	p.step("done in %s; namespaces, processes and pins removed", rep.Took.Round(time.Second))
	return rep, err
}

// progress prints what the run is doing to stderr, with the time elapsed.
type progress struct{ start time.Time }

func (p *progress) step(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, a...))
}

func (p *progress) done(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "          %s\n", fmt.Sprintf(format, a...))
}
