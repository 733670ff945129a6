// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/l4lb/l4lb/discovery/kubernetes/kubetest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

// k8sNamespace holds the bench's Services and EndpointSlices.
const k8sNamespace = "bench"

// k8sMaxServices is how many LoadBalancer Services kubetest's apiserver
// can hold: each takes a ClusterIP of its 10.96.0.0/16, 65,534 addresses
// less the few the apiserver keeps.
const k8sMaxServices = 65000

// k8sCluster is a real kube-apiserver and etcd (kubetest) in the LB box's
// namespace holding n Services of type LoadBalancer (our class, pod
// backends, the VIP by annotation) and one EndpointSlice of b endpoints
// for each, and a kubeconfig with l4lbd's rights (etc/kubernetes/rbac.yaml).
type k8sCluster struct {
	scope      *scope
	client     kubernetes.Interface
	kubeconfig string
	setup      time.Duration // from the cluster's start to every object created
	// slice is the changed Service's EndpointSlice as last written.
	slice *discoveryv1.EndpointSlice
	// changes counts the changes made so far, over every binary.
	changes int
}

// startKubernetes starts the cluster and creates the objects, 64 requests
// at a time.
func startKubernetes(sc *testnet.Script, h *topo.Host, n, b int) *k8sCluster {
	t0 := time.Now()
	k := &k8sCluster{scope: newScope(sc)}
	c := kubetest.StartWith(k.scope, kubetest.Options{
		Command: h.NS.Command,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := h.NS.Do(func() error {
				var err error
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	})
	if _, err := os.Stat(rbacManifest); err != nil {
		sc.Fatalf("kubernetes: %v (run from the repository's root, as make does)", err)
	}
	c.Apply(rbacManifest)
	k.kubeconfig = c.Kubeconfig("kube-system", "l4lb")
	rc := c.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	var err error
	if k.client, err = kubernetes.NewForConfig(rc); err != nil {
		sc.Fatalf("kubernetes client: %v", err)
	}
	ctx := context.Background()
	if _, err := k.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k8sNamespace}}, metav1.CreateOptions{}); err != nil {
		sc.Fatalf("kubernetes: create namespace: %v", err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				_, err := k.client.CoreV1().Services(k8sNamespace).Create(ctx, k8sService(i), metav1.CreateOptions{})
				if err == nil {
					_, err = k.client.DiscoveryV1().EndpointSlices(k8sNamespace).Create(ctx, k8sSlice(i, b, -1), metav1.CreateOptions{})
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("service s%d: %w", i, err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		sc.Fatalf("kubernetes: %v", firstErr)
	}
	if k.slice, err = k.client.DiscoveryV1().EndpointSlices(k8sNamespace).Get(ctx, k8sSlice(n/2, b, -1).Name, metav1.GetOptions{}); err != nil {
		sc.Fatalf("kubernetes: %v", err)
	}
	k.setup = time.Since(t0)
	return k
}

func (k *k8sCluster) stop() { k.scope.close() }

// rbacManifest is l4lbd's rights, relative to the repository's root.
const rbacManifest = "etc/kubernetes/rbac.yaml"

// k8sService is Service s<i>: type LoadBalancer of l4lbd's default class,
// its VIP requested by annotation, pod backends, no NodePorts (the
// apiserver's NodePort range would run out at 2,768 Services).
func k8sService(i int) *corev1.Service {
	class, noNodePorts := "l4lb.io/l4lb", false
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i), Namespace: k8sNamespace, Annotations: map[string]string{
			"l4lb.io/ips":      serviceVIP(i).String(),
			"l4lb.io/backends": "pod",
		}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class, AllocateLoadBalancerNodePorts: &noNodePorts,
			Ports: []corev1.ServicePort{{Name: "http", Port: servicePort, Protocol: corev1.ProtocolTCP}}},
	}
}

// k8sBackends are Service i's pod backends: the file's backend addresses
// with the port of its first (the file's b backends of a service share
// their port while b divides 100). change ≥ 0 replaces the first
// endpoint's address by one no service has (10.100.0.200-249).
func k8sBackends(i, b, change int) []netip.AddrPort {
	port := backendAddr(i * b).Port()
	out := make([]netip.AddrPort, b)
	for j := range out {
		out[j] = netip.AddrPortFrom(backendAddr(i*b+j).Addr(), port)
	}
	if change >= 0 {
		out[0] = netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("%s%d", topo.Prefix4, 200+change%50)), port)
	}
	return out
}

