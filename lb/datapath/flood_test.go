// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// Sizes of the flood tests: the tables, the established state put in them,
// and the floods (each ten times the tables' capacity).
const (
	floodTable    = 2048
	floodDSRFlows = 500 // per protocol
	floodNATFlows = 250 // per protocol
	floodPackets  = 10 * floodTable
	// floodRate is datapath.flow_insert_rate during the floods: at most
	// a few dozen of each flood's packets make state, however slow the
	// machine runs them.
	floodRate = 20
)

// spoofer rewrites one frame into packets of ever new flows: the client
// address and port change, the IPv4 header checksum is made right again
// (the datapath checks it; TCP/UDP checksums it leaves to the endpoints).
type spoofer struct {
	base []byte
	l    pkttest.Layout
	rng  *rand.Rand
}

func newSpoofer(t testing.TB, frame []byte, seed uint64) *spoofer {
	return &spoofer{base: frame, l: pkttest.MustLayout(t, frame), rng: rand.New(rand.NewPCG(seed, 77))}
}

func (s *spoofer) next() []byte {
	b := bytes.Clone(s.base)
	if s.l.Family == 4 {
		binary.BigEndian.PutUint32(b[s.l.L3+12:], 0x0b000000|s.rng.Uint32()&0x00ffffff) // 11.0.0.0/8
		pkttest.FixIPv4Checksum(b, s.l)
	} else {
		binary.BigEndian.PutUint64(b[s.l.L3+16:], 0x20010db8ff000000|s.rng.Uint64()&0xffffff)
		binary.BigEndian.PutUint64(b[s.l.L3+8+8:], s.rng.Uint64())
	}
	binary.BigEndian.PutUint16(b[s.l.L4:], uint16(1024+s.rng.IntN(60000)))
	return b
}

// floodKind is what a flood's packets are.
type floodKind struct {
	name  string
	proto lb.Protocol
	syn   bool
}

var floodKinds = []floodKind{{"SYN", lb.TCP, true}, {"ACK", lb.TCP, false}, {"UDP", lb.UDP, false}}

