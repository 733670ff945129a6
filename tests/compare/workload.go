// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"net/netip"

	"github.com/l4lb/l4lb/lb"
)

// A workload is the same set of services handed to both load balancers:
// as kube-proxy service ports for iptables and as lb.Services for l4lb.
// Service i has VIP 198.18.x.y:80 (only ever routed inside the namespaces
// of a run) and its endpoints on pod-network addresses, except where a
// scenario puts real backends in.
type workload struct {
	svcs []kpService
}

// vipOf is service i's cluster IP: 198.18.0.0/15, the benchmarking range.
func vipOf(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18 + byte(i>>16), byte(i >> 8), byte(i)}), 80)
}

// podOf is endpoint j of service i on the pod network 10.244.0.0/16 (the
// kube-proxy cluster CIDR): addresses nothing answers on, for services
// that only make the rule set or the maps big.
func podOf(i, j int) netip.AddrPort {
	n := i*64 + j
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(n >> 8), byte(n)}), uint16(8000+n>>16))
}

// newWorkload makes n services of b synthetic endpoints each.
func newWorkload(n, b int) *workload {
	w := &workload{svcs: make([]kpService, n)}
	for i := range w.svcs {
		s := kpService{ID: i, Name: fmt.Sprintf("bench/svc-%d:http", i), VIP: vipOf(i)}
		for j := range b {
			s.Endpoints = append(s.Endpoints, podOf(i, j))
		}
		w.svcs[i] = s
	}
	return w
}

// maglevSize is the table size l4lb gets for b backends: the smallest of a
// few primes that is at least 100 times the backend count, which keeps
// Maglev's imbalance under a percent or so (and the tables of 10,000
// services in memory).
func maglevSize(b int) uint32 {
	for _, p := range []uint32{251, 1021, 2039, 4093, 5003, 8191, 16381, 32749, 65521} {
		if int(p) >= 100*b {
			return p
		}
	}
	return 65521
}

// lbServices is the workload as l4lb's model: SNAT services (replies come
// back through the box, as they do through kube-proxy's masquerade).
func (w *workload) lbServices() []lb.Service {
	out := make([]lb.Service, len(w.svcs))
	for i, s := range w.svcs {
		out[i] = lbService(s)
	}
	return out
}

func lbService(s kpService) lb.Service {
	v := lb.Service{
		Name: fmt.Sprintf("svc-%d", s.ID), Frontend: lb.Frontend{Addr: s.VIP.Addr(), Port: s.VIP.Port(), Proto: lb.TCP},
		Mode: lb.ModeSNAT, TableSize: maglevSize(len(s.Endpoints)),
	}
	for _, ep := range s.Endpoints {
		v.Backends = append(v.Backends, lb.Backend{Addr: ep, Weight: lb.DefaultWeight})
	}
	return v
}

// replaceEndpoint swaps endpoint j of service i for a new address, as a pod
// rescheduled elsewhere does, and returns the endpoint chain that went away.
func (w *workload) replaceEndpoint(i, j int, to netip.AddrPort) string {
	s := &w.svcs[i]
	old := sepChain(s, s.Endpoints[j])
	s.Endpoints[j] = to
	return old
}
