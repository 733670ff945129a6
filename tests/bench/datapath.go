// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

var benchSeed = maglev.Seed{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// skbContext is a struct __sk_buff with only ifindex (offset 40) set.
func skbContext(ifindex uint32) []byte {
	ctx := make([]byte, 192)
	binary.NativeEndian.PutUint32(ctx[40:], ifindex)
	return ctx
}

// rig is a datapath loaded in a namespace where backends are routable.
type rig struct {
	ns      *testnet.NS
	lb      *datapath.LB
	rec     *reconciler.Reconciler
	ifindex uint32
	mac     net.HardwareAddr
	// freshClients counts the client addresses handed to fresh paths.
	freshClients uint32
}

const maxServices = 100_001

var (
	lbAddr4 = netip.MustParseAddr("10.0.0.1")
	lbAddr6 = netip.MustParseAddr("fd00::1")
	client4 = netip.MustParseAddr("203.0.113.7")
	client6 = netip.MustParseAddr("2001:db8:1::7")
)

func backend(v6 bool, i int) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("fd00::1:%d", i))
	}
	return netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})
}

// newRig loads obj (nil: the embedded object) on a namespace of its own,
// with the daemon's default capacities except SNAT tables of snatMax
// bindings (0: the default).
func newRig(t *testnet.Script, b build, snatMax uint32) *rig {
	// Anonymous: a bench stopped with ^C or killed leaves no namespace.
	ns := testnet.NewAnonNS(t, "bench")
	peer := testnet.NewAnonNS(t, "benchpeer")
	testnet.Veth(t, ns, "lb0", peer, "peer0")
	ns.AddAddr(t, "lb0", "10.0.0.1/16")
	ns.AddAddr(t, "lb0", "fd00::1/64")
	snatAddrs := []netip.Addr{lbAddr4, lbAddr6}
	for i := 2; i <= datapath.MaxSNATAddresses; i++ {
		a4, a6 := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), netip.MustParseAddr(fmt.Sprintf("fd00::%x", i))
		ns.AddAddr(t, "lb0", a4.String()+"/16")
		ns.AddAddr(t, "lb0", a6.String()+"/64")
		snatAddrs = append(snatAddrs, a4, a6)
	}
	ns.Sysctl(t, "net.ipv4.conf.all.forwarding", "1")
	ns.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	for i := 1; i <= 3; i++ {
		ns.AddNeigh(t, "lb0", backend(false, i).String(), net.HardwareAddr{2, 0xbe, 0, 0, 1, byte(i)})
		ns.AddNeigh(t, "lb0", backend(true, i).String(), net.HardwareAddr{2, 0xbe, 0, 0, 2, byte(i)})
	}
	// Clients are reached through a router on the segment (SNAT replies).
	ns.AddNeigh(t, "lb0", "10.0.0.254", net.HardwareAddr{2, 0xee, 0, 0, 0, 1})
	ns.AddNeigh(t, "lb0", "fd00::fe", net.HardwareAddr{2, 0xee, 0, 0, 0, 2})
	ns.AddRoute(t, "203.0.113.0/24", "10.0.0.254", "lb0")
	ns.AddRoute(t, "2001:db8:1::/64", "fd00::fe", "lb0")
	d, err := datapath.Load(datapath.Config{
		Seed: benchSeed, MaxServices: maxServices, MaxBackends: maxServices * 3,
		// Every SNAT address a family may have: fresh paths make a
		// binding per flow, tens of thousands a run, and with one
		// address the 3 backends' ports (3 x 16384 in the default
		// range) would fill up and time port exhaustion instead.
		SNATAddresses: snatAddrs,
		SNATMax:       snatMax,
		ConntrackMax:  rigConntrackMax,
		Netns:         ns.Handle(),
		Object:        b.obj,
		FlowCounts:    b.flowCounts,
		Log:           slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	// What attaching would learn (lb0's MAC and addresses): the
	// datapath forwards only frames to its interface's MAC.
	if err := d.LearnInterface("lb0"); err != nil {
		t.Fatalf("learn lb0: %v", err)
	}
	rec := reconciler.New(reconciler.Config{Seed: benchSeed, MaxServices: maxServices, MaxBackends: maxServices * 3}, d, nil)
	l := ns.Link(t, "lb0")
	return &rig{ns: ns, lb: d, rec: rec, ifindex: uint32(l.Attrs().Index), mac: l.Attrs().HardwareAddr}
}

// packet is a TCP packet of tg's client from port sport to tg's frontend,
// as received on the rig's lb0.
func (r *rig) packet(t *testnet.Script, tg target, sport uint16, syn, ack bool) []byte {
	return r.packetFrom(t, tg, netip.AddrPortFrom(tg.client(), sport), syn, ack)
}

// packetFrom is packet from any client address and port.
func (r *rig) packetFrom(t *testnet.Script, tg target, src netip.AddrPort, syn, ack bool) []byte {
	return pkttest.Build(t, pkttest.Packet{
		DstMAC: r.mac, Src: src, Dst: netip.AddrPortFrom(tg.vip(), tg.port),
		SYN: syn, ACK: ack, Payload: make([]byte, 64),
	})
}

// nonVIP is a packet of the family's client to an address no service has.
func (r *rig) nonVIP(t *testnet.Script, v6 bool) []byte {
	src, dst := netip.AddrPortFrom(client4, 1000), netip.MustParseAddrPort("192.0.2.99:80")
	if v6 {
		src, dst = netip.AddrPortFrom(client6, 1000), netip.MustParseAddrPort("[2001:db8::99]:80")
	}
	return pkttest.Build(t, pkttest.Packet{DstMAC: r.mac, Src: src, Dst: dst, ACK: true, Payload: make([]byte, 64)})
}

// fresh gives a new-flow path its packets: every run, in every round, a
// flow never sent before. A path cycling through a fixed set of ports
// would, from its second round on, time flows the connection table (or
// the handshakes buckets) already holds. Each path takes client addresses
// of its own, a new one every freshPorts flows.
func (r *rig) fresh(t *testnet.Script, tg target, syn bool) func(int) []byte {
	flow := r.freshFlows(tg)
	return func(int) []byte { return r.packetFrom(t, tg, flow(), syn, !syn) }
}

// freshFlows gives the client end of a flow never sent before at each
// call, from client addresses of its own (see fresh).
func (r *rig) freshFlows(tg target) func() netip.AddrPort {
	var src netip.Addr
	n := 0
	return func() netip.AddrPort {
		if n%freshPorts == 0 {
			src = r.freshClient(tg.v6)
		}
		port := uint16(freshPortMin + n%freshPorts)
		n++
		return netip.AddrPortFrom(src, port)
	}
}

// The client ports of fresh flows: each client address sends from all of
// them once.
const (
	freshPortMin = 1024
	freshPorts   = 65536 - freshPortMin
)

// freshClient is a client address no other path of the rig uses, in a
// range of its own: 100.64.0.0/10, or 2001:db8:f::/64.
func (r *rig) freshClient(v6 bool) netip.Addr {
	r.freshClients++
	k := r.freshClients
	if v6 {
		a := netip.MustParseAddr("2001:db8:f::").As16()
		binary.BigEndian.PutUint32(a[12:], k)
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte{100, 64 + byte(k>>16), byte(k >> 8), byte(k)})
}

// cacheMissFlows is how many established flows the first many-flows path
// cycles through: four times the slots of a CPU's flow cache
// (L4LB_FLOW_CACHE_SLOTS), so that almost every packet finds its slot
// taken by another flow and reads the connection table, whose entries are
// no longer in the CPU's caches either: a busy box's worst case. The
// second one (bench-ab's) cycles through manyFlows, where the connection
// table's own buckets and entries (a quarter of the default table) are
// far beyond the CPU's caches and TLB.
const (
	cacheMissFlows = 4 * 4096
	manyFlows      = 1 << 18
)

// rigConntrackMax is the connection table's capacity on the bench's
// datapaths: twice the daemon's default, so that bench-ab's four targets
// of a family each keep their manyFlows entries, and the fresh paths'
// beside them, without the LRU evicting any.
const rigConntrackMax = 1 << 21

// many establishes n flows of tg, each client address of the rig's own
// sending from every fresh port, and returns a packet source that cycles
// through them, round after round.
func (r *rig) many(t *testnet.Script, prog *ebpf.Program, k hookKind, tg target, n int) func(int) []byte {
	frames := make([][]byte, n)
	var src netip.Addr
	for i := range frames {
		if i%freshPorts == 0 {
			src = r.freshClient(tg.v6)
		}
		frames[i] = r.packetFrom(t, tg, netip.AddrPortFrom(src, uint16(freshPortMin+i%freshPorts)), false, true)
		if tg.mode == lb.ModeSNAT {
			r.establish(t, prog, k, tg, frames[i])
		}
	}
	if tg.mode != lb.ModeSNAT {
		r.timeRuns(t, prog, k, n, func(i int) []byte { return frames[i] })
	}
	next := 0
	return func(int) []byte {
		next = (next + 1) % n
		return frames[next]
	}
}

// freshPair gives the SYN and then the first ACK of a flow never sent
// before, a new one every run (see fresh): pre is the SYN, pkt the ACK.
func (r *rig) freshPair(t *testnet.Script, tg target, both bool) feed {
	flow := r.freshFlows(tg)
	var ack []byte
	return feed{
		pre: func(int) []byte {
			c := flow()
			ack = r.packetFrom(t, tg, c, false, true)
			return r.packetFrom(t, tg, c, true, false)
		},
		pkt:  func(int) []byte { return ack },
		both: both,
	}
}

// A row is a packet path timed for every target (that it applies to).
type row struct {
	name string
	// kind groups the path for make bench's summary (see path).
	kind string
	// flows: the many-flows rows' flow count (0 for the others).
	flows int
	// snat: the row times SNAT targets only.
	snat bool
	feed func(t *testnet.Script, r *rig, prog *ebpf.Program, k hookKind, tg target) (feed, bool)
}

func (rw row) String() string { return rw.name }

// rows are the paths timed per target, in the order the tables print
// them.
var rows = []row{
	{name: "established", kind: "established", feed: func(t *testnet.Script, r *rig, prog *ebpf.Program, k hookKind, tg target) (feed, bool) {
		est := r.packet(t, tg, 2000+uint16(k), false, true)
		// Put the established flow in the tables (SNAT: the
		// handshake's client ACK and a reply make it established).
		r.establish(t, prog, k, tg, est)
		return feed{pkt: func(int) []byte { return est }}, true
	}},
	// A backend's reply to an established SNAT flow, rewritten back to
	// the client (bpf/include/snat.h, snat_reply).
	{name: "reply", kind: "reply", snat: true, feed: func(t *testnet.Script, r *rig, prog *ebpf.Program, k hookKind, tg target) (feed, bool) {
		if tg.mode != lb.ModeSNAT {
			return feed{}, false
		}
		reply := r.establish(t, prog, k, tg, r.packet(t, tg, 3000+uint16(k), false, true))
		return feed{pkt: func(int) []byte { return reply }}, true
	}},
	// Established flows that miss the flow cache: many flows, cycled
	// (bpf/include/flowcache.h).
	manyRow(cacheMissFlows),
	manyRow(manyFlows),
	// Every SYN is a new client port: a new flow for every run, which for
	// SNAT means allocating a new binding.
	{name: "new flow, SYN", kind: "syn", feed: func(t *testnet.Script, r *rig, _ *ebpf.Program, _ hookKind, tg target) (feed, bool) {
		return feed{pkt: r.fresh(t, tg, true)}, true
	}},
	// The first packet without SYN of a flow the table does not know:
	// balanced and recorded.
	{name: "new flow, first non-SYN", kind: "first", feed: func(t *testnet.Script, r *rig, _ *ebpf.Program, _ hookKind, tg target) (feed, bool) {
		return feed{pkt: r.fresh(t, tg, false)}, true
	}},
	// What every connection takes: its client's first ACK, right after
	// its own SYN went through (untimed).
	{name: "ACK after its own SYN", kind: "ack", feed: func(t *testnet.Script, r *rig, _ *ebpf.Program, _ hookKind, tg target) (feed, bool) {
		return r.freshPair(t, tg, false), true
	}},
	// The two together: what setting up a connection costs the LB.
	{name: "per connection (SYN + ACK after it)", kind: "conn", feed: func(t *testnet.Script, r *rig, _ *ebpf.Program, _ hookKind, tg target) (feed, bool) {
		return r.freshPair(t, tg, true), true
	}},
}

// manyRow is the row of an established packet among n flows.
func manyRow(n int) row {
	return row{
		name: fmt.Sprintf("established among %s flows", thousands(n)), kind: "many", flows: n,
		feed: func(t *testnet.Script, r *rig, prog *ebpf.Program, k hookKind, tg target) (feed, bool) {
			return feed{pkt: r.many(t, prog, k, tg, n)}, true
		},
	}
}

// thousands writes n with commas between its groups of three digits.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// filler returns n IPv4 DSR services on VIPs 198.18.x.y:80 that only make
// the service map big; they are never sent traffic.
func filler(n int) []lb.Service {
	out := make([]lb.Service, n)
	for i := range out {
		vip := netip.AddrFrom4([4]byte{198, 18 + byte(i>>16), byte(i >> 8), byte(i)})
		s := lb.Service{
			Name: fmt.Sprintf("fill%d", i), Frontend: lb.Frontend{Addr: vip, Port: 80, Proto: lb.TCP},
			Mode: lb.ModeDSR, Dispatch: lb.DispatchIPIP, TableSize: 251,
		}
		for b := 1; b <= 3; b++ {
			s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(backend(false, b), 80), Weight: 1})
		}
		out[i] = s
	}
	return out
}

