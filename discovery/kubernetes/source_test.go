// SPDX-License-Identifier: Apache-2.0

package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/discovery/kubernetes/kubetest"
	"github.com/l4lb/l4lb/internal/discoverytest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// waitTimeout bounds every wait for the source or the apiserver; a busy
// machine is slow, but nothing here should take this long.
const waitTimeout = 60 * time.Second

var testDefaults = lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251}

func testLog(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("test", t.Name())
}

// cluster starts an apiserver with the RBAC manifest applied, and returns
// it with a kubeconfig that has exactly those rights.
func cluster(t *testing.T) (*kubetest.Cluster, string) {
	c := kubetest.Start(t)
	c.Apply(filepath.Join("..", "..", "etc", "kubernetes", "rbac.yaml"))
	return c, c.Kubeconfig("kube-system", "l4lb")
}

func sourceConfig(kubeconfig, lease string, selector map[string]string) *config.Kubernetes {
	return &config.Kubernetes{
		Kubeconfig: kubeconfig, LoadBalancerClass: "l4lb.io/l4lb", NodeSelector: selector,
		Pools:      []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/120")},
		NamedPools: map[string][]netip.Prefix{"gold": {netip.MustParsePrefix("198.51.100.0/29")}},
		Backends:   config.K8sNodePort, QPS: 100, Burst: 200, LeaseNamespace: "kube-system", LeaseName: lease,
		Health: config.K8sHealth{Cluster: config.ClusterCheckNodePort, KubeProxyPort: 10256, Pod: lb.HealthTCP,
			Interval: 5 * time.Second, Timeout: 2 * time.Second, Rise: 2, Fall: 3},
	}
}

// harness runs one Source and keeps its latest snapshot.
type harness struct {
	t    *testing.T
	src  *kubernetes.Source
	ch   chan discovery.Snapshot
	stop context.CancelFunc
	done chan struct{}

	mu    sync.Mutex
	last  []lb.Service
	count int
	wake  chan struct{}
}

