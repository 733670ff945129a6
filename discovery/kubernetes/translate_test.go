// SPDX-License-Identifier: Apache-2.0

package kubernetes

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// These tests drive the translation with API objects built in code: it is
// a pure function of them. The source's tests run it against a real
// apiserver.

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testCfg() config.Kubernetes {
	return config.Kubernetes{
		LoadBalancerClass: "l4lb.io/l4lb",
		Pools:             []netip.Prefix{netip.MustParsePrefix("192.0.2.0/29"), netip.MustParsePrefix("2001:db8::/126")},
		NamedPools:        map[string][]netip.Prefix{"gold": {netip.MustParsePrefix("198.51.100.8/30")}},
		Health: config.K8sHealth{Cluster: config.ClusterCheckNodePort, KubeProxyPort: 10256, Pod: lb.HealthTCP,
			Interval: 5 * time.Second, Timeout: 2 * time.Second, Rise: 2, Fall: 3},
	}
}

type svcOpt func(*corev1.Service)

func lbSvc(ns, name string, age int, opts ...svcOpt) *corev1.Service {
	class := "l4lb.io/l4lb"
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(age) * time.Minute)), Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func ann(k, v string) svcOpt { return func(s *corev1.Service) { s.Annotations[k] = v } }
func noClass() svcOpt        { return func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil } }
func class(c string) svcOpt  { return func(s *corev1.Service) { s.Spec.LoadBalancerClass = &c } }
func status(ip string) svcOpt {
	return func(s *corev1.Service) {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
}
func deleted(finalizer string) svcOpt {
	return func(s *corev1.Service) {
		now := metav1.NewTime(epoch.Add(time.Hour))
		s.DeletionTimestamp = &now
		s.Finalizers = append(s.Finalizers, finalizer)
	}
}
func local(hcPort int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = hcPort
	}
}
func dual() svcOpt {
	return func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
}

func testNode(name string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.99"})
	return n
}

func translateAll(cfg config.Kubernetes, allocate bool, svcs []*corev1.Service, nodes []*corev1.Node, eps ...*discoveryv1.EndpointSlice) result {
	w := world{services: svcs, nodes: nodes, slices: map[key][]*discoveryv1.EndpointSlice{}}
	for _, e := range eps {
		k := key{e.Namespace, e.Labels[labelServiceName]}
		w.slices[k] = append(w.slices[k], e)
	}
	t := translator{cfg: cfg, defaults: lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251}, allocate: allocate}
	return t.translate(w)
}

func vipsOf(r result, ns, name string) string {
	o := r.outcomes[key{ns, name}]
	if o == nil {
		return "<not served>"
	}
	return joinAddrs(o.vips)
}

