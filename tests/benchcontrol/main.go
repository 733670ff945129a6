// SPDX-License-Identifier: Apache-2.0

// Command benchcontrol measures what one endpoint change costs the control
// plane end to end (`make bench-control`): a real l4lbd on a real datapath
// in a namespace serves N services of B backends, one backend of one
// service changes, C times, and each change is timed from its event to the
// moment the datapath holds it. The end is read from l4lbd's pinned BPF
// maps by the bench process itself (read only, every 100 µs): the
// service's Maglev table names exactly the backends it should, each active
// in the backend map and owned by the service. No API answer ends an
// interval. The paths (-paths), and where each interval starts:
//
//   - file: one backend of one service replaced in the file (written
//     before the clock starts), then `l4lbctl reload`'s request.
//   - override: `l4lbctl backend drain` / `enable` of one backend of
//     another service: the request.
//   - consul: a dev-mode Consul agent (bin/consul) holds the N services
//     instead of the file, as catalog entries of one node; one instance
//     of one service is registered again with the same ID on another port
//     (PUT /v1/catalog/register): the call's return.
//     Changes are 150 ms apart, so that none waits for the Consul source's
//     rate limit (a query per 100 ms after a burst of 10).
//   - kubernetes: a real kube-apiserver and etcd (kubetest, `make
//     kube-tools`) hold N Services of type LoadBalancer (pod backends, VIP
//     by annotation) with one EndpointSlice of B endpoints each; one
//     endpoint's address changes (an EndpointSlice update): the update
//     call's return. Timing starts once l4lbd has programmed the last
//     Service and the changed one and its CPU is idle for a second (the
//     status write-back is over). At most 65,000 Services: kubetest's ClusterIP range is a /16.
//   - health: one extra service, hc, with TCP checks (interval 200 ms, rise
//     and fall 1) on listeners of the bench in the topology's backend
//     host; one listener is closed, or opened again: the health manager's
//     own log line of the state change ("backend down" / "backend up",
//     millisecond resolution). The time from the listener's close or
//     open, probe interval included, is reported beside it.
//
// It reports each path's p50 and p99, the CPU l4lbd spent per change (from
// /proc: user + system, over all changes of the path), the same net of what
// it spends without changes (read over 3 s before them, once a second of
// at most 100 ms of CPU says its start-up is over), and the daemon's
// start-up time and resident memory at each size.
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
	consulMaxWatches := flag.Int("consul-max-watches", 0, "discovery.consul.max_watches of the consul path (0: not set, l4lbd's default)")
	tableSize := flag.Int("table-size", 1021, "maglev.table_size of every service (a prime ≥ 100 × backends)")
	pathList := flag.String("paths", "file,override", "what changes, comma-separated: file, override, consul, health")
	consulBin := flag.String("consul", "bin/consul", "the Consul agent of the consul path (`make bin/consul`)")
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
	paths := map[string]bool{}
	for _, p := range strings.Split(*pathList, ",") {
		p = strings.TrimSpace(p)
		switch p {
		case pathFile, pathOverride, pathConsul, pathKubernetes, pathHealth:
			paths[p] = true
		default:
			fmt.Fprintf(os.Stderr, "benchcontrol: unknown path %q (file, override, health, consul, kubernetes)\n", p)
			os.Exit(2)
		}
	}
	if *changes > 40 && paths[pathHealth] {
		// Each backend of hc flips down and up at most twice: more
		// would trip the health manager's flap damping.
		fmt.Fprintln(os.Stderr, "benchcontrol: the health path takes at most 40 changes")
		os.Exit(2)
	}
	if paths[pathConsul] {
		abs, err := filepath.Abs(*consulBin)
		if err == nil {
			_, err = os.Stat(abs)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchcontrol: no Consul agent for the consul path (`make bin/consul` builds it): %v\n", err)
			os.Exit(2)
		}
		*consulBin = abs
	}
	if paths[pathKubernetes] && slices.Max(counts) > k8sMaxServices {
		fmt.Fprintf(os.Stderr, "benchcontrol: the kubernetes path takes at most %d services: kubetest's apiserver has a /16 of ClusterIPs, and every LoadBalancer Service takes one\n", k8sMaxServices)
		os.Exit(2)
	}
	o := opts{backends: *backends, tableSize: *tableSize, changes: *changes, paths: paths, consulMaxWatches: *consulMaxWatches}

	results := map[[2]int][]run{}                                                    // (size, binary) -> runs
	setups := map[string]map[int][]time.Duration{pathConsul: {}, pathKubernetes: {}} // path -> size -> setup times
	var sc testnet.Script
	err := sc.Run(func() {
		tp := topo.New(&sc, topo.Options{LBs: 1, Backends: 1})
		lbHost := tp.LBs[0]
		var hb *hcBackends
		if paths[pathHealth] {
			hb = listenBackends(&sc, tp.Backends[0], *backends)
		}
		for r := range *rounds {
			for si, n := range counts {
				var agent *consulAgent
				if paths[pathConsul] {
					fmt.Fprintf(os.Stderr, "round %d: Consul agent with %d services × %d instances\n", r+1, n, *backends)
					agent = startConsul(&sc, lbHost, *consulBin, n, *backends)
					setups[pathConsul][n] = append(setups[pathConsul][n], agent.setup)
					fmt.Fprintf(os.Stderr, "  registered in %s\n", agent.setup.Round(100*time.Millisecond))
				}
				var cluster *k8sCluster
				if paths[pathKubernetes] {
					fmt.Fprintf(os.Stderr, "round %d: kube-apiserver and etcd with %d Services and EndpointSlices of %d endpoints\n", r+1, n, *backends)
					cluster = startKubernetes(&sc, lbHost, n, *backends)
					setups[pathKubernetes][n] = append(setups[pathKubernetes][n], cluster.setup)
					fmt.Fprintf(os.Stderr, "  created in %s\n", cluster.setup.Round(100*time.Millisecond))
				}
				for bi, bin := range binList {
					fmt.Fprintf(os.Stderr, "round %d: %d services × %d backends, %s\n", r+1, n, *backends, label[bi])
					res := measure(tp, lbHost, bin, n, o, agent, cluster, hb)
					results[[2]int{si, bi}] = append(results[[2]int{si, bi}], res)
					// Also as it comes, so that a later failure loses
					// nothing measured.
					for _, row := range res.rows(n, label[bi]) {
						fmt.Fprint(os.Stderr, "  "+row)
					}
				}
				if agent != nil {
					agent.stop()
				}
				if cluster != nil {
					cluster.stop()
				}
			}
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcontrol:", err)
		os.Exit(1)
	}
	fmt.Printf("One endpoint change, timed from its event to the datapath holding it (read from the pinned maps every %s); %d changes per run, table_size %d, %d backends per service.\n", pollEvery, *changes, *tableSize, *backends)
	fmt.Println("Starts: file = `l4lbctl reload` request (file written before), override = `l4lbctl backend drain|enable` request, health = l4lbd's \"backend down|up\" log line (ms), consul = return of the catalog register call, kubernetes = return of the EndpointSlice update call.")
	for _, s := range []struct{ path, what string }{
		{pathConsul, "Consul agent start and registration of every instance (64 per transaction)"},
		{pathKubernetes, "kube-apiserver and etcd start, creation of every Service and EndpointSlice (64 at a time)"},
	} {
		if !paths[s.path] {
			continue
		}
		fmt.Print(s.what + ":")
		for _, n := range counts {
			for _, d := range setups[s.path][n] {
				fmt.Printf(" %d services %s;", n, d.Round(100*time.Millisecond))
			}
		}
		fmt.Printf(" the start-up of a %s row lasts until the changed service is programmed.\n", s.path)
	}
	fmt.Println()
	fmt.Println("CPU per change is l4lbd's over the changes; net of idle, less what it spent per second over 3 s without changes (idle CPU per s), read once it had a second of at most 100 ms of CPU or after 30 s.")
	fmt.Println()
	fmt.Println("| services | l4lbd | path | p50 | p99 | CPU per change | net of idle | idle CPU per s | start-up | RSS |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for si, n := range counts {
		for bi := range binList {
			for _, res := range results[[2]int{si, bi}] {
				for _, row := range res.rows(n, label[bi]) {
					fmt.Print(row)
				}
			}
		}
	}
}

// The paths, in the order they run and are reported.
const (
	pathFile       = "file"
	pathOverride   = "override"
	pathHealth     = "health"
	pathConsul     = "consul"
	pathKubernetes = "kubernetes"
)

var allPaths = []string{pathFile, pathOverride, pathHealth, pathConsul, pathKubernetes}

// opts are the settings every run shares.
type opts struct {
	backends, tableSize, changes int
	paths                        map[string]bool
	// consulMaxWatches is written as discovery.consul.max_watches
	// when not 0 (a baseline older than the key refuses it).
	consulMaxWatches int
}

// run is one binary at one size.
type run struct {
	paths map[string]timing
}

// rows are r's lines of the report's table.
func (r run) rows(n int, label string) []string {
	var out []string
	for _, p := range allPaths {
		tm, ok := r.paths[p]
		if !ok {
			continue
		}
		name := p
		if tm.note != "" {
			name += " (" + tm.note + ")"
		}
		out = append(out, fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %d MiB |\n", n, label, name, ms(tm.p50), ms(tm.p99), ms(tm.cpu),
			ms(tm.net), ms(tm.idle), tm.start.Round(100*time.Millisecond), tm.rss>>20))
	}
	return out
}