// runSource runs a source and keeps, of its snapshots, the services of
// namespace ns: the subtests share one cluster.
func runSource(t *testing.T, cfg *config.Kubernetes, identity, ns string, tune ...func(*kubernetes.Options)) *harness {
	t.Helper()
	opts := kubernetes.Options{
		Defaults: testDefaults, Log: testLog(t), Identity: identity, ProbeInterval: 500 * time.Millisecond,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
	}
	for _, f := range tune {
		f(&opts)
	}
	src, err := kubernetes.New(cfg, opts)
	if err != nil {
		t.Fatalf("kubernetes.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, src: src, ch: make(chan discovery.Snapshot), stop: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go func() {
		defer close(h.done)
		if err := src.Run(ctx, h.ch); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	go func() {
		for {
			select {
			case snap := <-h.ch:
				var mine []lb.Service
				for _, s := range snap.Services {
					if strings.HasPrefix(s.Name, ns+".") {
						mine = append(mine, s)
					}
				}
				h.mu.Lock()
				h.last, h.count = mine, h.count+1
				h.mu.Unlock()
				select {
				case h.wake <- struct{}{}:
				default:
				}
			case <-h.done:
				return
			}
		}
	}()
	t.Cleanup(h.Stop)
	return h
}

// Stop ends Run and waits for it.
func (h *harness) Stop() {
	h.stop()
	select {
	case <-h.done:
	case <-time.After(waitTimeout):
		h.t.Errorf("Run did not return %v after its context ended", waitTimeout)
	}
}

func (h *harness) snapshot() ([]lb.Service, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last, h.count
}

// waitFor waits until the latest snapshot satisfies ok.
func (h *harness) waitFor(what string, ok func([]lb.Service) bool) []lb.Service {
	h.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		svcs, n := h.snapshot()
		if n > 0 && ok(svcs) {
			return svcs
		}
		select {
		case <-h.wake:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; last snapshot:\n%s", what, discoverytest.Dump(svcs))
		}
	}
}

// program tells the source that the datapath holds every frontend of its
// latest snapshot, as the daemon does after a pass; but the frontends of
// the Services named in refused, as a datapath that refused them would.
func (h *harness) program(refused ...string) {
	svcs, _ := h.snapshot()
	var fes []lb.Frontend
	for _, s := range svcs {
		if !slices.ContainsFunc(refused, func(r string) bool { return strings.HasPrefix(s.Name, r) }) {
			fes = append(fes, s.Frontend)
		}
	}
	h.src.SetProgrammed(fes)
}

func addrs(bs []lb.Backend, state lb.BackendState) string {
	var out []string
	for _, b := range bs {
		if b.State == state {
			out = append(out, b.Addr.Addr().String())
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

type svcOpt func(*corev1.Service)

func createService(t *testing.T, c *kubetest.Cluster, ns, name string, opts ...svcOpt) *corev1.Service {
	t.Helper()
	class := "l4lb.io/l4lb"
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	out, err := c.Admin.CoreV1().Services(ns).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s/%s: %v", ns, name, err)
	}
	return out
}

func namespace(t *testing.T, c *kubetest.Cluster, name string) string {
	t.Helper()
	_, err := c.Admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func getService(t *testing.T, c *kubetest.Cluster, ns, name string) (*corev1.Service, bool) {
	t.Helper()
	s, err := c.Admin.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return s, true
}

// eventually polls cond (reading the apiserver) until it holds.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func update(t *testing.T, c *kubetest.Cluster, ns, name string, f func(*corev1.Service)) {
	t.Helper()
	for range 20 {
		s, ok := getService(t, c, ns, name)
		if !ok {
			t.Fatalf("Service %s/%s is gone", ns, name)
		}
		f(s)
		_, err := c.Admin.CoreV1().Services(ns).Update(context.Background(), s, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatalf("update Service %s/%s: %v", ns, name, err)
		}
	}
	t.Fatalf("update Service %s/%s: conflicts all the time", ns, name)
}

func condition(s *corev1.Service) *metav1.Condition {
	return meta.FindStatusCondition(s.Status.Conditions, kubernetes.ConditionProgrammed)
}

func ingressIPs(s *corev1.Service) string {
	var out []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		mode := ""
		if in.IPMode != nil {
			mode = string(*in.IPMode)
		}
		out = append(out, in.IP+"/"+mode)
	}
	return strings.Join(out, ",")
}

func events(t *testing.T, c *kubetest.Cluster, ns, name string) []string {
	t.Helper()
	list, err := c.Admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Type+" "+e.Reason+": "+e.Message)
		}
	}
	return out
}

// TestAgainstAPIServer runs the source against one real apiserver; the
// subtests use their own namespaces, node labels and Leases, and the
// outage comes last because it stops the apiserver.
func TestAgainstAPIServer(t *testing.T) {
	c, kc := cluster(t)
	t.Run("ServeAndWriteBack", func(t *testing.T) { testServeAndWriteBack(t, c, kc) })
	t.Run("RestartReassignsNothing", func(t *testing.T) { testRestartReassignsNothing(t, c, kc) })
	t.Run("ExcludeLabel", func(t *testing.T) { testExcludeLabel(t, c, kc) })
	t.Run("LocalFollowsPodMove", func(t *testing.T) { testLocalFollowsPodMove(t, c, kc) })
	t.Run("InvalidAnnotation", func(t *testing.T) { testInvalidAnnotation(t, c, kc) })
	t.Run("StatusFollowsEndpoints", func(t *testing.T) { testStatusFollowsEndpoints(t, c, kc) })
	t.Run("OneWriter", func(t *testing.T) { testOneWriter(t, c, kc) })
	t.Run("FollowerReportsItsDatapath", func(t *testing.T) { testFollowerReports(t, c, kc) })
	t.Run("PropagationLatency", func(t *testing.T) { testPropagationLatency(t, c, kc) })
	t.Run("FailStatic", func(t *testing.T) { testFailStatic(t, c, kc) })
}