func TestVIPChoice(t *testing.T) {
	nodes := []*corev1.Node{testNode("n1", "10.0.0.1")}
	tests := []struct {
		name     string
		svcs     []*corev1.Service
		allocate bool
		want     map[string]string // service name -> VIPs
		reasons  map[string]string
	}{
		{
			name:     "lowest free address, oldest Service first, network address skipped",
			svcs:     []*corev1.Service{lbSvc("a", "new", 2), lbSvc("a", "old", 1)},
			allocate: true,
			want:     map[string]string{"old": "192.0.2.1", "new": "192.0.2.2"},
		},
		{
			name:     "status is kept, even when a lower address is free",
			svcs:     []*corev1.Service{lbSvc("a", "old", 1), lbSvc("a", "restarted", 2, status("192.0.2.5"))},
			allocate: true,
			want:     map[string]string{"old": "192.0.2.1", "restarted": "192.0.2.5"},
		},
		{
			name:     "a status address outside every pool is not adopted",
			svcs:     []*corev1.Service{lbSvc("a", "s", 1, status("203.0.113.5"))},
			allocate: true,
			want:     map[string]string{"s": "192.0.2.1"},
		},
		{
			name: "a request never moves the Service that has the address",
			svcs: []*corev1.Service{
				lbSvc("a", "asker", 1, ann(AnnotationIPs, "192.0.2.3")),
				lbSvc("a", "holder", 2, status("192.0.2.3")),
			},
			allocate: true,
			want:     map[string]string{"asker": "", "holder": "192.0.2.3"},
			reasons:  map[string]string{"asker": ReasonIPConflict},
		},
		{
			name:     "a new request moves the Service off its old address",
			svcs:     []*corev1.Service{lbSvc("a", "s", 1, status("192.0.2.5"), ann(AnnotationIPs, "192.0.2.4"))},
			allocate: true,
			want:     map[string]string{"s": "192.0.2.4"},
		},
		{
			name: "an unreadable request refuses the Service, which keeps its address",
			svcs: []*corev1.Service{
				lbSvc("a", "typo", 1, status("192.0.2.1"), ann(AnnotationIPs, "192.0.2.x")),
				lbSvc("a", "new", 2),
			},
			allocate: true,
			want:     map[string]string{"typo": "192.0.2.1", "new": "192.0.2.2"},
			reasons:  map[string]string{"typo": ReasonInvalidConfig},
		},
		{
			name: "a deleted Service keeps its address until its finalizer is released",
			svcs: []*corev1.Service{
				lbSvc("a", "gone", 1, status("192.0.2.1"), deleted(Finalizer)),
				lbSvc("a", "asker", 2, ann(AnnotationIPs, "192.0.2.1")),
				lbSvc("a", "new", 3),
			},
			allocate: true,
			want:     map[string]string{"gone": "<not served>", "asker": "", "new": "192.0.2.2"},
			reasons:  map[string]string{"asker": ReasonIPConflict},
		},
		{
			name: "a deleted Service without our finalizer holds nothing",
			svcs: []*corev1.Service{
				lbSvc("a", "gone", 1, status("192.0.2.1"), deleted("example.com/other")),
				lbSvc("a", "new", 2),
			},
			allocate: true,
			want:     map[string]string{"gone": "<not served>", "new": "192.0.2.1"},
		},
		{
			name:     "no allocation before the first full list",
			svcs:     []*corev1.Service{lbSvc("a", "new", 1), lbSvc("a", "had", 2, status("192.0.2.6"))},
			allocate: false,
			want:     map[string]string{"new": "", "had": "192.0.2.6"},
			reasons:  map[string]string{"new": ReasonNoPool},
		},
		{
			name:     "a requested address outside the pools is refused",
			svcs:     []*corev1.Service{func() *corev1.Service { s := lbSvc("a", "s", 1); s.Spec.LoadBalancerIP = "203.0.113.1"; return s }()},
			allocate: true,
			want:     map[string]string{"s": ""},
			reasons:  map[string]string{"s": ReasonNoPool},
		},
		{
			name: "two Services asking for one address without a sharing key",
			svcs: []*corev1.Service{
				lbSvc("a", "first", 1, ann(AnnotationIPs, "192.0.2.4")),
				lbSvc("a", "second", 2, ann(AnnotationIPs, "192.0.2.4")),
			},
			allocate: true,
			want:     map[string]string{"first": "192.0.2.4", "second": ""},
			reasons:  map[string]string{"second": ReasonIPConflict},
		},
		{
			name: "sharing key with disjoint ports shares; overlapping ports do not",
			svcs: []*corev1.Service{
				lbSvc("a", "web", 1, ann(AnnotationSharingKey, "k")),
				lbSvc("a", "dns", 2, ann(AnnotationSharingKey, "k"), func(s *corev1.Service) {
					s.Spec.Ports = []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP, NodePort: 30053}}
				}),
				lbSvc("a", "web2", 3, ann(AnnotationSharingKey, "k")),
			},
			allocate: true,
			want:     map[string]string{"web": "192.0.2.1", "dns": "192.0.2.1", "web2": "192.0.2.2"},
		},
		{
			name:     "named pool",
			svcs:     []*corev1.Service{lbSvc("a", "s", 1, ann(AnnotationPool, "gold"))},
			allocate: true,
			want:     map[string]string{"s": "198.51.100.9"},
		},
		{
			name:     "unknown pool",
			svcs:     []*corev1.Service{lbSvc("a", "s", 1, ann(AnnotationPool, "silver"))},
			allocate: true,
			want:     map[string]string{"s": ""},
			reasons:  map[string]string{"s": ReasonInvalidConfig},
		},
		{
			name:     "dual stack gets one address per family",
			svcs:     []*corev1.Service{lbSvc("a", "s", 1, dual())},
			allocate: true,
			want:     map[string]string{"s": "192.0.2.1, 2001:db8::1"},
		},
		{
			name: "pool exhausted",
			svcs: []*corev1.Service{
				lbSvc("a", "s1", 1), lbSvc("a", "s2", 2), lbSvc("a", "s3", 3), lbSvc("a", "s4", 4),
				lbSvc("a", "s5", 5), lbSvc("a", "s6", 6), lbSvc("a", "s7", 7),
			},
			allocate: true,
			want:     map[string]string{"s6": "192.0.2.6", "s7": ""},
			reasons:  map[string]string{"s7": ReasonNoPool},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := translateAll(testCfg(), tt.allocate, tt.svcs, nodes)
			for name, want := range tt.want {
				if got := vipsOf(r, "a", name); got != want {
					t.Errorf("%s: VIPs %q, want %q (%s: %s)", name, got, want, r.outcomes[key{"a", name}].reason, r.outcomes[key{"a", name}].message)
				}
			}
			for name, want := range tt.reasons {
				if got := r.outcomes[key{"a", name}].reason; got != want {
					t.Errorf("%s: reason %s, want %s (%s)", name, got, want, r.outcomes[key{"a", name}].message)
				}
			}
		})
	}
}

