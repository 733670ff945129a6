// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// Sizes of TestFloodsAtDefaults: tables four times a SNAT address's ports
// towards three backends (the shipped defaults also leave the tables far
// larger than the port space), floods ten times the tables, and the real
// clients that must get through.
const (
	defFloodTable   = 4096
	defFloodPortMin = 40000
	defFloodPortMax = 40000 + 341 // 342 ports per backend, 1,026 for three
	defFloodPackets = 10 * defFloodTable
	defFloodChunks  = 10                                   // real clients are sent between chunks of the flood
	defFloodClients = 300                                  // per flood and mode: half during it, half after
	defFloodEach    = defFloodClients / 2 / defFloodChunks // per chunk
)

// TestFloodsAtDefaults floods a SNAT and a DSR service (TCP and UDP each)
// with spoofed SYNs, ACKs and datagrams, ten times the tables' capacity
// each, at the shipped datapath.flow_insert_rate and SNAT timeouts, while
// established SNAT flows hold bindings. Between chunks of each flood and
// after it, 300 new real clients per flood and mode connect: at least 99%
// must get through (a SNAT handshake ending in an open binding, both ways
// on one port; a DSR flow forwarded with its entry made), and every
// established SNAT flow keeps its port. Before unproven bindings gave
// their ports up (snat_preempt) the SNAT floods took every port for the
// closing timeout and no new client got one.
func TestFloodsAtDefaults(t *testing.T) {
	def := config.Default().Datapath
	cases := []struct {
		k   hook
		fam family
	}{{hookXDP, families[0]}, {hookTC, families[0]}, {hookXDP, families[1]}}
	for _, c := range cases {
		t.Run(c.k.String()+"/"+c.fam.name, func(t *testing.T) {
			fam, k := c.fam, c.k
			e := newSNATEnv(t, envOptions{
				conntrackMax: defFloodTable, snatMax: defFloodTable,
				snatPortMin: defFloodPortMin, snatPortMax: defFloodPortMax,
				insertRate:   def.FlowInsertRate,
				snatTimeouts: datapath.SNATTimeouts(def.SNATTimeouts),
			})
			nat := map[lb.Protocol]lb.Service{
				lb.TCP: snatService("nat-tcp", fam.vip, 8080, lb.TCP, fam.backends[:3]...),
				lb.UDP: snatService("nat-udp", fam.vip, 8053, lb.UDP, fam.backends[:3]...),
			}
			dsr := map[lb.Protocol]lb.Service{
				lb.TCP: dsrService("dsr-tcp", fam.vip, 80, lb.TCP, fam.backends[:3]...),
				lb.UDP: dsrService("dsr-udp", fam.vip, 53, lb.UDP, fam.backends[:3]...),
			}
			e.reconcile(t, nat[lb.TCP], nat[lb.UDP], dsr[lb.TCP], dsr[lb.UDP])

			// Established SNAT flows, a tenth of the port space.
			type natFlow struct {
				f    maglev.Flow
				snat netip.AddrPort
			}
			var established []natFlow
			port := uint16(10000)
			for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
				for range 50 {
					f := flowTo(nat[proto].Frontend, fam.client, port)
					port++
					s, ok := realSNATClient(t, e, k, nat[proto], f)
					if !ok {
						t.Fatalf("established flow %v could not be set up", f)
					}
					established = append(established, natFlow{f, s})
				}
			}

			before := e.events(t)
			for i, fk := range floodKinds {
				for j, svc := range []lb.Service{nat[fk.proto], dsr[fk.proto]} {
					f := flowTo(svc.Frontend, fam.client, 1)
					sp := newSpoofer(t, e.frame(t, packet(f, fk.syn, !fk.syn, []byte("flood"))), uint64(100+10*i+j))
					ok, total, entries := 0, 0, 0
					client := func() {
						f := flowTo(svc.Frontend, fam.client, port)
						port++
						total++
						if svc.Mode == lb.ModeSNAT {
							if _, good := realSNATClient(t, e, k, svc, f); good {
								ok++
							}
						} else if fwd, entry := realDSRClient(t, e, k, f); fwd {
							ok++
							if entry {
								entries++
							}
						}
					}
					for range defFloodChunks {
						frames := make([][]byte, defFloodPackets/defFloodChunks)
						for n := range frames {
							frames[n] = sp.next()
						}
						for n, r := range e.runBurst(t, k, frames) {
							if r.verdict != k.tx() {
								t.Fatalf("%s flood to %s, packet %d: verdict %s (ports must be found for it too)", fk.name, svc.Name, n, k.verdictName(r.verdict))
							}
						}
						for range defFloodEach {
							client()
						}
					}
					for range defFloodClients / 2 {
						client()
					}
					note := ""
					if svc.Mode == lb.ModeDSR {
						note = fmt.Sprintf(" (%d with a connection entry)", entries)
					}
					t.Logf("%s flood of %d packets to %s: %d of %d new real clients got through%s", fk.name, defFloodPackets, svc.Name, ok, total, note)
					if ok*100 < total*99 {
						t.Errorf("%s flood to %s: %d of %d new real clients got through, want at least 99%%", fk.name, svc.Name, ok, total)
					}
				}
			}
			after := e.events(t)
			t.Logf("events over the floods: %d SNAT bindings preempted, %d to the overflow tables, %d connection entries not made (limited)",
				after["snat_preempted"]-before["snat_preempted"], after["snat_overflow"]-before["snat_overflow"],
				after["ct_insert_limited"]-before["ct_insert_limited"])

			for _, nf := range established {
				b, ok := e.binding(t, nf.f)
				if !ok || ntohs(b.fwd.SnatPort) != nf.snat.Port() {
					t.Errorf("established SNAT flow %v: binding %+v (present %v) after the floods, want its port %d", nf.f, b, ok, nf.snat.Port())
					continue
				}
				svc := nat[lb.Protocol(nf.f.Proto)]
				if got := e.sendSNAT(t, k, svc, nf.f, clientPacket(nf.f, false, true)); got != nf.snat {
					t.Errorf("established SNAT flow %v left from %s after the floods, want %s", nf.f, got, nf.snat)
				}
			}
		})
	}
}

