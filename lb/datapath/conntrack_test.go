// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// established is a flow the test opened and the backend it went to.
type established struct {
	flow    maglev.Flow
	backend netip.Addr
}

// open sends a SYN and then an ACK for each flow and returns where they
// went. The SYN must leave the connection table alone; the ACK must add an
// entry.
func (e *env) open(t *testing.T, svc lb.Service, flows []maglev.Flow) []established {
	t.Helper()
	n0 := e.conntrackEntries(t)
	syns := make([][]byte, len(flows))
	for i, f := range flows {
		syns[i] = e.frame(t, packet(f, true, false, nil))
	}
	for i, r := range e.runAll(t, syns) {
		e.checkTX(t, syns[i], r)
	}
	if n := e.conntrackEntries(t); n != n0 {
		t.Fatalf("%d SYNs changed the connection table from %d to %d entries, want no change", len(flows), n0, n)
	}
	out := e.send(t, svc, flows)
	if n := e.conntrackEntries(t); n != n0+len(flows) {
		t.Fatalf("%d first ACKs left %d entries (from %d), want one entry per flow", len(flows), n, n0)
	}
	for _, c := range out {
		if want := mustPick(t, svc, c.flow); c.backend != want {
			t.Fatalf("new flow %+v went to %s, want the table's choice %s", c.flow, c.backend, want)
		}
	}
	return out
}

// send sends one ACK (a datagram for UDP) per flow and returns where each
// went.
func (e *env) send(t *testing.T, svc lb.Service, flows []maglev.Flow) []established {
	t.Helper()
	frames := make([][]byte, len(flows))
	for i, f := range flows {
		frames[i] = e.frame(t, packet(f, false, true, []byte("data")))
	}
	out := make([]established, len(flows))
	for i, r := range e.runAll(t, frames) {
		out[i] = established{flow: flows[i], backend: e.checkTX(t, frames[i], r)}
	}
	return out
}

func (e *env) conntrackEntries(t testing.TB) int {
	t.Helper()
	n, err := e.lb.ConntrackEntries()
	if err != nil {
		t.Fatalf("count connection table entries: %v", err)
	}
	return n
}

// moved returns the flows whose new-flow choice under svc differs from the
// backend they are established on.
func moved(t testing.TB, svc lb.Service, flows []established) []established {
	t.Helper()
	var out []established
	for _, c := range flows {
		if mustPick(t, svc, c.flow) != c.backend {
			out = append(out, c)
		}
	}
	return out
}

// expectSticky checks that every flow still goes to its backend.
func (e *env) expectSticky(t *testing.T, svc lb.Service, flows []established) {
	t.Helper()
	for i, got := range e.send(t, svc, flowsOf(flows)) {
		if got.backend != flows[i].backend {
			t.Errorf("established flow %+v moved from %s to %s", flows[i].flow, flows[i].backend, got.backend)
		}
	}
}

func flowsOf(cs []established) []maglev.Flow {
	out := make([]maglev.Flow, len(cs))
	for i, c := range cs {
		out[i] = c.flow
	}
	return out
}

