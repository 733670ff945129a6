// SPDX-License-Identifier: Apache-2.0

package kubernetes

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// Reasons of the l4lb.io/Programmed condition.
const (
	ReasonProgrammed    = "Programmed"
	ReasonNoPool        = "NoPool"
	ReasonIPConflict    = "IPConflict"
	ReasonNoBackends    = "NoBackends"
	ReasonInvalidConfig = "InvalidConfig"
	// ReasonPending: translated, but the datapath does not hold it (yet):
	// another source claims the frontend, or the datapath refused it
	// (l4lbctl status says which).
	ReasonPending = "Pending"
)

// Labels and taints that take a Node out of every Service, as the cloud
// controllers do.
const (
	labelExcludeLB   = "node.kubernetes.io/exclude-from-external-load-balancers"
	taintToBeDeleted = "ToBeDeletedByClusterAutoscaler"
	labelServiceName = discoveryv1.LabelServiceName
)

// key is a Service's namespace/name.
type key struct{ ns, name string }

func (k key) String() string { return k.ns + "/" + k.name }

func keyOf(svc *corev1.Service) key { return key{svc.Namespace, svc.Name} }

// world is the informers' view that one translation reads.
type world struct {
	services []*corev1.Service
	nodes    []*corev1.Node
	slices   map[key][]*discoveryv1.EndpointSlice
}

// outcome is what became of one served Service.
type outcome struct {
	reason  string // a Reason*; ReasonProgrammed when nothing is wrong
	message string
	// vips are the addresses assigned, at most one per family.
	vips []netip.Addr
	// frontends are the lb.Services published for it, by name.
	frontends []lb.Frontend
	// eligible counts the backends that can take new flows.
	eligible int
	// generation is the Service's metadata.generation translated.
	generation int64
	// note is said with a Programmed condition: served, but not as the
	// Service may expect.
	note string
}

// served: the translation publishes the Service (with or without
// backends able to take new flows), so a datapath should hold its
// frontends; any other reason refuses it.
func (o *outcome) served() bool {
	return o.reason == ReasonProgrammed || o.reason == ReasonNoBackends
}

// missing lists the Service's frontends a datapath holding programmed
// lacks.
func (o *outcome) missing(programmed map[lb.Frontend]bool) []lb.Frontend {
	var out []lb.Frontend
	for _, fe := range o.frontends {
		if !programmed[fe] {
			out = append(out, fe)
		}
	}
	return out
}

// result is one translation of the world.
type result struct {
	services []lb.Service
	outcomes map[key]*outcome
	// assigned is every VIP assignment made (kept across translations so
	// that an address once chosen stays, even before status says so).
	assigned map[key][]netip.Addr
	// problems are left-out parts that do not refuse a Service (a Node
	// with a bad weight annotation, an SCTP port).
	problems []string

	// What retranslate needs to redo one Service: the eligible nodes,
	// each Service's outcome after VIP assignment and before its
	// frontends were built, and services' positions by name. Shared
	// between a result and the results retranslated from it: never
	// written after translate.
	nodes []node
	pre   map[key]outcome
	at    map[string]int
}

// translator holds what a translation needs besides the world.
type translator struct {
	cfg      config.Kubernetes
	defaults lb.Defaults
	// prev are earlier assignments.
	prev map[key][]netip.Addr
	// allocate is false until the first full list has synced, and while
	// the apiserver is unreachable: no new address is handed out then.
	allocate bool
}

// selected reports whether this box serves svc.
func (t *translator) selected(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if c := svc.Spec.LoadBalancerClass; c != nil {
		return *c == t.cfg.LoadBalancerClass
	}
	return t.cfg.IncludeClassless
}

