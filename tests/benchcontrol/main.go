// SPDX-License-Identifier: Apache-2.0

// Command benchcontrol measures what one endpoint change costs the control
// plane end to end (`make bench-control`): a real l4lbd on a real datapath
// in a namespace serves N services of B backends from its file; one
// backend of one service is replaced in the file and `l4lbctl reload`'s
// request (which returns once the change is programmed, or rejected) is
// timed, C times; then one backend of another service is drained and
// enabled again by runtime override (`l4lbctl backend drain|enable`, which
// also returns once programmed), C times. It reports the latency's p50 and p99, the CPU l4lbd spent
// per change (from /proc: user + system, over all changes), and the
// daemon's start-up time and resident memory at each size.
//
// With several binaries (-l4lbd A,B) every size runs each of them in turn,
// round after round, so that a build is compared with a baseline measured
// in the same run on the same machine. It needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

func main() {
	bins := flag.String("l4lbd", "bin/l4lbd", "l4lbd binaries to compare, comma-separated (the first is the baseline)")
	names := flag.String("names", "", "names of the binaries for the report, comma-separated")
	sizes := flag.String("services", "100,1000,10000", "service counts, comma-separated")
	backends := flag.Int("backends", 10, "backends per service")
	changes := flag.Int("changes", 20, "changes timed per size and binary")
	rounds := flag.Int("rounds", 1, "rounds: every binary runs every size once per round")
	tableSize := flag.Int("table-size", 1021, "maglev.table_size of every service (a prime ≥ 100 × backends)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "benchcontrol: needs root (BPF, network namespaces)")
		os.Exit(1)
	}
	binList := strings.Split(*bins, ",")
	label := binList
	if *names != "" {
		label = strings.Split(*names, ",")
		if len(label) != len(binList) {
			fmt.Fprintln(os.Stderr, "benchcontrol: -names must name every binary of -l4lbd")
			os.Exit(2)
		}
	}
	for i, b := range binList {
		abs, err := filepath.Abs(b)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchcontrol:", err)
			os.Exit(2)
		}
		binList[i] = abs
	}
	var counts []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "benchcontrol: bad service count %q\n", s)
			os.Exit(2)
		}
		counts = append(counts, n)
	}

	results := map[[2]int][]run{} // (size, binary) -> runs
	var sc testnet.Script
	err := sc.Run(func() {
		tp := topo.New(&sc, topo.Options{LBs: 1})
		lbHost := tp.LBs[0]
		for r := range *rounds {
			for si, n := range counts {
				for bi, bin := range binList {
					fmt.Fprintf(os.Stderr, "round %d: %d services × %d backends, %s\n", r+1, n, *backends, label[bi])
					res := measure(tp, lbHost, bin, n, *backends, *tableSize, *changes)
					results[[2]int{si, bi}] = append(results[[2]int{si, bi}], res)
				}
			}
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcontrol:", err)
		os.Exit(1)
	}
	fmt.Printf("One backend of one service replaced in the file, then `l4lbctl reload` (returns once programmed); %d changes per run, table_size %d, %d backends per service.\n\n", *changes, *tableSize, *backends)
	fmt.Println("| services | l4lbd | reload p50 | reload p99 | CPU per reload | override p50 | override p99 | CPU per override | start-up | RSS |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for si, n := range counts {
		for bi := range binList {
			for _, res := range results[[2]int{si, bi}] {
				fmt.Printf("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %d MiB |\n", n, label[bi], ms(res.reload.p50), ms(res.reload.p99), ms(res.reload.cpu),
					ms(res.override.p50), ms(res.override.p99), ms(res.override.cpu), res.start.Round(100*time.Millisecond), res.rss>>20)
			}
		}
	}
}

// run is one binary at one size.
type run struct {
	reload, override timing
	start            time.Duration
	rss              uint64
}

// timing is one kind of change, timed C times.
type timing struct {
	p50, p99 time.Duration
	cpu      time.Duration // per change
}

// timeChanges makes changes changes with change(i), each returning once
// it is in force, and times them and l4lbd's CPU (process pid). prepare(i),
// when not nil, runs before each, untimed.
func timeChanges(pid, changes int, prepare, change func(i int)) timing {
	var lat []time.Duration
	cpu0 := cpuTime(pid)
	for i := range changes {
		if prepare != nil {
			prepare(i)
		}
		s := time.Now()
		change(i)
		lat = append(lat, time.Since(s))
	}
	var tm timing
	tm.cpu = (cpuTime(pid) - cpu0) / time.Duration(changes)
	slices.Sort(lat)
	tm.p50 = lat[len(lat)/2]
	tm.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	return tm
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// measure starts bin with n services, times changes reloads, and stops it
// again (its pins are removed).
func measure(tp *topo.Topology, h *topo.Host, bin string, n, backends, tableSize, changes int) run {
	t := tp.T
	cfg := config(n, backends, tableSize, -1)
	t0 := time.Now()
	d := h.StartL4LBD(bin, cfg)
	var res run
	res.start = time.Since(t0)
	pid := d.Pid()
	res.rss = rss(pid)
	ctx := context.Background()
	// The file is written before the clock starts: what is timed is
	// l4lbd's part, as `l4lbctl reload` sees it.
	res.reload = timeChanges(pid, changes, func(i int) {
		d.WriteConfig(config(n, backends, tableSize, i))
	}, func(i int) {
		rl, err := d.API().Reload(ctx)
		if err != nil || !rl.OK {
			t.Fatalf("reload %d: %v %s\n%s", i, err, rl.Error, d.Log())
		}
	})
	svc, addr := n/4, backendAddr(n/4*backends+1)
	res.override = timeChanges(pid, changes, nil, func(i int) {
		action := api.ActionDrain
		if i%2 == 1 {
			action = api.ActionEnable
		}
		if err := d.API().Backend(ctx, fmt.Sprintf("s%d", svc), addr, action); err != nil {
			t.Fatalf("override %d: %v\n%s", i, err, d.Log())
		}
	})
	if err := d.Stop(); err != nil {
		t.Fatalf("stop l4lbd: %v", err)
	}
	if out, err := runCmd(bin, "--config", d.Config, "--cleanup"); err != nil {
		t.Fatalf("l4lbd --cleanup: %v\n%s", err, out)
	}
	return res
}

// backendAddr is the k-th backend of the file: an address on the
// topology's segment and a port that makes it unique.
func backendAddr(k int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("%s%d", topo.Prefix4, 100+k%100)), uint16(1000+k/100))
}

