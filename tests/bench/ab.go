// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
)

// benchAB times the paths of one hook (k) of several builds of the LB object (the
// first is A, the baseline; the others are B, C, ...) in one process, each
// on its own datapath and namespace, one path of every build after the
// other within each round. Two runs of `make bench` differ from process to
// process by more than most changes to the C are worth (docs/datapath.md);
// within one process, one round's builds share whatever the machine was
// doing, so their ratio in the same round is what is compared. Each build
// runs on copies datapaths, and its figure in a round is the median of
// theirs: where the kernel put one datapath's maps moves every path of it
// by 5-10% against a second load of the very same object (the control),
// which no number of rounds averages away. only, when not nil, picks the
// paths timed by name (to profile one, say); jitOut, when set, is where
// the JIT line map of every datapath loaded goes (jitlines.go).
func benchAB(t *testnet.Script, objs []build, names []string, k hookKind, v6 bool, rounds, runs, copies int, only *regexp.Regexp, jitOut string) {
	fl := loadFloors(t)
	prog := func(r *rig) *ebpf.Program {
		if k == hookTC {
			return r.lb.ProgramTC()
		}
		return r.lb.Program()
	}
	var tgs []target
	for _, tg := range targets() {
		if tg.v6 == v6 {
			tgs = append(tgs, tg)
		}
	}
	var svcs []lb.Service
	for _, tg := range tgs {
		svcs = append(svcs, tg.service())
	}
	// rigs[i] are build i's datapaths; the copies of the builds are
	// loaded in turn, so that no build gets the first (or last) of the
	// kernel's allocations.
	rigs := make([][]*rig, len(objs))
	for range copies {
		for i := range rigs {
			r := newRig(t, objs[i], 0)
			if err := r.rec.Reconcile(svcs); err != nil {
				t.Fatalf("%s: reconcile: %v", names[i], err)
			}
			rigs[i] = append(rigs[i], r)
		}
	}
	if jitOut != "" {
		writeJITFile(t, jitOut, rigs)
	}
	fl.program(t, targets()[0])
	floorFrame := rigs[0][0].packet(t, targets()[0], 2000, false, true)
	paths := fl.paths(k, floorFrame)
	on := []*rig{rigs[0][0], rigs[0][0]}
	// A group is one path of every build: at[i] indexes build i's
	// copies of it.
	type group struct {
		name string
		at   [][]int
	}
	var groups []group
	add := func(name string, mk func(r *rig) feed) {
		if only != nil && !only.MatchString(name) {
			return
		}
		g := group{name: name, at: make([][]int, len(rigs))}
		for i, rs := range rigs {
			for _, r := range rs {
				g.at[i] = append(g.at[i], len(paths))
				f := mk(r)
				paths = append(paths, path{name: name, hook: k, prog: prog(r), next: f.pkt, pre: f.pre, both: f.both})
				on = append(on, r)
			}
		}
		groups = append(groups, g)
	}
	add("non-VIP pass-through", func(r *rig) feed {
		frame := r.nonVIP(t, v6)
		return feed{pkt: func(int) []byte { return frame }}
	})
	for _, rw := range rows {
		for _, tg := range tgs {
			if rw.snat && tg.mode != lb.ModeSNAT {
				continue
			}
			add(tg.name+": "+rw.name, func(r *rig) feed {
				f, _ := rw.feed(t, r, prog(r), k, tg)
				return f
			})
		}
	}

	// The build that runs first moves round by round: whichever runs
	// after another finds the kernel code they share (map and LRU
	// helpers) warm.
	var order [][][]int
	for _, g := range groups {
		order = append(order, g.at)
	}
	perRound := timeRounds(t, paths, on, order, rounds, runs)
	floors := summarize(perRound[:2])
	empty, floorNet := floors[0].med, floors[1].med-floors[0].med
	fmt.Printf("\nA/B, %s %s, %d rounds x %d packets, each build on %d datapath(s), the builds interleaved (the first one moving round by round):\n", k, family(v6), rounds, runs, copies)
	for i, n := range names {
		fmt.Printf("  %c = %s\n", 'A'+i, n)
	}
	fmt.Printf("floors: empty program %d ns, parse + one lookup %d ns (net %d)\n", empty.Nanoseconds(), floors[1].med.Nanoseconds(), floorNet.Nanoseconds())
	fmt.Printf("ns and net/floor as make bench prints them; X/A = median over rounds of X's net / A's net in the same round\n")
	var hdr strings.Builder
	fmt.Fprintf(&hdr, "  %-56s %7s %8s", "path", "A ns", "A /floor")
	for i := 1; i < len(names); i++ {
		c := 'A' + i
		fmt.Fprintf(&hdr, " %7s %8s %16s", fmt.Sprintf("%c ns", c), fmt.Sprintf("%c /floor", c), fmt.Sprintf("%c/A (min-max)", c))
	}
	fmt.Println(hdr.String())
	for _, g := range groups {
		base := slotRounds(perRound, g.at[0])
		a := median(base)
		fmt.Printf("  %-56s %7d %7.2fx", g.name, a.Nanoseconds(), perFloor(a, empty, floorNet))
		for i := 1; i < len(g.at); i++ {
			x := slotRounds(perRound, g.at[i])
			ratio := "-"
			if rs := roundRatios(base, x, perRound[0]); len(rs) > 0 {
				ratio = fmt.Sprintf("%.2f (%.2f-%.2f)", rs[len(rs)/2], rs[0], rs[len(rs)-1])
			}
			xm := median(x)
			fmt.Printf(" %7d %7.2fx %16s", xm.Nanoseconds(), perFloor(xm, empty, floorNet), ratio)
		}
		fmt.Println()
	}
}

