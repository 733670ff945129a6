// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/l4lb/l4lb/internal/bird"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// The scale-out rig: a client behind a router running BIRD, two LB boxes
// announcing the VIPs to it over BGP, three DSR backends (IPIP through the
// backend companion). The router installs what BIRD learns as ECMP routes
// and hashes flows over the boxes by their 5-tuple.
var (
	bgpVIP  = netip.MustParseAddr("10.200.0.10") // web: always healthy
	bgpVIP6 = netip.MustParseAddr("2001:db8:200::10")
	flapVIP = netip.MustParseAddr("10.200.0.20") // flap: its backends fail and return
)

const flapPort = 8080

// birdConfig peers with every LB box over IPv4 and IPv6. Short timers keep
// the test quick: a dead box is withdrawn after the 3 s hold time, and a
// session that failed is retried within a second.
func birdConfig(dir string, lbs []*topo.Host) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
router id 10.100.0.1;
log "%s/bird.log" all;
protocol device { scan time 1; }
# Equal routes from several boxes become one multipath route in the kernel.
protocol kernel kernel4 { ipv4 { import none; export all; }; merge paths on; }
protocol kernel kernel6 { ipv6 { import none; export all; }; merge paths on; }
template bgp lb {
	local as 65000;
	hold time 3;
	keepalive time 1;
	connect delay time 1;
	connect retry time 1;
	error wait time 1, 2;
	graceful restart on;
}
`, dir)
	for _, h := range lbs {
		fmt.Fprintf(&b, `
protocol bgp %s from lb { neighbor %s as 65001; ipv4 { import all; export none; }; }
protocol bgp %s6 from lb { neighbor %s as 65001; ipv6 { import all; export none; }; }
`, h.Name, h.Addr4, h.Name, h.Addr6)
	}
	return b.String()
}

// bgpBoxConfig is an LB box's config: web on both families, flap, DSR
// over IPIP, health-checked through the VIP, announced to the router.
func bgpBoxConfig(box *topo.Host, onStop string) string {
	var b strings.Builder
	b.WriteString(boxHead(fmt.Sprintf("[%q]", box.Addr4.String()+":9842"), "dsr", 1021))
	fmt.Fprintf(&b, `
[bgp]
asn         = 65001
router_id   = "%s"
on_stop     = %q
restart_time = 60
`, box.Addr4, onStop)
	for _, peer := range []string{topo.Prefix4 + "1", topo.Prefix6 + "1"} {
		fmt.Fprintf(&b, "\n[[bgp.peer]]\naddress = %q\nasn = 65000\nhold_time = 3\nkeepalive = 1\nconnect_retry = 1\n", peer)
	}
	for _, svc := range []struct {
		name   string
		vip    netip.Addr
		port   int
		prefix string
	}{{"web", bgpVIP, 80, topo.Prefix4}, {"web6", bgpVIP6, 80, topo.Prefix6}, {"flap", flapVIP, flapPort, topo.Prefix4}} {
		checkedService(&b, svc.name, svc.vip, svc.port, svc.prefix, 2)
	}
	return b.String()
}

// checkedService writes a TCP service on vip:port whose backends are .21
// to .23 of prefix, checked every 250 ms, down after fall failed probes.
func checkedService(b *strings.Builder, name string, vip netip.Addr, port int, prefix string, fall int) {
	fmt.Fprintf(b, `