func TestSelection(t *testing.T) {
	nodes := []*corev1.Node{testNode("n1", "10.0.0.1")}
	svcs := []*corev1.Service{
		lbSvc("a", "ours", 1),
		lbSvc("a", "classless", 2, noClass()),
		lbSvc("a", "theirs", 3, class("example.com/other")),
		func() *corev1.Service {
			s := lbSvc("a", "clusterip", 4)
			s.Spec.Type = corev1.ServiceTypeClusterIP
			return s
		}(),
	}
	r := translateAll(testCfg(), true, svcs, nodes)
	for name, served := range map[string]bool{"ours": true, "classless": false, "theirs": false, "clusterip": false} {
		if _, ok := r.outcomes[key{"a", name}]; ok != served {
			t.Errorf("%s served = %v, want %v", name, ok, served)
		}
	}
	cfg := testCfg()
	cfg.IncludeClassless = true
	r = translateAll(cfg, true, svcs, nodes)
	for name, served := range map[string]bool{"ours": true, "classless": true, "theirs": false} {
		if _, ok := r.outcomes[key{"a", name}]; ok != served {
			t.Errorf("include_classless: %s served = %v, want %v", name, ok, served)
		}
	}
}

func backendsOf(r result, name string) []lb.Backend {
	for _, s := range r.services {
		if s.Name == name {
			return s.Backends
		}
	}
	return nil
}

