// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/bird"
	"github.com/l4lb/l4lb/tests/topo"
)

// bfdVIP is served by every backend and always healthy.
var bfdVIP = netip.MustParseAddr("10.200.0.40")

// healthVIP is the VIP of service hwN, whose backends are stopped in
// trial N to time health-driven withdrawal: one service per trial, because
// the checker holds a backend down that changed state more than four times
// in five minutes.
func healthVIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 200, 0, byte(50 + n)}) }

const bfdHealthPort = 8081

// failoverTrials is how many times each failure is repeated: 3 under
// `make test`, L4LB_FAILOVER_TRIALS (make failover sets 10) to measure.
func failoverTrials(t *testing.T) int {
	if v := os.Getenv("L4LB_FAILOVER_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("L4LB_FAILOVER_TRIALS = %q: want a positive integer", v)
		}
		return n
	}
	return 3
}

// birdBFDConfig is the router of the BFD tests: BFD on its segment
// interface with l4lbd's default timers, and BGP sessions that BFD takes
// down. The hold time is long (30 s) so that a withdrawal within seconds
// can only be BFD's doing.
func birdBFDConfig(dir string, lbs []*topo.Host) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
router id 10.100.0.1;
log "%s/bird.log" all;
timeformat log iso long ms;
protocol device { scan time 1; }
protocol kernel kernel4 { ipv4 { import none; export all; }; merge paths on; }
protocol bfd {
	interface "eth0" { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; };
}
template bgp lb {
	local as 65000;
	hold time 30;
	keepalive time 10;
	connect delay time 1;
	connect retry time 1;
	error wait time 1, 2;
	graceful restart on;
	bfd on;
	debug { events };       # logs "BFD session down", timed in ms
}
`, dir)
	for _, h := range lbs {
		fmt.Fprintf(&b, "protocol bgp %s from lb { neighbor %s as 65001; ipv4 { import all; export none; }; }\n", h.Name, h.Addr4)
	}
	return b.String()
}

// bfdBoxConfig is an LB box with BFD on its session to the router, at
// the default timers, and the same 30 s hold time as the router. web's
// checks ride out the second a blackholed box cannot reach its backends
// (fall 8 at 250 ms), or the trials would take it down and hold it down
// for flapping; hwN's fail after two probes, as a tight setting would.
func bfdBoxConfig(box *topo.Host, trials int) string {
	var b strings.Builder
	b.WriteString(boxHead(fmt.Sprintf("[%q]", box.Addr4.String()+":9842"), "dsr", 1021))
	fmt.Fprintf(&b, `
