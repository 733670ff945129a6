// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

// Report is everything a run measured; -o json prints it as is.
type Report struct {
	Command      string            `json:"command"`
	Machine      Machine           `json:"machine"`
	Started      time.Time         `json:"started"`
	Took         time.Duration     `json:"took_ns"`
	ControlPlane []CPRow           `json:"control_plane,omitempty"`
	Rollout      *RolloutResult    `json:"rolling_update,omitempty"`
	Conntrack    *ExhaustionResult `json:"conntrack_exhaustion,omitempty"`
	Latency      []LatencyRow      `json:"latency,omitempty"`
	ConnRate     []ConnRateRound   `json:"connection_rate,omitempty"`
}

// Machine is what the figures were measured on.
type Machine struct {
	CPU       string `json:"cpu"`
	CPUs      int    `json:"cpus"`
	MemoryGiB int    `json:"memory_gib"`
	Kernel    string `json:"kernel"`
	IPTables  string `json:"iptables"`
	Conntrack string `json:"conntrack"`
	Go        string `json:"go"`
	// Load and LoadEnd are the 1-minute load average when the run
	// started and ended: other work on the machine shifts every figure.
	Load    string `json:"load_average"`
	LoadEnd string `json:"load_average_end"`
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryGiB = int((uint64(si.Totalram)*uint64(si.Unit) + 1<<29) >> 30)
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	m.IPTables = toolVersion("iptables", "--version")
	m.Conntrack = toolVersion("conntrack", "--version")
	m.Load = loadAverage()
	return m
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

func toolVersion(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(firstLines(string(out), 1))
}

// write prints the report as tables.
func (r *Report) write(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "l4lb next to a kube-proxy-shaped iptables setup, one run on one machine (%s).\n", r.Command)
	fmt.Fprintf(w, "Machine: %s, %d CPUs, %d GiB, Linux %s, %s, %s, %s; load average %s at the start, %s at the end.\n",
		m.CPU, m.CPUs, m.MemoryGiB, m.Kernel, m.IPTables, m.Conntrack, m.Go, m.Load, m.LoadEnd)
	fmt.Fprintf(w, "The figures are relative: both sides ran on this machine in this run; another machine gives other numbers.\n")
	fmt.Fprintf(w, "The run took %s.\n", r.Took.Round(time.Second))
	if r.ControlPlane != nil {
		r.writeControlPlane(w)
	}
	if r.Rollout != nil {
		r.writeRollout(w)
	}
	if r.Conntrack != nil {
		r.writeConntrack(w)
	}
	if r.Latency != nil {
		r.writeLatency(w)
	}
	if r.ConnRate != nil {
		r.writeConnRate(w)
	}
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func syncCell(s Sync) string {
	switch {
	case !s.measured():
		return "-"
	case s.Over:
		return "> " + secs(s.Time)
	}
	return secs(s.Time)
}

func ratioCell(s Sync, l4lb time.Duration) string {
	x := s.Ratio(l4lb)
	switch {
	case x == 0:
		return "-"
	case s.Over:
		return fmt.Sprintf("> %.0fx", x)
	case x < 10:
		return fmt.Sprintf("%.1fx", x)
	}
	return fmt.Sprintf("%.0fx", x)
}

func (r *Report) writeControlPlane(w io.Writer) {
	rows := r.ControlPlane
	most := 0
	for _, c := range rows {
		most = max(most, c.Full.Samples, c.Partial.Samples, c.L4LBSamples)
	}
	fmt.Fprintf(w, "\n1. Control plane: one endpoint change (one endpoint of one service replaced), median of up to %d changes\n", most)
	tw := table(w)
	fmt.Fprintln(tw, "SERVICES\tBACKENDS\tRULE LINES\tLOAD\tFULL SYNC\tPARTIAL SYNC (LINES)\tL4LB\tL4LB OPS\tFULL/L4LB\tPARTIAL/L4LB")
	for _, c := range rows {
		partial := syncCell(c.Partial)
		if c.Partial.Lines > 0 {
			partial += fmt.Sprintf(" (%d)", c.Partial.Lines)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", c.Services, c.Backends, c.Load.Lines,
			syncCell(c.Load), syncCell(c.Full), partial, us(c.L4LB), sumOps(c.L4LBOps),
			ratioCell(c.Full, c.L4LB), ratioCell(c.Partial, c.L4LB))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, `  LOAD: the whole rule set restored into empty filter and nat tables (iptables-restore), as when kube-proxy starts.
  FULL SYNC: kube-proxy's full sync (every sync before 1.28; since, at start, after a failed sync and at intervals):
    every chain it owns regenerated and applied with iptables-restore --noflush --counters. PARTIAL SYNC: kube-proxy
    1.28+ otherwise: KUBE-SERVICES and the changed service's chains. Each is rule generation plus iptables-restore.
    "> T": the restore ran past its budget T and was stopped, or a smaller rule set already had and it was not run;
    "-": not run because the rules could not be loaded. Changes are measured again only while they take less than
    %s together (-o json has the count and the reasons).
  L4LB: the pass l4lbd runs when a source changes one service: the source's whole snapshot merged, then lb/plan's
    pass over the changed service into the real BPF maps of lb/datapath. L4LB OPS are the datapath operations of the change: %s.
`, cpRepeat, opsWords(rows))
}

func opsWords(rows []CPRow) string {
	seen := map[string]bool{}
	var parts []string
	for _, c := range rows {
		var f []string
		for _, k := range slices.Sorted(maps.Keys(c.L4LBOps)) {
			f = append(f, fmt.Sprintf("%s %d", k, c.L4LBOps[k]))
		}
		s := strings.Join(f, ", ")
		if !seen[s] {
			seen[s] = true
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ") + " (a table swap is one new Maglev table of " + slotWords(rows) + " slots built aside and swapped in)"
}

func (r *Report) writeRollout(w io.Writer) {
	ro := r.Rollout
	fmt.Fprintf(w, "\n2. Rolling update: %d services; every one of the %d backends of one of them replaced one by one (%s apart),\n", ro.Services, ro.Backends, ro.Step.Round(time.Millisecond))
	fmt.Fprintf(w, "   while the client opens %d new connections/s to it for %s\n", ro.Rate, ro.Duration)
	tw := table(w)
	fmt.Fprintln(tw, "SYSTEM\tCONNECTIONS\tFAILED\tLONGEST FAILURE WINDOW\tCHANGE IN FORCE AFTER (MEDIAN / MAX)\tROLLED OVER")
	for _, x := range ro.Rows {
		lag := secs(x.LagMedian) + " / " + secs(x.LagMax)
		if x.Unapplied > 0 {
			lag += fmt.Sprintf(" (%d of %d not in force at the end)", x.Unapplied, x.Changes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.System, x.cells(), lag, yesNo(x.RolledOver))
	}
	_ = tw.Flush()
	seen := map[string]bool{}
	for _, x := range ro.Rows {
		if !seen[x.Procedure] {
			seen[x.Procedure] = true
			var who []string
			for _, y := range ro.Rows {
				if y.Procedure == x.Procedure {
					who = append(who, y.System)
				}
			}
			fmt.Fprintf(w, "  %s: %s.\n", strings.Join(who, "; "), x.Procedure)
		}
	}
	for _, x := range ro.Rows {
		if x.Procedure == procDrain && x.ToDraining > 0 {
			fmt.Fprintf(w, "  %s: %d new connections reached a backend after its draining state was in force, %d of them from a client\n", x.System, x.ToDraining, x.ToDrainingReused)
			fmt.Fprintf(w, "    port that an earlier connection to that backend had used: l4lb's connection table sends a SYN whose 5-tuple it\n")
			fmt.Fprintf(w, "    holds to that entry's backend, draining or not (see docs/compare.md).\n")
		}
	}
	for _, x := range ro.Rows {
		caveats(w, x.System, x.Outcome, x.L4LBReasons)
	}
	fmt.Fprintf(w, "  A connection fails when it is refused, reset or not greeted by a backend within 1 s. A failure window runs from\n")
	fmt.Fprintf(w, "  a failed connection to the end of the last failure less than %s after the previous one. ROLLED OVER: in\n", windowGap)
	fmt.Fprintf(w, "  the last second every connection succeeded and reached a new backend.\n")
}

// lateNote is how far behind its schedule a load generator may fall before
// the report says so.
const lateNote = 250 * time.Millisecond

// caveats notes what may explain a row other than the system: a load
// generator that fell behind (on a busy machine it counts its own wait as
// the connections'), and what l4lb's datapath counted besides forwarding.
func caveats(w io.Writer, system string, o Outcome, reasons map[string]uint64) {
	if o.ClientLate > lateNote {
		fmt.Fprintf(w, "  %s: the client fell up to %s behind its schedule: it did not get the CPU when it needed it, and a\n", system, secs(o.ClientLate))
		fmt.Fprintf(w, "    client short of CPU also sees its own delays as slow or failed connections.\n")
	}
	if len(reasons) > 0 {
		var f []string
		for _, k := range slices.Sorted(maps.Keys(reasons)) {
			f = append(f, fmt.Sprintf("%s %d", k, reasons[k]))
		}
		fmt.Fprintf(w, "  %s: l4lb's datapath counted %s.\n", system, strings.Join(f, ", "))
	}
}

// cells are an outcome's CONNECTIONS, FAILED and LONGEST FAILURE WINDOW
// columns.
func (o Outcome) cells() string {
	win := "-"
	if o.Failed > 0 {
		win = secs(o.LongestWindow)
		if o.OpenAtEnd {
			win = ">= " + win + " (still failing at the end)"
		}
	}
	return fmt.Sprintf("%d\t%d%s\t%s", o.Connections, o.Failed, kinds(o.FailedByKind), win)
}

func kinds(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	var f []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		f = append(f, fmt.Sprintf("%d %s", m[k], k))
	}
	return " (" + strings.Join(f, ", ") + ")"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (r *Report) writeConntrack(w io.Writer) {
	c := r.Conntrack
	fmt.Fprintf(w, "\n3. Conntrack exhaustion: short connections (connect, greeting, normal close) at %d/s with %d entries of room\n", c.Rate, c.Free)
	tw := table(w)
	fmt.Fprintln(tw, "SYSTEM\tCONNECTIONS\tFAILED\tLONGEST FAILURE WINDOW\tTABLE")
	for _, x := range c.Rows {
		var tab string
		if x.Netfilter != nil {
			tab = fmt.Sprintf("conntrack -S over the run: insert_failed +%d, drop +%d, early_drop +%d",
				x.Netfilter["insert_failed"], x.Netfilter["drop"], x.Netfilter["early_drop"])
		} else {
			tab = "l4lbctl conntrack stats: " + x.L4LBLine
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", x.System, x.cells(), tab)
	}
	_ = tw.Flush()
	for _, x := range c.Rows {
		caveats(w, x.System, x.Outcome, x.L4LBReasons)
	}
	fmt.Fprintf(w, "  iptables: nf_conntrack_max is %d for the whole kernel and read-only inside a network namespace, so the box's\n", c.NFConntrackMax)
	fmt.Fprintf(w, "  own table was first given %d idle established (ASSURED) entries, leaving %d: a box full of long-lived clients.\n", c.Filled, c.Free)
	fmt.Fprintf(w, "  l4lb: conntrack_max = snat_max = %d; its tables are LRU maps, so a full table forgets the flow idle the longest.\n", c.Free)
}

func (r *Report) writeLatency(w io.Writer) {
	fmt.Fprintf(w, "\n4. Connection latency (connect and greeting, one connection after another), the measured service last in KUBE-SERVICES\n")
	tw := table(w)
	fmt.Fprintln(tw, "SYSTEM\tSERVICES\tP50\tP99\tCONNECTIONS\tFAILED\tP50 VS FEWEST SERVICES")
	base := map[string]time.Duration{}
	for _, x := range r.Latency {
		if _, ok := base[x.System]; !ok {
			base[x.System] = x.P50
		}
		rel := "-"
		if b := base[x.System]; b > 0 {
			rel = fmt.Sprintf("%+.0f µs", float64(x.P50-b)/1e3)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\n", x.System, x.Services, us(x.P50), us(x.P99), x.Connections, x.Failed, rel)
	}
	_ = tw.Flush()
}

func (r *Report) writeConnRate(w io.Writer) {
	m, coreLo, coreHi, wallLo, wallHi := connRateSummary(r.ConnRate)
	fmt.Fprintf(w, "\n5. New TCP connections per second through l4lbd (SNAT, replies through the LB too; connect, greeting, close with RST),\n")
	fmt.Fprintf(w, "   %d client processes back to back; LB CPU from the kernel's BPF run-time statistics of lb2's XDP program\n", m.Workers)
	tw := table(w)
	fmt.Fprintln(tw, "ROUND\tCONNECTIONS\tFAILED\tCLIENT CONN/S\tLB PACKETS/CONN\tLB NS/CONN\tCONN/S PER LB CORE")
	for i, x := range r.ConnRate {
		ok := max(x.Connections-x.Failed, 1)
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.1f\t%.0f\t%.0f\n", i+1, x.Connections, x.Failed, x.PerSecond,
			float64(x.LBPackets)/float64(ok), x.LBNsPerConn(), x.PerLBCore())
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "  one LB core: %.0f connections/s (median; rounds %.0f-%.0f), the datapath program's time alone;\n", m.PerLBCore(), coreLo, coreHi)
	fmt.Fprintf(w, "  the client reached %.0f-%.0f/s, on CPUs it shares with the backends and the LB.\n", wallLo, wallHi)
}

func slotWords(rows []CPRow) string {
	var s []string
	seen := map[uint32]bool{}
	for _, c := range rows {
		if !seen[c.L4LBTableSlots] {
			seen[c.L4LBTableSlots] = true
			s = append(s, fmt.Sprint(c.L4LBTableSlots))
		}
	}
	return strings.Join(s, " or ")
}
