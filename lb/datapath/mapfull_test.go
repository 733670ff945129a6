// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// TestMapFull: with the backend map full, the service that does not fit is
// refused with an error naming it and the setting to raise; every other
// service keeps forwarding.
func TestMapFull(t *testing.T) {
	e := newEnvWith(t, envOptions{maxBackends: 4})
	a := dsrService("a", vip4, 80, lb.TCP, backends4[0], backends4[1])
	b := dsrService("b", vip4, 81, lb.TCP, backends4[0], backends4[1])
	c := dsrService("c", vip4, 82, lb.TCP, backends4[2])
	err := e.rec.Reconcile([]lb.Service{withDefaults(a), withDefaults(b), withDefaults(c)})
	if err == nil || !strings.Contains(err.Error(), `service "c": backend map full (max_backends = 4); raise datapath.max_backends`) {
		t.Fatalf("reconcile: %v, want service c refused for a full backend map", err)
	}
	for _, svc := range []lb.Service{a, b} {
		f := maglev.Flow{Src: client4, Dst: vip4, SrcPort: 5000, DstPort: svc.Frontend.Port, Proto: 6}
		r := e.run(t, e.frame(t, packet(f, true, false, nil)))
		if r.verdict != xdpTX {
			t.Errorf("service %s stopped forwarding when c did not fit: verdict %s", svc.Name, verdictName(r.verdict))
		}
	}
	f := maglev.Flow{Src: client4, Dst: vip4, SrcPort: 5000, DstPort: 82, Proto: 6}
	if r := e.run(t, e.frame(t, packet(f, true, false, nil))); r.verdict != xdpPass {
		t.Errorf("refused service c: verdict %s, want pass (not programmed)", verdictName(r.verdict))
	}
}