func testServeAndWriteBack(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "basic")
	sel := map[string]string{"l4lb-test": "basic"}
	c.AddNode("basic-1", sel, netip.MustParseAddr("10.1.0.1"))
	c.AddNode("basic-2", sel, netip.MustParseAddr("10.1.0.2"))
	web := createService(t, c, ns, "web")
	createService(t, c, ns, "classless", func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil })
	createService(t, c, ns, "theirs", func(s *corev1.Service) { cl := "example.com/other"; s.Spec.LoadBalancerClass = &cl })

	h := runSource(t, sourceConfig(kc, "basic", sel), "basic-box", ns)
	svcs := h.waitFor("web", func(svcs []lb.Service) bool { _, ok := discoverytest.Find(svcs, "basic.web.80-tcp"); return ok })
	if len(svcs) != 1 {
		t.Fatalf("published %d services, want only web (class-less and other-class ones untouched):\n%s", len(svcs), discoverytest.Dump(svcs))
	}
	s := svcs[0]
	np := web.Spec.Ports[0].NodePort
	want := fmt.Sprintf("192.0.2.1:80/tcp -> 10.1.0.1:%d 10.1.0.2:%d", np, np)
	got := fmt.Sprintf("%s -> %s %s", s.Frontend, s.Backends[0].Addr, s.Backends[1].Addr)
	if len(s.Backends) != 2 || got != want {
		t.Fatalf("got %s, want %s (the apiserver allocated nodePort %d)", got, want, np)
	}
	if s.Health.Type != lb.HealthTCP || s.Health.Port != uint16(np) {
		t.Errorf("health %+v, want TCP to the NodePort", s.Health)
	}

	// Nothing is written back before the datapath holds it.
	time.Sleep(time.Second)
	if cur, _ := getService(t, c, ns, "web"); len(cur.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("ingress %s written before the datapath held the VIP", ingressIPs(cur))
	}
	h.program()
	eventually(t, "web's status", func() (bool, string) {
		cur, _ := getService(t, c, ns, "web")
		cond := condition(cur)
		ok := ingressIPs(cur) == "192.0.2.1/VIP" && cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == "Programmed" &&
			slices.Contains(cur.Finalizers, kubernetes.Finalizer)
		return ok, fmt.Sprintf("ingress %q condition %+v finalizers %v", ingressIPs(cur), cond, cur.Finalizers)
	})
	cur, _ := getService(t, c, ns, "web")
	if p := cur.Status.LoadBalancer.Ingress[0].Ports; len(p) != 1 || p[0].Port != 80 || p[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("ingress ports %+v, want 80/TCP", p)
	}
	managed := false
	for _, mf := range cur.ManagedFields {
		managed = managed || (mf.Manager == kubernetes.FieldManager && mf.Subresource == "status")
	}
	if !managed {
		t.Errorf("status not written by field manager %q: %+v", kubernetes.FieldManager, cur.ManagedFields)
	}
	eventually(t, "a Programmed event", func() (bool, string) {
		ev := events(t, c, ns, "web")
		return slices.ContainsFunc(ev, func(e string) bool { return strings.HasPrefix(e, "Normal Programmed") }), fmt.Sprint(ev)
	})
	for _, name := range []string{"classless", "theirs"} {
		o, _ := getService(t, c, ns, name)
		if len(o.Finalizers) > 0 || len(o.Status.LoadBalancer.Ingress) > 0 || len(o.Status.Conditions) > 0 {
			t.Errorf("%s was touched: finalizers %v status %+v", name, o.Finalizers, o.Status)
		}
	}

	// A deleted Service leaves the snapshot at once, but is released, and
	// its VIP free for another Service, only once the datapath dropped it.
	if err := c.Admin.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("web gone", func(svcs []lb.Service) bool { return len(svcs) == 0 })
	createService(t, c, ns, "next")
	svcs = h.waitFor("next", func(svcs []lb.Service) bool { _, ok := discoverytest.Find(svcs, "basic.next.80-tcp"); return ok })
	if s, _ := discoverytest.Find(svcs, "basic.next.80-tcp"); s.Frontend.Addr.String() != "192.0.2.2" {
		t.Errorf("next got %s while the deleted web's 192.0.2.1 was still in the datapath, want 192.0.2.2", s.Frontend.Addr)
	}
	time.Sleep(time.Second)
	if _, ok := getService(t, c, ns, "web"); !ok {
		t.Fatal("web was released while the datapath still held its VIP")
	}
	h.program() // the datapath holds next, no longer web
	eventually(t, "web released", func() (bool, string) { _, ok := getService(t, c, ns, "web"); return !ok, "still there" })
	createService(t, c, ns, "after")
	h.waitFor("after on the freed 192.0.2.1", func(svcs []lb.Service) bool {
		s, ok := discoverytest.Find(svcs, "basic.after.80-tcp")
		return ok && s.Frontend.Addr.String() == "192.0.2.1"
	})
}