[[service]]
name = %q
vip = "%s"
port = %d
protocol = "tcp"
[service.health]
type = "tcp"
interval = "250ms"
timeout = "200ms"
rise = 2
fall = %d
`, name, vip, port, fall)
	for n := 21; n <= 23; n++ {
		fmt.Fprintf(b, "[[service.backend]]\naddress = \"%s%d\"\n", prefix, n)
	}
}

// fib reads the router's kernel route to a VIP: its next hops, none when
// there is no route.
func fib(t *testing.T, tp *topo.Topology, vip netip.Addr) []netip.Addr {
	t.Helper()
	out, err := fibOf(tp, vip)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fibOf(tp *topo.Topology, vip netip.Addr) ([]netip.Addr, error) {
	fam := netlink.FAMILY_V4
	if vip.Is6() {
		fam = netlink.FAMILY_V6
	}
	dst := &net.IPNet{IP: net.IP(vip.AsSlice()), Mask: net.CIDRMask(vip.BitLen(), vip.BitLen())}
	routes, err := tp.Router.NS.Netlink().RouteListFiltered(fam, &netlink.Route{Dst: dst, Table: syscall.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("router routes: %v", err)
	}
	var out []netip.Addr
	for _, r := range routes {
		if r.Gw != nil {
			a, _ := netip.AddrFromSlice(r.Gw)
			out = append(out, a.Unmap())
		}
		for _, nh := range r.MultiPath {
			a, _ := netip.AddrFromSlice(nh.Gw)
			out = append(out, a.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// waitFIB polls the router's route to vip until its next hops are want,
// and returns when that happened.
func waitFIB(t *testing.T, tp *topo.Topology, r *bird.Router, vip netip.Addr, within time.Duration, want ...netip.Addr) time.Time {
	t.Helper()
	slices.SortFunc(want, netip.Addr.Compare)
	deadline := time.Now().Add(within)
	for {
		got := fib(t, tp, vip)
		if slices.Equal(got, want) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			routes, _ := r.Show("show", "route", "all")
			protos, _ := r.Show("show", "protocols")
			t.Fatalf("router's next hops for %s are %v, want %v after %s\n%s\n%s", vip, got, want, within, protos, routes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// routeEvents subscribes to the router's route changes and returns when
// each arrived: a wait on them sees a withdrawal when the kernel reports
// it, where polling would add up to its interval and a dump under load.
func routeEvents(t *testing.T, tp *topo.Topology) (events <-chan time.Time, stop func()) {
	t.Helper()
	updates := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	out := make(chan time.Time, 256)
	err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{Namespace: tp.Router.NS.Handle()})
	if err != nil {
		t.Fatalf("subscribe to the router's routes: %v", err)
	}
	go func() {
		defer close(out)
		for range updates {
			select {
			case out <- time.Now():
			default: // the waiter checks the table on the next one
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done) }) }
	t.Cleanup(stop)
	return out, stop
}

// waitFIBEvent is waitFIB timed by the route change that made the router's
// next hops for vip exactly want, from events (routeEvents) subscribed
// before the change.
func waitFIBEvent(t *testing.T, tp *topo.Topology, r *bird.Router, events <-chan time.Time, vip netip.Addr, within time.Duration, want ...netip.Addr) time.Time {
	t.Helper()
	slices.SortFunc(want, netip.Addr.Compare)
	if slices.Equal(fib(t, tp, vip), want) {
		return time.Now()
	}
	deadline := time.After(within)
	for {
		select {
		case at, ok := <-events:
			if !ok {
				return waitFIB(t, tp, r, vip, within, want...)
			}
			if slices.Equal(fib(t, tp, vip), want) {
				return at
			}
		case <-deadline:
			return waitFIB(t, tp, r, vip, 0, want...)
		}
	}
}

// fibWatch records every change of the router's next hops for a VIP.
type fibWatch struct {
	t    *testing.T
	stop chan struct{}
	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	seen [][]netip.Addr
	err  error
}

// watchFIB watches until finish, or the end of the test, whichever comes
// first (a failed step must not leave it reading a removed namespace).
func watchFIB(t *testing.T, tp *topo.Topology, vip netip.Addr) *fibWatch {
	w := &fibWatch{t: t, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var last []netip.Addr
		for first := true; ; first = false {
			got, err := fibOf(tp, vip)
			if err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
			if first || !slices.Equal(got, last) {
				w.mu.Lock()
				w.seen = append(w.seen, got)
				w.mu.Unlock()
				last = got
			}
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *fibWatch) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// finish stops the watch and returns every next-hop set seen, in order.
func (w *fibWatch) finish() [][]netip.Addr {
	w.t.Helper()
	w.halt()
	if w.err != nil {
		w.t.Fatal(w.err)
	}
	return w.seen
}

// longFlow is a TCP connection that echoes a line every 50 ms and
// tolerates a pause (a box failing over) of up to 30 s before it counts as
// broken; it records its longest pause.
type longFlow struct {
	c      *topo.Conn
	sport  uint16
	broken atomic.Bool
	err    atomic.Value
	maxGap atomic.Int64
	echoes atomic.Int64
}

func startLongFlows(t *testing.T, tp *topo.Topology, dst netip.AddrPort, n int, firstPort uint16) ([]*longFlow, func()) {
	t.Helper()
	var flows []*longFlow
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range n {
		sport := firstPort + uint16(i)
		c, err := tp.Client.DialTCP(sport, dst)
		if err != nil {
			t.Fatalf("long flow from port %d: %v", sport, err)
		}
		f := &longFlow{c: c, sport: sport}
		flows = append(flows, f)
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := time.Now()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				msg := fmt.Sprintf("ping %d", n)
				_, err := fmt.Fprintf(c, "%s\n", msg)
				var line string
				if err == nil {
					line, err = readLine(c)
				}
				if err == nil && line != c.Backend+" "+msg {
					err = fmt.Errorf("echo %q, want %q", line, c.Backend+" "+msg)
				}
				if err != nil {
					f.broken.Store(true)
					f.err.Store(err.Error())
					return
				}
				if gap := time.Since(last); gap > time.Duration(f.maxGap.Load()) {
					f.maxGap.Store(int64(gap))
				}
				last = time.Now()
				f.echoes.Add(1)
			}
		}()
	}
	return flows, func() {
		close(stop)
		wg.Wait()
		for _, f := range flows {
			f.c.Abort()
		}
	}
}

func readLine(c *topo.Conn) (string, error) {
	line, err := c.ReadLine()
	return strings.TrimSuffix(line, "\n"), err
}

// predictBackend asks l4lbctl (on a box's admin socket) where a client
// flow to a service goes.
func predictBackend(t *testing.T, d *topo.L4LBD, service string, client netip.Addr, sport uint16) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "l4lbctl"), "--socket", d.Socket, "-o", "json", "maglev", "lookup",
		"--service", service, "--src", client.String(), "--sport", fmt.Sprint(sport)).CombinedOutput()
	if err != nil {
		t.Fatalf("l4lbctl maglev lookup: %v\n%s", err, out)
	}
	var l api.Lookup
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatalf("l4lbctl maglev lookup: %v\n%s", err, out)
	}
	return l.Backend
}

func newFlows(t *testing.T, d *topo.L4LBD, service string) uint64 {
	t.Helper()
	s, err := d.API().Service(context.Background(), service)
	if err != nil {
		t.Fatal(err)
	}
	return s.Counters.NewFlows
}

// backendOf is the address:port of the backend named name (be1..be3).
func backendOf(tp *topo.Topology, name string, port uint16, v6 bool) string {
	for _, be := range tp.Backends {
		if be.Name == name {
			if v6 {
				return netip.AddrPortFrom(be.Addr6, port).String()
			}
			return netip.AddrPortFrom(be.Addr4, port).String()
		}
	}
	return "?" + name
}

// reachable tries one connection to dst with a short timeout.
func reachable(tp *topo.Topology, dst netip.AddrPort) bool {
	c, err := tp.Client.DialTCPTimeout(0, dst, 300*time.Millisecond)
	if err != nil {
		return false
	}
	c.Abort()
	return true
}

// TestBGPScaleOut runs the scale-out story end to end, each step on the
// state the previous one left: (a) the VIP is reachable only once the boxes
// announce it, and a VIP whose backends never passed a check is never
// announced; (b) flows spread over both boxes (the router's kernel says
// which flow takes which box), each to the backend l4lbctl predicts; (e) a
// service whose backends all fail is withdrawn and comes back; (d) a
// restart and a kill -9 of l4lbd keep the route (graceful restart) and
// break nothing; (c) a dead box (link down) is withdrawn at the router
// after the hold time and its flows continue on the other box, to the same
// backend. Long-lived flows run from (b) to the end; none may break. lb2
// runs with exactly the unit's capabilities. Durations are measured and
// logged, never asserted.
func TestBGPScaleOut(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 3, Router: true})
	lb1, lb2 := tp.LBs[0], tp.LBs[1]
	// flap's backends serve only once lb1 runs: a VIP whose backends
	// never passed a check must not be announced.
	var flapServers []*topo.Server
	for _, be := range tp.Backends {
		be.HoldVIPs(bgpVIP, bgpVIP6, flapVIP)
		be.StartCompanion(l4lbd(), bgpVIP.String(), bgpVIP6.String(), flapVIP.String())
		be.Serve(netip.AddrPortFrom(bgpVIP, 80), netip.AddrPortFrom(bgpVIP6, 80))
	}
	dir := t.TempDir()
	router := bird.Start(t, dir, tp.Router.NS, birdConfig(dir, tp.LBs))
	web := netip.AddrPortFrom(bgpVIP, 80)
	web6 := netip.AddrPortFrom(bgpVIP6, 80)

	var boxes [2]*topo.L4LBD
	if !t.Run("a_reachable_only_when_announced", func(t *testing.T) {
		if got := fib(t, tp, bgpVIP); len(got) != 0 {
			t.Fatalf("the router has a route to %s before any box runs: %v", bgpVIP, got)
		}
		if reachable(tp, web) {
			t.Fatalf("%s is reachable before any box announces it", web)
		}
		flapRoutes := watchFIB(t, tp, flapVIP)
		start := time.Now()
		boxes[0] = lb1.StartL4LBD(l4lbd(), bgpBoxConfig(lb1, "keep"))
		ready := time.Now()
		routed := waitFIB(t, tp, router, bgpVIP, 30*time.Second, lb1.Addr4)
		var reached time.Time
		for deadline := time.Now().Add(30 * time.Second); reached.IsZero(); {
			if reachable(tp, web) {
				reached = time.Now()
				// It became reachable: it must be through the
				// announced route, which cannot have gone since.
				if got := fib(t, tp, bgpVIP); len(got) == 0 {
					t.Fatalf("%s reachable without a route at the router", web)
				}
			} else if time.Now().After(deadline) {
				t.Fatalf("%s not reachable 30s after the route appeared\n%s", web, boxes[0].Log())
			}
		}
		t.Logf("MEASURE lb1 start -> admin API up: %s; -> route at router: %s; -> VIP reachable: %s",
			ready.Sub(start).Round(time.Millisecond), routed.Sub(start).Round(time.Millisecond), reached.Sub(start).Round(time.Millisecond))

		// flap, whose backends are all down, was never announced, not
		// even before its first checks ended: web's announcement came
		// with the same first set, and its checks have failed since.
		time.Sleep(time.Second)
		for _, nh := range flapRoutes.finish() {
			if len(nh) != 0 {
				t.Fatalf("%s was announced before any of its backends passed a check: router next hops %v", flapVIP, nh)
			}
		}
		checkWithheld(t, boxes[0], flapVIP, "0 healthy backends")
		for _, be := range tp.Backends {
			flapServers = append(flapServers, be.Serve(netip.AddrPortFrom(flapVIP, flapPort)))
		}
		serving := time.Now()
		flapUp := waitFIB(t, tp, router, flapVIP, 30*time.Second, lb1.Addr4)
		t.Logf("MEASURE flap backends serve -> announced: %s", flapUp.Sub(serving).Round(time.Millisecond))

		// lb2 runs with exactly systemd/l4lb.service's capabilities:
		// [bgp] needs no other.
		start = time.Now()
		boxes[1] = lb2.StartL4LBDWrapped(capSet("bpf", "net_admin", "perfmon"), l4lbd(), bgpBoxConfig(lb2, "keep"))
		ecmp := waitFIB(t, tp, router, bgpVIP, 30*time.Second, lb1.Addr4, lb2.Addr4)
		t.Logf("MEASURE lb2 start -> second ECMP next hop at router: %s", ecmp.Sub(start).Round(time.Millisecond))
		waitFIB(t, tp, router, bgpVIP6, 30*time.Second, lb1.Addr6, lb2.Addr6)
		waitFIB(t, tp, router, flapVIP, 30*time.Second, lb1.Addr4, lb2.Addr4)
	}) {
		return
	}

	var flows []*longFlow
	var stopFlows func()
	// via is the box the router sends each long flow to, by source port.
	via := map[uint16]netip.Addr{}
	if !t.Run("b_spread_and_predicted", func(t *testing.T) {
		before := [2]uint64{newFlows(t, boxes[0], "web"), newFlows(t, boxes[1], "web")}
		const n = 40
		flows, stopFlows = startLongFlows(t, tp, web, n, 41000)
		perBackend := map[string]int{}
		perBox := map[netip.Addr]uint64{}
		for _, f := range flows {
			via[f.sport] = routerChoice(t, tp, web, f.sport)
			perBox[via[f.sport]]++
			want := predictBackend(t, boxes[0], "web", tp.Client.Addr4, f.sport)
			if other := predictBackend(t, boxes[1], "web", tp.Client.Addr4, f.sport); other != want {
				t.Errorf("flow from port %d: lb1 predicts %s, lb2 %s", f.sport, want, other)
			}
			got := backendOf(tp, f.c.Backend, 80, false)
			if got != want {
				t.Errorf("flow from port %d reached %s (%s), l4lbctl maglev lookup predicts %s", f.sport, got, f.c.Backend, want)
			}
			perBackend[f.c.Backend]++
		}
		after := [2]uint64{newFlows(t, boxes[0], "web"), newFlows(t, boxes[1], "web")}
		d1, d2 := after[0]-before[0], after[1]-before[1]
		t.Logf("MEASURE %d flows: lb1 %d, lb2 %d new flows; backends %v", n, d1, d2, perBackend)
		if d1 == 0 || d2 == 0 || d1+d2 < n {
			t.Errorf("flows did not spread over both boxes: lb1 %d, lb2 %d of %d", d1, d2, n)
		}
		// The router's own answer for each flow agrees with what each
		// box counted, so (c) knows which flows lose their box. A box
		// may count a flow twice (a SYN retransmitted after its first
		// copy met an unresolved neighbour), never fewer times.
		t.Logf("MEASURE the router sends %d flows to lb1, %d to lb2", perBox[lb1.Addr4], perBox[lb2.Addr4])
		if perBox[lb1.Addr4] > d1 || perBox[lb2.Addr4] > d2 || perBox[lb1.Addr4]+perBox[lb2.Addr4] != n {
			t.Errorf("the router says it sends %d flows to lb1 and %d to lb2; the boxes counted %d and %d", perBox[lb1.Addr4], perBox[lb2.Addr4], d1, d2)
		}
		// IPv6 goes the same way.
		for i := range 8 {
			sport := uint16(42000 + i)
			c, err := tp.Client.DialTCP(sport, web6)
			if err != nil {
				t.Fatalf("IPv6 flow from port %d: %v", sport, err)
			}
			want := predictBackend(t, boxes[0], "web6", tp.Client.Addr6, sport)
			if got := backendOf(tp, c.Backend, 80, true); got != want {
				t.Errorf("IPv6 flow from port %d reached %s, predicted %s", sport, got, want)
			}
			c.Abort()
		}
	}) {
		if stopFlows != nil {
			stopFlows()
		}
		return
	}
	defer func() {
		if stopFlows != nil {
			stopFlows()
		}
	}()

	if !t.Run("e_failed_service_withdrawn_and_back", func(t *testing.T) {
		for _, s := range flapServers {
			s.Close()
		}
		down := time.Now()
		gone := waitFIB(t, tp, router, flapVIP, 30*time.Second)
		t.Logf("MEASURE flap backends down -> route withdrawn at router: %s", gone.Sub(down).Round(time.Millisecond))
		if got := fib(t, tp, bgpVIP); len(got) != 2 {
			t.Errorf("web's route changed with flap's: %v", got)
		}
		checkWithheld(t, boxes[0], flapVIP, "0 healthy backends")
		if out, err := exec.Command(filepath.Join(bin, "l4lbctl"), "--socket", boxes[0].Socket, "bgp", "status").CombinedOutput(); err != nil ||
			!strings.Contains(string(out), "established") || !strings.Contains(string(out), flapVIP.String()) {
			t.Errorf("l4lbctl bgp status: %v\n%s", err, out)
		} else {
			t.Logf("l4lbctl bgp status on lb1 with flap down:\n%s", out)
		}
		for _, be := range tp.Backends {
			be.Serve(netip.AddrPortFrom(flapVIP, flapPort))
		}
		up := time.Now()
		back := waitFIB(t, tp, router, flapVIP, 30*time.Second, lb1.Addr4, lb2.Addr4)
		t.Logf("MEASURE flap backends back -> route announced again: %s", back.Sub(up).Round(time.Millisecond))
		if !reachable(tp, netip.AddrPortFrom(flapVIP, flapPort)) {
			t.Errorf("flap not reachable after it came back")
		}
	}) {
		return
	}

	if !t.Run("d_restart_keeps_the_route", func(t *testing.T) {
		for _, step := range []struct {
			name string
			box  int
			do   func(d *topo.L4LBD)
		}{
			// Both on lb1: an l4lbd with only the unit's capabilities
			// (lb2) cannot read its pinned Maglev tables back at
			// restart yet (the datapath opens them by id, which takes
			// CAP_SYS_ADMIN).
			{"SIGTERM and start again (on_stop = keep)", 0, func(d *topo.L4LBD) { d.Restart() }},
			{"kill -9 and start again", 0, func(d *topo.L4LBD) { d.KillAndStart() }},
		} {
			load := startLoad(t, tp.Client, web, 0)
			w := watchFIB(t, tp, bgpVIP)
			start := time.Now()
			step.do(boxes[step.box])
			// Established again and announcing: its peer shows the
			// route advertised.
			waitAdvertised(t, boxes[step.box], 30*time.Second)
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond) // BIRD has the End-of-RIB by now
			seen := w.finish()
			load.finish()
			t.Logf("MEASURE %s of %s: back announcing after %s; router next hops seen %v; %d new connections ok, %d failed",
				step.name, tp.LBs[step.box].Name, took.Round(time.Millisecond), seen, load.newOK.Load(), load.newFailed.Load())
			for _, nh := range seen {
				if len(nh) != 2 {
					t.Errorf("%s: the router's route lost a next hop: %v", step.name, seen)
					break
				}
			}
			if load.newFailed.Load() > 0 {
				t.Errorf("%s: %d new connections failed: %v", step.name, load.newFailed.Load(), load.failures)
			}
			proto, _ := router.Show("show", "protocols", "all", tp.LBs[step.box].Name)
			if !strings.Contains(proto, "Established") {
				t.Errorf("session not established again:\n%s", proto)
			}
		}
	}) {
		return
	}

	t.Run("c_box_failure", func(t *testing.T) {
		gaps := map[uint16]time.Duration{}
		for _, f := range flows {
			gaps[f.sport] = time.Duration(f.maxGap.Load())
		}
		for _, f := range flows {
			if now := routerChoice(t, tp, web, f.sport); now != via[f.sport] {
				t.Fatalf("flow from port %d: the router moved it from %s to %s before the failure", f.sport, via[f.sport], now)
			}
		}
		down := time.Now()
		// The box dies: its link goes down, as when it loses power.
		tp.Switch.Run(t, "ip", "link", "set", "p-"+lb1.Name, "down")
		gone := waitFIB(t, tp, router, bgpVIP, 30*time.Second, lb2.Addr4)
		t.Logf("MEASURE lb1 link down -> withdrawn at the router: %s", gone.Sub(down).Round(time.Millisecond))
		// Let every flow echo again through lb2.
		time.Sleep(8 * time.Second)
		stopFlows()
		stopFlows = nil
		broken, moved := 0, 0
		var movedGap, stayedGap time.Duration
		for _, f := range flows {
			if f.broken.Load() {
				broken++
				t.Errorf("flow from port %d (via %s) to %s broke: %v", f.sport, via[f.sport], f.c.Backend, f.err.Load())
				continue
			}
			if now := routerChoice(t, tp, web, f.sport); now != lb2.Addr4 {
				t.Errorf("flow from port %d goes to %s after lb1 died", f.sport, now)
			}
			// Every echo since (b) came from the backend the flow
			// started on (startLongFlows checks each), so a flow that
			// moved kept its backend.
			if g := time.Duration(f.maxGap.Load()); via[f.sport] == lb1.Addr4 {
				moved++
				movedGap = max(movedGap, g)
			} else {
				stayedGap = max(stayedGap, g-gaps[f.sport])
			}
		}
		t.Logf("MEASURE box failure: %d long flows, %d moved from lb1 to lb2 (longest pause %s), %d broken; flows on lb2 paused at most %s longer than before",
			len(flows), moved, movedGap.Round(time.Millisecond), broken, stayedGap.Round(time.Millisecond))
		if moved == 0 {
			t.Errorf("no long flow went through lb1: the failure tested nothing")
		}
		// New flows work through the remaining box.
		for i := range 10 {
			if !reachable(tp, web) {
				t.Errorf("new connection %d through lb2 failed", i)
			}
		}
	})
}

// checkWithheld checks that d's bgp status has vip withheld for reason.
func checkWithheld(t *testing.T, d *topo.L4LBD, vip netip.Addr, reason string) {
	t.Helper()
	st, err := d.API().BGP(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.VIPs {
		if v.VIP == vip.String() && (v.Announced || !strings.Contains(v.Reason, reason)) {
			t.Errorf("%s: bgp status for %s: %+v, want withheld: %s", d.Host.Name, vip, v, reason)
		}
	}
}

// routerChoice asks the router's kernel which LB box it forwards a client
// flow to dst from sport to, by the same multipath hash as its forwarding.
func routerChoice(t *testing.T, tp *topo.Topology, dst netip.AddrPort, sport uint16) netip.Addr {
	t.Helper()
	out := tp.Router.NS.Run(t, "ip", "-j", "route", "get", dst.Addr().String(), "from", tp.Client.Addr4.String(), "iif", topo.ClientIface,
		"ipproto", "tcp", "sport", fmt.Sprint(sport), "dport", fmt.Sprint(dst.Port()))
	var routes []struct {
		Gateway string `json:"gateway"`
	}
	if err := json.Unmarshal([]byte(out), &routes); err != nil || len(routes) != 1 {
		t.Fatalf("ip route get on the router: %v\n%s", err, out)
	}
	a, err := netip.ParseAddr(routes[0].Gateway)
	if err != nil {
		t.Fatalf("ip route get on the router: no gateway: %s", out)
	}
	return a
}

// waitAdvertised waits until every BGP session of d is established and
// advertises what d announces.
func waitAdvertised(t *testing.T, d *topo.L4LBD, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := d.API().BGP(context.Background())
		if err == nil {
			ok := len(st.Peers) > 0
			for _, p := range st.Peers {
				ok = ok && p.Up && p.Advertised > 0
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: BGP not advertising after %s: %+v %v\n%s", d.Host.Name, within, st, err, d.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