func TestNodeBackends(t *testing.T) {
	excluded := testNode("excluded", "10.0.0.2")
	excluded.Labels[labelExcludeLB] = ""
	tainted := testNode("tainted", "10.0.0.3")
	tainted.Spec.Taints = []corev1.Taint{{Key: taintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}
	deleting := testNode("deleting", "10.0.0.4")
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	notReady := testNode("notready", "10.0.0.5")
	notReady.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}
	unsched := testNode("unschedulable", "10.0.0.6")
	unsched.Spec.Unschedulable = true
	heavy := testNode("heavy", "10.0.0.7", "fd00::7")
	heavy.Annotations[AnnotationWeight] = "3"
	broken := testNode("broken", "10.0.0.8")
	broken.Annotations[AnnotationWeight] = "lots"
	v6only := testNode("v6only", "fd00::9")
	nodes := []*corev1.Node{testNode("plain", "10.0.0.1"), excluded, tainted, deleting, notReady, unsched, heavy, broken, v6only}

	r := translateAll(testCfg(), true, []*corev1.Service{lbSvc("a", "web", 1)}, nodes)
	got := backendsOf(r, "a.web.80-tcp")
	want := []lb.Backend{
		{Addr: netip.MustParseAddrPort("10.0.0.1:30080"), Weight: 1},
		{Addr: netip.MustParseAddrPort("10.0.0.5:30080"), Weight: 1},
		{Addr: netip.MustParseAddrPort("10.0.0.6:30080"), Weight: 1},
		{Addr: netip.MustParseAddrPort("10.0.0.7:30080"), Weight: 3},
	}
	if !sameBackends(got, want) {
		t.Errorf("backends %v, want %v", got, want)
	}
	if len(r.problems) != 1 || !strings.Contains(r.problems[0], "node broken: annotation l4lb.io/weight") {
		t.Errorf("problems %q, want one about node broken's weight", r.problems)
	}

	cfg := testCfg()
	cfg.NodeSelector = map[string]string{"edge": "true"}
	heavy.Labels["edge"] = "true"
	r = translateAll(cfg, true, []*corev1.Service{lbSvc("a", "web", 1)}, nodes)
	if got := backendsOf(r, "a.web.80-tcp"); len(got) != 1 || got[0].Addr.Addr() != netip.MustParseAddr("10.0.0.7") {
		t.Errorf("node selector: backends %v, want only heavy", got)
	}
}

func sameBackends(a, b []lb.Backend) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func slice(ns, svc string, ports map[string]int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc + "-x", Labels: map[string]string{labelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
	}
	for name, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Port: &p})
	}
	return s
}

func ep(addr, node string, ready, serving, terminating bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
	if node != "" {
		e.NodeName = &node
	}
	return e
}

func TestLocalTrafficPolicy(t *testing.T) {
	nodes := []*corev1.Node{testNode("n1", "10.0.0.1"), testNode("n2", "10.0.0.2"), testNode("n3", "10.0.0.3")}
	svc := lbSvc("a", "web", 1, local(32000))
	for _, tt := range []struct {
		name   string
		eps    []discoveryv1.Endpoint
		active string
	}{
		{"pod on n2", []discoveryv1.Endpoint{ep("10.244.2.5", "n2", true, true, false)}, "10.0.0.2"},
		{"pod moved to n3, old one terminating", []discoveryv1.Endpoint{ep("10.244.2.5", "n2", false, true, true), ep("10.244.3.7", "n3", true, true, false)}, "10.0.0.3"},
		{"no ready pod", []discoveryv1.Endpoint{ep("10.244.3.7", "n3", false, false, false)}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := translateAll(testCfg(), true, []*corev1.Service{svc}, nodes, slice("a", "web", map[string]int32{"http": 8080}, tt.eps...))
			bs := backendsOf(r, "a.web.80-tcp")
			if len(bs) != 3 {
				t.Fatalf("backends %v: every eligible node stays a member", bs)
			}
			var active []string
			for _, b := range bs {
				if b.State == lb.Active {
					active = append(active, b.Addr.Addr().String())
				}
			}
			if strings.Join(active, ",") != tt.active {
				t.Errorf("active %v, want %q", active, tt.active)
			}
			s := r.services[0]
			if s.Health.Type != lb.HealthHTTP || s.Health.Port != 32000 || s.Health.Path != "/healthz" {
				t.Errorf("health %+v, want HTTP /healthz on the healthCheckNodePort 32000", s.Health)
			}
			if tt.active == "" && r.outcomes[key{"a", "web"}].reason != ReasonNoBackends {
				t.Errorf("reason %s, want NoBackends", r.outcomes[key{"a", "web"}].reason)
			}
		})
	}
	// Local is there to keep the client's address: SNAT loses it, which
	// the condition says; DSR keeps it and says nothing.
	eps := slice("a", "web", map[string]int32{"http": 8080}, ep("10.244.2.5", "n2", true, true, false))
	for _, tt := range []struct {
		name string
		svc  *corev1.Service
		note string
	}{
		{"snat by default", svc, "mode snat replaces the client's address"},
		{"dsr", lbSvc("a", "web", 1, local(32000), ann(AnnotationMode, "dsr")), ""},
		{"hybrid over UDP", lbSvc("a", "web", 1, local(32000), ann(AnnotationMode, "hybrid"), func(s *corev1.Service) { s.Spec.Ports[0].Protocol = corev1.ProtocolUDP }), "mode hybrid replaces the client's address with the LB box's on udp"},
		{"cluster policy", lbSvc("a", "web", 1), ""},
	} {
		r := translateAll(testCfg(), true, []*corev1.Service{tt.svc}, nodes, eps)
		o := r.outcomes[key{"a", "web"}]
		if o.reason != ReasonProgrammed || (tt.note == "") != (o.note == "") || !strings.Contains(o.note, tt.note) {
			t.Errorf("%s: reason %s note %q, want Programmed and a note with %q", tt.name, o.reason, o.note, tt.note)
		}
	}
}