func testRestartReassignsNothing(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "restart")
	sel := map[string]string{"l4lb-test": "restart"}
	c.AddNode("restart-1", sel, netip.MustParseAddr("10.2.0.1"))
	cfg := sourceConfig(kc, "restart", sel)
	for _, n := range []string{"s1", "s2", "s3"} {
		createService(t, c, ns, n)
	}
	h := runSource(t, cfg, "restart-box", ns)
	h.waitFor("three services", func(svcs []lb.Service) bool { return len(svcs) == 3 })
	h.program()
	vips := map[string]string{}
	eventually(t, "status of all three", func() (bool, string) {
		for _, n := range []string{"s1", "s2", "s3"} {
			s, _ := getService(t, c, ns, n)
			if len(s.Status.LoadBalancer.Ingress) == 0 {
				return false, n + " has no ingress"
			}
			vips[n] = s.Status.LoadBalancer.Ingress[0].IP
		}
		return true, ""
	})
	h.Stop()

	// While no box runs: the oldest Service goes (freeing the lowest
	// address), a new one comes. A restarted box must keep s2 and s3 where
	// they are and give the new one the free address.
	if err := c.Admin.CoreV1().Services(ns).Delete(context.Background(), "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// s1 still carries the finalizer of the stopped box: release it by
	// hand, as the operator of a box that is gone for good would.
	update(t, c, ns, "s1", func(s *corev1.Service) { s.Finalizers = nil })
	createService(t, c, ns, "s4")
	h2 := runSource(t, cfg, "restart-box-2", ns)
	svcs := h2.waitFor("s2, s3 and s4", func(svcs []lb.Service) bool { return len(svcs) == 3 })
	for _, s := range svcs {
		want := vips[strings.Split(s.Name, ".")[1]]
		if strings.HasPrefix(s.Name, "restart.s4") {
			want = vips["s1"]
		}
		if s.Frontend.Addr.String() != want {
			t.Errorf("%s: VIP %s after the restart, want %s", s.Name, s.Frontend.Addr, want)
		}
	}
}