// config renders n services of b backends each on the topology's segment
// (SNAT, so backend ports may differ from the service's); change ≥ 0
// replaces one backend of the middle service by one that differs with
// every change.
func config(n, b, tableSize, change int) string {
	var s strings.Builder
	fmt.Fprintf(&s, `[daemon]
admin_socket   = "{{socket}}"
metrics_listen = []
bpffs          = "{{bpffs}}"
log_level      = "info"
[datapath]
interfaces    = ["eth0"]
mode          = "snat"
conntrack_max = 65536
snat_max      = 65536
max_services  = %d
max_backends  = %d
[maglev]
hash_seed  = "d3e0d3e0d3e0d3e0d3e0d3e0d3e0d3e0"
table_size = %d
`, n+16, n*b+64, tableSize)
	for i := range n {
		fmt.Fprintf(&s, "\n[[service]]\nname = \"s%d\"\nvip = \"10.%d.%d.%d\"\nport = 80\nprotocol = \"tcp\"\n", i, 200+i/65536, i/256%256, i%256)
		for j := range b {
			k := i*b + j
			a := backendAddr(k)
			port := a.Port()
			if i == n/2 && j == 0 && change >= 0 {
				port = 60000 + uint16(change%5000)
			}
			fmt.Fprintf(&s, "[[service.backend]]\naddress = \"%s\"\nport = %d\n", a.Addr(), port)
		}
	}
	return s.String()
}
