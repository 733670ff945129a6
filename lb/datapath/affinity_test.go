// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/bpftest"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// sendFlow sends one packet of kind on flow f through hook k and returns
// the backend it was encapsulated to (DSR over IPIP).
func (e *env) sendFlow(t testing.TB, k hook, f maglev.Flow, kind pktKind) netip.Addr {
	t.Helper()
	in := e.frame(t, kindPacket(f, kind))
	r := e.runOn(t, k, in)
	if r.verdict != k.tx() {
		t.Fatalf("packet of %v: verdict %s, want %s; output:\n%s", f, k.verdictName(r.verdict), k.verdictName(k.tx()), pkttest.Decode(r.out).Dump())
	}
	be := checkEncap(t, in, r.out)
	e.checkMACs(t, r.out, be)
	return be
}

// affinityKey is the affinity table's key of client for service id.
func affinityKey(id uint32, client netip.Addr) bpf.LbAffinityKey {
	return bpf.LbAffinityKey{SvcId: id, Client: client.As16()}
}

// affinityOf reads the affinity entry of client for fe; ok is false when
// there is none.
func (e *env) affinityOf(t testing.TB, fe lb.Frontend, client netip.Addr) (v bpf.LbAffinityValue, ok bool) {
	t.Helper()
	k := affinityKey(uint32(e.state(t, fe).ID), client)
	if err := e.lb.Maps()[bpf.LbMapAffinity].Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return v, false
		}
		t.Fatalf("look up the affinity of %s: %v", client, err)
	}
	return v, true
}

// backendID is the id the reconciler gave fe's backend at addr.
func (e *env) backendID(t testing.TB, fe lb.Frontend, addr netip.Addr) uint32 {
	t.Helper()
	for _, b := range e.state(t, fe).Backends {
		if b.Addr.Addr() == addr {
			return uint32(b.ID)
		}
	}
	t.Fatalf("%s is not a programmed backend of %s", addr, fe)
	return 0
}

// clientFlows returns n new flows of client to fe, from source ports of its
// own, and how many of them Maglev alone would send elsewhere than to be.
func clientFlows(t testing.TB, svc lb.Service, client netip.Addr, base uint16, n int, be netip.Addr) (flows []maglev.Flow, elsewhere int) {
	t.Helper()
	for i := range n {
		f := flowTo(svc.Frontend, client, base+uint16(i))
		flows = append(flows, f)
		if mustPick(t, svc, f) != be {
			elsewhere++
		}
	}
	return flows, elsewhere
}