// timing is one path's changes, timed C times.
type timing struct {
	p50, p99 time.Duration
	cpu      time.Duration // per change
	// idle is l4lbd's CPU per second without changes, and net the CPU
	// per change above it.
	idle, net time.Duration
	note      string
	// start and rss are those of the l4lbd the path ran on.
	start time.Duration
	rss   uint64
}

// timeChanges makes changes changes with change(i), each returning the
// interval it timed, and l4lbd's CPU (process pid) over all of them. It
// first measures l4lbd's CPU over idleWindow without changes: what it
// spends anyway (the self-check's slices, probes, timers), so that the
// part of CPU per change that the changes caused can be told apart.
func timeChanges(pid, changes int, change func(i int) time.Duration) timing {
	var tm timing
	settle(pid)
	idle0, t0 := cpuTime(pid), time.Now()
	time.Sleep(idleWindow)
	tm.idle = time.Duration(float64(cpuTime(pid)-idle0) / time.Since(t0).Seconds())
	var lat []time.Duration
	cpu0, start := cpuTime(pid), time.Now()
	for i := range changes {
		lat = append(lat, change(i))
	}
	spent := cpuTime(pid) - cpu0
	tm.cpu = spent / time.Duration(changes)
	background := time.Duration(float64(tm.idle) * time.Since(start).Seconds())
	tm.net = max(0, spent-background) / time.Duration(changes)
	tm.p50, tm.p99 = percentiles(lat)
	return tm
}