// realSNATClient runs a real client's start of f through SNAT service svc
// (TCP: SYN, the backend's SYN+ACK, the client's ACK; UDP: a datagram, the
// answer, a second datagram) and reports its SNAT address and port, and
// whether every packet went through on that one port and the binding
// ended open.
func realSNATClient(t testing.TB, e *env, k hook, svc lb.Service, f maglev.Flow) (netip.AddrPort, bool) {
	t.Helper()
	tcp := svc.Frontend.Proto == lb.TCP
	r := e.runOn(t, k, e.frame(t, clientPacket(f, tcp, false)))
	if r.verdict != k.tx() {
		return netip.AddrPort{}, false
	}
	snat := source(t, r.out)
	reply := replyPacket(netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort), snat, svc.Frontend.Proto, false, false)
	reply.SYN = tcp
	if r := e.runOn(t, k, e.frame(t, reply)); r.verdict != k.tx() {
		return snat, false
	}
	r = e.runOn(t, k, e.frame(t, clientPacket(f, false, tcp)))
	if r.verdict != k.tx() || source(t, r.out) != snat {
		return snat, false
	}
	b, ok := e.binding(t, f)
	if !ok {
		b, ok = e.ovfBinding(t, f)
	}
	return snat, ok && b.rev.State == bpf.LbL4lbSnatStateL4LB_SNAT_OPEN
}