// A measured configuration: one service per mode, dispatch and family.
type target struct {
	name     string
	mode     lb.Mode
	dispatch lb.Dispatch
	v6       bool
	port     uint16
}

func (tg target) vip() netip.Addr {
	if tg.v6 {
		return netip.MustParseAddr("2001:db8::10")
	}
	return netip.MustParseAddr("192.0.2.10")
}

func (tg target) client() netip.Addr {
	if tg.v6 {
		return client6
	}
	return client4
}

func (tg target) service() lb.Service {
	s := lb.Service{
		Name: tg.name, Frontend: lb.Frontend{Addr: tg.vip(), Port: tg.port, Proto: lb.TCP},
		Mode: tg.mode, Dispatch: tg.dispatch, TableSize: 251,
	}
	for b := 1; b <= 3; b++ {
		s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(backend(tg.v6, b), tg.port), Weight: 1})
	}
	return s
}

func targets() []target {
	var out []target
	port := uint16(80)
	for _, v6 := range []bool{false, true} {
		fam := "IPv4"
		if v6 {
			fam = "IPv6"
		}
		for _, m := range []struct {
			name     string
			mode     lb.Mode
			dispatch lb.Dispatch
		}{
			{"dsr/ipip", lb.ModeDSR, lb.DispatchIPIP},
			{"dsr/geneve", lb.ModeDSR, lb.DispatchGeneve},
			{"dsr/opt", lb.ModeDSR, lb.DispatchOpt},
			{"snat", lb.ModeSNAT, lb.DispatchDefault},
		} {
			out = append(out, target{name: m.name + " " + fam, mode: m.mode, dispatch: m.dispatch, v6: v6, port: port})
			port++
		}
	}
	return out
}