// TestConntrackKeepsFlows checks that established flows keep their backend
// while backends are added and weights change, and that a flow whose
// backend is removed is balanced again.
func TestConntrackKeepsFlows(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := newEnv(t)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1])
			e.reconcile(t, svc)
			conns := e.open(t, svc, randomFlows(svc.Frontend, 64, 1))

			// A third backend takes about a third of the slots.
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			if m := moved(t, svc, conns); len(m) == 0 {
				t.Fatalf("no established flow's slot moved to %s: pick more flows", b[2])
			}
			e.expectSticky(t, svc, conns)
			// The table did change: a new flow follows it.
			expectNewFlowsFollowTable(t, e, svc)

			// A weight change moves slots between the existing backends.
			svc.Backends[0].Weight = 5
			e.reconcile(t, svc)
			if m := moved(t, svc, conns); len(m) == 0 {
				t.Fatalf("no established flow's slot moved after raising %s's weight", b[0])
			}
			e.expectSticky(t, svc, conns)

			// Removing b[1] re-balances its flows by the new table and
			// rewrites their entries (no new entry is added).
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[2])
			svc.Backends[0].Weight = 5
			e.reconcile(t, svc)
			n0 := e.conntrackEntries(t)
			var orphans, kept []established
			for _, c := range conns {
				if c.backend == b[1] {
					orphans = append(orphans, c)
				} else {
					kept = append(kept, c)
				}
			}
			if len(orphans) == 0 {
				t.Fatalf("no established flow was on %s", b[1])
			}
			rebalanced := e.send(t, svc, flowsOf(orphans))
			for _, c := range rebalanced {
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Errorf("flow %+v of removed backend %s went to %s, want the new table's %s", c.flow, b[1], c.backend, want)
				}
			}
			e.expectSticky(t, svc, kept)
			if n := e.conntrackEntries(t); n != n0 {
				t.Errorf("re-balancing changed the connection table from %d to %d entries, want its entries rewritten", n0, n)
			}

			// The rewritten entries hold: adding a backend does not move
			// the re-balanced flows.
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[2], b[3])
			svc.Backends[0].Weight = 5
			e.reconcile(t, svc)
			if m := moved(t, svc, rebalanced); len(m) == 0 {
				t.Fatalf("no re-balanced flow's slot moved to %s: pick more flows", b[3])
			}
			e.expectSticky(t, svc, rebalanced)
			e.expectSticky(t, svc, kept)
		})
	}
}

// expectNewFlowsFollowTable sends SYNs of fresh flows and checks they go
// where the current table says.
func expectNewFlowsFollowTable(t *testing.T, e *env, svc lb.Service) {
	t.Helper()
	flows := randomFlows(svc.Frontend, 64, 99)
	frames := make([][]byte, len(flows))
	for i, f := range flows {
		frames[i] = e.frame(t, packet(f, true, false, nil))
	}
	for i, r := range e.runAll(t, frames) {
		if got, want := e.checkTX(t, frames[i], r), mustPick(t, svc, flows[i]); got != want {
			t.Errorf("new flow %+v went to %s, want %s", flows[i], got, want)
		}
	}
}

// TestConntrackSYNFlood checks that a flood of spoofed SYNs, ten times the
// connection table's capacity, neither adds entries nor evicts established
// flows.
func TestConntrackSYNFlood(t *testing.T) {
	const capacity = 1024
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	// The LRU keeps one list per possible CPU with capacity/cpus entries
	// each; stay well below one list's share so that the established
	// flows fit wherever the test thread runs.
	nConns := min(64, max(1, capacity/cpus/4))

	e := newEnvWith(t, envOptions{conntrackMax: capacity})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1])
			e.reconcile(t, svc)
			n0 := e.conntrackEntries(t)
			conns := e.open(t, svc, randomFlows(svc.Frontend, nConns, 7))

			flood := randomFlows(svc.Frontend, 10*capacity, 8)
			frames := make([][]byte, len(flood))
			for i, f := range flood {
				frames[i] = e.frame(t, packet(f, true, false, nil))
			}
			for i, r := range e.runAll(t, frames) {
				if r.verdict != xdpTX {
					t.Fatalf("spoofed SYN %d: verdict %s, want XDP_TX (balanced statelessly)", i, verdictName(r.verdict))
				}
			}
			if n := e.conntrackEntries(t); n != n0+nConns {
				t.Errorf("after %d SYNs the connection table holds %d entries, want the %d established ones", len(flood), n, n0+nConns)
			}

			// Move slots so that the entries, not the table, decide.
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			if m := moved(t, svc, conns); len(m) == 0 {
				t.Fatalf("no established flow's slot moved: pick more flows")
			}
			e.expectSticky(t, svc, conns)
		})
	}
}