func testExcludeLabel(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "exclude")
	sel := map[string]string{"l4lb-test": "exclude"}
	c.AddNode("exclude-1", sel, netip.MustParseAddr("10.3.0.1"))
	n2 := c.AddNode("exclude-2", sel, netip.MustParseAddr("10.3.0.2"))
	c.AddNode("exclude-other", map[string]string{"l4lb-test": "elsewhere"}, netip.MustParseAddr("10.3.0.3"))
	createService(t, c, ns, "web")
	h := runSource(t, sourceConfig(kc, "exclude", sel), "exclude-box", ns)
	backends := func(want string) {
		t.Helper()
		h.waitFor("backends "+want, func(svcs []lb.Service) bool {
			s, ok := discoverytest.Find(svcs, "exclude.web.80-tcp")
			return ok && addrs(s.Backends, lb.Active) == want
		})
	}
	backends("10.3.0.1,10.3.0.2")
	n2.Labels["node.kubernetes.io/exclude-from-external-load-balancers"] = "true"
	if _, err := c.Admin.CoreV1().Nodes().Update(context.Background(), n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	backends("10.3.0.1")
	svcs, _ := h.snapshot()
	if s, _ := discoverytest.Find(svcs, "exclude.web.80-tcp"); addrs(s.Backends, lb.Draining) != "10.3.0.2" {
		t.Errorf("the excluded node does not drain: %s", discoverytest.Dump(svcs))
	}
	n2, _ = c.Admin.CoreV1().Nodes().Get(context.Background(), "exclude-2", metav1.GetOptions{})
	delete(n2.Labels, "node.kubernetes.io/exclude-from-external-load-balancers")
	if _, err := c.Admin.CoreV1().Nodes().Update(context.Background(), n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	backends("10.3.0.1,10.3.0.2")
}

func testLocalFollowsPodMove(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "local")
	sel := map[string]string{"l4lb-test": "local"}
	c.AddNode("local-1", sel, netip.MustParseAddr("10.4.0.1"))
	c.AddNode("local-2", sel, netip.MustParseAddr("10.4.0.2"))
	svc := createService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort")
	}
	ports := map[string]int32{"http": 8080}
	c.SetEndpoints(ns, "web", ports, kubetest.Endpoint{Addr: netip.MustParseAddr("10.244.1.5"), Node: "local-1", Ready: true, Serving: true})
	h := runSource(t, sourceConfig(kc, "local", sel), "local-box", ns)
	svcs := h.waitFor("local-1 active", func(svcs []lb.Service) bool {
		s, ok := discoverytest.Find(svcs, "local.web.80-tcp")
		return ok && addrs(s.Backends, lb.Active) == "10.4.0.1" && addrs(s.Backends, lb.Draining) == "10.4.0.2"
	})
	s, _ := discoverytest.Find(svcs, "local.web.80-tcp")
	if s.Health.Type != lb.HealthHTTP || s.Health.Port != uint16(svc.Spec.HealthCheckNodePort) || s.Health.Path != "/healthz" {
		t.Errorf("health %+v, want HTTP /healthz on healthCheckNodePort %d", s.Health, svc.Spec.HealthCheckNodePort)
	}
	// The pod moves: the old one terminates, a new one is ready on local-2.
	c.SetEndpoints(ns, "web", ports,
		kubetest.Endpoint{Addr: netip.MustParseAddr("10.244.1.5"), Node: "local-1", Serving: true, Terminating: true},
		kubetest.Endpoint{Addr: netip.MustParseAddr("10.244.2.9"), Node: "local-2", Ready: true, Serving: true})
	h.waitFor("local-2 active, local-1 draining", func(svcs []lb.Service) bool {
		s, ok := discoverytest.Find(svcs, "local.web.80-tcp")
		return ok && addrs(s.Backends, lb.Active) == "10.4.0.2" && addrs(s.Backends, lb.Draining) == "10.4.0.1"
	})
}

func testInvalidAnnotation(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "invalid")
	sel := map[string]string{"l4lb-test": "invalid"}
	c.AddNode("invalid-1", sel, netip.MustParseAddr("10.5.0.1"))
	createService(t, c, ns, "bad", func(s *corev1.Service) { s.Annotations[kubernetes.AnnotationMode] = "turbo" })
	createService(t, c, ns, "good")
	h := runSource(t, sourceConfig(kc, "invalid", sel), "invalid-box", ns)
	svcs := h.waitFor("good", func(svcs []lb.Service) bool { _, ok := discoverytest.Find(svcs, "invalid.good.80-tcp"); return ok })
	if _, ok := discoverytest.Find(svcs, "invalid.bad.80-tcp"); ok {
		t.Fatal("the Service with an invalid annotation was published")
	}
	h.program()
	eventually(t, "bad's condition", func() (bool, string) {
		s, _ := getService(t, c, ns, "bad")
		cond := condition(s)
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == "InvalidConfig" && strings.Contains(cond.Message, "l4lb.io/mode"),
			fmt.Sprintf("%+v", cond)
	})
	eventually(t, "a Warning event naming the annotation", func() (bool, string) {
		ev := events(t, c, ns, "bad")
		return slices.ContainsFunc(ev, func(e string) bool {
			return strings.HasPrefix(e, "Warning InvalidConfig") && strings.Contains(e, "l4lb.io/mode")
		}), fmt.Sprint(ev)
	})
	if st := h.src.Status(); !slices.ContainsFunc(st.Errors, func(e string) bool { return strings.Contains(e, "invalid/bad") }) {
		t.Errorf("status errors %q do not name invalid/bad", st.Errors)
	}
	// Fixed, it is served with the address it was given.
	update(t, c, ns, "bad", func(s *corev1.Service) { s.Annotations[kubernetes.AnnotationMode] = "snat" })
	h.waitFor("bad fixed", func(svcs []lb.Service) bool { _, ok := discoverytest.Find(svcs, "invalid.bad.80-tcp"); return ok })
}