// idleWindow is how long l4lbd's CPU is read before a path's changes.
const idleWindow = 3 * time.Second

// settle waits, at most settleMax, for a second in which l4lbd spends at
// most settledCPU: the tail of its start-up (the last-good file, the fleet
// record, the collector) is not what it spends without changes.
func settle(pid int) {
	for deadline := time.Now().Add(settleMax); time.Now().Before(deadline); {
		c := cpuTime(pid)
		time.Sleep(time.Second)
		if cpuTime(pid)-c <= settledCPU {
			return
		}
	}
}

const (
	settleMax  = 30 * time.Second
	settledCPU = 100 * time.Millisecond
)

func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	lat = slices.Clone(lat)
	slices.Sort(lat)
	return lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// measure starts bin with n services and times the changes of every path
// asked for: file, override and health on one l4lbd reading the file,
// consul on another reading agent, kubernetes on a third reading cluster. Each l4lbd is stopped again and its
// pins removed.
func measure(tp *topo.Topology, h *topo.Host, bin string, n int, o opts, agent *consulAgent, cluster *k8sCluster, hb *hcBackends) run {
	res := run{paths: map[string]timing{}}
	if o.paths[pathFile] || o.paths[pathOverride] || o.paths[pathHealth] {
		measureFile(tp, h, bin, n, o, hb, res.paths)
	}
	if o.paths[pathConsul] {
		res.paths[pathConsul] = measureConsul(tp, h, bin, n, o, agent)
	}
	if o.paths[pathKubernetes] {
		res.paths[pathKubernetes] = measureKubernetes(tp, h, bin, n, o, cluster)
	}
	return res
}