type hookKind int

const (
	hookXDP hookKind = iota
	hookTC
)

func (h hookKind) String() string { return [...]string{"XDP", "tc"}[h] }

// timeRuns runs prog once per packet (a fresh packet each run) and returns
// the kernel-measured durations.
func (r *rig) timeRuns(t *testnet.Script, prog *ebpf.Program, k hookKind, runs int, next func(i int) []byte) []time.Duration {
	return r.timeFeed(t, prog, k, runs, feed{pkt: next})
}

// A feed gives a path the packets of its runs: run i sends pre(i) first
// when pre is set, then pkt(i). Only pkt's is timed, or with both the two
// packets' times added: what a flow's first two packets cost together.
type feed struct {
	pre, pkt func(i int) []byte
	both     bool
}

// timeFeed runs prog on runs of f (a fresh packet each run) and returns
// the kernel-measured durations.
func (r *rig) timeFeed(t *testnet.Script, prog *ebpf.Program, k hookKind, runs int, f feed) []time.Duration {
	ds := make([]time.Duration, 0, runs)
	run := func(pkt []byte) (time.Duration, error) {
		var ctx any = xdpMD{DataEnd: uint32(len(pkt)), IngressIfindex: r.ifindex}
		if k == hookTC {
			ctx = skbContext(r.ifindex)
		}
		res, err := bpftest.Run(prog, pkt, ctx, 1)
		return res.Duration, err
	}
	err := r.ns.Do(func() error {
		for i := range runs {
			var first time.Duration
			if f.pre != nil {
				d, err := run(f.pre(i))
				if err != nil {
					return err
				}
				if f.both {
					first = d
				}
			}
			d, err := run(f.pkt(i))
			if err != nil {
				return err
			}
			ds = append(ds, first+d)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("timing: %v", err)
	}
	return ds
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// roundCost is what one round of runs says a path costs: the mean of the
// middle half of its per-run times (the interquartile mean). The kernel
// times a run with the machine's clocksource, which on a KVM guest
// (kvm-clock) moves in steps of about 10 ns; a round's median is then one
// of those steps, and a path a few ns from a step's edge reads 10 ns apart
// from round to round, several percent of an established packet's net
// cost. The mean of the middle half resolves between the steps and, like
// the median, ignores the interrupts and migrations in the tails.
func roundCost(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	mid := s[len(s)/4 : len(s)-len(s)/4]
	var sum time.Duration
	for _, d := range mid {
		sum += d
	}
	return sum / time.Duration(len(mid))
}

// path is one packet path to time.
type path struct {
	name string
	hook hookKind
	prog *ebpf.Program
	next func(int) []byte
	// kind groups the path for the summary ("established", "syn",
	// "first", "nonvip"; "" for floors).
	kind string
	// copies are more loads of prog, each with maps of its own; a
	// round then costs the median of what prog and each copy cost in it
	// (see floorCopies).
	copies []*ebpf.Program
	// pre and both: see feed.
	pre  func(int) []byte
	both bool
}

// round times one round of p (roundCost), over its copies if it has any.
func (r *rig) round(t *testnet.Script, p path, runs int) time.Duration {
	var costs []time.Duration
	for _, prog := range append([]*ebpf.Program{p.prog}, p.copies...) {
		costs = append(costs, roundCost(r.timeFeed(t, prog, p.hook, runs, feed{p.pre, p.next, p.both})))
	}
	return median(costs)
}

// timing is one path's figure: the median of its rounds' costs
// (roundCost), and the smallest and largest of them.
type timing struct{ med, lo, hi time.Duration }

// measure times each path: rounds interleave the paths so that machine
// noise spreads over all of them alike.
func (r *rig) measure(t *testnet.Script, paths []path, rounds, runs int) []timing {
	meds := make([][]time.Duration, len(paths))
	for range rounds {
		for i, p := range paths {
			meds[i] = append(meds[i], r.round(t, p, runs))
		}
	}
	return summarize(meds)
}

// summarize turns each path's round costs into its timing.
func summarize(meds [][]time.Duration) []timing {
	out := make([]timing, len(meds))
	for i := range meds {
		out[i] = timing{median(meds[i]), slices.Min(meds[i]), slices.Max(meds[i])}
	}
	return out
}

// floors are the two reference programs of one hook: an empty program
// (its cost is the test-run harness itself) and the LB's parser plus one
// hash lookup (the least a program doing the job could cost), in
// floorCopies loads.
type floors struct {
	pass  *ebpf.Program
	parse []*ebpf.Program
}

// scaleCopies is how many datapaths each service count of the scale table
// is timed on (see benchScale).
const scaleCopies = 3

// scaleSNATMax is the SNAT tables' capacity on the scale table's
// datapaths: twelve datapaths at the default (1,048,576) take 5 GB for
// SNAT tables alone, and the table compares service counts, every one of
// them with the same SNAT tables.
const scaleSNATMax = 65536

// floorCopies is how many times the parse+lookup floor is loaded, each
// with maps of its own. What one load costs depends on where the kernel
// put its map and code: on the project's test box, eight loads in one
// process read 137 to 190 ns, and a single load's figure moved every
// ratio of a run by up to 40%. The median of five loads moved about
// a tenth as much between processes.
const floorCopies = 5

// report prints paths with their net cost (minus the empty program of the
// same run) and that net cost as a multiple of the parse+lookup floor's.
// Floors must be paths 0 (empty) and 1 (parse + lookup).
func report(title string, paths []path, res []timing) {
	empty, floorNet := res[0].med, res[1].med-res[0].med
	fmt.Printf("\n%s\n  %-56s %7s %13s %7s %9s\n", title, "path", "ns", "min-max", "net", "net/floor")
	for i, p := range paths {
		net := res[i].med - empty
		ratio := "-"
		if i > 0 && floorNet > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(net)/float64(floorNet))
		}
		fmt.Printf("  %-56s %7d %6d-%-6d %7d %9s\n", p.name, res[i].med.Nanoseconds(), res[i].lo.Nanoseconds(), res[i].hi.Nanoseconds(), net.Nanoseconds(), ratio)
	}
}

// benchDatapath times every packet path at both hooks next to the floors,
// then the main paths at 1, 10,000 and 100,000 services, then a backend
// change on real maps; obj is the LB object to time (nil: the embedded one).
func benchDatapath(t *testnet.Script, obj []byte, rounds, runs int) {
	r := newRig(t, build{obj: obj}, 0)
	fl := loadFloors(t)

	tgs := targets()
	var svcs []lb.Service
	for _, tg := range tgs {
		svcs = append(svcs, tg.service())
	}
	if err := r.rec.Reconcile(svcs); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	fl.program(t, tgs[0])
	progs := map[hookKind]*ebpf.Program{hookXDP: r.lb.Program(), hookTC: r.lb.ProgramTC()}
	floorFrame := r.packet(t, tgs[0], 2000, false, true)
	nonVIP := r.nonVIP(t, false)

	fmt.Printf("\nper-packet cost, kernel-timed with BPF_PROG_TEST_RUN (repeat 1), one fresh 64-byte-payload TCP packet per run;\n"+
		"ns = median of %d interleaved rounds x %d packets, a round being the mean of its middle half of packets\n"+
		"(min-max of the rounds); net = ns - the empty program;\n"+
		"net/floor = net / net of the parse + one lookup floor (a round's median of %d loads of it), both of the same hook and run\n", rounds, runs, floorCopies)
	benchPrimitives(t, r, fl, floorFrame, rounds, runs)
	summary := map[string][]float64{}
	for _, k := range []hookKind{hookXDP, hookTC} {
		paths := fl.paths(k, floorFrame)
		paths = append(paths, path{name: "non-VIP pass-through", hook: k, prog: progs[k], next: func(int) []byte { return nonVIP }, kind: "nonvip"})
		for _, tg := range tgs {
			for _, rw := range rows {
				if rw.flows > cacheMissFlows {
					// bench-ab's alone: one datapath here serves both
					// hooks and families, and every target's quarter
					// of a million flows would overflow its table.
					continue
				}
				if f, ok := rw.feed(t, r, progs[k], k, tg); ok {
					paths = append(paths, path{name: tg.name + ": " + rw.name, hook: k, prog: progs[k], kind: rw.kind, next: f.pkt, pre: f.pre, both: f.both})
				}
			}
		}
		res := r.measure(t, paths, rounds, runs)
		report(k.String(), paths, res)
		if k == hookXDP {
			floorNet := float64(res[1].med - res[0].med)
			for i, p := range paths {
				if p.kind == "" || !isIPv4(p.name) && p.kind != "nonvip" {
					continue
				}
				key := p.kind
				if p.kind != "nonvip" {
					if isSNAT(p.name) {
						key += " snat"
					} else {
						key += " dsr"
					}
				}
				summary[key] = append(summary[key], float64(res[i].med-res[0].med)/floorNet)
			}
		}
	}
	fmt.Printf("\nsummary, XDP IPv4, net cost / parse+lookup floor (range over dispatches):\n")
	for _, k := range []string{"established dsr", "established snat", "many dsr", "many snat", "syn dsr", "syn snat", "first dsr", "first snat", "ack dsr", "ack snat", "conn dsr", "conn snat", "nonvip"} {
		v := summary[k]
		if len(v) == 0 {
			continue
		}
		fmt.Printf("  %-18s %.2fx - %.2fx\n", k, slices.Min(v), slices.Max(v))
	}

	benchScale(t, obj, fl, svcs, tgs, floorFrame, rounds, runs)
}

func isIPv4(name string) bool { return strings.Contains(name, "IPv4") }
func isSNAT(name string) bool { return strings.HasPrefix(name, "snat") }

// establish puts tg's flow of frame est in the datapath's tables as a
// connection in the middle of its life: the client's packet, and for SNAT
// the backend's answer and the client's next packet (a binding that has
// seen both directions). It returns the backend's answer, nil for DSR.
func (r *rig) establish(t *testnet.Script, prog *ebpf.Program, k hookKind, tg target, est []byte) []byte {
	r.timeRuns(t, prog, k, 1, func(int) []byte { return est })
	if tg.mode != lb.ModeSNAT {
		return nil
	}
	// The binding's port: the datapath's own choice, read back from the
	// rewritten packet.
	var out []byte
	err := r.ns.Do(func() error {
		var ctx any = xdpMD{DataEnd: uint32(len(est)), IngressIfindex: r.ifindex}
		if k == hookTC {
			ctx = skbContext(r.ifindex)
		}
		res, err := bpftest.Run(prog, est, ctx, 1)
		out = res.Out
		return err
	})
	if err != nil {
		t.Fatalf("establish %s: %v", tg.name, err)
	}
	d := pkttest.Decode(out)
	var snat, be netip.AddrPort
	switch {
	case d.Outer4 != nil && d.TCP != nil:
		snat = netip.AddrPortFrom(netip.AddrFrom4([4]byte(d.Outer4.SrcIP.To4())), uint16(d.TCP.SrcPort))
		be = netip.AddrPortFrom(netip.AddrFrom4([4]byte(d.Outer4.DstIP.To4())), uint16(d.TCP.DstPort))
	case d.Outer6 != nil && d.TCP != nil:
		snat = netip.AddrPortFrom(netip.AddrFrom16([16]byte(d.Outer6.SrcIP)), uint16(d.TCP.SrcPort))
		be = netip.AddrPortFrom(netip.AddrFrom16([16]byte(d.Outer6.DstIP)), uint16(d.TCP.DstPort))
	default:
		t.Fatalf("establish %s: the SNAT-ed packet is not TCP over IP:\n%s", tg.name, d.Dump())
	}
	reply := pkttest.Build(t, pkttest.Packet{DstMAC: r.mac, Src: be, Dst: snat, ACK: true, Payload: make([]byte, 64)})
	r.timeRuns(t, prog, k, 1, func(int) []byte { return reply })
	r.timeRuns(t, prog, k, 1, func(int) []byte { return est })
	return reply
}

// benchScale times the main paths at 1, 10,000 and 100,000 services, each
// count on datapaths of its own (one service: the DSR paths' alone on one
// datapath, the SNAT path's alone on another), all in the same rounds, the
// count timed first moving round by round, as benchAB does for builds. So
// each count starts from empty connection tables, the machine's drift
// falls on every count alike, and the ratio of two counts is taken within
// a round. Each count has scaleCopies datapaths, and a round's figure for
// it is the median of theirs: where the kernel put a datapath's maps moves
// a new flow's cost by more than the service count does (one datapath per
// count read a SYN at 100,000 services 0.82 of one service's). Timed one
// count after another on one datapath instead, the later counts found the
// entries the earlier ones' new flows had made, and whichever count came
// first read cheaper. Then a backend change on the 100,000 services' real
// maps.
func benchScale(t *testnet.Script, obj []byte, fl *floorSet, svcs []lb.Service, tgs []target, floorFrame []byte, rounds, runs int) {
	dsrTg, snatTg := tgs[0], tgs[3]
	counts := []int{1, 10_000, maxServices - 1}
	// rigs[c] serve count c; snat1 the SNAT path at one service.
	rigs := make([][]*rig, len(counts))
	var snat1 []*rig
	var took []time.Duration
	program := func(services []lb.Service) *rig {
		r := newRig(t, build{obj: obj}, scaleSNATMax)
		start := time.Now()
		if err := r.rec.Reconcile(services); err != nil {
			t.Fatalf("reconcile %d services: %v", len(services), err)
		}
		took = append(took, time.Since(start))
		return r
	}
	for range scaleCopies {
		rigs[0] = append(rigs[0], program([]lb.Service{svcs[0]}))
		snat1 = append(snat1, program([]lb.Service{svcs[3]}))
		for c, n := range counts[1:] {
			rigs[c+1] = append(rigs[c+1], program(append(slices.Clone(svcs), filler(n-len(svcs))...)))
		}
	}

	paths := fl.paths(hookXDP, floorFrame)
	on := []*rig{rigs[0][0], rigs[0][0]}
	// A group is one path at every count: at[c] indexes count c's
	// copies.
	type group struct {
		name string
		at   [][]int
	}
	var groups []group
	add := func(name string, snat bool, mk func(r *rig) func(int) []byte) {
		g := group{name: name, at: make([][]int, len(counts))}
		for c := range counts {
			rs := rigs[c]
			if c == 0 && snat {
				rs = snat1
			}
			for _, r := range rs {
				g.at[c] = append(g.at[c], len(paths))
				paths = append(paths, path{name: name, hook: hookXDP, prog: r.lb.Program(), next: mk(r), kind: ""})
				on = append(on, r)
			}
		}
		groups = append(groups, g)
	}
	established := func(tg target) func(r *rig) func(int) []byte {
		return func(r *rig) func(int) []byte {
			est := r.packet(t, tg, 2000, false, true)
			r.establish(t, r.lb.Program(), hookXDP, tg, est)
			return func(int) []byte { return est }
		}
	}
	add("non-VIP pass-through", false, func(r *rig) func(int) []byte {
		frame := r.nonVIP(t, false)
		return func(int) []byte { return frame }
	})
	add(dsrTg.name+": established", false, established(dsrTg))
	add(dsrTg.name+": new flow, SYN", false, func(r *rig) func(int) []byte { return r.fresh(t, dsrTg, true) })
	add(dsrTg.name+": new flow, first non-SYN", false, func(r *rig) func(int) []byte { return r.fresh(t, dsrTg, false) })
	add(snatTg.name+": established", true, established(snatTg))
	// What programming left to the Go runtime is collected now rather
	// than on the other CPU while paths are timed.
	runtime.GC()

	// perRound[i] is path i's cost in each round; a count's figure in a
	// round is the median of its copies'.
	var order [][][]int
	for _, g := range groups {
		order = append(order, g.at)
	}
	// One round untimed first: on fresh datapaths the first new flows of
	// each cost ten times what later ones do (measured: about 10 µs a
	// SYN in the first round of 300, 1 µs after), pages of the connection
	// and handshakes tables touched for the first time; the main table's
	// datapath has been through the many-flows paths by then. With few
	// rounds that first round would set the median.
	timeRounds(t, paths, on, order, 1, runs)
	perRound := timeRounds(t, paths, on, order, rounds, runs)
	floors := summarize(perRound[:2])
	empty, floorNet := floors[0].med, floors[1].med-floors[0].med
	fmt.Printf("\nscale, XDP IPv4, each count on %d datapaths of its own, all in the same rounds: ns (net/floor); floors: empty program %d ns, parse + one lookup %d ns\n",
		scaleCopies, empty.Nanoseconds(), floors[1].med.Nanoseconds())
	fmt.Printf("ratio = median over rounds of the path's net at N / its net at 1 service in the same round\n")
	fmt.Printf("  %-42s", "path")
	for _, n := range counts {
		fmt.Printf(" %19s", fmt.Sprintf("%d service%s", n, map[bool]string{true: "", false: "s"}[n == 1]))
	}
	fmt.Printf("  %s\n", "ratio 10k / 100k")
	for _, g := range groups {
		fmt.Printf("  %-42s", g.name)
		per := make([][]time.Duration, len(counts))
		for c := range counts {
			per[c] = slotRounds(perRound, g.at[c])
			med := median(per[c])
			fmt.Printf(" %8d (%6.2fx)   ", med.Nanoseconds(), perFloor(med, empty, floorNet))
		}
		var out []string
		for c := 1; c < len(counts); c++ {
			ratio := "-"
			if r, ok := roundRatio(per[0], per[c], perRound[0]); ok {
				ratio = fmt.Sprintf("%.2fx", r)
			}
			out = append(out, ratio)
		}
		fmt.Printf("  %s\n", strings.Join(out, " / "))
	}
	fmt.Printf("  (programmed in %s and %s)\n", took[2].Round(time.Millisecond), took[3].Round(time.Millisecond))

	// One backend change among 100,000 services, on the real maps.
	r := rigs[len(rigs)-1][0]
	all := append(slices.Clone(svcs), filler(maxServices-1-len(svcs))...)
	var lat []time.Duration
	for i := range 21 {
		all[len(svcs)+5].Backends[2].Weight = uint32(1 + i%2)
		start := time.Now()
		if err := r.rec.Reconcile(all); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	fmt.Printf("\none weight change among %d services, real maps (diff + table build + swap): median %s over %d runs\n",
		len(all), median(lat).Round(time.Microsecond), len(lat))
}

// floorSet holds the floor programs of both hooks, floorCopies loads of
// each; objs[0] also holds the primitives.
type floorSet struct {
	objs  []bpf.FloorObjects
	hooks map[hookKind]floors
}

func loadFloors(t *testnet.Script) *floorSet {
	fs := &floorSet{objs: make([]bpf.FloorObjects, floorCopies)}
	xdp := floors{pass: emptyProgram(t, ebpf.XDP, 2)}
	tc := floors{pass: emptyProgram(t, ebpf.SchedCLS, -1)}
	for i := range fs.objs {
		o := &fs.objs[i]
		if err := bpf.LoadFloorObjects(o, nil); err != nil {
			t.Fatalf("floor program: %v", err)
		}
		t.Cleanup(func() { o.Close() })
		xdp.parse = append(xdp.parse, o.L4lbFloor)
		tc.parse = append(tc.parse, o.L4lbFloorTc)
	}
	fs.hooks = map[hookKind]floors{hookXDP: xdp, hookTC: tc}
	return fs
}

// program gives the parse+lookup floors the service of tg, so their
// lookups hit.
func (fs *floorSet) program(t *testnet.Script, tg target) {
	fk := bpf.FloorSvcKey{Addr: tg.vip().As16(), Port: tg.port<<8 | tg.port>>8, Proto: 6}
	for i := range fs.objs {
		if err := fs.objs[i].FloorServices.Put(&fk, &bpf.FloorSvcValue{Id: 1}); err != nil {
			t.Fatalf("floor map: %v", err)
		}
	}
}

// paths are the two floor paths of hook k, on frame (a packet to the
// floor's service).
func (fs *floorSet) paths(k hookKind, frame []byte) []path {
	f := fs.hooks[k]
	return []path{
		{name: "floor: empty program", hook: k, prog: f.pass, next: func(int) []byte { return frame }},
		{name: "floor: parse + one lookup", hook: k, prog: f.parse[0], next: func(int) []byte { return frame }, copies: f.parse[1:]},
	}
}

// emptyProgram is a program of type typ that returns verdict.
func emptyProgram(t *testnet.Script, typ ebpf.ProgramType, verdict int32) *ebpf.Program {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: typ, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, verdict), asm.Return()},
	})
	if err != nil {
		t.Fatalf("empty program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
