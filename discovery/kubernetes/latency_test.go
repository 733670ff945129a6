// SPDX-License-Identifier: Apache-2.0

package kubernetes_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/discovery/kubernetes/kubetest"
	"github.com/l4lb/l4lb/internal/discoverytest"
	"github.com/l4lb/l4lb/lb"
)

// latencyChanges is how many changes of each kind are timed.
const latencyChanges = 100

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

	pipes := discoverytest.Pipelines(t, testDefaults)

	cfg := sourceConfig(kc, "latency", sel)
	h := runSource(t, cfg, "latency-box", ns)
	svcs := h.waitFor("both services", func(svcs []lb.Service) bool { return len(svcs) == 2 })
	podSvc, _ := discoverytest.Find(svcs, "latency.pods.80-tcp")
	nodeSvc, _ := discoverytest.Find(svcs, "latency.nodes.80-tcp")
	node2 := netip.AddrPortFrom(netip.MustParseAddr("10.8.0.2"), uint16(node.Spec.Ports[0].NodePort))
	for _, p := range pipes {
		p.Apply(t, discovery.Snapshot{Source: kubernetes.SourceName, Services: svcs}, nodeSvc.Frontend, node2, true)
	}

	type kind struct {
		name  string
		toSrc []time.Duration
		toDP  [][]time.Duration // per pipe
	}
	kinds := []*kind{{name: "EndpointSlice", toDP: make([][]time.Duration, len(pipes))}, {name: "Service", toDP: make([][]time.Duration, len(pipes))}}
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
				s, _ := discoverytest.Find(svcs, podSvc.Name)
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
				s, _ := discoverytest.Find(svcs, nodeSvc.Name)
				return slices.ContainsFunc(s.Backends, func(b lb.Backend) bool { return b.Addr == addr && b.State == lb.Active }) == on
			}
		}
		got := h.waitFor(fmt.Sprintf("%s change %d", k.name, i), check)
		d := time.Since(start)
		k.toSrc = append(k.toSrc, d)
		snap := discovery.Snapshot{Source: kubernetes.SourceName, Services: got}
		for j, p := range pipes {
			k.toDP[j] = append(k.toDP[j], d+p.Apply(t, snap, fe, addr, on))
		}
	}
	t.Logf("propagation over %d changes of each kind (each one waited for before the next):", latencyChanges)
	for _, k := range kinds {
		t.Logf("  %-13s change -> %-15s %s", k.name, "snapshot:", discoverytest.Summary(k.toSrc))
		for j, p := range pipes {
			t.Logf("  %-13s change -> %-15s %s", k.name, p.Name+":", discoverytest.Summary(k.toDP[j]))
		}
	}
}