// translate turns the world into lb.Services. It is a pure function of its
// inputs, so every box fed by the same cluster decides the same.
func (t *translator) translate(w world) result {
	res := result{outcomes: map[key]*outcome{}, assigned: map[key][]netip.Addr{}}
	// served are the Services this box balances; releasing are deleted
	// ones that still carry our finalizer: their VIPs may still be in the
	// datapath, so they keep them until the finalizer is released.
	var served, releasing []*corev1.Service
	for _, svc := range w.services {
		switch {
		case !t.selected(svc):
		case svc.DeletionTimestamp == nil:
			served = append(served, svc)
		case slices.Contains(svc.Finalizers, Finalizer):
			releasing = append(releasing, svc)
		}
	}
	// The oldest Service claims first, so that a new Service can never take
	// an address from an existing one.
	slices.SortFunc(served, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	nodes, nodeProblems := t.eligibleNodes(w.nodes)
	res.problems = append(res.problems, nodeProblems...)

	vips := t.assign(served, releasing, &res)
	res.nodes, res.pre = nodes, make(map[key]outcome, len(served))
	for _, svc := range served {
		k := keyOf(svc)
		o := res.outcomes[k]
		if o.reason != ReasonProgrammed {
			continue
		}
		res.pre[k] = *o
		t.frontends(svc, vips[k], nodes, w.slices[k], o, &res)
	}
	slices.SortFunc(res.services, func(a, b lb.Service) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(res.problems)
	res.at = make(map[string]int, len(res.services))
	for i, s := range res.services {
		res.at[s.Name] = i
	}
	return res
}

// retranslate is translate for a world that differs from the one prev was
// translated from only in the EndpointSlices of the Services keys (svcs
// holds those Services, eps their slices): VIPs, nodes and every other
// Service stay as prev has them, so only those Services' frontends are
// built again. An EndpointSlice event then costs its Service, not the
// cluster. It answers false, and the caller translates in full, when the
// result might differ from translate's in more than those Services'
// backends and counts: a Service not found, or one whose frontends, or
// whether it is served, would change.
//
// moved are the positions in the result's services of the lb.Services
// built again.
func (t *translator) retranslate(prev *result, svcs map[key]*corev1.Service, eps map[key][]*discoveryv1.EndpointSlice, keys []key) (res result, moved []int, ok bool) {
	res = *prev
	copied := false
	for _, k := range keys {
		pre, ok := prev.pre[k]
		if !ok {
			// Not served, or refused before its backends mattered:
			// its EndpointSlices change nothing.
			continue
		}
		svc := svcs[k]
		old := prev.outcomes[k]
		if svc == nil || old == nil || svc.Generation != pre.generation {
			return result{}, nil, false
		}
		o := pre
		var one result
		t.frontends(svc, o.vips, prev.nodes, eps[k], &o, &one)
		if !o.served() || !old.served() || !slices.Equal(o.frontends, old.frontends) || len(one.services) != len(old.frontends) {
			return result{}, nil, false
		}
		if !copied {
			res.services = slices.Clone(prev.services)
			res.outcomes = maps.Clone(prev.outcomes)
			copied = true
		}
		for _, svc := range one.services {
			i, ok := res.at[svc.Name]
			if !ok {
				return result{}, nil, false
			}
			res.services[i] = svc
			moved = append(moved, i)
		}
		res.outcomes[k] = &o
	}
	return res, moved, true
}

// node is an eligible Node reduced to what backends need.
type node struct {
	name   string
	addrs  []netip.Addr // InternalIPs
	weight uint32
}

func (n node) addr(v6 bool) (netip.Addr, bool) {
	for _, a := range n.addrs {
		if a.Is6() == v6 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// eligibleNodes are the Nodes that may carry traffic: not being deleted,
// not excluded by label or taint, matching the node selector. Readiness
// is left to the health checks: a NotReady Node may still forward, and
// removing it on a kubelet hiccup would move every flow it carries.
func (t *translator) eligibleNodes(all []*corev1.Node) ([]node, []string) {
	var out []node
	var problems []string
	for _, n := range all {
		if n.DeletionTimestamp != nil {
			continue
		}
		if _, ok := n.Labels[labelExcludeLB]; ok {
			continue
		}
		if slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == taintToBeDeleted }) {
			continue
		}
		match := true
		for k, v := range t.cfg.NodeSelector {
			if got, ok := n.Labels[k]; !ok || got != v {
				match = false
			}
		}
		if !match {
			continue
		}
		nd := node{name: n.Name, weight: lb.DefaultWeight}
		if v, ok := n.Annotations[AnnotationWeight]; ok {
			w, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				problems = append(problems, fmt.Sprintf("node %s: annotation %s = %q is not a weight (0..4294967295): the node is left out of every Service until it is fixed", n.Name, AnnotationWeight, v))
				continue
			}
			nd.weight = uint32(w)
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				nd.addrs = append(nd.addrs, ip.Unmap())
			}
		}
		if len(nd.addrs) > 0 {
			out = append(out, nd)
		}
	}
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.name, b.name) })
	return out, problems
}

