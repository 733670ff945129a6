// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/discovery/kubernetes/kubetest"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// The second address of the Kubernetes test's pool, and the one of its
// named pool "pods".
var (
	vip4b    = netip.MustParseAddr("10.200.0.11")
	vip4pods = netip.MustParseAddr("10.200.0.12")
)

func kubernetesConfig(kubeconfig string) string {
	return fmt.Sprintf(`
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = []
bpffs          = "{{bpffs}}"

[datapath]
interfaces    = ["eth0"]
conntrack_max = 65536
max_services  = 16
max_backends  = 64

[maglev]
hash_seed  = %q
table_size = 251

[discovery.kubernetes]
kubeconfig = %q
pools      = ["10.200.0.10/31"]

[discovery.kubernetes.named_pools]
pods = ["10.200.0.12/32"]

[discovery.kubernetes.health]
interval = "200ms"
timeout  = "150ms"
rise     = 1
fall     = 2

# The announcement decision is what BGP would announce too; the VIPs are
# routed to the box statically, so nobody asks for them on the segment.
[l2]
interfaces = ["eth0"]
`, e2eSeed, kubeconfig)
}

// announced says whether l4lbd announces vip (on L2; BGP decides alike).
func announced(st api.Status, vip netip.Addr) bool {
	if st.L2 == nil {
		return false
	}
	for _, v := range st.L2.VIPs {
		if v.VIP == vip.String() {
			return v.Announced
		}
	}
	return false
}

// healthz answers kube-proxy's healthCheckNodePort question for one node:
// 200 while the node has a local endpoint, 503 otherwise.
type healthz struct{ local atomic.Bool }