// TestAffinity runs client-IP affinity at both hooks, for both families and
// for TCP (a SYN, which creates no connection entry) and UDP: new flows of a
// client stick to the backend of its first one across source ports; an
// entry past its timeout, a removed backend and a draining one are not
// followed; another client and a service without affinity follow Maglev.
func TestAffinity(t *testing.T) {
	for _, k := range hooks {
		for _, fam := range families {
			for _, kind := range []pktKind{pktKinds[0], pktKinds[2]} {
				t.Run(k.String()+"/"+fam.name+"/"+kind.name, func(t *testing.T) {
					e := newEnv(t)
					svc := dsrService("sticky", fam.vip, 80, kind.proto, fam.backends...)
					// A timeout that can be aged past at any
					// uptime: the datapath's clock counts from boot.
					timeout := bpftest.AgeableTimeout(5*time.Second, time.Hour)
					svc.Affinity = lb.Affinity{ClientIP: true, Timeout: timeout}
					plain := dsrService("plain", fam.vip, 81, kind.proto, fam.backends...)
					e.reconcile(t, svc, plain)
					fe := svc.Frontend
					id := uint32(e.state(t, fe).ID)

					first := flowTo(fe, fam.client, 51000)
					b0 := e.sendFlow(t, k, first, kind)
					if want := mustPick(t, svc, first); b0 != want {
						t.Fatalf("first flow went to %s, want Maglev's %s", b0, want)
					}
					if v, ok := e.affinityOf(t, fe, fam.client); !ok || v.BackendId != e.backendID(t, fe, b0) || v.LastSeen == 0 {
						t.Fatalf("affinity entry %+v (present %v), want backend id %d and a time", v, ok, e.backendID(t, fe, b0))
					}

					flows, elsewhere := clientFlows(t, svc, fam.client, 51001, 24, b0)
					if elsewhere == 0 {
						t.Fatal("Maglev sends all test flows to the first backend: the test proves nothing")
					}
					for _, f := range flows {
						if got := e.sendFlow(t, k, f, kind); got != b0 {
							t.Errorf("new flow %v went to %s, want the client's %s (Maglev says %s)", f, got, b0, mustPick(t, svc, f))
						}
					}
					// Another client, and a service without affinity, follow Maglev.
					other := fam.client.Next()
					for _, f := range []maglev.Flow{flowTo(fe, other, 51100), flowTo(plain.Frontend, fam.client, 51101)} {
						s := svc
						if f.DstPort == plain.Frontend.Port {
							s = plain
						}
						if got, want := e.sendFlow(t, k, f, kind), mustPick(t, s, f); got != want {
							t.Errorf("flow %v went to %s, want Maglev's %s", f, got, want)
						}
					}
					if _, ok := e.affinityOf(t, plain.Frontend, fam.client); ok {
						t.Error("a service without affinity wrote an affinity entry")
					}

					// Aged on the datapath's own clock (time since
					// boot), both sides of the timeout: last seen half
					// a timeout ago the entry still holds; last seen
					// two timeouts ago it is forgotten, and the new
					// flow's choice replaces it.
					m := e.lb.Maps()[bpf.LbMapAffinity]
					key := affinityKey(id, fam.client)
					age := func(ago time.Duration) uint64 {
						t.Helper()
						seen := uint64(bpftest.KernelNow() - ago)
						v := bpf.LbAffinityValue{BackendId: e.backendID(t, fe, b0), LastSeen: seen}
						if err := m.Update(&key, &v, ebpf.UpdateExist); err != nil {
							t.Fatal(err)
						}
						return seen
					}
					seen := age(timeout / 2)
					live := firstElsewhere(t, svc, fam.client, 51200, b0)
					if got := e.sendFlow(t, k, live, kind); got != b0 {
						t.Errorf("last seen half a timeout (%s) ago, new flow went to %s, want the client's %s (Maglev says %s)",
							timeout/2, got, b0, mustPick(t, svc, live))
					}
					if v, _ := e.affinityOf(t, fe, fam.client); v.BackendId != e.backendID(t, fe, b0) || v.LastSeen <= seen {
						t.Errorf("after a flow within the timeout the entry is %+v, want backend id %d refreshed past %d", v, e.backendID(t, fe, b0), seen)
					}
					seen = age(2 * timeout)
					f := firstElsewhere(t, svc, fam.client, 51600, b0)
					b1 := e.sendFlow(t, k, f, kind)
					if want := mustPick(t, svc, f); b1 != want {
						t.Errorf("last seen two timeouts ago, new flow went to %s, want Maglev's %s", b1, want)
					}
					if v, _ := e.affinityOf(t, fe, fam.client); v.BackendId != e.backendID(t, fe, b1) || v.LastSeen <= seen {
						t.Errorf("after expiry the entry is %+v, want backend id %d seen now", v, e.backendID(t, fe, b1))
					}

					// A draining backend keeps its flows but not its clients.
					drain := svc.Clone()
					for i := range drain.Backends {
						if drain.Backends[i].Addr.Addr() == b1 {
							drain.Backends[i].State = lb.Draining
						}
					}
					e.reconcile(t, drain, plain)
					if kind.proto == lb.UDP {
						// (A TCP SYN is never established.)
						if got := e.sendFlow(t, k, f, kind); got != b1 {
							t.Errorf("established flow %v moved from draining %s to %s", f, b1, got)
						}
					}
					g := flowTo(fe, fam.client, 51300)
					b2 := e.sendFlow(t, k, g, kind)
					if want := mustPick(t, drain, g); b2 == b1 || b2 != want {
						t.Errorf("new flow went to %s with %s draining, want Maglev's %s", b2, b1, want)
					}
					if got := e.sendFlow(t, k, flowTo(fe, fam.client, 51301), kind); got != b2 {
						t.Errorf("next new flow went to %s, want the client's new backend %s", got, b2)
					}

					// A removed backend is not followed either.
					var kept []lb.Backend
					for _, b := range svc.Backends {
						if b.Addr.Addr() != b2 {
							kept = append(kept, b)
						}
					}
					removed := svc.Clone()
					removed.Backends = kept
					e.reconcile(t, removed, plain)
					h := flowTo(fe, fam.client, 51400)
					if got, want := e.sendFlow(t, k, h, kind), mustPick(t, removed, h); got != want {
						t.Errorf("with %s removed, new flow went to %s, want Maglev's %s", b2, got, want)
					}

					// ICMP errors about new flows look, but leave no entry.
					n := e.affinityEntries(t)
					stranger := fam.client.Next().Next()
					e.sendICMPToFlow(t, k, removed, flowTo(fe, stranger, 51500), errKinds(fam)[1])
					if got := e.affinityEntries(t); got != n {
						t.Errorf("an ICMP error changed the affinity table from %d to %d entries", n, got)
					}
				})
			}
		}
	}
}

// firstElsewhere is the first flow of client from port base on whose slot
// Maglev has another backend than be.
func firstElsewhere(t testing.TB, svc lb.Service, client netip.Addr, base uint16, be netip.Addr) maglev.Flow {
	t.Helper()
	for p := base; p < base+200; p++ {
		f := flowTo(svc.Frontend, client, p)
		if mustPick(t, svc, f) != be {
			return f
		}
	}
	t.Fatalf("every flow of %s maps to %s", client, be)
	return maglev.Flow{}
}

// TestAffinityTimeout lets a short affinity timeout pass for real: after
// it, a client's new flow follows Maglev again. (Only the expiry is
// asserted: that the entry still holds before the timeout would depend on
// how fast the test runs.)
func TestAffinityTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	e := newEnv(t)
	var svcs []lb.Service
	for _, fam := range families {
		svc := dsrService("short-"+fam.name, fam.vip, 80, lb.UDP, fam.backends...)
		svc.Affinity = lb.Affinity{ClientIP: true, Timeout: timeout}
		svcs = append(svcs, svc)
	}
	e.reconcile(t, svcs...)
	type stuck struct {
		k    hook
		svc  lb.Service
		next maglev.Flow
		was  netip.Addr
	}
	var all []stuck
	for i, fam := range families {
		for _, k := range hooks {
			client := fam.client
			if k == hookTC {
				client = client.Next()
			}
			was := e.sendFlow(t, k, flowTo(svcs[i].Frontend, client, 53000), pktKinds[2])
			all = append(all, stuck{k, svcs[i], firstElsewhere(t, svcs[i], client, 53001, was), was})
		}
	}
	time.Sleep(2 * timeout)
	for _, s := range all {
		if got, want := e.sendFlow(t, s.k, s.next, pktKinds[2]), mustPick(t, s.svc, s.next); got != want {
			t.Errorf("%s: %s after the %s timeout, new flow %v went to %s, want Maglev's %s (the expired entry said %s)",
				s.k, s.svc.Name, timeout, s.next, got, want, s.was)
		}
	}
}
