// SPDX-License-Identifier: Apache-2.0

package main

import (
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

// rig is a datapath loaded in a namespace where backends are routable.
type rig struct {
	ns      *testnet.NS
	lb      *datapath.LB
	rec     *reconciler.Reconciler
	ifindex uint32
	mac     net.HardwareAddr
}

const maxServices = 100_001

func newRig(t *testnet.Script) *rig {
	ns := testnet.NewNS(t, "bench")
	peer := testnet.NewNS(t, "benchpeer")
	testnet.Veth(t, ns, "lb0", peer, "peer0")
	ns.AddAddr(t, "lb0", "10.0.0.1/16")
	ns.Sysctl(t, "net.ipv4.conf.all.forwarding", "1")
	for i := 1; i <= 250; i++ {
		ns.AddNeigh(t, "lb0", fmt.Sprintf("10.0.1.%d", i), net.HardwareAddr{2, 0xbe, 0, 0, 1, byte(i)})
	}
	d, err := datapath.Load(datapath.Config{
		Seed: benchSeed, MaxServices: maxServices, MaxBackends: maxServices * 3, ConntrackMax: 1 << 20,
		Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	rec := reconciler.New(reconciler.Config{Seed: benchSeed, MaxServices: maxServices, MaxBackends: maxServices * 3}, d, nil)
	l := ns.Link(t, "lb0")
	return &rig{ns: ns, lb: d, rec: rec, ifindex: uint32(l.Attrs().Index), mac: l.Attrs().HardwareAddr}
}

// services returns n DSR services: service i has VIP 198.18.x.y:80 and
// backends 10.0.1.1..3.
func services(n int) []lb.Service {
	out := make([]lb.Service, n)
	for i := range out {
		vip := netip.AddrFrom4([4]byte{198, 18 + byte(i>>16), byte(i >> 8), byte(i)})
		s := lb.Service{
			Name: fmt.Sprintf("svc%d", i), Frontend: lb.Frontend{Addr: vip, Port: 80, Proto: lb.TCP},
			Mode: lb.ModeDSR, Dispatch: lb.DispatchIPIP, TableSize: 251,
		}
		for b := 1; b <= 3; b++ {
			s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(b)}), 80), Weight: 1})
		}
		out[i] = s
	}
	return out
}