func TestPodBackends(t *testing.T) {
	svc := lbSvc("a", "web", 1, ann(AnnotationBackends, "pod"))
	ports := map[string]int32{"http": 8080, "metrics": 9090}
	r := translateAll(testCfg(), true, []*corev1.Service{svc}, nil, slice("a", "web", ports,
		ep("10.244.1.1", "n1", true, true, false),
		ep("10.244.1.2", "n1", false, true, true),
		ep("10.244.1.3", "n2", false, false, false)))
	if got := backendsOf(r, "a.web.80-tcp"); len(got) != 1 || got[0].Addr != netip.MustParseAddrPort("10.244.1.1:8080") {
		t.Errorf("backends %v, want the ready endpoint at the port named http", got)
	}
	r = translateAll(testCfg(), true, []*corev1.Service{svc}, nil, slice("a", "web", ports,
		ep("10.244.1.2", "n1", false, true, true),
		ep("10.244.1.3", "n2", false, false, false)))
	if got := backendsOf(r, "a.web.80-tcp"); len(got) != 1 || got[0].Addr != netip.MustParseAddrPort("10.244.1.2:8080") {
		t.Errorf("backends %v, want the serving terminating endpoint as fallback", got)
	}
	if h := r.services[0].Health; h.Type != lb.HealthTCP || h.Port != 0 {
		t.Errorf("health %+v, want TCP to the endpoint", h)
	}
}