func testOneWriter(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "fleet")
	sel := map[string]string{"l4lb-test": "fleet"}
	c.AddNode("fleet-1", sel, netip.MustParseAddr("10.6.0.1"))
	for _, n := range []string{"a", "b", "c"} {
		createService(t, c, ns, n)
	}
	cfg := sourceConfig(kc, "fleet", sel)
	boxes := []*harness{runSource(t, cfg, "box-1", ns), runSource(t, cfg, "box-2", ns)}
	var snaps [2][]lb.Service
	for i, h := range boxes {
		snaps[i] = h.waitFor("three services", func(svcs []lb.Service) bool { return len(svcs) == 3 })
		h.program()
	}
	if discoverytest.Dump(snaps[0]) != discoverytest.Dump(snaps[1]) {
		t.Errorf("the boxes disagree:\n%s\nvs\n%s", discoverytest.Dump(snaps[0]), discoverytest.Dump(snaps[1]))
	}
	leaders := func() []int {
		var out []int
		for i, h := range boxes {
			if h.src.Status().Leader {
				out = append(out, i)
			}
		}
		return out
	}
	eventually(t, "one leader", func() (bool, string) { l := leaders(); return len(l) == 1, fmt.Sprint(l) })
	eventually(t, "status of all three", func() (bool, string) {
		for _, n := range []string{"a", "b", "c"} {
			if s, _ := getService(t, c, ns, n); len(s.Status.LoadBalancer.Ingress) == 0 {
				return false, n
			}
		}
		return true, ""
	})
	// Both boxes keep running and translating: if they fought, the
	// status would keep changing. It must stay as it is.
	before := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		s, _ := getService(t, c, ns, n)
		before[n] = s.ResourceVersion
	}
	time.Sleep(3 * time.Second)
	for _, n := range []string{"a", "b", "c"} {
		if s, _ := getService(t, c, ns, n); s.ResourceVersion != before[n] {
			t.Errorf("Service %s was written again without a change (resourceVersion %s -> %s)", n, before[n], s.ResourceVersion)
		}
	}
	if l := leaders(); len(l) != 1 || len(leaders()) != 1 {
		t.Fatalf("leaders %v", l)
	}
	// The writer goes; the other box takes over and writes.
	l := leaders()[0]
	boxes[l].Stop()
	other := boxes[1-l]
	eventually(t, "the other box leads", func() (bool, string) { return other.src.Status().Leader, "" })
	createService(t, c, ns, "d")
	other.waitFor("d", func(svcs []lb.Service) bool { return len(svcs) == 4 })
	other.program()
	eventually(t, "d's status from the new writer", func() (bool, string) {
		s, _ := getService(t, c, ns, "d")
		return len(s.Status.LoadBalancer.Ingress) == 1, ingressIPs(s)
	})
}

