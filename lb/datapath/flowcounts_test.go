// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// packetsOf is what Flows reports for f: its packets and bytes, and
// whether the connection table holds it.
func (e *env) packetsOf(t testing.TB, f maglev.Flow) (packets, bytes uint64, ok bool) {
	t.Helper()
	err := e.lb.Flows(datapath.FlowFilter{Counts: true}, func(fl datapath.Flow) bool {
		if fl.Client == netip.AddrPortFrom(f.Src, f.SrcPort) && fl.Frontend.Addr == f.Dst &&
			fl.Frontend.Port == f.DstPort && uint8(fl.Frontend.Proto) == f.Proto {
			packets, bytes, ok = fl.Packets, fl.Bytes, true
			return false
		}
		return true
	})
	if err != nil {
		t.Fatalf("read flows: %v", err)
	}
	return packets, bytes, ok
}

// sendDSR sends p of flow f through hook k and checks that it was
// encapsulated to a backend.
func (e *env) sendDSR(t testing.TB, k hook, f maglev.Flow, p pkttest.Packet) {
	t.Helper()
	in := e.frame(t, p)
	r := e.runOn(t, k, in)
	if r.verdict != k.tx() {
		t.Fatalf("packet of %v: verdict %s, want %s; output:\n%s", f, k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	checkEncap(t, in, r.out)
}

// flowCountEntries is how many counters the datapath's table holds.
func (e *env) flowCountEntries(t testing.TB) int {
	t.Helper()
	return mapEntries[bpf.LbFlowKey, bpf.LbFlowCount](t, e.lb.Maps()[bpf.LbMapFlowCounts])
}

// TestFlowCounts checks the per-flow counters IPFIX records carry, on both
// hooks, both families, DSR and SNAT, TCP and UDP: each forwarded client
// packet counts once with its IP length; a TCP SYN, which makes no
// connection entry, makes no counter; a SNAT reply is not counted;
// ForgetFlowCounts deletes the counter and the flow's next packet starts
// a new one.
func TestFlowCounts(t *testing.T) {
	e := newSNATEnv(t, envOptions{flowCounts: true})
	type svcCase struct {
		mode  string
		proto lb.Protocol
	}
	var svcs []lb.Service
	byCase := map[string]lb.Service{}
	port := uint16(80)
	for _, fam := range families {
		for _, c := range []svcCase{{"dsr", lb.TCP}, {"dsr", lb.UDP}, {"snat", lb.TCP}, {"snat", lb.UDP}} {
			var s lb.Service
			if c.mode == "dsr" {
				s = dsrService(c.mode+fam.name+c.proto.String(), fam.vip, port, c.proto, fam.backends[:2]...)
			} else {
				s = snatService(c.mode+fam.name+c.proto.String(), fam.vip, port, c.proto, fam.backends[:2]...)
			}
			port++
			svcs = append(svcs, s)
			byCase[fam.name+"/"+c.mode+"/"+c.proto.String()] = s
		}
	}
	e.reconcile(t, svcs...)

	sport := uint16(41000)
	for _, k := range hooks {
		for _, fam := range families {
			for _, mode := range []string{"dsr", "snat"} {
				for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
					svc := byCase[fam.name+"/"+mode+"/"+proto.String()]
					sport++
					f := flowTo(svc.Frontend, fam.client, sport)
					t.Run(k.String()+"/"+fam.name+"/"+mode+"/"+proto.String(), func(t *testing.T) {
						var snat netip.AddrPort
						send := func(p pkttest.Packet) uint64 {
							t.Helper()
							if mode == "snat" {
								snat = e.sendSNAT(t, k, svc, f, p)
							} else {
								e.sendDSR(t, k, f, p)
							}
							return sizeOfL3(t, e.frame(t, p))
						}
						expect := func(when string, packets, bytes uint64) {
							t.Helper()
							gp, gb, ok := e.packetsOf(t, f)
							if !ok {
								t.Fatalf("%s: the connection table lacks the flow", when)
							}
							if gp != packets || gb != bytes {
								t.Errorf("%s: %d packets, %d bytes; want %d, %d", when, gp, gb, packets, bytes)
							}
						}
						if proto == lb.TCP {
							before := e.flowCountEntries(t)
							send(packet(f, true, false, make([]byte, 20)))
							if n := e.flowCountEntries(t); n != before {
								t.Errorf("a SYN changed the counters from %d to %d entries, want no counter (no connection entry)", before, n)
							}
						}
						var packets, bytes uint64
						for _, size := range []int{100, 20, 64, 1200} {
							bytes += send(packet(f, false, true, make([]byte, size)))
							packets++
						}
						expect("after 4 packets", packets, bytes)
						if mode == "snat" {
							be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
							e.replySNAT(t, k, f, be, snat, false, false)
							expect("after a reply", packets, bytes)
						}
						id := datapath.FlowID{Client: netip.AddrPortFrom(f.Src, f.SrcPort), Frontend: svc.Frontend}
						if err := e.lb.ForgetFlowCounts([]datapath.FlowID{id}); err != nil {
							t.Fatalf("forget: %v", err)
						}
						expect("forgotten", 0, 0)
						n := send(packet(f, false, true, make([]byte, 33)))
						expect("a packet after", 1, n)
						// Forgetting a flow without a counter is no error.
						if err := e.lb.ForgetFlowCounts([]datapath.FlowID{id, id}); err != nil {
							t.Errorf("forget twice: %v", err)
						}
					})
				}
			}
		}
	}
}

// TestFlowCountsOff checks that without Config.FlowCounts the programs
// never touch the counter table (it has one entry, and stays empty) and
// flows report no counts.
func TestFlowCountsOff(t *testing.T) {
	e := newEnv(t)
	m := e.lb.Maps()[bpf.LbMapFlowCounts]
	if info, err := m.Info(); err != nil || info.MaxEntries != 1 {
		t.Fatalf("flow_counts: %v, %+v; want 1 entry", err, info)
	}
	fam := families[0]
	svc := dsrService("web", fam.vip, 80, lb.UDP, fam.backends[:2]...)
	e.reconcile(t, svc)
	for _, k := range hooks {
		for i := range 3 {
			f := flowTo(svc.Frontend, fam.client, uint16(42000+i))
			e.sendDSR(t, k, f, packet(f, false, false, make([]byte, 10)))
			if p, b, ok := e.packetsOf(t, f); !ok || p != 0 || b != 0 {
				t.Errorf("%s: flow %v: %d packets, %d bytes (in the table: %t); want an entry with none", k, f, p, b, ok)
			}
		}
	}
	if n := e.flowCountEntries(t); n != 0 {
		t.Errorf("flow_counts holds %d entries with counting off, want 0", n)
	}
	if err := e.lb.ForgetFlowCounts([]datapath.FlowID{{Client: netip.AddrPortFrom(fam.client, 1), Frontend: svc.Frontend}}); err != nil {
		t.Errorf("forget with counting off: %v", err)
	}
}

// TestFlowCountsAcrossRestart loads a datapath over the pins of one that
// did not count, as an l4lbd restarted with [ipfix] newly configured does,
// and back: the established flow keeps its backend throughout, gets a
// counter at its first packet after the counting restart (its entry
// is there), and a restart without counting loads over the same pins.
func TestFlowCountsAcrossRestart(t *testing.T) {
	fam := families[0]
	off := envOptions{pinPath: pinDir(t, "flowcounts")}
	on := off
	on.flowCounts = true
	e := newEnvWith(t, off)
	svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[:3]...)
	e.reconcile(t, svc)
	f := flowTo(svc.Frontend, fam.client, 43000)
	ack := func(n int) (be netip.Addr, size uint64) {
		t.Helper()
		in := e.frame(t, packet(f, false, true, make([]byte, n)))
		return e.checkTX(t, in, e.run(t, in)), sizeOfL3(t, in)
	}
	first, _ := ack(40)

	e.reload(t, on, svc)
	be, n := ack(50)
	if be != first {
		t.Errorf("after the restart with counting, the flow went to %s, want its entry's %s", be, first)
	}
	if p, b, _ := e.packetsOf(t, f); p != 1 || b != n {
		t.Errorf("after the restart with counting: %d packets, %d bytes; want 1, %d (counted from the restart)", p, b, n)
	}

	e.reload(t, off, svc)
	if be, _ := ack(60); be != first {
		t.Errorf("after the restart without counting, the flow went to %s, want its entry's %s", be, first)
	}
	if p, b, _ := e.packetsOf(t, f); p != 0 || b != 0 {
		t.Errorf("after the restart without counting: %d packets, %d bytes; want none", p, b)
	}
}