// families are the IP families of svc's frontends, as spec.ipFamilies says.
func families(svc *corev1.Service) []bool {
	var out []bool
	for _, f := range svc.Spec.IPFamilies {
		out = append(out, f == corev1.IPv6Protocol)
	}
	if len(out) == 0 {
		out = []bool{false}
	}
	return out
}

// portKey is one port a VIP serves, for sharing checks.
type portKey struct {
	port  int32
	proto corev1.Protocol
}

// holder is a Service holding a VIP.
type holder struct {
	svc   key
	share string // its sharing key; "" shares with nobody
	ports []portKey
	// deleted: a deleted Service whose VIP may still be in the datapath.
	deleted bool
}

func portsOf(svc *corev1.Service) []portKey {
	var out []portKey
	for _, p := range svc.Spec.Ports {
		out = append(out, portKey{p.Port, p.Protocol})
	}
	return out
}

func shareOf(svc *corev1.Service) string {
	return strings.TrimSpace(svc.Annotations[AnnotationSharingKey])
}

// fits reports whether a Service with share and ports may join the holders
// of one address.
func fits(holders []holder, share string, ports []portKey) bool {
	for _, h := range holders {
		if share == "" || h.share != share || h.deleted {
			return false
		}
		for _, p := range ports {
			if slices.Contains(h.ports, p) {
				return false
			}
		}
	}
	return true
}

// assign chooses every served Service's VIPs. Addresses in use are placed
// before any other: first those of deleted Services not yet released,
// then those a Service already has (status, or an earlier choice of this
// box) unless it now asks for another one; then the requested ones
// (l4lb.io/ips, spec.loadBalancerIP); then new ones from the pools. So a
// VIP never moves unless its own Service asks, and a request for an
// address another Service has is refused rather than granted by moving
// that one.
func (t *translator) assign(served, releasing []*corev1.Service, res *result) map[key][]netip.Addr {
	held := map[netip.Addr][]holder{}
	vips := map[key][]netip.Addr{}
	type want struct {
		v6   bool
		req  netip.Addr // the address requested for this family, if any
		done bool
	}
	wants := map[key][]*want{}
	for _, svc := range served {
		k := keyOf(svc)
		o := &outcome{reason: ReasonProgrammed, generation: svc.Generation}
		res.outcomes[k] = o
		for _, v6 := range families(svc) {
			wants[k] = append(wants[k], &want{v6: v6})
		}
	}
	take := func(svc *corev1.Service, a netip.Addr) bool {
		k := keyOf(svc)
		if !fits(held[a], shareOf(svc), portsOf(svc)) {
			return false
		}
		held[a] = append(held[a], holder{svc: k, share: shareOf(svc), ports: portsOf(svc)})
		vips[k] = append(vips[k], a)
		return true
	}
	fail := func(o *outcome, reason, format string, args ...any) {
		if o.reason == ReasonProgrammed || severity(reason) > severity(o.reason) {
			o.reason, o.message = reason, fmt.Sprintf(format, args...)
		}
	}

	// Deleted Services awaiting the release of their finalizer.
	for _, svc := range releasing {
		k := keyOf(svc)
		for _, a := range slices.Concat(statusIPs(svc), t.prev[k]) {
			if t.inPool(a, "") && !slices.ContainsFunc(held[a], func(h holder) bool { return h.svc == k }) {
				held[a] = append(held[a], holder{svc: k, share: shareOf(svc), ports: portsOf(svc), deleted: true})
			}
		}
	}
	// Requests, matched to the families they are for. A Service whose
	// request cannot be read is refused, but keeps what it has for when it
	// is fixed.
	for _, svc := range served {
		k := keyOf(svc)
		o := res.outcomes[k]
		req, err := requested(svc)
		if err != nil {
			fail(o, ReasonInvalidConfig, "%v", err)
			continue
		}
		for _, a := range req {
			i := slices.IndexFunc(wants[k], func(w *want) bool { return w.v6 == a.Is6() && !w.req.IsValid() })
			if i < 0 {
				fail(o, ReasonInvalidConfig, "requested VIP %s is %s, but spec.ipFamilies has no such family (or names it once and two are requested)", a, family(a))
				continue
			}
			wants[k][i].req = a
		}
	}
	// Addresses the Service already has.
	for _, svc := range served {
		k := keyOf(svc)
		have := slices.Concat(statusIPs(svc), t.prev[k])
		for _, w := range wants[k] {
			for _, a := range have {
				if a.Is6() != w.v6 || (w.req.IsValid() && a != w.req) {
					continue
				}
				if (w.req.IsValid() || t.inPool(a, poolOf(svc))) && t.inPool(a, "") && take(svc, a) {
					w.done = true
					break
				}
			}
		}
	}
	// Requested addresses. One that cannot be had is reported, never
	// replaced by another one.
	for _, svc := range served {
		k := keyOf(svc)
		o := res.outcomes[k]
		for _, w := range wants[k] {
			if w.done || !w.req.IsValid() {
				continue
			}
			w.done = true
			a := w.req
			switch {
			case !t.inPool(a, ""):
				fail(o, ReasonNoPool, "requested VIP %s lies in no configured pool: add a pool holding it to [discovery.kubernetes] pools or named_pools", a)
			case !take(svc, a):
				fail(o, ReasonIPConflict, "requested VIP %s is already used by %s: give both the same %s annotation with disjoint ports to share it, or request another address", a, heldBy(held[a]), AnnotationSharingKey)
			}
		}
	}
	// New addresses.
	for _, svc := range served {
		k := keyOf(svc)
		o := res.outcomes[k]
		if o.reason == ReasonInvalidConfig {
			continue
		}
		pool := poolOf(svc)
		prefixes, ok := t.pool(pool)
		if !ok {
			fail(o, ReasonInvalidConfig, "annotation %s = %q names no pool: configure [discovery.kubernetes.named_pools] %s, or remove the annotation", AnnotationPool, pool, pool)
			continue
		}
		for _, w := range wants[k] {
			if w.done {
				continue
			}
			if !t.allocate {
				fail(o, ReasonNoPool, "no %s VIP yet: addresses are handed out only while the whole cluster view is in sync", familyName(w.v6))
				continue
			}
			if t.free(prefixes, w.v6, held, svc, take) {
				w.done = true
				continue
			}
			where := "pools"
			if pool != "" {
				where = "named_pools." + pool
			}
			fail(o, ReasonNoPool, "no free %s address in %s: add addresses to the pool, or free one", familyName(w.v6), where)
		}
	}
	for k, a := range vips {
		slices.SortFunc(a, func(x, y netip.Addr) int { return x.Compare(y) })
		res.assigned[k] = a
		res.outcomes[k].vips = a
	}
	return vips
}