func TestAnnotations(t *testing.T) {
	nodes := []*corev1.Node{testNode("n1", "10.0.0.1")}
	tests := []struct {
		name    string
		opts    []svcOpt
		problem string // substring of the InvalidConfig message; "" = accepted
		check   func(t *testing.T, s lb.Service)
	}{
		{name: "mode, dispatch, table size, drain", opts: []svcOpt{ann(AnnotationMode, "dsr"), ann(AnnotationDispatch, "opt"), ann(AnnotationTableSize, "509"), ann(AnnotationDrainTimeout, "30s")},
			check: func(t *testing.T, s lb.Service) {
				if s.Mode != lb.ModeDSR || s.Dispatch != lb.DispatchOpt || s.TableSize != 509 || s.DrainTimeout != 30*time.Second {
					t.Errorf("got %+v", s)
				}
				if s.Backends[0].Addr.Port() != 30080 {
					t.Errorf("dispatch opt rewrites the port: backend %v, want the NodePort", s.Backends[0].Addr)
				}
			}},
		{name: "DSR over IPIP reaches the node at the Service port", opts: []svcOpt{ann(AnnotationMode, "dsr")},
			check: func(t *testing.T, s lb.Service) {
				if s.Backends[0].Addr.Port() != 80 || s.Health.Port != 30080 {
					t.Errorf("backend %v health port %d, want :80 and the NodePort probed", s.Backends[0].Addr, s.Health.Port)
				}
			}},
		{name: "session affinity from the spec", opts: []svcOpt{func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			to := int32(600)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &to}}
		}}, check: func(t *testing.T, s lb.Service) {
			if !s.Affinity.ClientIP || s.Affinity.Timeout != 10*time.Minute {
				t.Errorf("affinity %+v", s.Affinity)
			}
		}},
		{name: "source ranges of the VIP's family", opts: []svcOpt{func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
		}}, check: func(t *testing.T, s lb.Service) {
			if len(s.SourceRanges) != 1 || s.SourceRanges[0] != netip.MustParsePrefix("198.51.100.0/24") {
				t.Errorf("source ranges %v", s.SourceRanges)
			}
		}},
		{name: "health override", opts: []svcOpt{ann(AnnotationHealthCheck, "http"), ann(AnnotationHealthPath, "/ready"), ann(AnnotationHealthPort, "31000")},
			check: func(t *testing.T, s lb.Service) {
				if s.Health.Type != lb.HealthHTTP || s.Health.Path != "/ready" || s.Health.Port != 31000 || s.Health.Interval != 5*time.Second {
					t.Errorf("health %+v", s.Health)
				}
			}},
		{name: "health off", opts: []svcOpt{ann(AnnotationHealthCheck, "none")},
			check: func(t *testing.T, s lb.Service) {
				if s.Health.Type != lb.HealthNone {
					t.Errorf("health %+v", s.Health)
				}
			}},
		{name: "announcement", opts: []svcOpt{ann(AnnotationAnnounceMinHealthy, "2")},
			check: func(t *testing.T, s lb.Service) {
				if s.Announce != (lb.Announce{MinHealthy: 2}) {
					t.Errorf("announce %+v", s.Announce)
				}
			}},
		{name: "announcement off", opts: []svcOpt{ann(AnnotationAnnounce, "false")},
			check: func(t *testing.T, s lb.Service) {
				if !s.Announce.Off {
					t.Errorf("announce %+v", s.Announce)
				}
			}},
		{name: "announce not a boolean", opts: []svcOpt{ann(AnnotationAnnounce, "no")}, problem: "annotation l4lb.io/announce = \"no\": announce must be true or false"},
		{name: "announce threshold while off", opts: []svcOpt{ann(AnnotationAnnounce, "false"), ann(AnnotationAnnounceMinHealthy, "2")}, problem: "l4lb.io/announce / l4lb.io/announce-min-healthy: announce_min_healthy"},
		{name: "bad mode", opts: []svcOpt{ann(AnnotationMode, "fast")}, problem: `annotation l4lb.io/mode = "fast": mode: unknown mode "fast"`},
		{name: "table size not prime", opts: []svcOpt{ann(AnnotationTableSize, "1000")}, problem: "annotation l4lb.io/table-size = \"1000\""},
		{name: "table size not a number", opts: []svcOpt{ann(AnnotationTableSize, "big")}, problem: "annotation l4lb.io/table-size = \"big\": table_size must be an integer"},
		{name: "unknown annotation", opts: []svcOpt{ann("l4lb.io/mdoe", "dsr")}, problem: "annotation l4lb.io/mdoe is unknown"},
		{name: "bad source range", opts: []svcOpt{func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.1/24"} }}, problem: "spec.loadBalancerSourceRanges"},
		{name: "bad health port", opts: []svcOpt{ann(AnnotationHealthPort, "70000")}, problem: "annotation l4lb.io/health-port = \"70000\""},
		{name: "bad backends", opts: []svcOpt{ann(AnnotationBackends, "pods")}, problem: "annotation l4lb.io/backends"},
		{name: "other prefixes are not ours", opts: []svcOpt{ann("example.com/mode", "x")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svcs := []*corev1.Service{lbSvc("a", "web", 1, tt.opts...), lbSvc("a", "neighbour", 2)}
			r := translateAll(testCfg(), true, svcs, nodes)
			o := r.outcomes[key{"a", "web"}]
			if tt.problem != "" {
				if o.reason != ReasonInvalidConfig || !strings.Contains(o.message, tt.problem) {
					t.Errorf("reason %s message %q, want InvalidConfig with %q", o.reason, o.message, tt.problem)
				}
				if len(backendsOf(r, "a.web.80-tcp")) != 0 {
					t.Error("a refused Service was published")
				}
				if n := r.outcomes[key{"a", "neighbour"}]; n.reason != ReasonProgrammed {
					t.Errorf("the neighbour was refused too: %s %s", n.reason, n.message)
				}
				return
			}
			if o.reason != ReasonProgrammed {
				t.Fatalf("refused: %s %s", o.reason, o.message)
			}
			if tt.check != nil {
				for _, s := range r.services {
					if s.Name == "a.web.80-tcp" {
						tt.check(t, s)
					}
				}
			}
		})
	}
}