// testFollowerReports: a box that does not hold the Lease, and whose
// datapath lacks a Service the holder serves, says so in an Event naming
// itself after the grace period, without touching status; and says so
// again when its datapath holds the Service.
func testFollowerReports(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "follower")
	sel := map[string]string{"l4lb-test": "follower"}
	c.AddNode("follower-1", sel, netip.MustParseAddr("10.7.0.1"))
	createService(t, c, ns, "a")
	createService(t, c, ns, "b")
	cfg := sourceConfig(kc, "follower", sel)
	const grace = time.Second
	quick := func(o *kubernetes.Options) { o.BoxReportGrace = grace }
	first := runSource(t, cfg, "box-1", ns, quick)
	first.waitFor("two services", func(svcs []lb.Service) bool { return len(svcs) == 2 })
	first.program()
	eventually(t, "box-1 leads", func() (bool, string) { return first.src.Status().Leader, "" })
	eventually(t, "b programmed", func() (bool, string) {
		s, _ := getService(t, c, ns, "b")
		cond := condition(s)
		return cond != nil && cond.Status == metav1.ConditionTrue, fmt.Sprint(cond)
	})
	second := runSource(t, cfg, "box-2", ns, quick)
	second.waitFor("two services", func(svcs []lb.Service) bool { return len(svcs) == 2 })
	second.program(ns + ".b")
	b, _ := getService(t, c, ns, "b")
	missing := func(e string) bool {
		return strings.HasPrefix(e, "Warning "+kubernetes.ReasonNotProgrammedOnBox+": box box-2: ")
	}
	eventually(t, "box-2's Warning on b", func() (bool, string) {
		evs := events(t, c, ns, "b")
		return slices.ContainsFunc(evs, missing), strings.Join(evs, "\n")
	})
	for _, e := range events(t, c, ns, "a") {
		if strings.Contains(e, "OnBox") {
			t.Errorf("Service a is in both datapaths, yet: %s", e)
		}
	}
	if got, _ := getService(t, c, ns, "b"); got.ResourceVersion != b.ResourceVersion {
		t.Errorf("the follower's report wrote the Service (resourceVersion %s -> %s)", b.ResourceVersion, got.ResourceVersion)
	}
	if first.src.Status().Leader == second.src.Status().Leader {
		t.Fatalf("leaders: box-1 %v, box-2 %v", first.src.Status().Leader, second.src.Status().Leader)
	}
	second.program()
	eventually(t, "box-2's Normal on b", func() (bool, string) {
		evs := events(t, c, ns, "b")
		return slices.Contains(evs, "Normal "+kubernetes.ReasonProgrammedOnBox+": box box-2: the Service's VIPs are in this box's datapath again"), strings.Join(evs, "\n")
	})
	n := 0
	for _, e := range events(t, c, ns, "b") {
		if missing(e) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d NotProgrammedOnBox Events for one episode, want 1", n)
	}
}