// TestHandshakeKeepsBackend checks that a TCP handshake in flight when the
// Maglev table changes stays on the backend its SYN went to: the SYN's
// retransmit and the first ACK follow it (the ACK then records the flow),
// where the new table would send them to a backend that never saw the SYN.
// A handshake whose backend left the service is balanced by the new table.
func TestHandshakeKeepsBackend(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := newEnv(t)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1])
			e.reconcile(t, svc)
			flows := randomFlows(svc.Frontend, 64, 5)
			first := e.synAll(t, flows)
			for _, c := range first {
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Fatalf("SYN %+v went to %s, want the table's choice %s", c.flow, c.backend, want)
				}
			}
			n0 := e.conntrackEntries(t)

			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			if m := moved(t, svc, first); len(m) == 0 {
				t.Fatalf("no handshake's slot moved to %s: pick more flows", b[2])
			}
			for i, c := range e.synAll(t, flows) {
				if c.backend != first[i].backend {
					t.Errorf("retransmitted SYN %+v went to %s, its first SYN to %s", c.flow, c.backend, first[i].backend)
				}
			}
			e.expectSticky(t, svc, first)
			if n := e.conntrackEntries(t); n != n0+len(flows) {
				t.Errorf("first ACKs left %d connection entries (from %d), want one per flow", n, n0)
			}
			e.expectSticky(t, svc, first)

			// b[1] leaves: its handshakes follow the new table, the others
			// stay.
			others := randomFlows(svc.Frontend, 64, 6)
			pending := e.synAll(t, others)
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[2])
			e.reconcile(t, svc)
			orphaned := 0
			for i, c := range e.send(t, svc, others) {
				want := pending[i].backend
				if want == b[1] {
					want = mustPick(t, svc, c.flow)
					orphaned++
				}
				if c.backend != want {
					t.Errorf("first ACK %+v went to %s, want %s (its SYN went to %s)", c.flow, c.backend, want, pending[i].backend)
				}
			}
			if orphaned == 0 {
				t.Fatalf("no handshake was on %s: pick more flows", b[1])
			}

			// A flush forgets handshakes too: after it, a first ACK goes
			// where the table says, not where its SYN went.
			third := randomFlows(svc.Frontend, 64, 7)
			pending = e.synAll(t, third)
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[2], b[3])
			e.reconcile(t, svc)
			if m := moved(t, svc, pending); len(m) == 0 {
				t.Fatalf("no handshake's slot moved to %s: pick more flows", b[3])
			}
			if _, err := e.lb.FlushFlows(datapath.FlowFilter{}); err != nil {
				t.Fatal(err)
			}
			for _, c := range e.send(t, svc, third) {
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Errorf("after a flush, first ACK %+v went to %s, want the table's %s", c.flow, c.backend, want)
				}
			}
		})
	}
}

// TestConntrackDraining checks that a draining backend keeps its
// established flows and gets no new ones.
func TestConntrackDraining(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := newEnv(t)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			conns := e.open(t, svc, randomFlows(svc.Frontend, 64, 3))
			var onDraining int
			for _, c := range conns {
				if c.backend == b[1] {
					onDraining++
				}
			}
			if onDraining == 0 {
				t.Fatalf("no established flow on %s", b[1])
			}

			svc.Backends[1].State = lb.Draining
			e.reconcile(t, svc)
			e.expectSticky(t, svc, conns)

			// New flows, with SYN or without, avoid the draining backend.
			fresh := randomFlows(svc.Frontend, 300, 4)
			for _, c := range e.send(t, svc, fresh) {
				if c.backend == b[1] {
					t.Errorf("new flow %+v went to draining backend %s", c.flow, b[1])
				}
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Errorf("new flow %+v went to %s, want %s", c.flow, c.backend, want)
				}
			}
		})
	}
}

// TestCounters checks the per-service and per-backend packet, byte (L3
// length) and new-flow counters.
func TestCounters(t *testing.T) {
	for _, fam := range families {
		for _, proto := range []lb.Protocol{lb.TCP, lb.UDP} {
			t.Run(fam.name+"/"+proto.String(), func(t *testing.T) {
				e := newEnv(t)
				svc := dsrService("svc", fam.vip, 80, proto, fam.backends[:3]...)
				e.reconcile(t, svc)
				f := flowTo(svc.Frontend, fam.client, 40100)
				be := mustPick(t, svc, f)

				// A TCP flow is new at its first packet without SYN; a
				// UDP flow at its first datagram.
				steps := []struct {
					p   []byte
					new uint64
				}{
					{p: e.frame(t, packet(f, true, false, nil)), new: 0},
					{p: e.frame(t, packet(f, false, true, make([]byte, 100))), new: 1},
					{p: e.frame(t, packet(f, false, true, make([]byte, 7))), new: 0},
				}
				if proto == lb.UDP {
					steps[0].new, steps[1].new = 1, 0
				}
				var want datapath.Counters
				for i, s := range steps {
					if got := e.checkTX(t, s.p, e.run(t, s.p)); got != be {
						t.Fatalf("packet %d went to %s, want %s", i, got, be)
					}
					want.Packets++
					want.Bytes += sizeOfL3(t, s.p)
					want.NewFlows += s.new

					st := e.state(t, svc.Frontend)
					got, err := e.lb.ServiceCounters(st.ID)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Errorf("after packet %d: service counters %+v, want %+v", i, got, want)
					}
					for _, entry := range st.Backends {
						got, err := e.lb.BackendCounters(entry.ID)
						if err != nil {
							t.Fatal(err)
						}
						w := datapath.Counters{}
						if entry.Addr.Addr() == be {
							w = want
						}
						if got != w {
							t.Errorf("after packet %d: backend %s counters %+v, want %+v", i, entry.Addr, got, w)
						}
					}
				}
			})
		}
	}
}