// TestFloods puts established DSR flows and SNAT bindings in tables of
// 2048 entries, then floods each service with spoofed SYNs, ACKs and UDP
// datagrams, ten times the tables' capacity each: no established entry is
// evicted, and every established flow keeps its backend (for DSR even
// across a backend added after the flood, which Maglev alone would move
// some flows for) and its SNAT port, both ways.
func TestFloods(t *testing.T) {
	cases := []struct {
		k   hook
		fam family
	}{{hookXDP, families[0]}, {hookXDP, families[1]}, {hookTC, families[0]}}
	for _, c := range cases {
		t.Run(c.k.String()+"/"+c.fam.name, func(t *testing.T) {
			dir := pinDir(t, "flood")
			opts := envOptions{conntrackMax: floodTable, snatMax: floodTable, pinPath: dir}
			e := newSNATEnv(t, opts)
			fam, k := c.fam, c.k
			dsr := map[lb.Protocol]lb.Service{
				lb.TCP: dsrService("dsr-tcp", fam.vip, 80, lb.TCP, fam.backends[:3]...),
				lb.UDP: dsrService("dsr-udp", fam.vip, 53, lb.UDP, fam.backends[:3]...),
			}
			nat := map[lb.Protocol]lb.Service{
				lb.TCP: snatService("nat-tcp", fam.vip, 8080, lb.TCP, fam.backends[:3]...),
				lb.UDP: snatService("nat-udp", fam.vip, 8053, lb.UDP, fam.backends[:3]...),
			}
			svcs := []lb.Service{dsr[lb.TCP], dsr[lb.UDP], nat[lb.TCP], nat[lb.UDP]}
			e.reconcile(t, svcs...)

			// Established state, made with no insert limit.
			type natFlow struct {
				f    maglev.Flow
				be   netip.AddrPort
				snat netip.AddrPort
			}
			dsrFlows := map[maglev.Flow]netip.Addr{}
			var natFlows []natFlow
			for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
				for _, f := range randomFlows(dsr[proto].Frontend, floodDSRFlows, 1) {
					kind := pktKinds[1]
					if proto == lb.UDP {
						kind = pktKinds[2]
					}
					dsrFlows[f] = e.sendFlow(t, k, f, kind)
				}
				// Replies must be routable: the client's own prefix.
				for i := range floodNATFlows {
					svc := nat[proto]
					f := flowTo(svc.Frontend, fam.client, uint16(20000+i))
					be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
					snat := e.sendSNAT(t, k, svc, f, clientPacket(f, proto == lb.TCP, false))
					e.replySNAT(t, k, f, be, snat, false, false)
					if got := e.sendSNAT(t, k, svc, f, clientPacket(f, false, true)); got != snat {
						t.Fatalf("flow %v moved from %s to %s while being set up", f, snat, got)
					}
					natFlows = append(natFlows, natFlow{f, be, snat})
				}
			}
			if _, ok := e.binding(t, natFlows[0].f); !ok {
				t.Fatal("an established SNAT flow has no binding in the main tables")
			}

			// The floods, with the rate limit of a defended box.
			opts.insertRate = floodRate
			e.reload(t, opts, svcs...)
			before, beforeEv := e.reasons(t), e.events(t)
			for i, fk := range floodKinds {
				for j, svc := range []lb.Service{dsr[fk.proto], nat[fk.proto]} {
					f := flowTo(svc.Frontend, fam.client, 1)
					sp := newSpoofer(t, e.frame(t, packet(f, fk.syn, !fk.syn, []byte("flood"))), uint64(10*i+j))
					frames := make([][]byte, floodPackets)
					for n := range frames {
						frames[n] = sp.next()
					}
					for n, r := range e.runBurst(t, k, frames) {
						if r.verdict != k.tx() {
							t.Fatalf("%s flood to %s, packet %d: verdict %s (a new flow under a flood is still forwarded)", fk.name, svc.Name, n, k.verdictName(r.verdict))
						}
					}
				}
			}
			after, afterEv := e.reasons(t), e.events(t)
			t.Logf("%d flood packets: %d connection entries not made (limited), %d SNAT bindings to the overflow tables, %d insert failures",
				3*2*floodPackets, afterEv["ct_insert_limited"]-beforeEv["ct_insert_limited"],
				afterEv["snat_overflow"]-beforeEv["snat_overflow"], after["event_ct_insert_failed"]-before["event_ct_insert_failed"])
			if n := afterEv["snat_overflow"] - beforeEv["snat_overflow"]; n == 0 {
				t.Error("no SNAT binding went to the overflow tables: the flood was not limited")
			}

			// Every established connection entry and binding survived.
			ct := e.lb.Maps()[bpf.LbMapConntrack]
			lost := 0
			for f := range dsrFlows {
				key := maglev.FlowKey(f)
				var v bpf.LbCtValue
				if err := ct.Lookup(key[:], &v); err != nil {
					lost++
				}
			}
			if lost > 0 {
				t.Errorf("%d of %d established DSR flows lost their connection entry to the floods", lost, len(dsrFlows))
			}
			for _, nf := range natFlows {
				b, ok := e.binding(t, nf.f)
				if !ok || ntohs(b.fwd.SnatPort) != nf.snat.Port() {
					t.Errorf("SNAT flow %v: binding %+v (present %v) after the floods, want its port %d", nf.f, b, ok, nf.snat.Port())
				}
			}

			// A backend joins: Maglev alone would move some flows; the
			// established ones stay where they are.
			grown := map[lb.Protocol]lb.Service{}
			for proto, s := range dsr {
				g := s.Clone()
				g.Backends = append(g.Backends, lb.Backend{Addr: netip.AddrPortFrom(fam.backends[3], s.Frontend.Port), Weight: 1})
				grown[proto] = g
			}
			e.reconcile(t, grown[lb.TCP], grown[lb.UDP], nat[lb.TCP], nat[lb.UDP])
			moved, wouldMove := 0, 0
			for f, was := range dsrFlows {
				kind := pktKinds[1]
				if f.Proto == uint8(lb.UDP) {
					kind = pktKinds[2]
				}
				if mustPick(t, grown[lb.Protocol(f.Proto)], f) != was {
					wouldMove++
				}
				if got := e.sendFlow(t, k, f, kind); got != was {
					moved++
				}
			}
			if wouldMove == 0 {
				t.Fatal("the new backend takes none of the established flows' slots: the check proves nothing")
			}
			if moved > 0 {
				t.Errorf("%d of %d established DSR flows changed backend after the floods (Maglev alone would move %d)", moved, len(dsrFlows), wouldMove)
			}
			for _, nf := range natFlows {
				svc := nat[lb.Protocol(nf.f.Proto)]
				if got := e.sendSNAT(t, k, svc, nf.f, clientPacket(nf.f, false, true)); got != nf.snat {
					t.Errorf("SNAT flow %v left from %s after the floods, want its binding %s", nf.f, got, nf.snat)
				}
				e.replySNAT(t, k, nf.f, nf.be, nf.snat, false, false)
			}
		})
	}
}

