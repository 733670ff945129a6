// SPDX-License-Identifier: Apache-2.0

// Command bench is the datapath part of `make bench`: it times the LB
// program per packet path with BPF_PROG_TEST_RUN next to two floors (an
// XDP_PASS program and a parse + one-lookup program, the latter loaded
// floorCopies times), the main paths at 1, 10,000 and 100,000 services
// (benchScale), and a backend change on the real maps. New-flow paths send
// a flow never sent before on every run (fresh). Each path runs on a fresh
// packet per test run (the kernel's repeat would re-run the program on its
// own rewritten output), kernel-timed; the figure is the median over rounds
// of each round's interquartile mean (roundCost). It also times the
// primitives paths are made of (primitives.go).
//
// With -b it compares builds of the LB object instead, in one process
// (ab.go; `make bench-ab`). It needs root.
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/l4lb/l4lb/internal/testnet"
)

func main() {
	rounds := flag.Int("rounds", 7, "rounds per path")
	runs := flag.Int("runs", 3000, "packets per round")
	a := flag.String("a", "", "A/B mode: the baseline LB object A (an lb_bpfel.o); empty takes the embedded one. Without -b: the full table for this object instead of the embedded one")
	b := flag.String("b", "", "A/B mode: the LB objects to compare with A, comma-separated, path by path in one process; an object named with the suffix +counts is loaded with the per-flow IPFIX counters on (datapath.Config.FlowCounts)")
	v6 := flag.Bool("6", false, "A/B mode: IPv6 paths instead of IPv4")
	tc := flag.Bool("tc", false, "A/B mode: the tc program's paths instead of XDP's")
	labels := flag.String("names", "", "A/B mode: comma-separated names of the objects, for the report")
	pathsRe := flag.String("paths", "", "A/B mode: time only the paths whose name matches this regular expression")
	copies := flag.Int("copies", 3, "A/B mode: datapaths per build; a build's figure in a round is the median of its copies' (each takes about 0.7 GB)")
	jitOut := flag.String("jitlines", "", "A/B mode: write the JIT address of every C line of each LB program loaded to this file, for -lines (jitlines.go)")
	linesFrom := flag.String("lines", "", "read `perf script -F ip,sym` on stdin and print the hottest C lines of the LB programs, by the -jitlines file given here; nothing is timed")
	flag.Parse()
	if *linesFrom != "" {
		if err := printHotLines(*linesFrom); err != nil {
			fmt.Fprintln(os.Stderr, "bench: -lines:", err)
			os.Exit(1)
		}
		return
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (BPF, network namespaces)")
		os.Exit(1)
	}
	t := &testnet.Script{}
	var obj []byte
	if *a != "" && *b == "" {
		var err error
		if obj, err = os.ReadFile(*a); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	run := func() { benchDatapath(t, obj, *rounds, *runs) }
	if *b != "" {
		objs, names, err := readObjects(*a, *b)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		for i, n := range strings.Split(*labels, ",") {
			if n != "" && i < len(names) {
				names[i] = n
			}
		}
		if *copies < 1 {
			fmt.Fprintln(os.Stderr, "bench: -copies must be at least 1")
			os.Exit(2)
		}
		var only *regexp.Regexp
		if *pathsRe != "" {
			if only, err = regexp.Compile(*pathsRe); err != nil {
				fmt.Fprintln(os.Stderr, "bench: -paths:", err)
				os.Exit(2)
			}
		}
		k := hookXDP
		if *tc {
			k = hookTC
		}
		run = func() { benchAB(t, objs, names, k, *v6, *rounds, *runs, *copies, only, *jitOut) }
	}
	if err := t.Run(run); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// build is one LB object the A/B mode times, and how it is loaded.
type build struct {
	obj []byte // nil: the embedded object
	// flowCounts loads it with the per-flow IPFIX counters on, as l4lbd
	// does with [ipfix] configured.
	flowCounts bool
}

// readObjects reads the A/B mode's LB objects: a, then each of the
// comma-separated bs. An empty path is the embedded object (nil); a
// +counts suffix (alone: the embedded object) turns the flow counters on.
func readObjects(a, bs string) ([]build, []string, error) {
	var objs []build
	var names []string
	for _, p := range append([]string{a}, strings.Split(bs, ",")...) {
		name := p
		p, counts := strings.CutSuffix(p, "+counts")
		if p == "" {
			if name == "" {
				name = "the embedded object"
			}
			objs, names = append(objs, build{flowCounts: counts}), append(names, name)
			continue
		}
		obj, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, fmt.Errorf("A/B object: %w", err)
		}
		objs, names = append(objs, build{obj: obj, flowCounts: counts}), append(names, name)
	}
	return objs, names, nil
}