// TestConntrackLastSeenFollowsClock checks the time an established flow's
// entry carries. The datapath reads the coarse clock through a per-CPU copy
// renewed whenever jiffies moved (bpf/include/clock.h): an entry a packet
// refreshes must show the kernel's time of that packet, also when every
// CPU's copy is old, and a refreshed entry is not rewritten by the next
// packets within the one-second refresh step.
func TestConntrackLastSeenFollowsClock(t *testing.T) {
	const tick = 50 * time.Millisecond // more than a tick at any HZ
	fam := families[0]
	e := newEnv(t)
	svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[0], fam.backends[1])
	e.reconcile(t, svc)
	flows := randomFlows(svc.Frontend, 8, 1)
	ct := e.lb.Maps()[bpf.LbMapConntrack]
	entry := func(f maglev.Flow) bpf.LbCtValue {
		t.Helper()
		key := maglev.FlowKey(f)
		var v bpf.LbCtValue
		if err := ct.Lookup(key[:], &v); err != nil {
			t.Fatalf("entry of flow %+v: %v", f, err)
		}
		return v
	}
	expectBetween := func(what string, got, lo, hi time.Duration) {
		t.Helper()
		if got < lo-tick || got > hi {
			t.Errorf("%s: last_seen %s, want the kernel's time between %s and %s (less a tick)", what, got, lo, hi)
		}
	}

	before := bpftest.KernelNow()
	e.open(t, svc, flows)
	after := bpftest.KernelNow()
	for _, f := range flows {
		expectBetween("new entry", time.Duration(entry(f).LastSeen), before, after)
	}

	// Every CPU's copy as if read 10 s ago, at a jiffies value that is
	// not the current one (jiffies is 1 for one tick about five minutes
	// after boot); entries idle for 20 s. The packet that ends their
	// idleness must renew the copy, not stamp the entry 10 s ago.
	clock := e.lb.Maps()[bpf.LbMapClockCache]
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	stale := make([]bpf.LbClockCopy, cpus)
	for i := range stale {
		stale[i] = bpf.LbClockCopy{Jiffies: 1, Ns: uint64(bpftest.KernelNow() - 10*time.Second)}
	}
	if err := clock.Put(uint32(0), stale); err != nil {
		t.Fatalf("write the clock copies: %v", err)
	}
	idle := uint64(bpftest.KernelNow() - 20*time.Second)
	for _, f := range flows {
		key, v := maglev.FlowKey(f), entry(f)
		v.LastSeen = idle
		if err := ct.Put(key[:], &v); err != nil {
			t.Fatal(err)
		}
	}
	before = bpftest.KernelNow()
	e.send(t, svc, flows)
	after = bpftest.KernelNow()
	refreshed := make([]time.Duration, len(flows))
	for i, f := range flows {
		refreshed[i] = time.Duration(entry(f).LastSeen)
		expectBetween("entry idle for 20 s, clock copies 10 s old, then a packet", refreshed[i], before, after)
	}

	// Within the refresh step a packet leaves the entry as it is.
	e.send(t, svc, flows)
	for i, f := range flows {
		if got := time.Duration(entry(f).LastSeen); got != refreshed[i] {
			t.Errorf("flow %+v: a packet %s after the refresh moved last_seen from %s to %s, want it left (refresh step 1 s)",
				f, bpftest.KernelNow()-refreshed[i], refreshed[i], got)
		}
	}
}