// realDSRClient runs a real client's start of f through a DSR service (a
// SYN and an ACK, or a datagram) and reports whether every packet was
// forwarded, which is what the connection needs, and whether it got its
// connection entry. The entry depends on the insert budget
// (flow_insert_rate, a rate in time), which a flood sent faster than the
// rate spends: the flow is then forwarded by its Maglev choice alone, and
// the test reports how many entries were made rather than require them.
func realDSRClient(t testing.TB, e *env, k hook, f maglev.Flow) (forwarded, entry bool) {
	t.Helper()
	kinds := []pktKind{pktKinds[0], pktKinds[1]}
	if f.Proto == uint8(lb.UDP) {
		kinds = []pktKind{pktKinds[2]}
	}
	for _, kind := range kinds {
		if r := e.runOn(t, k, e.frame(t, kindPacket(f, kind))); r.verdict != k.tx() {
			return false, false
		}
	}
	key := maglev.FlowKey(f)
	var v bpf.LbCtValue
	return true, e.lb.Maps()[bpf.LbMapConntrack].Lookup(key[:], &v) == nil
}

// TestReadmit spends a CPU's insert budget (datapath.flow_insert_rate 1:
// one entry, then none for a second), then takes an established DSR
// flow's entry away, as a flood's inserts push it out of the LRU: the
// flow's next packet records it again (event ct_readmitted), while a new
// flow's packet, over the same budget, is forwarded unrecorded. Spoofed
// flows, which the connection-table filter has not seen, are not
// re-admitted.
func TestReadmit(t *testing.T) {
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				onOneCPU(t)
				e := newSNATEnv(t, envOptions{insertRate: 1})
				svc := dsrService("dsr", fam.vip, 80, lb.TCP, fam.backends[:3]...)
				e.reconcile(t, svc)
				ct := e.lb.Maps()[bpf.LbMapConntrack]
				has := func(f maglev.Flow) bool {
					key := maglev.FlowKey(f)
					var v bpf.LbCtValue
					return ct.Lookup(key[:], &v) == nil
				}
				// The budget's one token goes to the established
				// flow; if a second passed meanwhile, to the flows
				// after it, until one is limited.
				est := flowTo(svc.Frontend, fam.client, 1000)
				e.sendFlow(t, k, est, pktKinds[1])
				if !has(est) {
					t.Fatal("the established flow got no entry with the budget full")
				}
				for port := uint16(2000); ; port++ {
					if port == 2010 {
						t.Fatal("10 new flows in a row at a rate of one a second were all recorded")
					}
					ev := e.events(t)
					e.sendFlow(t, k, flowTo(svc.Frontend, fam.client, port), pktKinds[1])
					if e.events(t)["ct_insert_limited"] > ev["ct_insert_limited"] {
						break
					}
				}

				key := maglev.FlowKey(est)
				if err := ct.Delete(key[:]); err != nil {
					t.Fatalf("evict the established flow's entry: %v", err)
				}
				ev := e.events(t)
				e.sendFlow(t, k, est, pktKinds[1])
				if !has(est) {
					t.Error("the evicted flow's next packet did not get its entry back over the spent budget")
				}
				if n := e.events(t)["ct_readmitted"] - ev["ct_readmitted"]; n != 1 {
					t.Errorf("%d flows re-admitted, want 1", n)
				}

				// Spoofed flows over the spent budget: none is
				// recorded (the filter has not seen them; a false
				// positive would need a set bit, few here).
				ev = e.events(t)
				f := flowTo(svc.Frontend, fam.client, 1)
				sp := newSpoofer(t, e.frame(t, packet(f, false, true, []byte("flood"))), 5)
				frames := make([][]byte, 200)
				for n := range frames {
					frames[n] = sp.next()
				}
				e.runBurst(t, k, frames)
				got := e.events(t)
				if n := got["ct_readmitted"] - ev["ct_readmitted"]; n > 2 {
					t.Errorf("%d of %d spoofed flows re-admitted, want at most 2 (the filter's false positives)", n, len(frames))
				}
				if n := got["ct_insert_limited"] - ev["ct_insert_limited"]; n < uint64(len(frames))-3 {
					t.Errorf("%d of %d spoofed flows limited, want nearly all", n, len(frames))
				}
			})
		}
	}
}