// TestFlowCountsOverInsertRate checks that a flow forwarded over
// flow_insert_rate, which gets no connection entry, gets no counter
// either: a flood of new flows cannot push counters out faster than it can
// push out entries.
func TestFlowCountsOverInsertRate(t *testing.T) {
	onOneCPU(t)
	fam := families[0]
	// The burst is one entry: the first flow takes it, a later one
	// (the next, unless a second passed in between) is over the rate.
	e := newEnvWith(t, envOptions{insertRate: 1, flowCounts: true})
	svc := dsrService("dns", fam.vip, 53, lb.UDP, fam.backends[:2]...)
	e.reconcile(t, svc)
	for port := uint16(44000); ; port++ {
		if port == 44010 {
			t.Fatal("10 new flows in a row at a rate of one a second were all given an entry")
		}
		f := flowTo(svc.Frontend, fam.client, port)
		ev, counters := e.events(t), e.flowCountEntries(t)
		e.sendDSR(t, hookXDP, f, packet(f, false, false, make([]byte, 20)))
		limited := e.events(t)["ct_insert_limited"] > ev["ct_insert_limited"]
		_, _, entry := e.packetsOf(t, f)
		switch n := e.flowCountEntries(t); {
		case limited && (entry || n != counters):
			t.Fatalf("flow over the insert rate: entry %t, counters %d -> %d; want no entry and no counter", entry, counters, n)
		case !limited && (!entry || n != counters+1):
			t.Fatalf("flow under the insert rate: entry %t, counters %d -> %d; want an entry and one more counter", entry, counters, n)
		}
		if limited {
			return
		}
	}
}