func (h *healthz) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if h.local.Load() {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

func serveHealthz(t *testing.T, h *topo.Host, port int32) *healthz {
	t.Helper()
	hz := &healthz{}
	var l net.Listener
	if err := h.NS.Do(func() error {
		var err error
		l, err = net.Listen("tcp", netip.AddrPortFrom(h.Addr4, uint16(port)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: hz}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return hz
}

// spread opens n connections to dst from the client and returns the set
// of nodes that answered, sorted.
func spread(t *testing.T, tp *topo.Topology, dst netip.AddrPort, n int) string {
	t.Helper()
	seen := map[string]bool{}
	for i := range n {
		c, err := tp.Client.DialTCP(0, dst)
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, dst, err)
		}
		seen[c.Backend] = true
		c.Close()
	}
	var out []string
	for b := range seen {
		out = append(out, b)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// waitAPI polls l4lbd's admin API until ok holds.
func waitAPI(t *testing.T, d *topo.L4LBD, what string, ok func([]api.Service, api.Status) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		svcs, err1 := d.API().Services(ctx)
		st, err2 := d.API().Status(ctx)
		cancel()
		if err1 == nil && err2 == nil && ok(svcs, st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: services %+v status %+v (%v %v)\n%s", what, svcs, st.Discovery, err1, err2, tail(d.Log()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string) string {
	if len(s) > 6000 {
		return s[len(s)-6000:]
	}
	return s
}

// backendStates renders a service's backends as "addr=state/health".
func backendStates(svcs []api.Service, name string) string {
	for _, s := range svcs {
		if s.Name == name {
			var out []string
			for _, b := range s.Backends {
				out = append(out, b.Address+"="+b.State)
			}
			slices.Sort(out)
			return strings.Join(out, " ")
		}
	}
	return "<absent>"
}

func kubeStale(st api.Status) (bool, bool) {
	for _, s := range st.Discovery {
		if s.Name == kubernetes.SourceName {
			return s.Stale, true
		}
	}
	return false, false
}

// TestKubernetes runs l4lbd against a real apiserver, which runs on the LB
// box's 127.0.0.1: Nodes are the backend hosts (each serving the
// NodePort), the test plays kubelet and EndpointSlice controller, and
// traffic from the client goes through l4lbd to the nodes.
func TestKubernetes(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	lbHost := tp.LBs[0]
	c := kubetest.StartWith(t, kubetest.Options{
		Command: lbHost.NS.Command,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := lbHost.NS.Do(func() error {
				var err error
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	})
	c.Apply(filepath.Join("..", "..", "etc", "kubernetes", "rbac.yaml"))
	kc := c.Kubeconfig("kube-system", "l4lb")
	ctx := context.Background()
	nodes := map[string]*topo.Host{}
	for _, be := range tp.Backends {
		c.AddNode(be.Name, nil, be.Addr4)
		nodes[be.Name] = be
	}
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := "l4lb.io/l4lb"
	web, err := c.Admin.CoreV1().Services("e2e").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := web.Spec.Ports[0].NodePort
	for _, be := range tp.Backends {
		be.Serve(netip.AddrPortFrom(be.Addr4, uint16(nodePort)))
	}
	tp.RouteVIPs(lbHost, vip4, vip4b, vip4pods)
	dst := netip.AddrPortFrom(vip4, 80)
	const name = "e2e.web.80-tcp"

	d := lbHost.StartL4LBD(l4lbd(), kubernetesConfig(kc))
	waitAPI(t, d, "web programmed on "+dst.String(), func(svcs []api.Service, _ api.Status) bool {
		return backendStates(svcs, name) == fmt.Sprintf("10.100.0.21:%d=active 10.100.0.22:%d=active", nodePort, nodePort)
	})
	status := func(what string, ok func(*corev1.Service) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			s, err := c.Admin.CoreV1().Services("e2e").Get(ctx, "web", metav1.GetOptions{})
			if err == nil && ok(s) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v (%v)", what, s.Status, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	status("ingress and condition written back", func(s *corev1.Service) bool {
		cond := meta.FindStatusCondition(s.Status.Conditions, kubernetes.ConditionProgrammed)
		return len(s.Status.LoadBalancer.Ingress) == 1 && s.Status.LoadBalancer.Ingress[0].IP == vip4.String() &&
			cond != nil && cond.Status == metav1.ConditionTrue
	})
	if got := spread(t, tp, dst, 16); got != "be1,be2" {
		t.Errorf("eTP=Cluster: connections reached %q, want both nodes", got)
	}

	t.Run("ExcludeLabel", func(t *testing.T) {
		setLabel := func(on bool) {
			n, err := c.Admin.CoreV1().Nodes().Get(ctx, "be2", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			if on {
				n.Labels["node.kubernetes.io/exclude-from-external-load-balancers"] = ""
			} else {
				delete(n.Labels, "node.kubernetes.io/exclude-from-external-load-balancers")
			}
			if _, err := c.Admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setLabel(true)
		waitAPI(t, d, "be2 draining", func(svcs []api.Service, _ api.Status) bool {
			return strings.Contains(backendStates(svcs, name), "10.100.0.22:"+fmt.Sprint(nodePort)+"=draining")
		})
		if got := spread(t, tp, dst, 16); got != "be1" {
			t.Errorf("be2 excluded: new connections reached %q, want be1 only", got)
		}
		setLabel(false)
		waitAPI(t, d, "be2 back", func(svcs []api.Service, _ api.Status) bool {
			return !strings.Contains(backendStates(svcs, name), "draining")
		})
	})

	// eTP=Local: a /healthz server per node on the healthCheckNodePort
	// (started by LocalFollowsPodMove, kept to the end), and the Service's
	// one pod, moved between the nodes through the apiserver via.
	top := t
	hz := map[string]*healthz{}
	movePod := func(via *kubetest.Cluster, to string) {
		hz["be1"].local.Store(to == "be1")
		hz["be2"].local.Store(to == "be2")
		via.SetEndpoints("e2e", "web", map[string]int32{"http": 8080},
			kubetest.Endpoint{Addr: netip.MustParseAddr("10.244." + strings.TrimPrefix(to, "be") + ".5"), Node: to, Ready: true, Serving: true})
	}
	// onlyOn: the pod's node is active and healthy, the other drains.
	onlyOn := func(to string) func([]api.Service, api.Status) bool {
		other := map[string]string{"be1": "10.100.0.22", "be2": "10.100.0.21"}[to]
		here := nodes[to].Addr4.String()
		return func(svcs []api.Service, _ api.Status) bool {
			for _, sv := range svcs {
				if sv.Name != name {
					continue
				}
				ok := true
				for _, b := range sv.Backends {
					switch {
					case strings.HasPrefix(b.Address, here+":"):
						ok = ok && b.State == "active" && b.Health == "healthy"
					case strings.HasPrefix(b.Address, other+":"):
						ok = ok && b.State == "draining"
					}
				}
				return ok
			}
			return false
		}
	}

	t.Run("LocalFollowsPodMove", func(t *testing.T) {
		var s *corev1.Service
		for range 10 {
			s, err = c.Admin.CoreV1().Services("e2e").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			if s, err = c.Admin.CoreV1().Services("e2e").Update(ctx, s, metav1.UpdateOptions{}); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		for n, h := range nodes {
			hz[n] = serveHealthz(top, h, s.Spec.HealthCheckNodePort)
		}
		for _, to := range []string{"be1", "be2", "be1"} {
			movePod(c, to)
			waitAPI(t, d, "the pod on "+to, onlyOn(to))
			if got := spread(t, tp, dst, 16); got != to {
				t.Errorf("eTP=Local with the pod on %s: new connections reached %q", to, got)
			}
		}
	})

	t.Run("RestartKeepsVIP", func(t *testing.T) {
		d.Restart()
		waitAPI(t, d, "web programmed after the restart", func(svcs []api.Service, _ api.Status) bool {
			for _, s := range svcs {
				if s.Name == name {
					return s.Frontend == dst.String()+"/tcp"
				}
			}
			return false
		})
		if got := spread(t, tp, dst, 8); got != "be1" {
			t.Errorf("after the restart: connections reached %q, want be1 (the pod's node)", got)
		}
	})

	// Pod backends: the backend hosts play pods of a routable pod network,
	// serving 8080; the EndpointSlice flips them between ready, serving
	// but terminating, and gone. Then the Service is deleted: l4lbd drops
	// it from its datapath, and only then releases it in the apiserver.
	t.Run("PodBackendsAndDelete", func(t *testing.T) {
		for _, be := range tp.Backends {
			be.Serve(netip.AddrPortFrom(be.Addr4, 8080))
		}
		if _, err := c.Admin.CoreV1().Services("e2e").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "pods", Annotations: map[string]string{
				kubernetes.AnnotationBackends: "pod", kubernetes.AnnotationPool: "pods"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		const podsName = "e2e.pods.80-tcp"
		podDst := netip.AddrPortFrom(vip4pods, 80)
		pod := func(be string, ready, serving, terminating bool) kubetest.Endpoint {
			return kubetest.Endpoint{Addr: nodes[be].Addr4, Node: be, Ready: ready, Serving: serving, Terminating: terminating}
		}
		ports := map[string]int32{"http": 8080}
		steps := []struct {
			what   string
			eps    []kubetest.Endpoint
			states string // in l4lbd
			reach  string // of new connections
		}{
			{"both pods ready", []kubetest.Endpoint{pod("be1", true, true, false), pod("be2", true, true, false)},
				"10.100.0.21:8080=active 10.100.0.22:8080=active", "be1,be2"},
			{"be2 terminating", []kubetest.Endpoint{pod("be1", true, true, false), pod("be2", false, true, true)},
				"10.100.0.21:8080=active 10.100.0.22:8080=draining", "be1"},
			{"be1 gone, be2 the last one serving", []kubetest.Endpoint{pod("be2", false, true, true)},
				"10.100.0.21:8080=draining 10.100.0.22:8080=active", "be2"},
		}
		for _, st := range steps {
			c.SetEndpoints("e2e", "pods", ports, st.eps...)
			waitAPI(t, d, st.what, func(svcs []api.Service, _ api.Status) bool {
				if backendStates(svcs, podsName) != st.states {
					return false
				}
				for _, s := range svcs {
					if s.Name == podsName {
						for _, b := range s.Backends {
							if b.State == "active" && b.Health != "healthy" {
								return false
							}
						}
					}
				}
				return true
			})
			if got := spread(t, tp, podDst, 16); got != st.reach {
				t.Errorf("%s: new connections reached %q, want %q", st.what, got, st.reach)
			}
		}

		if err := c.Admin.CoreV1().Services("e2e").Delete(ctx, "pods", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitAPI(t, d, "pods out of the datapath", func(svcs []api.Service, _ api.Status) bool { return backendStates(svcs, podsName) == "<absent>" })
		deadline := time.Now().Add(60 * time.Second)
		for {
			_, err := c.Admin.CoreV1().Services("e2e").Get(ctx, "pods", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the deleted Service is still there a minute after l4lbd dropped it (%v)", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("ApiserverOutage", func(t *testing.T) {
		// A fixed port above the kernel's ephemeral range (ending at
		// 60999 by default), which the earlier connections of this test
		// may hold or keep in TIME_WAIT.
		held, err := tp.Client.DialTCP(61200, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		start := time.Now()
		c.KillAPIServer()
		waitAPI(t, d, "kubernetes stale", func(_ []api.Service, st api.Status) bool { stale, ok := kubeStale(st); return ok && stale })
		waitAPI(t, d, vip4.String()+" still announced during the outage", func(_ []api.Service, st api.Status) bool { return announced(st, vip4) })
		t.Logf("apiserver killed -> l4lbd status shows the Kubernetes source stale: %v", time.Since(start).Round(time.Millisecond))
		if err := held.Echo("during the outage"); err != nil {
			t.Errorf("an established connection broke when the apiserver died: %v", err)
		}
		if got := spread(t, tp, dst, 8); got != "be1" {
			t.Errorf("during the outage: new connections reached %q, want be1 as before", got)
		}
		// Health checks go on during the outage.
		beHealth := func(want string) func([]api.Service, api.Status) bool {
			return func(svcs []api.Service, st api.Status) bool {
				stale, _ := kubeStale(st)
				for _, sv := range svcs {
					for _, b := range sv.Backends {
						if sv.Name == name && strings.HasPrefix(b.Address, "10.100.0.21:") {
							return stale && b.Health == want
						}
					}
				}
				return false
			}
		}
		hz["be1"].local.Store(false)
		waitAPI(t, d, "be1 unhealthy while the source is stale", beHealth("unhealthy"))
		hz["be1"].local.Store(true)
		waitAPI(t, d, "be1 healthy again while the source is stale", beHealth("healthy"))
		// A restart during the outage keeps the adopted services in the
		// datapath, and gives them back their definitions from the last
		// snapshot l4lbd kept: listed and health-checked as before.
		d.Restart()
		waitAPI(t, d, "source stale after the restart", func(_ []api.Service, st api.Status) bool { stale, ok := kubeStale(st); return ok && stale })
		waitAPI(t, d, "web listed with be1 healthy after the restart during the outage", beHealth("healthy"))
		waitAPI(t, d, vip4.String()+" announced after the restart during the outage", func(_ []api.Service, st api.Status) bool { return announced(st, vip4) })
		hz["be1"].local.Store(false)
		waitAPI(t, d, "be1 unhealthy after the restart during the outage", beHealth("unhealthy"))
		hz["be1"].local.Store(true)
		waitAPI(t, d, "be1 healthy again after the restart during the outage", beHealth("healthy"))
		if got := spread(t, tp, dst, 8); got != "be1" {
			t.Errorf("restarted during the outage: new connections reached %q, want be1 as before", got)
		}
		// The pod moves during the outage, through a second apiserver
		// l4lbd does not know: the resync brings the new EndpointSlice.
		second := c.SecondAPIServer()
		movePod(second, "be2")
		back := time.Now()
		c.StartAPIServer()
		waitAPI(t, d, "kubernetes fresh again", func(_ []api.Service, st api.Status) bool { stale, ok := kubeStale(st); return ok && !stale })
		waitAPI(t, d, "the pod on be2 after the resync", onlyOn("be2"))
		t.Logf("apiserver started again -> l4lbd forwards by the EndpointSlice changed during the outage: %v", time.Since(back).Round(time.Millisecond))
		if got := spread(t, tp, dst, 8); got != "be2" {
			t.Errorf("after the resync: new connections reached %q, want be2, where the pod moved", got)
		}
		// Changes flow again after the relist: a new Service gets the
		// pool's other address.
		if _, err := c.Admin.CoreV1().Services("e2e").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web2"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitAPI(t, d, "web2 on "+vip4b.String(), func(svcs []api.Service, _ api.Status) bool {
			for _, s := range svcs {
				if s.Name == "e2e.web2.80-tcp" {
					return s.Frontend == netip.AddrPortFrom(vip4b, 80).String()+"/tcp"
				}
			}
			return false
		})
		if got := spread(t, tp, dst, 8); got != "be2" {
			t.Errorf("after the outage: connections to web reached %q, want be2", got)
		}
	})
}
