// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
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

func newRig(t *testnet.Script) *rig {
	ns := testnet.NewNS(t, "bench")
	peer := testnet.NewNS(t, "benchpeer")
	testnet.Veth(t, ns, "lb0", peer, "peer0")
	ns.AddAddr(t, "lb0", "10.0.0.1/16")
	ns.AddAddr(t, "lb0", "fd00::1/64")
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
		Seed: benchSeed, MaxServices: maxServices, MaxBackends: maxServices * 3, ConntrackMax: 1 << 20,
		SNATAddresses: []netip.Addr{lbAddr4, lbAddr6},
		Log:           slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	rec := reconciler.New(reconciler.Config{Seed: benchSeed, MaxServices: maxServices, MaxBackends: maxServices * 3}, d, nil)
	l := ns.Link(t, "lb0")
	return &rig{ns: ns, lb: d, rec: rec, ifindex: uint32(l.Attrs().Index), mac: l.Attrs().HardwareAddr}
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
	ds := make([]time.Duration, 0, runs)
	err := r.ns.Do(func() error {
		for i := range runs {
			pkt := next(i)
			var ctx any = xdpMD{DataEnd: uint32(len(pkt)), IngressIfindex: r.ifindex}
			if k == hookTC {
				ctx = skbContext(r.ifindex)
			}
			res, err := bpftest.Run(prog, pkt, ctx, 1)
			if err != nil {
				return err
			}
			ds = append(ds, res.Duration)
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

// path is one packet path to time.
type path struct {
	name string
	hook hookKind
	prog *ebpf.Program
	next func(int) []byte
}

// measure times each path: rounds interleave the paths so that machine
// noise spreads over all of them alike; the figure is the median of the
// rounds' medians.
func (r *rig) measure(t *testnet.Script, paths []path, rounds, runs int) []time.Duration {
	meds := make([][]time.Duration, len(paths))
	for range rounds {
		for i, p := range paths {
			meds[i] = append(meds[i], median(r.timeRuns(t, p.prog, p.hook, runs, p.next)))
		}
	}
	out := make([]time.Duration, len(paths))
	for i := range meds {
		out[i] = median(meds[i])
	}
	return out
}

// benchDatapath times every packet path at both hooks next to two floors,
// then the cost of 100,000 services, then a backend change on real maps.
func benchDatapath(t *testnet.Script, rounds, runs int) {
	r := newRig(t)
	passXDP, passTC := floorPass(t, ebpf.XDP, 2), floorPass(t, ebpf.SchedCLS, -1)
	var floor bpf.FloorObjects
	if err := bpf.LoadFloorObjects(&floor, nil); err != nil {
		t.Fatalf("floor program: %v", err)
	}
	defer floor.Close()

	tgs := targets()
	var svcs []lb.Service
	for _, tg := range tgs {
		svcs = append(svcs, tg.service())
	}
	if err := r.rec.Reconcile(svcs); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	fk := bpf.FloorSvcKey{Addr: tgs[0].vip().As16(), Port: 80 << 8, Proto: 6}
	if err := floor.FloorServices.Put(&fk, &bpf.FloorSvcValue{Id: 1}); err != nil {
		t.Fatalf("floor map: %v", err)
	}
	pkt := func(tg target, sport uint16, syn, ack bool) []byte {
		return pkttest.Build(t, pkttest.Packet{
			DstMAC: r.mac, Src: netip.AddrPortFrom(tg.client(), sport), Dst: netip.AddrPortFrom(tg.vip(), tg.port),
			SYN: syn, ACK: ack, Payload: make([]byte, 64),
		})
	}
	progs := map[hookKind]*ebpf.Program{hookXDP: r.lb.Program(), hookTC: r.lb.ProgramTC()}
	floorFrame := pkt(tgs[0], 2000, false, true)
	nonVIP := pkttest.Build(t, pkttest.Packet{DstMAC: r.mac, Src: netip.AddrPortFrom(client4, 1000),
		Dst: netip.MustParseAddrPort("192.0.2.99:80"), ACK: true, Payload: make([]byte, 64)})

	fmt.Printf("\nper-packet cost, kernel-timed with BPF_PROG_TEST_RUN, one fresh 64-byte-payload TCP packet per run,\nmedian of %d rounds x %d packets; every path of a hook measured in the same rounds as its floors\n", rounds, runs)
	for _, k := range []hookKind{hookXDP, hookTC} {
		passProg := passXDP
		if k == hookTC {
			passProg = passTC
		}
		paths := []path{
			{"floor: empty program (pass)", k, passProg, func(int) []byte { return floorFrame }},
		}
		if k == hookXDP {
			paths = append(paths, path{"floor: parse + one lookup", k, floor.L4lbFloor, func(int) []byte { return floorFrame }})
		}
		paths = append(paths, path{"non-VIP pass-through", k, progs[k], func(int) []byte { return nonVIP }})
		for _, tg := range tgs {
			est := pkt(tg, 2000+uint16(k), false, true)
			// Put the established flow in the tables.
			r.timeRuns(t, progs[k], k, 1, func(int) []byte { return est })
			// Every SYN is a new client port: a new flow for every run,
			// which for SNAT means allocating a new binding.
			newFlow := func(i int) []byte { return pkt(tg, uint16(10000+(i+int(k)*25000)%50000), true, false) }
			paths = append(paths,
				path{tg.name + ": established", k, progs[k], func(int) []byte { return est }},
				path{tg.name + ": new flow (SYN)", k, progs[k], newFlow},
			)
		}
		res := r.measure(t, paths, rounds, runs)
		fmt.Printf("\n%s\n", k)
		for i, p := range paths {
			fmt.Printf("  %-44s %5d ns  (%.1fx the empty program)\n", p.name, res[i].Nanoseconds(), float64(res[i])/float64(res[0]))
		}
	}

	// Scale: the same paths with the service map holding 100,000 entries.
	scale := []path{
		{"non-VIP pass-through", hookXDP, r.lb.Program(), func(int) []byte { return nonVIP }},
		{"dsr/ipip IPv4: established", hookXDP, r.lb.Program(), func(int) []byte { return pkt(tgs[0], 2000, false, true) }},
		{"dsr/ipip IPv4: new flow (SYN)", hookXDP, r.lb.Program(), func(int) []byte { return pkt(tgs[0], 3000, true, false) }},
	}
	before := r.measure(t, scale, rounds, runs)
	fill := filler(maxServices - 1 - len(tgs))
	start := time.Now()
	if err := r.rec.Reconcile(append(slices.Clone(svcs), fill...)); err != nil {
		t.Fatalf("reconcile %d services: %v", len(fill)+len(svcs), err)
	}
	took := time.Since(start)
	after := r.measure(t, scale, rounds, runs)
	fmt.Printf("\nscale: %d services (3 backends, table 251 each) programmed in %s\n", len(fill)+len(svcs), took.Round(time.Millisecond))
	for i, p := range scale {
		fmt.Printf("  %-44s %5d ns at %d services, %5d ns at %d (%.2fx)\n", p.name,
			before[i].Nanoseconds(), len(svcs), after[i].Nanoseconds(), len(fill)+len(svcs), float64(after[i])/float64(before[i]))
	}

	// One backend change among 100,000 services, on the real maps.
	all := append(slices.Clone(svcs), fill...)
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

// floorPass is a program of type typ that returns verdict.
func floorPass(t *testnet.Script, typ ebpf.ProgramType, verdict int32) *ebpf.Program {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: typ, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, verdict), asm.Return()},
	})
	if err != nil {
		t.Fatalf("floor program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
