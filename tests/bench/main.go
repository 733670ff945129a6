// SPDX-License-Identifier: Apache-2.0

// Command bench is the datapath part of `make bench`: it times the LB
// program per packet path with BPF_PROG_TEST_RUN next to two floors (an
// XDP_PASS program and a parse + one-lookup program) at 1 and 100,000
// services, and a backend change on the real maps. Each path runs on a fresh
// packet per test run (the kernel's repeat would re-run the program on its
// own rewritten output), kernel-timed; the figure is the median over rounds
// of the median per round. It needs root.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/l4lb/l4lb/internal/testnet"
)

func main() {
	rounds := flag.Int("rounds", 7, "rounds per path")
	runs := flag.Int("runs", 3000, "packets per round")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (BPF, network namespaces)")
		os.Exit(1)
	}
	t := &testnet.Script{}
	if err := t.Run(func() { benchDatapath(t, *rounds, *runs) }); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