// onOneCPU keeps the calling test's goroutine on one CPU until it ends:
// the insert rate is per CPU, and BPF_PROG_TEST_RUN runs where the
// caller does.
func onOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatalf("sched_getaffinity: %v", err)
	}
	for c := range 1024 {
		if old.IsSet(c) {
			one.Set(c)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatalf("sched_setaffinity: %v", err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// TestFloodNewFlowsStillWork checks that a new SNAT connection opened while
// the CPU is over the insert rate works (its binding in the overflow
// tables), and moves to the main tables once it has proved itself and the
// rate allows.
func TestFloodNewFlowsStillWork(t *testing.T) {
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			onOneCPU(t)
			// A rate so low that the burst is one binding: the first
			// flow takes it, the next overflows. The next but one, if
			// the machine is so slow that a second passed in between:
			// no wall-clock assumption.
			e := newSNATEnv(t, envOptions{insertRate: 1})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[:2]...)
			e.reconcile(t, svc)
			var (
				f    maglev.Flow
				snat netip.AddrPort
			)
			for port := uint16(1000); ; port++ {
				if port == 1010 {
					t.Fatal("10 new flows in a row at a rate of one a second made no overflow binding")
				}
				f = flowTo(svc.Frontend, c.fam.client, port)
				ev := e.events(t)
				snat = e.sendSNAT(t, c.hook, svc, f, clientPacket(f, c.proto == lb.TCP, false))
				got := e.events(t)["snat_overflow"] - ev["snat_overflow"]
				if got > 1 {
					t.Fatalf("one new flow made %d overflow bindings, want 1", got)
				}
				if got == 1 {
					break
				}
			}
			be := netip.AddrPortFrom(mustPick(t, svc, f), snatBackendPort)
			if _, ok := e.binding(t, f); ok {
				t.Fatal("the overflowing flow's binding is in the main tables")
			}
			e.replySNAT(t, c.hook, f, be, snat, false, false)
			// After the reply and a second client packet it is promoted
			// once a token is there (one a second; the test waits).
			deadline := 3
			for i := 0; ; i++ {
				if got := e.sendSNAT(t, c.hook, svc, f, clientPacket(f, false, true)); got != snat {
					t.Fatalf("flow moved from %s to %s", snat, got)
				}
				e.replySNAT(t, c.hook, f, be, snat, false, false)
				if _, ok := e.binding(t, f); ok {
					break
				}
				if i == deadline {
					t.Fatalf("the answered overflow binding was not promoted after %d tries a second apart", deadline)
				}
				time.Sleep(time.Second)
			}
		})
	}
}