// severity orders reasons: the worst one is reported.
func severity(r string) int {
	switch r {
	case ReasonInvalidConfig:
		return 4
	case ReasonIPConflict:
		return 3
	case ReasonNoPool:
		return 2
	case ReasonNoBackends:
		return 1
	}
	return 0
}

func heldBy(hs []holder) string {
	var names []string
	for _, h := range hs {
		n := "Service " + h.svc.String()
		if h.deleted {
			n += " (deleted; free once the datapath dropped it)"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// free finds an address of the wanted family for svc: one that Services of
// the same sharing key hold, when their ports are disjoint, else the lowest
// address nobody holds.
func (t *translator) free(prefixes []netip.Prefix, v6 bool, held map[netip.Addr][]holder, svc *corev1.Service, take func(*corev1.Service, netip.Addr) bool) bool {
	if share := shareOf(svc); share != "" {
		var shared []netip.Addr
		for a, hs := range held {
			if a.Is6() == v6 && len(hs) > 0 && hs[0].share == share && !hs[0].deleted && inAny(a, prefixes) {
				shared = append(shared, a)
			}
		}
		slices.SortFunc(shared, func(x, y netip.Addr) int { return x.Compare(y) })
		for _, a := range shared {
			if take(svc, a) {
				return true
			}
		}
	}
	for _, p := range prefixes {
		if p.Addr().Is6() != v6 {
			continue
		}
		first, last := usable(p)
		for a := first; a.IsValid() && p.Contains(a) && a.Compare(last) <= 0; a = a.Next() {
			if len(held[a]) == 0 && take(svc, a) {
				return true
			}
		}
	}
	return false
}

// usable is the range of a pool prefix handed out: all of it, except the
// network and broadcast addresses of an IPv4 subnet (and the all-zero
// address of an IPv6 one), which some routers and clients mishandle.
func usable(p netip.Prefix) (first, last netip.Addr) {
	first = p.Addr()
	bits := p.Addr().BitLen()
	last = lastAddr(p)
	if p.Bits() <= bits-2 {
		first = first.Next()
		if p.Addr().Is4() {
			last = last.Prev()
		}
	}
	return first, last
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func inAny(a netip.Addr, ps []netip.Prefix) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

// pool returns the prefixes of a named pool ("" is the default pools).
func (t *translator) pool(name string) ([]netip.Prefix, bool) {
	if name == "" {
		return t.cfg.Pools, true
	}
	ps, ok := t.cfg.NamedPools[name]
	return ps, ok
}

// inPool reports whether a lies in the pool name, or, for "", in any pool.
func (t *translator) inPool(a netip.Addr, name string) bool {
	if name != "" {
		ps, _ := t.pool(name)
		return inAny(a, ps)
	}
	if inAny(a, t.cfg.Pools) {
		return true
	}
	for _, ps := range t.cfg.NamedPools {
		if inAny(a, ps) {
			return true
		}
	}
	return false
}

func poolOf(svc *corev1.Service) string { return strings.TrimSpace(svc.Annotations[AnnotationPool]) }

// requested are the addresses the Service asks for.
func requested(svc *corev1.Service) ([]netip.Addr, error) {
	var texts []string
	if v, ok := svc.Annotations[AnnotationIPs]; ok {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				texts = append(texts, s)
			}
		}
		if len(texts) == 0 {
			return nil, fmt.Errorf("annotation %s is empty: list one VIP per family, or remove it", AnnotationIPs)
		}
	} else if ip := strings.TrimSpace(svc.Spec.LoadBalancerIP); ip != "" {
		texts = []string{ip}
	}
	var out []netip.Addr
	for _, s := range texts {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			field := AnnotationIPs
			if _, ok := svc.Annotations[AnnotationIPs]; !ok {
				field = "spec.loadBalancerIP"
			}
			return nil, fmt.Errorf("%s: %q is not an IP address", field, s)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// statusIPs are the VIPs status says the Service has.
func statusIPs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func family(a netip.Addr) string { return familyName(a.Is6()) }

func familyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// frontends builds the lb.Services of one Service: one per VIP and port.
func (t *translator) frontends(svc *corev1.Service, vips []netip.Addr, nodes []node, eps []*discoveryv1.EndpointSlice, o *outcome, res *result) {
	k := keyOf(svc)
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var out []lb.Service
	for i, vip := range vips {
		st, problems := parseSettings(svc, vip.String(), t.defaultHealth(svc), t.defaults, t.cfg.Backends)
		if len(problems) > 0 {
			o.reason, o.message = ReasonInvalidConfig, strings.Join(problems, "; ")
			return
		}
		eff := st.tmpl.WithDefaults(t.defaults)
		for _, p := range svc.Spec.Ports {
			var proto lb.Protocol
			switch p.Protocol {
			case corev1.ProtocolTCP, "":
				proto = lb.TCP
			case corev1.ProtocolUDP:
				proto = lb.UDP
			default:
				if i > 0 {
					continue // reported with the first VIP
				}
				res.problems = append(res.problems, fmt.Sprintf("Service %s: port %s (%d/%s) is not served: l4lb balances TCP and UDP only", k, portName(p), p.Port, p.Protocol))
				continue
			}
			s := st.tmpl.Clone()
			s.Frontend = lb.Frontend{Addr: vip, Port: uint16(p.Port), Proto: proto}
			s.Name = serviceName(k, p, vip)
			s.Source = SourceName
			eff.Frontend = s.Frontend
			var bs []lb.Backend
			if st.backends == config.K8sPod {
				bs = podBackends(p, vip.Is6(), eps)
			} else {
				if p.NodePort == 0 && !dsrSamePort(eff) {
					o.reason, o.message = ReasonInvalidConfig, fmt.Sprintf("port %s has no nodePort (spec.allocateLoadBalancerNodePorts is false): node backends need one, or use mode dsr with dispatch ipip or geneve, or %s: pod", portName(p), AnnotationBackends)
					return
				}
				bs = nodeBackends(p, vip.Is6(), nodes, local, eps, dsrSamePort(eff))
				s.Health = t.nodeHealth(s.Health, p, svc, local)
			}
			s.Backends = bs
			if local && st.backends != config.K8sPod && eff.ModeFor(proto) == lb.ModeSNAT && o.note == "" {
				o.note = fmt.Sprintf("externalTrafficPolicy Local, but mode %s replaces the client's address with the LB box's on %s: set %s to dsr (or hybrid, for TCP) to keep it", eff.Mode, proto, AnnotationMode)
			}
			if ts := eff.TableSize; ts > 0 && len(bs) > int(ts) {
				o.reason, o.message = ReasonInvalidConfig, fmt.Sprintf("%d backends but the Maglev table has %d slots: set %s to a larger prime", len(bs), ts, AnnotationTableSize)
				return
			}
			for _, b := range bs {
				if b.State == lb.Active && b.Weight > 0 {
					o.eligible++
				}
			}
			out = append(out, s)
			o.frontends = append(o.frontends, s.Frontend)
		}
	}
	if o.eligible == 0 && len(out) > 0 {
		o.reason, o.message = ReasonNoBackends, noBackendsMessage(svc, local, t.cfg.Backends)
	}
	res.services = append(res.services, out...)
}

// dsrSamePort: with DSR over IPIP or Geneve the packet reaches the backend
// unchanged, addressed to the VIP and the Service port, which kube-proxy
// forwards like any LoadBalancer ingress (ipMode VIP). The backend port is
// then the Service port, not the NodePort.
func dsrSamePort(eff lb.Service) bool {
	return eff.ModeFor(eff.Frontend.Proto) == lb.ModeDSR && (eff.Dispatch == lb.DispatchIPIP || eff.Dispatch == lb.DispatchGeneve)
}

func noBackendsMessage(svc *corev1.Service, local bool, def config.K8sBackends) string {
	switch {
	case svc.Annotations[AnnotationBackends] == "pod" || (def == config.K8sPod && svc.Annotations[AnnotationBackends] == ""):
		return "no ready endpoint: the Service's EndpointSlices list none ready or serving"
	case local:
		return "no node has a ready local endpoint (externalTrafficPolicy Local): new connections are dropped"
	}
	return "no eligible node: every Node is excluded (label, taint, node_selector) or has no InternalIP of the VIP's family"
}

// defaultHealth is the check of the Service's backends before annotations.
func (t *translator) defaultHealth(svc *corev1.Service) lb.HealthCheck {
	h := t.cfg.Health
	hc := lb.HealthCheck{Interval: h.Interval, Timeout: h.Timeout, Rise: h.Rise, Fall: h.Fall}
	backends := t.cfg.Backends
	if v, err := config.ParseK8sBackends(strings.TrimSpace(svc.Annotations[AnnotationBackends])); err == nil {
		backends = v
	}
	switch {
	case backends == config.K8sPod:
		hc.Type = h.Pod
	case svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal:
		// Port filled per frontend by nodeHealth.
		hc.Type, hc.Path, hc.ExpectStatus = lb.HealthHTTP, "/healthz", 200
	case h.Cluster == config.ClusterCheckKubeProxy:
		hc.Type, hc.Port, hc.Path, hc.ExpectStatus = lb.HealthHTTP, h.KubeProxyPort, "/healthz", 200
	case h.Cluster == config.ClusterCheckNodePort:
		hc.Type = lb.HealthTCP
	default:
		hc.Type = lb.HealthNone
	}
	if hc.Type == lb.HealthNone {
		return lb.HealthCheck{}
	}
	return hc
}

// nodeHealth fills the probe port of a node check the annotations left
// open: the NodePort (the backend port may be the Service port, under DSR)
// or, for externalTrafficPolicy Local, the healthCheckNodePort.
func (t *translator) nodeHealth(h lb.HealthCheck, p corev1.ServicePort, svc *corev1.Service, local bool) lb.HealthCheck {
	if h.Type == lb.HealthNone || h.Port != 0 {
		return h
	}
	if local && h.Type == lb.HealthHTTP && svc.Spec.HealthCheckNodePort != 0 {
		h.Port = uint16(svc.Spec.HealthCheckNodePort)
	} else if p.NodePort != 0 {
		h.Port = uint16(p.NodePort)
	}
	return h
}

// nodeBackends: every eligible Node with an address of the family. For
// externalTrafficPolicy Local, a Node without a ready local endpoint
// drains at once (its established flows stay, it gets no new one); it is
// still probed, so when a pod lands on it, it takes traffic once its
// healthCheckNodePort says so.
func nodeBackends(p corev1.ServicePort, v6 bool, nodes []node, local bool, eps []*discoveryv1.EndpointSlice, samePort bool) []lb.Backend {
	var ready map[string]bool
	if local {
		ready = localEndpoints(eps)
	}
	port := uint16(p.NodePort)
	if samePort {
		port = uint16(p.Port)
	}
	var out []lb.Backend
	for _, n := range nodes {
		a, ok := n.addr(v6)
		if !ok {
			continue
		}
		b := lb.Backend{Addr: netip.AddrPortFrom(a, port), Weight: n.weight, State: lb.Active}
		if local && !ready[n.name] {
			b.State = lb.Draining
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b lb.Backend) int { return a.Addr.Compare(b.Addr) })
	return out
}

// localEndpoints are the Nodes with a ready endpoint of the Service.
func localEndpoints(eps []*discoveryv1.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, s := range eps {
		for _, e := range s.Endpoints {
			if e.NodeName != nil && isTrue(e.Conditions.Ready) {
				out[*e.NodeName] = true
			}
		}
	}
	return out
}

// isTrue reads an endpoint condition; unset means true (the API says a
// consumer must treat an unknown ready state as ready).
func isTrue(b *bool) bool { return b == nil || *b }

// podBackends are the ready endpoints at the port named like the Service
// port; when none is ready, the serving ones that are terminating, so that
// a rollout's last pods keep answering until replacements are ready.
func podBackends(p corev1.ServicePort, v6 bool, eps []*discoveryv1.EndpointSlice) []lb.Backend {
	want := discoveryv1.AddressTypeIPv4
	if v6 {
		want = discoveryv1.AddressTypeIPv6
	}
	proto := p.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	var ready, terminating []lb.Backend
	seen := map[netip.AddrPort]bool{}
	for _, s := range eps {
		if s.AddressType != want {
			continue
		}
		var port int32
		for _, sp := range s.Ports {
			name, sproto := "", corev1.ProtocolTCP
			if sp.Name != nil {
				name = *sp.Name
			}
			if sp.Protocol != nil {
				sproto = *sp.Protocol
			}
			if name == p.Name && sproto == proto && sp.Port != nil {
				port = *sp.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				continue
			}
			ap := netip.AddrPortFrom(a.Unmap(), uint16(port))
			if seen[ap] {
				continue
			}
			b := lb.Backend{Addr: ap, Weight: lb.DefaultWeight, State: lb.Active}
			switch {
			case isTrue(e.Conditions.Ready) && !isSet(e.Conditions.Terminating):
				seen[ap] = true
				ready = append(ready, b)
			case isTrue(e.Conditions.Serving) && isSet(e.Conditions.Terminating):
				seen[ap] = true
				terminating = append(terminating, b)
			}
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	slices.SortFunc(out, func(a, b lb.Backend) int { return a.Addr.Compare(b.Addr) })
	return out
}

func isSet(b *bool) bool { return b != nil && *b }

func portName(p corev1.ServicePort) string {
	if p.Name != "" {
		return strconv.Quote(p.Name)
	}
	return strconv.Itoa(int(p.Port))
}

// serviceName names the lb.Service of one frontend of a Kubernetes Service:
// namespace.name.port-protocol, -v6 for an IPv6 VIP. A name longer than the
// 63 characters allowed keeps its start and ends in a hash of the whole.
func serviceName(k key, p corev1.ServicePort, vip netip.Addr) string {
	proto := strings.ToLower(string(p.Protocol))
	if proto == "" {
		proto = "tcp"
	}
	n := fmt.Sprintf("%s.%s.%d-%s", k.ns, k.name, p.Port, proto)
	if vip.Is6() {
		n += "-v6"
	}
	if len(n) <= 63 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return n[:50] + "-" + hex.EncodeToString(sum[:])[:12]
}
