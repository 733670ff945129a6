// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// TestFlowHashParity is the "Go and C agree bit for bit" check: for random
// TCP and UDP flows of both families, the program must pick the backend at
// table[FlowHash % M] that lb/maglev computes, and must put the low bits of
// its own hash into the outer source (checkEncap compares them with
// FlowHash), which shows that the hashes agree and not only the slots.
func TestFlowHashParity(t *testing.T) {
	const flowsPerService = 400
	e := newEnv(t)
	var svcs []lb.Service
	for _, fam := range families {
		svcs = append(svcs,
			dsrService("web-"+fam.name, fam.vip, 80, lb.TCP, fam.backends...),
			dsrService("alt-"+fam.name, fam.vip, 8443, lb.TCP, fam.backends[:3]...),
			dsrService("dns-"+fam.name, fam.vip, 53, lb.UDP, fam.backends[1:]...))
	}
	// Unequal weights, so that a wrong slot is more likely to land on
	// another backend.
	svcs[0].Backends[0].Weight = 3
	e.reconcile(t, svcs...)

	for i, svc := range svcs {
		t.Run(svc.Name, func(t *testing.T) {
			flows := randomFlows(svc.Frontend, flowsPerService, uint64(i))
			frames := make([][]byte, len(flows))
			for k, f := range flows {
				// SYNs leave the connection table alone, so every TCP
				// packet is balanced by the table.
				frames[k] = e.frame(t, packet(f, true, false, nil))
			}
			st := e.state(t, svc.Frontend)
			hits := map[string]int{}
			for k, r := range e.runAll(t, frames) {
				got := e.checkTX(t, frames[k], r)
				want := mustPick(t, svc, flows[k])
				if got != want {
					t.Errorf("flow %+v: sent to %s, want %s (Go: hash %#x, slot %d; programmed table says %s)",
						flows[k], got, want, maglev.FlowHash(testSeed, flows[k]),
						maglev.Slot(maglev.FlowHash(testSeed, flows[k]), testTableSize), programmedPick(st, flows[k]))
				}
				hits[got.String()]++
				if t.Failed() {
					t.FailNow()
				}
			}
			// Every backend must have been seen, or a constant answer
			// could pass.
			if len(hits) != len(svc.Backends) {
				t.Errorf("flows reached %d backends (%v), want all %d", len(hits), hits, len(svc.Backends))
			}
		})
	}
}

// programmedPick is the backend the reconciler's programmed table holds for
// f, to tell a control-plane mismatch from a datapath one in messages.
func programmedPick(st reconciler.ServiceState, f maglev.Flow) string {
	if len(st.Table) == 0 {
		return "none"
	}
	id := st.Table[maglev.Slot(maglev.FlowHash(testSeed, f), uint32(len(st.Table)))]
	for _, b := range st.Backends {
		if b.ID == id {
			return b.Addr.Addr().String()
		}
	}
	return "unknown id"
}