// swapStamps reads maglev_swapped: for each service id, when its Maglev
// table last replaced another (0: never).
func (e *env) swapStamps(t testing.TB) map[uint32]uint64 {
	t.Helper()
	out := map[uint32]uint64{}
	var (
		k uint32
		v uint64
	)
	it := e.lb.Maps()[bpf.LbMapMaglevSwapped].Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			out[k] = v
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read maglev_swapped: %v", err)
	}
	return out
}

// synAll sends a SYN per flow and returns where each went.
func (e *env) synAll(t *testing.T, flows []maglev.Flow) []established {
	t.Helper()
	out := make([]established, len(flows))
	for i, f := range flows {
		out[i] = established{flow: f, backend: e.synTo(t, f)}
	}
	return out
}

// TestHandshakeHold checks how long a handshake outlives the table its SYN
// went by. A service's first table replaces none and records no swap. A
// replaced table keeps the handshakes in flight on their SYN's backend for
// Config.HandshakeHold; after that, SYNs and first ACKs alike go where the
// table says (the handshakes map is not read). A restart over pinned maps
// does not know what the earlier datapath swapped, and holds every
// service's handshakes as if its table had just been replaced.
func TestHandshakeHold(t *testing.T) {
	// Long enough that the packets sent right after a replacement fall
	// inside it even on a loaded machine; the test sleeps past it.
	const hold = 3 * time.Second
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			o := envOptions{handshakeHold: hold, pinPath: pinDir(t, "hold")}
			e := newEnvWith(t, o)
			b := fam.backends
			svc := dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1])
			e.reconcile(t, svc)
			if s := e.swapStamps(t); len(s) != 0 {
				t.Fatalf("a first table recorded swaps %v, want none", s)
			}

			// Within the hold: the SYNs' choices stand.
			flows := randomFlows(svc.Frontend, 64, 11)
			pending := e.synAll(t, flows)
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[1], b[2])
			e.reconcile(t, svc)
			if s := e.swapStamps(t); len(s) != 1 {
				t.Fatalf("replacing one table recorded swaps %v, want one", s)
			}
			half := len(flows) / 2
			if len(moved(t, svc, pending[:half])) == 0 || len(moved(t, svc, pending[half:])) == 0 {
				t.Fatalf("too few handshakes' slots moved to %s: pick more flows", b[2])
			}
			for i, c := range e.send(t, svc, flows[:half]) {
				if c.backend != pending[i].backend {
					t.Errorf("first ACK %+v within the hold went to %s, its SYN to %s", c.flow, c.backend, pending[i].backend)
				}
			}

			// Past it: the table decides, for a retransmitted SYN and
			// for the first ACK after it.
			time.Sleep(hold + 300*time.Millisecond)
			late := flows[half:]
			for _, c := range e.synAll(t, late) {
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Errorf("SYN %+v after the hold went to %s, want the table's %s", c.flow, c.backend, want)
				}
			}
			for _, c := range e.send(t, svc, late) {
				if want := mustPick(t, svc, c.flow); c.backend != want {
					t.Errorf("first ACK %+v after the hold went to %s, want the table's %s", c.flow, c.backend, want)
				}
			}

			// A restart right after a replacement: the new datapath
			// holds the handshakes the earlier one's swap left in
			// flight.
			more := randomFlows(svc.Frontend, 64, 12)
			pending = e.synAll(t, more)
			svc = dsrService("web", fam.vip, 80, lb.TCP, b[0], b[2], b[3])
			e.reconcile(t, svc)
			if len(moved(t, svc, pending)) == 0 {
				t.Fatalf("no handshake's slot moved: pick more flows")
			}
			time.Sleep(hold + 300*time.Millisecond)
			e.reload(t, o, svc)
			for i, c := range e.send(t, svc, more) {
				want := pending[i].backend
				if want == b[1] {
					// Its backend left: balanced by the table.
					want = mustPick(t, svc, c.flow)
				}
				if c.backend != want {
					t.Errorf("first ACK %+v after a restart went to %s, want %s (its SYN went to %s)", c.flow, c.backend, want, pending[i].backend)
				}
			}
		})
	}
}
