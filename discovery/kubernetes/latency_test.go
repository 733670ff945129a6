// SPDX-License-Identifier: Apache-2.0

package kubernetes_test

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/discoverytest"
	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/discovery/kubernetes/kubetest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// latencyChanges is how many changes of each kind are timed.
const latencyChanges = 60

// testPropagationLatency times a change in the apiserver -> snapshot ->
// datapath state, for EndpointSlice changes (a pod endpoint comes and goes)
// and Service changes (externalTrafficPolicy flips, which takes a node in
// and out of the table), into the fake datapath and, as root, into the
// real BPF maps. It logs the figures; it asserts only that every change
// arrives, in order.
func testPropagationLatency(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "latency")
	sel := map[string]string{"l4lb-test": "latency"}
	c.AddNode("latency-1", sel, netip.MustParseAddr("10.8.0.1"))
	c.AddNode("latency-2", sel, netip.MustParseAddr("10.8.0.2"))
	createService(t, c, ns, "pods", func(s *corev1.Service) { s.Annotations[kubernetes.AnnotationBackends] = "pod" })
	node := createService(t, c, ns, "nodes")
	ports := map[string]int32{"http": 8080}
	base := kubetest.Endpoint{Addr: netip.MustParseAddr("10.244.0.1"), Node: "latency-1", Ready: true, Serving: true}
	c.SetEndpoints(ns, "pods", ports, base)
	c.SetEndpoints(ns, "nodes", ports, base)

	seed := maglev.Seed{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	rcfg := reconciler.Config{Seed: seed, MaxServices: 64, MaxBackends: 256}
	fake := reconcilertest.NewFake()
	pipes := []*discoverytest.Pipeline{{Name: "fake datapath", Merger: discovery.NewMerger(), Rec: reconciler.New(rcfg, fake, nil), Defaults: testDefaults,
		State: func() (reconciler.State, error) { return fake.State(), nil }}}
	if os.Geteuid() == 0 {
		// SNAT needs a source address; it is only stored, no packet is sent.
		dp, err := datapath.Load(datapath.Config{Seed: seed, MaxServices: 64, MaxBackends: 256, ConntrackMax: 4096,
			SNATAddresses: []netip.Addr{netip.MustParseAddr("198.18.0.1")},
			Log:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatalf("load the datapath: %v", err)
		}
		t.Cleanup(func() { dp.Close() })
		pipes = append(pipes, &discoverytest.Pipeline{Name: "BPF maps", Merger: discovery.NewMerger(), Rec: reconciler.New(rcfg, dp, nil), State: dp.State, Defaults: testDefaults})
	} else {
		t.Log("not root: timing the fake datapath only")
	}

	cfg := sourceConfig(kc, "latency", sel)
	h := runSource(t, cfg, "latency-box", ns)
	svcs := h.waitFor("both services", func(svcs []lb.Service) bool { return len(svcs) == 2 })
	podSvc, _ := find(svcs, "latency.pods.80-tcp")
	nodeSvc, _ := find(svcs, "latency.nodes.80-tcp")
	node2 := netip.AddrPortFrom(netip.MustParseAddr("10.8.0.2"), uint16(node.Spec.Ports[0].NodePort))
	for _, p := range pipes {
		p.Apply(t, discovery.Snapshot{Source: kubernetes.SourceName, Services: svcs}, nodeSvc.Frontend, node2, true)
	}

	type kind struct {
		name  string
		toSrc []time.Duration
		pipes map[string][]time.Duration
	}
	kinds := []*kind{{name: "EndpointSlice", pipes: map[string][]time.Duration{}}, {name: "Service", pipes: map[string][]time.Duration{}}}
	for i := range 2 * latencyChanges {
		k := kinds[i%2]
		on := (i/2)%2 == 0
		var fe lb.Frontend
		var addr netip.AddrPort
		var check func([]lb.Service) bool
		var start time.Time
		if k.name == "EndpointSlice" {
			fe = podSvc.Frontend
			addr = netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 1+i/4%200)), 8080)
			eps := []kubetest.Endpoint{base}
			if on {
				eps = append(eps, kubetest.Endpoint{Addr: addr.Addr(), Node: "latency-2", Ready: true, Serving: true})
			}
			start = time.Now()
			c.SetEndpoints(ns, "pods", ports, eps...)
			check = func(svcs []lb.Service) bool {
				s, _ := find(svcs, podSvc.Name)
				return slices.ContainsFunc(s.Backends, func(b lb.Backend) bool { return b.Addr == addr && b.State == lb.Active }) == on
			}
		} else {
			// on: Cluster (node 2 serves); off: Local (node 2 has no pod).
			fe, addr = nodeSvc.Frontend, node2
			policy := corev1.ServiceExternalTrafficPolicyCluster
			if !on {
				policy = corev1.ServiceExternalTrafficPolicyLocal
			}
			start = time.Now()
			update(t, c, ns, "nodes", func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = policy
				if policy == corev1.ServiceExternalTrafficPolicyCluster {
					s.Spec.HealthCheckNodePort = 0
				}
			})
			check = func(svcs []lb.Service) bool {
				s, _ := find(svcs, nodeSvc.Name)
				return slices.ContainsFunc(s.Backends, func(b lb.Backend) bool { return b.Addr == addr && b.State == lb.Active }) == on
			}
		}
		got := h.waitFor(fmt.Sprintf("%s change %d", k.name, i), check)
		d := time.Since(start)
		k.toSrc = append(k.toSrc, d)
		snap := discovery.Snapshot{Source: kubernetes.SourceName, Services: got}
		for _, p := range pipes {
			t0 := time.Now()
			p.Apply(t, snap, fe, addr, on)
			k.pipes[p.Name] = append(k.pipes[p.Name], d+time.Since(t0))
		}
	}
	t.Logf("propagation over %d changes of each kind (each one waited for before the next):", latencyChanges)
	for _, k := range kinds {
		t.Logf("  %-13s change -> snapshot:   median %v, p99 %v", k.name, discoverytest.Percentile(k.toSrc, 0.5).Round(time.Microsecond), discoverytest.Percentile(k.toSrc, 0.99).Round(time.Microsecond))
		for _, p := range pipes {
			t.Logf("  %-13s change -> %-14s median %v, p99 %v", k.name, p.Name+":", discoverytest.Percentile(k.pipes[p.Name], 0.5).Round(time.Microsecond), discoverytest.Percentile(k.pipes[p.Name], 0.99).Round(time.Microsecond))
		}
	}
}