func measureFile(tp *topo.Topology, h *topo.Host, bin string, n int, o opts, hb *hcBackends, out map[string]timing) {
	t := tp.T
	b := o.backends
	extra := ""
	if hb != nil {
		extra = hcConfig(hb.h.Addr4, b)
	}
	cfg := func(change int) string { return config(n, b, o.tableSize, change) + extra }
	t0 := time.Now()
	d := h.StartL4LBD(bin, cfg(-1))
	start := time.Since(t0)
	pid := d.Pid()
	mem := rss(pid)
	dp := mustOpenDatapath(t, d)
	defer dp.Close()
	ctx := context.Background()
	wait := func(what string, i int, svc int, want []netip.AddrPort) time.Time {
		end, err := dp.waitTable(serviceVIP(svc), servicePort, want, changeTimeout)
		if err != nil {
			t.Fatalf("%s %d: %v\n%s", what, i, err, d.Log())
		}
		return end
	}
	if o.paths[pathFile] {
		// The file is written before the clock starts: what is timed is
		// l4lbd's part, from the reload request on.
		svc := n / 2
		tm := timeChanges(pid, o.changes, func(i int) time.Duration {
			d.WriteConfig(cfg(i))
			want := serviceBackends(svc, b)
			want[0] = changedBackend(want[0], i)
			s := time.Now()
			rl, err := d.API().Reload(ctx)
			if err != nil || !rl.OK {
				t.Fatalf("reload %d: %v %s\n%s", i, err, rl.Error, d.Log())
			}
			return wait("reload", i, svc, want).Sub(s)
		})
		tm.start, tm.rss = start, mem
		out[pathFile] = tm
	}
	if o.paths[pathOverride] {
		svc := n / 4
		all := serviceBackends(svc, b)
		addr := all[1]
		tm := timeChanges(pid, o.changes, func(i int) time.Duration {
			action, want := api.ActionDrain, slices.Delete(slices.Clone(all), 1, 2)
			if i%2 == 1 {
				action, want = api.ActionEnable, all
			}
			s := time.Now()
			if err := d.API().Backend(ctx, fmt.Sprintf("s%d", svc), addr, action); err != nil {
				t.Fatalf("override %d: %v\n%s", i, err, d.Log())
			}
			return wait("override", i, svc, want).Sub(s)
		})
		tm.start, tm.rss = start, mem
		out[pathOverride] = tm
	}
	if hb != nil {
		var fromEvent []time.Duration
		// Backend j flips down at change 2j and up at 2j+1 (mod b).
		tm := timeChanges(pid, o.changes, func(i int) time.Duration {
			j, down := i/2%b, i%2 == 0
			from := len(d.Log())
			s := time.Now()
			if down {
				hb.close(j)
			} else {
				hb.open(j)
			}
			end, err := dp.waitTable(hcVIP, servicePort, hb.up(), changeTimeout)
			if err != nil {
				t.Fatalf("health flip %d: %v\n%s", i, err, d.Log())
			}
			fromEvent = append(fromEvent, end.Sub(s))
			deadline := time.Now().Add(5 * time.Second)
			for {
				if at, ok := stateChangeAt(d.Log(), from, hb.addrs[j], down); ok {
					return end.Sub(at)
				}
				if time.Now().After(deadline) {
					t.Fatalf("health flip %d: the datapath changed but l4lbd logged no state change of %s\n%s", i, hb.addrs[j], d.Log())
				}
				time.Sleep(time.Millisecond)
			}
		})
		p50, p99 := percentiles(fromEvent)
		tm.note = fmt.Sprintf("from the listener's close/open: p50 %s, p99 %s", ms(p50), ms(p99))
		tm.start, tm.rss = start, mem
		out[pathHealth] = tm
	}
	stopAndClean(t, bin, d)
}

// consulPace separates consul changes so that each finds a token in the
// Consul source's watch bucket (one query per 100 ms after a burst of
// 10): what is timed is propagation, not that rate limit.
const consulPace = 150 * time.Millisecond

