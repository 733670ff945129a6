// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// ExhaustionRow is one system under many short connections with a small
// connection table.
type ExhaustionRow struct {
	System string `json:"system"`
	Outcome
	// Table is the room the run had: free netfilter entries for iptables,
	// conntrack_max for l4lb.
	Table int `json:"table_entries"`
	// Netfilter is the change of `conntrack -S` over the run (summed
	// over CPUs), for the iptables box.
	Netfilter map[string]uint64 `json:"netfilter_stats,omitempty"`
	// L4LB is `l4lbctl conntrack stats` after the run, and L4LBLine its
	// human output.
	L4LB     *api.Conntrack `json:"l4lbctl_conntrack_stats,omitempty"`
	L4LBLine string         `json:"l4lbctl_conntrack_stats_line,omitempty"`
	// L4LBReasons are l4lb's datapath reason counters that moved during
	// the run (see unusual).
	L4LBReasons map[string]uint64 `json:"l4lb_datapath_reasons,omitempty"`
}

// ExhaustionResult is the conntrack-exhaustion scenario.
type ExhaustionResult struct {
	// NFConntrackMax is the kernel's nf_conntrack_max; Filled is how many
	// idle established entries the iptables box's namespace was given so
	// that only Free entries were left (see exhaustion).
	NFConntrackMax int             `json:"nf_conntrack_max"`
	Filled         int             `json:"filled"`
	Free           int             `json:"free"`
	Rate           int             `json:"connections_per_second"`
	Rows           []ExhaustionRow `json:"rows"`
}

// exhaustion drives short connections (connect, greeting, normal close:
// each leaves a TIME_WAIT entry in netfilter's table for 120 s) through a
// box whose connection table has o.ctFree entries of room.
//
// nf_conntrack_max is one value for the whole kernel and, in a network
// namespace other than the host's, read-only, while each namespace counts
// its own entries against it. So the run never changes the host's value: it fills the
// iptables box's own table with idle established connections (inserted
// with `conntrack -R`, ASSURED, which netfilter never evicts early) up to
// nf_conntrack_max - o.ctFree, as a box full of long-lived clients is.
// l4lb runs with conntrack_max and snat_max = o.ctFree.
func exhaustion(ctx context.Context, r *rig, o options, p *progress) *ExhaustionResult {
	eps := []netip.AddrPort{r.backendAddr(0, 7101), r.backendAddr(1, 7101)}
	r.stopAll()
	for _, a := range eps {
		r.serve(a)
	}
	defer r.stopAll()
	w := r.fillerWorkload(10, 1, eps)
	rate := o.ctConns / max(int(o.ctDuration/time.Second), 1)
	spec := loadSpec{Target: targetVIP.String(), Rate: rate, Count: o.ctConns, Timeout: time.Second}
	res := &ExhaustionResult{Free: o.ctFree, Rate: rate}

	p.step("conntrack exhaustion: iptables, %d free netfilter entries, %d connections at %d/s", o.ctFree, o.ctConns, rate)
	r.iptLoad(ctx, w)
	r.via(r.ipt)
	res.NFConntrackMax = r.readSysctlInt(r.ipt, "net/netfilter/nf_conntrack_max")
	res.Filled = r.fillConntrack(r.ipt, res.NFConntrackMax-o.ctFree)
	before := r.ctStats(r.ipt)
	lr, err := runLoad(ctx, r.tp.Client, spec)
	if err != nil {
		r.t.Fatalf("conntrack exhaustion: %v", err)
	}
	after := r.ctStats(r.ipt)
	row := exhaustionRow("iptables", lr, o.ctFree)
	row.Netfilter = map[string]uint64{}
	for _, k := range []string{"insert", "insert_failed", "drop", "early_drop", "invalid", "found"} {
		row.Netfilter[k] = after[k] - before[k]
	}
	res.Rows = append(res.Rows, row)
	p.done("%d of %d failed; conntrack -S: insert_failed +%d, drop +%d, early_drop +%d", row.Failed, row.Connections,
		row.Netfilter["insert_failed"], row.Netfilter["drop"], row.Netfilter["early_drop"])

	p.step("conntrack exhaustion: l4lb, conntrack_max = snat_max = %d, %d connections at %d/s", o.ctFree, o.ctConns, rate)
	r.startL4LBD(r.l4Config(w, uint32(o.ctFree)))
	r.via(r.l4)
	reasons := r.l4Reasons()
	lr, err = runLoad(ctx, r.tp.Client, spec)
	if err != nil {
		r.t.Fatalf("conntrack exhaustion: %v", err)
	}
	row = exhaustionRow("l4lb", lr, o.ctFree)
	row.L4LBReasons = unusual(reasons, r.l4Reasons())
	row.L4LBLine = r.l4lbctl("conntrack", "stats")
	var ct api.Conntrack
	if err := json.Unmarshal([]byte(r.l4lbctl("-o", "json", "conntrack", "stats")), &ct); err != nil {
		r.t.Fatalf("l4lbctl -o json conntrack stats: %v", err)
	}
	row.L4LB = &ct
	res.Rows = append(res.Rows, row)
	p.done("%d of %d failed; l4lbctl conntrack stats: %s", row.Failed, row.Connections, row.L4LBLine)
	return res
}

func exhaustionRow(system string, lr loadResult, table int) ExhaustionRow {
	return ExhaustionRow{System: system, Outcome: outcomeOf(lr), Table: table}
}

// fillConntrack inserts idle established TCP entries into h's netfilter
// connection table until it holds upTo entries, and returns how many it
// inserted. The addresses (10.250.0.0/16 to 10.251.0.1:443) appear in
// these entries only; no packet carries them.
func (r *rig) fillConntrack(h *topo.Host, upTo int) int {
	n := upTo - r.ctCount(h)
	if n <= 0 {
		return 0
	}
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "-I -p tcp -s 10.250.%d.%d -d 10.251.0.1 --sport %d --dport 443 --state ESTABLISHED -u SEEN_REPLY,ASSURED -t 7200\n",
			(i>>8)&255, i&255, 1024+(i>>16))
	}
	r.p.done("filling %s's netfilter table with %d idle established entries (conntrack -R)", h.Name, n)
	cmd := h.NS.Command("conntrack", "-R", "-")
	var errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = &b, io.Discard, &errb
	if err := cmd.Run(); err != nil {
		r.t.Fatalf("%s: conntrack -R: %v\n%s", h.Name, err, firstLines(errb.String(), 10))
	}
	if got := r.ctCount(h); got < upTo-16 {
		r.t.Fatalf("%s: conntrack table holds %d entries after filling, want %d", h.Name, got, upTo)
	}
	return n
}