func testFailStatic(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "outage")
	sel := map[string]string{"l4lb-test": "outage"}
	c.AddNode("outage-1", sel, netip.MustParseAddr("10.7.0.1"))
	createService(t, c, ns, "web")
	h := runSource(t, sourceConfig(kc, "outage", sel), "outage-box", ns)
	before := h.waitFor("web", func(svcs []lb.Service) bool { return len(svcs) == 1 })
	if st := h.src.Status(); !st.Healthy {
		t.Fatalf("status before the outage: %+v", st)
	}
	// Changes the source cannot see while its apiserver is down are made
	// through a second apiserver on the same etcd, as in a cluster with
	// several: they must arrive with the resync.
	second := c.SecondAPIServer()
	class := "l4lb.io/l4lb"
	ctx := context.Background()

	var failTimes, readyTimes, healthyTimes, diffTimes []time.Duration
	const rounds = 3
	for round := range rounds {
		_, count := h.snapshot()
		start := time.Now()
		c.KillAPIServer()
		for h.src.Status().Healthy {
			if time.Since(start) > waitTimeout {
				t.Fatal("the source still says healthy a minute into the outage")
			}
			time.Sleep(10 * time.Millisecond)
		}
		failTimes = append(failTimes, time.Since(start))

		during := fmt.Sprintf("during-%d", round)
		if _, err := second.Admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: during},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if round == rounds-1 {
			if err := second.Admin.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Second)
		st := h.src.Status()
		if st.Healthy || st.Error == "" || st.Staleness(time.Now()) < time.Second {
			t.Errorf("round %d: status during the outage %+v: want unhealthy, an error, growing staleness", round, st)
		}
		if svcs, n := h.snapshot(); n != count || discoverytest.Dump(svcs) != discoverytest.Dump(before) {
			t.Fatalf("round %d: the source published during the outage (fail static means it keeps the last snapshot):\n%s", round, discoverytest.Dump(svcs))
		}

		back := time.Now()
		c.StartAPIServer()
		readyTimes = append(readyTimes, time.Since(back))
		for !h.src.Status().Healthy {
			if time.Since(back) > waitTimeout {
				t.Fatalf("round %d: not healthy a minute after the apiserver came back: %+v", round, h.src.Status())
			}
			time.Sleep(10 * time.Millisecond)
		}
		healthyTimes = append(healthyTimes, time.Since(back))
		before = h.waitFor(during+" after the resync", func(svcs []lb.Service) bool {
			_, ok := discoverytest.Find(svcs, "outage."+during+".80-tcp")
			_, web := discoverytest.Find(svcs, "outage.web.80-tcp")
			return ok && web == (round < rounds-1)
		})
		diffTimes = append(diffTimes, time.Since(back))
	}
	median := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2].Round(time.Millisecond) }
	t.Logf("over %d outages: apiserver killed -> source failing static (stale in status): median %v, all %v", rounds, median(failTimes), failTimes)
	t.Logf("  apiserver started again -> its /readyz answers 200:           median %v, all %v", median(readyTimes), readyTimes)
	t.Logf("  apiserver started again -> source resynced (healthy):         median %v, all %v", median(healthyTimes), healthyTimes)
	t.Logf("  apiserver started again -> the outage's changes published:    median %v, all %v", median(diffTimes), diffTimes)

	// After the resync, changes flow again.
	createService(t, c, ns, "after")
	h.waitFor("the Service created after the outage", func(svcs []lb.Service) bool { return len(svcs) == rounds+1 })
}

// testStatusFollowsEndpoints: the status writer looks again at the Service
// of an EndpointSlice event (only that Service is marked, not all), so
// its condition follows its endpoints: NoBackends when the last pod goes,
// Programmed when one comes back; the other Service's status stays.
func testStatusFollowsEndpoints(t *testing.T, c *kubetest.Cluster, kc string) {
	ns := namespace(t, c, "follow")
	sel := map[string]string{"l4lb-test": "follow"}
	c.AddNode("follow-1", sel, netip.MustParseAddr("10.9.0.1"))
	pods := func(s *corev1.Service) { s.Annotations[kubernetes.AnnotationBackends] = "pod" }
	createService(t, c, ns, "web", pods)
	createService(t, c, ns, "other", pods)
	ports := map[string]int32{"http": 8080}
	pod := kubetest.Endpoint{Addr: netip.MustParseAddr("10.244.9.1"), Node: "follow-1", Ready: true, Serving: true}
	c.SetEndpoints(ns, "web", ports, pod)
	c.SetEndpoints(ns, "other", ports, pod)

	h := runSource(t, sourceConfig(kc, "follow", sel), "follow-box", ns)
	h.waitFor("both services", func(svcs []lb.Service) bool { return len(svcs) == 2 })
	h.program()
	reason := func(name string) string {
		s, ok := getService(t, c, ns, name)
		if !ok || condition(s) == nil {
			return ""
		}
		return condition(s).Reason
	}
	wait := func(want string) {
		t.Helper()
		eventually(t, "web's condition "+want, func() (bool, string) {
			return reason("web") == want, "web " + reason("web") + ", other " + reason("other")
		})
		if reason("other") != kubernetes.ReasonProgrammed {
			t.Errorf("other's condition is %q, want %s", reason("other"), kubernetes.ReasonProgrammed)
		}
	}
	wait(kubernetes.ReasonProgrammed)
	c.SetEndpoints(ns, "web", ports)
	wait(kubernetes.ReasonNoBackends)
	c.SetEndpoints(ns, "web", ports, pod)
	wait(kubernetes.ReasonProgrammed)
}