[bgp]
asn          = 65001
router_id    = "%s"
restart_time = 60
[[bgp.peer]]
address       = "%s1"
asn           = 65000
hold_time     = 30
keepalive     = 10
connect_retry = 1
[bgp.peer.bfd]
`, box.Addr4, topo.Prefix4)
	checkedService(&b, "web", bfdVIP, 80, topo.Prefix4, 8)
	for i := range trials {
		checkedService(&b, fmt.Sprintf("hw%d", i), healthVIP(i), bfdHealthPort, topo.Prefix4, 2)
	}
	return b.String()
}

// durations summarises measured times: median, 99th percentile (nearest
// rank) and the range.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	p99 := s[(99*len(s)+99)/100-1]
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("n=%d median %s p99 %s min %s max %s", len(s), r(s[len(s)/2]), r(p99), r(s[0]), r(s[len(s)-1]))
}

// birdBFDDown is when BIRD logged the BFD session of protocol name down,
// the first time at or after since (bird.log, millisecond timestamps in
// local time).
func birdBFDDown(r *bird.Router, name string, since time.Time) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(r.Dir, "bird.log"))
	if err != nil {
		return time.Time{}, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, name+": BFD session down") || len(l) < 23 {
			continue
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.000", l[:23], time.Local)
		// The log has milliseconds; since has more.
		if err == nil && !at.Before(since.Truncate(time.Millisecond)) {
			return at, true
		}
	}
	return time.Time{}, false
}

// bfdState is a box's BFD session state toward the router, from its
// admin API.
func bfdState(t *testing.T, d *topo.L4LBD) string {
	t.Helper()
	st, err := d.API().BGP(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Peers) != 1 || st.Peers[0].BFD == nil {
		t.Fatalf("%s: bgp status has no BFD session: %+v", d.Host.Name, st.Peers)
	}
	return st.Peers[0].BFD.State
}

// waitBFDUp waits until both ends have the BFD session up and the box
// advertises again, so that the next trial starts from a healthy fleet.
func waitBFDUp(t *testing.T, tp *topo.Topology, router *bird.Router, d *topo.L4LBD) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := router.Show("show", "bfd", "sessions")
		if bfdState(t, d) == "up" && strings.Contains(bfdLine(out, d.Host.Addr4), "Up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: BFD not up again after 60s: l4lbd says %s; BIRD:\n%s\n%s", d.Host.Name, bfdState(t, d), out, router.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitAdvertised(t, d, 60*time.Second)
}

// bfdLine is BIRD's `show bfd sessions` line of a neighbour.
func bfdLine(out string, addr netip.Addr) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == addr.String() {
			return l
		}
	}
	return ""
}

// TestBFDFailover fails an LB box in the ways BFD exists for, on the
// scale-out rig (client → router running BIRD with BFD → two LB boxes →
// DSR backends): (a) each trial stops every backend of one service, timed
// to the route's withdrawal; then, with long flows running throughout,
// (b) l4lbd frozen (SIGSTOP) and (c) the box's link dropping every frame
// with its carrier up, each repeated and timed from the failure to the
// route gone from the router's kernel, with BIRD saying BFD took it down;
// (d) a planned restart under BIRD's `bfd on`, which withdraws nothing:
// the datapath answers BFD for the restarting l4lbd, and no connection
// fails. No long flow may break. Durations are logged (MEASURE), never asserted.
func TestBFDFailover(t *testing.T) {
	bird.Require(t)
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 3, Router: true})
	lb1, lb2 := tp.LBs[0], tp.LBs[1]
	trials := failoverTrials(t)
	vips := []netip.Addr{bfdVIP}
	for i := range trials {
		vips = append(vips, healthVIP(i))
	}
	vipNames := make([]string, len(vips))
	for i, v := range vips {
		vipNames[i] = v.String()
	}
	// healthServers[i] are hw<i>'s servers, one per backend.
	healthServers := make([][]*topo.Server, trials)
	for _, be := range tp.Backends {
		be.HoldVIPs(vips...)
		be.StartCompanion(l4lbd(), vipNames...)
		be.Serve(netip.AddrPortFrom(bfdVIP, 80))
		for i := range trials {
			healthServers[i] = append(healthServers[i], be.Serve(netip.AddrPortFrom(healthVIP(i), bfdHealthPort)))
		}
	}
	dir := t.TempDir()
	router := bird.Start(t, dir, tp.Router.NS, birdBFDConfig(dir, tp.LBs))
	boxes := []*topo.L4LBD{lb1.StartL4LBD(l4lbd(), bfdBoxConfig(lb1, trials)), lb2.StartL4LBD(l4lbd(), bfdBoxConfig(lb2, trials))}
	t.Cleanup(func() {
		if t.Failed() {
			for _, d := range boxes {
				t.Logf("--- %s log:\n%s", d.Host.Name, tail(d.Log()))
			}
			t.Logf("--- router:\n%s", tail(router.Logs()))
		}
	})
	web := netip.AddrPortFrom(bfdVIP, 80)
	both := []netip.Addr{lb1.Addr4, lb2.Addr4}
	waitFIB(t, tp, router, bfdVIP, 60*time.Second, both...)
	for _, d := range boxes {
		waitBFDUp(t, tp, router, d)
	}
	if out, err := l4lbctl(t, boxes[0].Socket, "bgp", "status"); err != nil || !strings.Contains(out, "up 3x300ms") {
		t.Errorf("l4lbctl bgp status shows no BFD session up at 3x300ms: %v\n%s", err, out)
	} else {
		t.Logf("l4lbctl bgp status on lb1:\n%s", out)
	}

	// Health first: the failures below make the boxes' own checks fail
	// for a moment, which must not count against hwN's backends.
	if !t.Run("a_health_withdrawal", func(t *testing.T) {
		var took []time.Duration
		for i := range trials {
			waitFIB(t, tp, router, healthVIP(i), 60*time.Second, both...)
			for _, s := range healthServers[i] {
				s.Close()
			}
			down := time.Now()
			gone := waitFIB(t, tp, router, healthVIP(i), 60*time.Second)
			took = append(took, gone.Sub(down))
			t.Logf("MEASURE health trial %d: every backend of hw%d down -> route withdrawn at the router: %s", i, i, gone.Sub(down).Round(time.Millisecond))
		}
		t.Logf("MEASURE health check tcp every 250ms, fall 2: every backend down -> route withdrawn: %s", durations(took))
	}) {
		return
	}

	flows, stopFlows := startLongFlows(t, tp, web, 24, 43000)
	defer func() {
		if stopFlows != nil {
			stopFlows()
		}
	}()

	// fail takes a box out, trial after trial, and times the router's
	// withdrawal; heal brings it back before the next trial.
	// fail returns when the failure began, so that preparing it (loading
	// a program) is not timed.
	failover := func(t *testing.T, what string, fail func(d *topo.L4LBD) time.Time, heal func(d *topo.L4LBD)) {
		var took, detected, withdrawn []time.Duration
		for i := range trials {
			d := boxes[i%2]
			other := boxes[(i+1)%2].Host.Addr4
			events, stopEvents := routeEvents(t, tp)
			start := fail(d)
			gone := waitFIBEvent(t, tp, router, events, bfdVIP, 60*time.Second, other)
			stopEvents()
			took = append(took, gone.Sub(start))
			proto, _ := router.Show("show", "protocols", "all", d.Host.Name)
			if !strings.Contains(proto, "BFD session down") {
				t.Errorf("trial %d: %s withdrawn, but not by BFD:\n%s", i, d.Host.Name, proto)
			}
			// Where the time went: BIRD's detection, then its BGP and
			// kernel sync.
			split := "BIRD logged no BFD down"
			if down, ok := birdBFDDown(router, d.Host.Name, start); ok {
				detected = append(detected, down.Sub(start))
				withdrawn = append(withdrawn, gone.Sub(down))
				split = fmt.Sprintf("BIRD's BFD down after %s, then withdrawn in %s", down.Sub(start).Round(time.Millisecond), gone.Sub(down).Round(time.Millisecond))
			}
			t.Logf("MEASURE %s trial %d (%s): failure -> route withdrawn at the router: %s (%s)", what, i, d.Host.Name, gone.Sub(start).Round(time.Millisecond), split)
			heal(d)
			waitBFDUp(t, tp, router, d)
			waitFIB(t, tp, router, bfdVIP, 60*time.Second, both...)
		}
		t.Logf("MEASURE %s, BFD 3x300ms, failure -> route withdrawn: %s", what, durations(took))
		t.Logf("MEASURE %s, BFD 3x300ms, failure -> BIRD's BFD down: %s; BFD down -> route gone from the router's kernel: %s", what, durations(detected), durations(withdrawn))
	}

	if !t.Run("b_frozen", func(t *testing.T) {
		// SIGSTOP stops l4lbd, and with it the BFD and BGP speakers;
		// the XDP program keeps forwarding whatever still reaches the
		// box, so the box's flows work until the router moves them.
		failover(t, "l4lbd frozen (SIGSTOP)",
			func(d *topo.L4LBD) time.Time {
				start := time.Now()
				if err := d.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				return start
			},
			func(d *topo.L4LBD) {
				if err := d.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			})
	}) {
		return
	}
	if !t.Run("c_gone", func(t *testing.T) {
		var restore func()
		failover(t, "link dropping every frame, carrier up",
			func(d *topo.L4LBD) (start time.Time) {
				restore, start = tp.BlackholeAt(d.Host)
				return start
			},
			func(*topo.L4LBD) { restore() })
	}) {
		return
	}
	// restart restarts box d (SIGTERM, on_stop = "keep", start again)
	// under load and returns the router's next-hop sets seen meanwhile.
	restart := func(t *testing.T, d *topo.L4LBD) [][]netip.Addr {
		w := watchFIB(t, tp, bfdVIP)
		load := startLoad(t, tp.Client, web, 0)
		start := time.Now()
		d.Restart()
		waitBFDUp(t, tp, router, d)
		waitFIB(t, tp, router, bfdVIP, 60*time.Second, both...)
		took := time.Since(start)
		time.Sleep(time.Second)
		seen := w.finish()
		load.finish()
		t.Logf("MEASURE planned restart of %s: BFD up and both next hops back after %s; router next hops seen %v; %d new connections ok, %d failed",
			d.Host.Name, took.Round(time.Millisecond), seen, load.newOK.Load(), load.newFailed.Load())
		if load.newFailed.Load() > 0 {
			t.Errorf("%d new connections failed during the restart: %v", load.newFailed.Load(), load.failures)
		}
		return seen
	}
	if !t.Run("d_planned_restart_bfd_on", func(t *testing.T) {
		// BIRD's `bfd on`, the setting that withdraws a frozen or dead
		// box within the detection time: the stopping l4lbd hands its
		// BFD session to the datapath, which answers the router's
		// control packets until the next l4lbd resumes the same
		// session, so BIRD's BFD never goes down and graceful restart
		// keeps the box's route throughout.
		withdrawn := 0
		for i := range trials {
			d := boxes[i%2]
			since := time.Now()
			for _, nh := range restart(t, d) {
				if len(nh) != 2 {
					withdrawn++
					proto, _ := router.Show("show", "protocols", "all", d.Host.Name)
					t.Errorf("trial %d: the router withdrew %s during a planned restart with bfd on: %v\n%s", i, d.Host.Name, nh, proto)
					break
				}
			}
			if at, ok := birdBFDDown(router, d.Host.Name, since); ok {
				t.Errorf("trial %d: BIRD saw BFD with %s go down during the planned restart, at %s", i, d.Host.Name, at.Format("15:04:05.000"))
			}
			log := d.Log()
			at := strings.LastIndex(log, "msg=\"BFD session resumed\"")
			if at < 0 {
				t.Fatalf("trial %d: %s did not resume its BFD session after the restart; log:\n%s", i, d.Host.Name, tail(log))
			}
			line := log[at:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			if strings.Contains(line, "answered_by_datapath=0") {
				t.Errorf("trial %d: the datapath answered no BFD packet during the restart: %s", i, line)
			}
			t.Logf("MEASURE planned restart trial %d (%s) with bfd on: %s", i, d.Host.Name, line)
		}
		t.Logf("MEASURE planned restarts with bfd on: %d of %d withdrawn", withdrawn, trials)
	}) {
		return
	}

	stopFlows()
	stopFlows = nil
	broken := 0
	var maxGap time.Duration
	for _, f := range flows {
		if f.broken.Load() {
			broken++
			t.Errorf("long flow from port %d to %s broke: %v", f.sport, f.c.Backend, f.err.Load())
		}
		maxGap = max(maxGap, time.Duration(f.maxGap.Load()))
	}
	t.Logf("MEASURE %d long DSR flows through every failure: %d broken, longest pause %s", len(flows), broken, maxGap.Round(time.Millisecond))

	t.Run("f_baseline_hold_timer", func(t *testing.T) {
		// The same link failure with BFD off at the router: only the
		// 30 s hold time notices it. After the long flows, which would
		// not survive a pause that long.
		router.Reconfigure(strings.ReplaceAll(birdBFDConfig(dir, tp.LBs), "bfd on;", ""))
		waitFIB(t, tp, router, bfdVIP, 60*time.Second, both...)
		for _, d := range boxes {
			waitAdvertised(t, d, 60*time.Second)
		}
		start := time.Now()
		restore := tp.Blackhole(lb1)
		gone := waitFIB(t, tp, router, bfdVIP, 60*time.Second, lb2.Addr4)
		restore()
		t.Logf("MEASURE baseline, BFD off, hold time 30s: link dropping every frame -> route withdrawn: %s", gone.Sub(start).Round(time.Millisecond))
	})
}
