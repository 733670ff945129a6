// SPDX-License-Identifier: Apache-2.0

package kubernetes

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/l4lb/l4lb/lb"
)

// TestRetranslateEqualsTranslate: after EndpointSlice changes, translating
// only their Services again gives what a whole translation of the new
// world gives, or declines. Worlds mix pod and node backends, Local and
// Cluster traffic policies, Services without endpoints and endpoint sets
// that empty or refill, over 300 random rounds.
func TestRetranslateEqualsTranslate(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 28))
	cfg := testCfg()
	cfg.Pools = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/27")}
	nodes := []*corev1.Node{testNode("n1", "10.0.0.1"), testNode("n2", "10.0.0.2"), testNode("n3", "10.0.0.3")}
	var svcs []*corev1.Service
	for i := range 12 {
		var opts []svcOpt
		switch i % 4 {
		case 0:
			opts = append(opts, ann(AnnotationBackends, "pod"))
		case 1:
			opts = append(opts, local(32000+int32(i)))
		}
		svcs = append(svcs, lbSvc("ns", fmt.Sprintf("s%d", i), i, opts...))
	}
	endpoints := func(name string) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for j := range rng.IntN(4) {
			node := fmt.Sprintf("n%d", 1+rng.IntN(3))
			eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", 1+rng.IntN(3), 1+j), node, rng.IntN(4) > 0, true, false))
		}
		return slice("ns", name, map[string]int32{"http": 8080}, eps...)
	}
	w := world{services: svcs, nodes: nodes, slices: map[key][]*discoveryv1.EndpointSlice{}}
	for _, s := range svcs {
		w.slices[keyOf(s)] = []*discoveryv1.EndpointSlice{endpoints(s.Name)}
	}
	tr := translator{cfg: cfg, defaults: lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251}, allocate: true}
	prev := tr.translate(w)
	tr.prev = prev.assigned
	declined := 0
	for round := range 300 {
		var keys []key
		byKey := map[key]*corev1.Service{}
		eps := map[key][]*discoveryv1.EndpointSlice{}
		for _, s := range svcs {
			if rng.IntN(5) != 0 {
				continue
			}
			k := keyOf(s)
			w.slices[k] = []*discoveryv1.EndpointSlice{endpoints(s.Name)}
			keys, byKey[k], eps[k] = append(keys, k), s, w.slices[k]
		}
		got, moved, ok := tr.retranslate(&prev, byKey, eps, keys)
		want := tr.translate(w)
		if !ok {
			declined++
			prev = want
			continue
		}
		opts := []cmp.Option{cmp.AllowUnexported(outcome{}), cmpopts.EquateEmpty(),
			cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })}
		if diff := cmp.Diff(want.services, got.services, opts...); diff != "" {
			t.Fatalf("round %d: services (-translate +retranslate):\n%s", round, diff)
		}
		if diff := cmp.Diff(want.outcomes, got.outcomes, opts...); diff != "" {
			t.Fatalf("round %d: outcomes (-translate +retranslate):\n%s", round, diff)
		}
		for _, i := range moved {
			if !slices.ContainsFunc(keys, func(k key) bool { return got.services[i].Name[:len(k.ns)+1+len(k.name)] == k.ns+"."+k.name }) {
				t.Fatalf("round %d: retranslate rebuilt %s, whose Service had no event", round, got.services[i].Name)
			}
		}
		prev = got
	}
	// Declining is for frontends that come or go; these worlds keep their
	// frontends, so nearly every round must have been patched.
	if declined > 30 {
		t.Errorf("retranslate declined %d of 300 rounds", declined)
	}
}