// timeRuns runs prog once per packet from next (a fresh packet every run)
// and returns the kernel-measured durations.
func (r *rig) timeRuns(t *testnet.Script, prog *ebpf.Program, runs int, next func(i int) []byte, want uint32) []time.Duration {
	ds := make([]time.Duration, 0, runs)
	err := r.ns.Do(func() error {
		for i := range runs {
			res, err := bpftest.Run(prog, next(i), xdpMD{DataEnd: uint32(len(next(i))), IngressIfindex: r.ifindex}, 1)
			if err != nil {
				return err
			}
			if res.Verdict != want {
				return fmt.Errorf("run %d: verdict %d, want %d", i, res.Verdict, want)
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

const (
	xdpDrop = 1
	xdpPass = 2
	xdpTX   = 3
)

type pathResult struct {
	name   string
	rounds []time.Duration // median of each round
}

func (p pathResult) median() time.Duration { return median(p.rounds) }

// benchDatapath times each packet path at 1 and at 100,000 services.
func benchDatapath(t *testnet.Script, rounds, runs int) {
	r := newRig(t)
	passProg, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.XDP, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()},
	})
	if err != nil {
		t.Fatalf("XDP_PASS program: %v", err)
	}
	defer passProg.Close()
	var floor bpf.FloorObjects
	if err := bpf.LoadFloorObjects(&floor, nil); err != nil {
		t.Fatalf("floor program: %v", err)
	}
	defer floor.Close()

	svcs := services(maxServices - 1)
	client := netip.MustParseAddr("203.0.113.7")
	target := svcs[0].Frontend.Addr
	fk := bpf.FloorSvcKey{Addr: target.As16(), Port: 80 << 8, Proto: 6}
	if err := floor.FloorServices.Put(&fk, &bpf.FloorSvcValue{Id: 1}); err != nil {
		t.Fatalf("floor map: %v", err)
	}

	pkt := func(vip netip.Addr, sport uint16, syn, ack bool) []byte {
		return pkttest.Build(t, pkttest.Packet{
			DstMAC: r.mac, Src: netip.AddrPortFrom(client, sport), Dst: netip.AddrPortFrom(vip, 80),
			SYN: syn, ACK: ack, Payload: make([]byte, 64),
		})
	}
	nonVIP := pkt(netip.MustParseAddr("192.0.2.99"), 1000, false, true)

	measure := func(label string, vip netip.Addr) []pathResult {
		established := pkt(vip, 2000, false, true)
		syn := pkt(vip, 3000, true, false)
		// Put the established flow in the connection table.
		r.timeRuns(t, r.lb.Program(), 1, func(int) []byte { return established }, xdpTX)
		paths := []struct {
			name string
			prog *ebpf.Program
			next func(int) []byte
			want uint32
		}{
			{"floor: XDP_PASS program", passProg, func(int) []byte { return established }, xdpPass},
			{"floor: parse + one lookup", floor.L4lbFloor, func(int) []byte { return established }, xdpPass},
			{"l4lb: non-VIP pass-through", r.lb.Program(), func(int) []byte { return nonVIP }, xdpPass},
			{"l4lb: established flow (conntrack hit, IPIP encap, XDP_TX)", r.lb.Program(), func(int) []byte { return established }, xdpTX},
			{"l4lb: new flow (SYN: flow hash + Maglev, IPIP encap, XDP_TX)", r.lb.Program(), func(int) []byte { return syn }, xdpTX},
		}
		out := make([]pathResult, len(paths))
		// Rounds interleave the paths so that machine noise spreads
		// over all of them alike.
		for range rounds {
			for i, p := range paths {
				ds := r.timeRuns(t, p.prog, runs, p.next, p.want)
				out[i].name = p.name
				out[i].rounds = append(out[i].rounds, median(ds))
			}
		}
		fmt.Printf("\n%s\n", label)
		base := out[0].median()
		for _, p := range out {
			fmt.Printf("  %-64s %6d ns/packet  (%.2fx the XDP_PASS floor; round medians %v)\n",
				p.name, p.median().Nanoseconds(), float64(p.median())/float64(base), p.rounds)
		}
		return out
	}

	if err := r.rec.Reconcile(svcs[:1]); err != nil {
		t.Fatalf("reconcile 1 service: %v", err)
	}
	one := measure("datapath, 1 service (median per packet, kernel-timed, one fresh packet per BPF_PROG_TEST_RUN)", target)

	start := time.Now()
	if err := r.rec.Reconcile(svcs); err != nil {
		t.Fatalf("reconcile %d services: %v", len(svcs), err)
	}
	fmt.Printf("\nprogrammed %d services (3 backends, table 251 each) in %s\n", len(svcs), time.Since(start).Round(time.Millisecond))
	many := measure(fmt.Sprintf("datapath, %d services", len(svcs)), target)
	fmt.Println("\ncost of 100,000 services against 1 (same run):")
	for i := range one {
		fmt.Printf("  %-64s %.2fx\n", one[i].name, float64(many[i].median())/float64(one[i].median()))
	}

	// One backend change on the real maps with 100,000 services programmed.
	var lat []time.Duration
	for i := range 21 {
		svcs[5].Backends[2].Weight = uint32(1 + i%2)
		start := time.Now()
		if err := r.rec.Reconcile(svcs); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	fmt.Printf("\none weight change among %d services, real maps (reconcile + table swap): median %s over %d runs\n",
		len(svcs), median(lat).Round(time.Microsecond), len(lat))
}