// k8sSlice is Service i's one EndpointSlice, every endpoint ready.
func k8sSlice(i, b, change int) *discoveryv1.EndpointSlice {
	bs := k8sBackends(i, b, change)
	name, port, tcp := "http", int32(bs[0].Port()), corev1.ProtocolTCP
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d-bench", i), Namespace: k8sNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: fmt.Sprintf("s%d", i), discoveryv1.LabelManagedBy: "benchcontrol"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
	}
	ready := true
	for _, a := range bs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

// k8sConfig is l4lbd's config for the cluster: pod backends without
// health checks (as the file's services), and a client rate high enough
// that the write-back of n Services' status and finalizer ends in seconds
// rather than at the default 20 requests per second.
func k8sConfig(n, b, tableSize int, kubeconfig string) string {
	return configHead(n, b, tableSize) + fmt.Sprintf(`
[discovery.kubernetes]
kubeconfig = %q
backends   = "pod"
pools      = ["10.200.0.0/15"]
qps        = 2000
burst      = 4000
[discovery.kubernetes.health]
pod = "none"
`, kubeconfig)
}

func measureKubernetes(tp *topo.Topology, h *topo.Host, bin string, n int, o opts, k *k8sCluster) timing {
	t := tp.T
	b := o.backends
	svc := n / 2
	want := func() []netip.AddrPort { return k8sBackends(svc, b, k.changes-1) }
	t0 := time.Now()
	d := h.StartL4LBD(bin, k8sConfig(n, b, o.tableSize, k.kubeconfig))
	dp := mustOpenDatapath(t, d)
	defer dp.Close()
	waitReady(t, "kubernetes", d, dp, readyService{n - 1, k8sBackends(n-1, b, -1)}, readyService{svc, want()})
	start := time.Since(t0)
	pid := d.Pid()
	settle := waitIdle(pid, 10*time.Minute)
	mem := rss(pid)
	ctx := context.Background()
	tm := timeChanges(pid, o.changes, func(i int) time.Duration {
		next := k8sSlice(svc, b, k.changes)
		next.ResourceVersion = k.slice.ResourceVersion
		k.changes++
		got, err := k.client.DiscoveryV1().EndpointSlices(k8sNamespace).Update(ctx, next, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("kubernetes change %d: %v", i, err)
		}
		s := time.Now()
		k.slice = got
		end, err := dp.waitTable(serviceVIP(svc), servicePort, want(), changeTimeout)
		if err != nil {
			t.Fatalf("kubernetes change %d: %v\n%s", i, err, d.Log())
		}
		return end.Sub(s)
	})
	tm.note = fmt.Sprintf("write-back settled %s after", settle.Round(100*time.Millisecond))
	tm.start, tm.rss = start, mem
	stopAndClean(t, bin, d)
	return tm
}

// waitIdle waits until process pid has used no CPU for a second (l4lbd
// has written back every Service's status), at most timeout, and returns
// how long that took.
func waitIdle(pid int, timeout time.Duration) time.Duration {
	t0 := time.Now()
	last := cpuTime(pid)
	for time.Since(t0) < timeout {
		time.Sleep(time.Second)
		now := cpuTime(pid)
		if now-last <= clockTick {
			break
		}
		last = now
	}
	return time.Since(t0)
}

// scope is a testnet.TB (and kubetest.TB) whose cleanups run when close
// is called, so that a cluster lives for one size rather than the whole
// run; a failure aborts the run as the script's own would.
type scope struct {
	sc       *testnet.Script
	mu       sync.Mutex
	cleanups []func()
}

func newScope(sc *testnet.Script) *scope {
	s := &scope{sc: sc}
	sc.Cleanup(s.close)
	return s
}

func (s *scope) Helper()                           {}
func (s *scope) Fatalf(format string, args ...any) { s.sc.Fatalf(format, args...) }
func (s *scope) Fatal(args ...any)                 { s.sc.Fatalf("%s", fmt.Sprint(args...)) }
func (s *scope) Skip(args ...any)                  { s.sc.Fatalf("%s", fmt.Sprint(args...)) }
func (s *scope) Skipf(format string, args ...any)  { s.sc.Fatalf(format, args...) }
func (s *scope) Logf(format string, args ...any)   { fmt.Fprintf(os.Stderr, "  "+format+"\n", args...) }

func (s *scope) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *scope) TempDir() string {
	d, err := os.MkdirTemp("", "l4lb-bench-")
	if err != nil {
		s.Fatalf("temp dir: %v", err)
	}
	s.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// close runs the cleanups, last first; a second call does nothing.
func (s *scope) close() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