func TestPortsAndNames(t *testing.T) {
	svc := lbSvc("a", "web", 1, dual(), func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports,
			corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, NodePort: 30053},
			corev1.ServicePort{Name: "sig", Port: 5060, Protocol: corev1.ProtocolSCTP, NodePort: 30060})
	})
	long := lbSvc(strings.Repeat("n", 40), strings.Repeat("s", 40), 2)
	r := translateAll(testCfg(), true, []*corev1.Service{svc, long}, []*corev1.Node{testNode("n1", "10.0.0.1", "fd00::1")})
	var names []string
	for _, s := range r.services {
		names = append(names, s.Name)
		if len(s.Name) > 63 {
			t.Errorf("name %q is longer than 63", s.Name)
		}
	}
	want := "a.web.53-udp a.web.53-udp-v6 a.web.80-tcp a.web.80-tcp-v6"
	if got := strings.Join(names[:4], " "); got != want {
		t.Errorf("names %q, want %q", got, want)
	}
	if len(r.problems) != 1 || !strings.Contains(r.problems[0], `port "sig" (5060/SCTP) is not served`) {
		t.Errorf("problems %q, want the SCTP port reported", r.problems)
	}
}

func TestLingeringBackends(t *testing.T) {
	l := newLingering()
	b1, b2 := lb.Backend{Addr: netip.MustParseAddrPort("10.0.0.1:1"), Weight: 1}, lb.Backend{Addr: netip.MustParseAddrPort("10.0.0.2:1"), Weight: 1}
	svc := lb.Service{Name: "s", Backends: []lb.Backend{b1, b2}}
	defs := lb.Defaults{DrainTimeout: time.Minute}
	l.apply([]lb.Service{svc}, defs, time.Hour, epoch)
	svc.Backends = []lb.Backend{b1}
	out, next := l.apply([]lb.Service{svc}, defs, time.Hour, epoch.Add(time.Second))
	if len(out[0].Backends) != 2 || out[0].Backends[1].State != lb.Draining || !next.Equal(epoch.Add(61*time.Second)) {
		t.Fatalf("after leaving: %+v next %v, want b2 draining until +61s", out[0].Backends, next)
	}
	out, next = l.apply([]lb.Service{svc}, defs, time.Hour, epoch.Add(62*time.Second))
	if len(out[0].Backends) != 1 || !next.IsZero() {
		t.Fatalf("after the drain timeout: %+v next %v, want b2 gone", out[0].Backends, next)
	}
}