func measureConsul(tp *topo.Topology, h *topo.Host, bin string, n int, o opts, agent *consulAgent) timing {
	t := tp.T
	b := o.backends
	svc := n / 2
	want := func() []netip.AddrPort {
		w := serviceBackends(svc, b)
		if agent.changes > 0 {
			w[0] = changedBackend(w[0], agent.changes-1)
		}
		return w
	}
	t0 := time.Now()
	section := fmt.Sprintf("\n[discovery.consul]\naddress = %q\n", consulAddr)
	if o.consulMaxWatches != 0 {
		section += fmt.Sprintf("max_watches = %d\n", o.consulMaxWatches)
	}
	d := h.StartL4LBD(bin, configHead(n, b, o.tableSize)+section)
	dp := mustOpenDatapath(t, d)
	defer dp.Close()
	waitReady(t, "consul", d, dp, readyService{n - 1, serviceBackends(n-1, b)}, readyService{svc, want()})
	start := time.Since(t0)
	pid := d.Pid()
	mem := rss(pid)
	tm := timeChanges(pid, o.changes, func(i int) time.Duration {
		time.Sleep(consulPace)
		reg := consulInstance(svc, 0, b, agent.changes)
		agent.changes++
		if err := agent.register(reg); err != nil {
			t.Fatalf("consul change %d: %v", i, err)
		}
		s := time.Now()
		end, err := dp.waitTable(serviceVIP(svc), servicePort, want(), changeTimeout)
		if err != nil {
			t.Fatalf("consul change %d: %v\n%s", i, err, d.Log())
		}
		return end.Sub(s)
	})
	tm.note = fmt.Sprintf("%s paces changes", consulPace)
	tm.start, tm.rss = start, mem
	stopAndClean(t, bin, d)
	return tm
}

// servicePort is every service's frontend port.
const servicePort = 80

// serviceVIP is service i's VIP.
func serviceVIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(200 + i/65536), byte(i / 256 % 256), byte(i % 256)})
}

// backendAddr is the k-th backend of the file: an address on the
// topology's segment and a port that makes it unique.
func backendAddr(k int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("%s%d", topo.Prefix4, 100+k%100)), uint16(1000+k/100))
}

// serviceBackends are service i's b backends as the file has them before
// any change.
func serviceBackends(i, b int) []netip.AddrPort {
	out := make([]netip.AddrPort, b)
	for j := range out {
		out[j] = backendAddr(i*b + j)
	}
	return out
}

// config renders n services of b backends each on the topology's segment
// (SNAT, so backend ports may differ from the service's); change ≥ 0
// replaces one backend of the middle service by changedBackend(…, change).
func config(n, b, tableSize, change int) string {
	var s strings.Builder
	s.WriteString(configHead(n, b, tableSize))
	for i := range n {
		fmt.Fprintf(&s, "\n[[service]]\nname = \"s%d\"\nvip = \"%s\"\nport = %d\nprotocol = \"tcp\"\n", i, serviceVIP(i), servicePort)
		for j, a := range serviceBackends(i, b) {
			if i == n/2 && j == 0 && change >= 0 {
				a = changedBackend(a, change)
			}
			fmt.Fprintf(&s, "[[service.backend]]\naddress = \"%s\"\nport = %d\n", a.Addr(), a.Port())
		}
	}
	return s.String()
}

// configHead is the config without services, its maps sized for n
// services of b backends.
func configHead(n, b, tableSize int) string {
	return fmt.Sprintf(`[daemon]
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
}

// mustOpenDatapath opens d's pinned maps for reading, or ends the run.
func mustOpenDatapath(t testnet.TB, d *topo.L4LBD) *dpReader {
	dp, err := openDatapath(d.PinDir)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return dp
}

// readyService is a service and the backends its table names once a
// source has published everything.
type readyService struct {
	svc  int
	want []netip.AddrPort
}

// waitReady waits until every service of ready is programmed with its
// backends (for a source: the last service and the one that changes), or
// ends the run naming path.
func waitReady(t testnet.TB, path string, d *topo.L4LBD, dp *dpReader, ready ...readyService) {
	for _, s := range ready {
		if _, err := dp.waitTable(serviceVIP(s.svc), servicePort, s.want, 10*time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, d.Log())
		}
	}
}

// stopAndClean stops d and removes what it left (l4lbd --cleanup), or
// ends the run.
func stopAndClean(t testnet.TB, bin string, d *topo.L4LBD) {
	if err := d.Stop(); err != nil {
		t.Fatalf("stop l4lbd: %v", err)
	}
	if out, err := runCmd(bin, "--config", d.Config, "--cleanup"); err != nil {
		t.Fatalf("l4lbd --cleanup: %v\n%s", err, out)
	}
}