// timeRounds times paths round by round: the two floors (paths 0 and 1)
// first, then each group's slots, the slot that goes first moving round by
// round, since whichever runs after another finds the kernel code they
// share warm. A slot is the paths timed as one (a build's path, a service
// count's copies); on[i] is the rig path i runs on. It returns each path's
// cost in each round.
func timeRounds(t *testnet.Script, paths []path, on []*rig, groups [][][]int, rounds, runs int) [][]time.Duration {
	costs := make([][]time.Duration, len(paths))
	time1 := func(i int) {
		costs[i] = append(costs[i], on[i].round(t, paths[i], runs))
	}
	for round := range rounds {
		time1(0)
		time1(1)
		for _, g := range groups {
			for k := range g {
				for _, i := range g[(k+round)%len(g)] {
					time1(i)
				}
			}
		}
	}
	return costs
}

// slotRounds is a slot's cost in each round (perRound as timeRounds
// returns it): the median of its paths' costs in that round.
func slotRounds(perRound [][]time.Duration, slot []int) []time.Duration {
	var out []time.Duration
	for round := range perRound[slot[0]] {
		var cs []time.Duration
		for _, i := range slot {
			cs = append(cs, perRound[i][round])
		}
		out = append(out, median(cs))
	}
	return out
}

// roundRatio is the median over rounds of x's net cost over base's in the
// same round (net: minus empty's cost in that round); ok is false when
// base's net was never positive.
func roundRatio(base, x, empty []time.Duration) (r float64, ok bool) {
	ratios := roundRatios(base, x, empty)
	if len(ratios) == 0 {
		return 0, false
	}
	return ratios[len(ratios)/2], true
}

// roundRatios are x's net cost over base's in each round (see
// roundRatio), sorted.
func roundRatios(base, x, empty []time.Duration) []float64 {
	var ratios []float64
	for k := range empty {
		bn, xn := base[k]-empty[k], x[k]-empty[k]
		if bn > 0 {
			ratios = append(ratios, float64(xn)/float64(bn))
		}
	}
	slices.Sort(ratios)
	return ratios
}

// perFloor is d's net cost (d - empty) as a multiple of the floor's.
func perFloor(d, empty, floorNet time.Duration) float64 {
	if floorNet <= 0 {
		return 0
	}
	return float64(d-empty) / float64(floorNet)
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}
