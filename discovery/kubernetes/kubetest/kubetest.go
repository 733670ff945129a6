// SPDX-License-Identifier: Apache-2.0

// Package kubetest runs a real kube-apiserver backed by a real etcd for the
// tests of the Kubernetes source and of l4lbd with it: no fake clientset,
// so what is tested is what a cluster does (status subresource, nodePort
// allocation, RBAC, Leases, watches that break when the apiserver dies).
// The binaries are built once into a cache by scripts/kube-tools.sh (`make
// kube-tools`, a dependency of `make test`); both listen on 127.0.0.1 only,
// with certificates and tokens the test generates into its temporary
// directory. Test support only: no l4lb program imports it; besides tests,
// the benchmark commands under tests/ (tests/benchcontrol) do, through TB.
//
// No controller-manager or kubelet runs: a test creates Nodes and sets
// their status, and creates the EndpointSlices, itself.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TB is what the package needs of its caller: a *testing.T or
// *testing.B, or a benchmark command's stand-in for one.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// privilegedEnv is set by `make test` (and so CI): there missing binaries
// are a failure, not a reason to skip.
const privilegedEnv = "L4LB_PRIVILEGED_TESTS"

// Binaries returns the kube-apiserver and etcd that scripts/kube-tools.sh
// built (L4LB_KUBE_APISERVER and L4LB_ETCD override them). Without them
// the test fails under `make test` and is skipped otherwise.
func Binaries(t TB) (apiserver, etcd string) {
	t.Helper()
	// Outside a test binary (a benchmark command) there is no -short.
	if _, inTest := t.(testing.TB); inTest && testing.Short() {
		t.Skip("skipping in -short mode (make check): runs kube-apiserver and etcd; make test runs them")
	}
	apiserver, etcd = os.Getenv("L4LB_KUBE_APISERVER"), os.Getenv("L4LB_ETCD")
	if apiserver == "" || etcd == "" {
		root, err := moduleRoot()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(root, "scripts", "kube-tools.sh"), "--print").Output()
		if err != nil {
			t.Fatalf("scripts/kube-tools.sh --print: %v", err)
		}
		paths := strings.Fields(string(out))
		if len(paths) != 2 {
			t.Fatalf("scripts/kube-tools.sh --print said %q, want two paths", out)
		}
		if apiserver == "" {
			apiserver = paths[0]
		}
		if etcd == "" {
			etcd = paths[1]
		}
	}
	for _, p := range []string{apiserver, etcd} {
		if _, err := os.Stat(p); err != nil {
			msg := fmt.Sprintf("%s is missing: build kube-apiserver and etcd with `make kube-tools` (the first build takes a quarter of an hour), or set L4LB_KUBE_APISERVER and L4LB_ETCD", p)
			if os.Getenv(privilegedEnv) != "" {
				t.Fatalf("%s (%s is set, so this is a failure)", msg, privilegedEnv)
			}
			t.Skip(msg)
		}
	}
	return apiserver, etcd
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(bytes.TrimSpace(stripComments(data)), []byte("module github.com/l4lb/l4lb\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no l4lb go.mod above %s", dir)
		}
	}
}

func stripComments(data []byte) []byte {
	var out []byte
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("//")) {
			out = append(out, l...)
		}
	}
	return out
}

// Cluster is one etcd and one kube-apiserver (or, from SecondAPIServer,
// another apiserver on the same etcd).
type Cluster struct {
	t   TB
	dir string
	// URL is the apiserver's https://127.0.0.1:port.
	URL string
	// Admin is a client with system:masters rights.
	Admin   kubernetes.Interface
	rest    *rest.Config
	bin     string
	args    []string
	command func(name string, args ...string) *exec.Cmd
	log     string // the apiserver's log file in dir

	mu  sync.Mutex
	api *proc
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Options place the cluster somewhere else than the test's own network
// namespace; the zero value runs it there.
type Options struct {
	// Command makes the command of etcd and of the apiserver, e.g. one
	// that runs in a test's network namespace, so that they listen on
	// that namespace's 127.0.0.1, where l4lbd runs.
	Command func(name string, args ...string) *exec.Cmd
	// Dial opens the admin client's connections (to that 127.0.0.1).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Start runs etcd and the apiserver and waits until the apiserver is
// ready. Both are killed, and their files removed, when the test ends.
func Start(t TB) *Cluster {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with Options.
func StartWith(t TB, o Options) *Cluster {
	t.Helper()
	apiserver, etcdBin := Binaries(t)
	dir := t.TempDir()
	if o.Command == nil {
		o.Command = exec.Command
	}
	c := &Cluster{t: t, dir: dir, bin: apiserver, command: o.Command, log: "kube-apiserver.log"}

	etcdPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	etcd := c.spawn(etcdBin, "etcd.log",
		"--name", "kubetest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kubetest="+peerURL,
		// The data is thrown away with the test; fsync only costs time.
		"--unsafe-no-fsync", "--log-level", "warn")
	t.Cleanup(func() { c.kill(etcd) })

	pki := writePKI(t, dir)
	c.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	c.args = []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort),
		// With a loopback advertise address the apiserver refuses to
		// start unless it leaves the kubernetes Service's endpoints alone.
		"--endpoint-reconciler-type", "none",
		"--tls-cert-file", pki.serverCert, "--tls-private-key-file", pki.serverKey,
		"--client-ca-file", pki.caCert,
		"--service-account-key-file", pki.saKey, "--service-account-signing-key-file", pki.saKey,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--authorization-mode", "RBAC",
		// Cluster IPs are only allocated, never routed: no packet goes there.
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v", "1",
	}
	// The credentials go in as data, not file names: client-go watches
	// client certificate files from a goroutine that outlives the test
	// and logs an error every few seconds once its directory is gone.
	var tlsc rest.TLSClientConfig
	for _, f := range []struct {
		path string
		into *[]byte
	}{{pki.caCert, &tlsc.CAData}, {pki.adminCert, &tlsc.CertData}, {pki.adminKey, &tlsc.KeyData}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		*f.into = b
	}
	c.rest = &rest.Config{
		Host:            c.URL,
		TLSClientConfig: tlsc,
		QPS:             200, Burst: 400,
		Dial: o.Dial,
	}
	var err error
	if c.Admin, err = kubernetes.NewForConfig(c.rest); err != nil {
		t.Fatal(err)
	}
	c.StartAPIServer()
	t.Cleanup(c.KillAPIServer)
	return c
}

// StartAPIServer starts the apiserver (again, after KillAPIServer) on the
// same port and data, and waits until it is ready.
func (c *Cluster) StartAPIServer() {
	c.t.Helper()
	c.mu.Lock()
	if c.api != nil {
		c.mu.Unlock()
		c.t.Fatal("kubetest: the apiserver is already running")
	}
	c.api = c.spawn(c.bin, c.log, c.args...)
	p := c.api
	c.mu.Unlock()
	c.waitReady(p)
}

// SecondAPIServer starts another apiserver on the same etcd, on its own
// port, as in a cluster with several: what a client of c cannot see while
// c's apiserver is down (KillAPIServer) can be changed through this one.
// It is killed when the test ends.
func (c *Cluster) SecondAPIServer() *Cluster {
	c.t.Helper()
	port := freePort(c.t)
	o := &Cluster{t: c.t, dir: c.dir, URL: "https://127.0.0.1:" + strconv.Itoa(port), bin: c.bin, command: c.command,
		args: slices.Clone(c.args), rest: rest.CopyConfig(c.rest), log: "kube-apiserver-2.log"}
	o.args[slices.Index(o.args, "--secure-port")+1] = strconv.Itoa(port)
	o.rest.Host = o.URL
	var err error
	if o.Admin, err = kubernetes.NewForConfig(o.rest); err != nil {
		c.t.Fatal(err)
	}
	o.StartAPIServer()
	c.t.Cleanup(o.KillAPIServer)
	return o
}

// KillAPIServer kills the apiserver with SIGKILL, as a crash or a lost
// machine would: with watches open it takes more than ten seconds to stop
// on SIGTERM, and an outage is what the tests want anyway.
func (c *Cluster) KillAPIServer() {
	c.mu.Lock()
	p := c.api
	c.api = nil
	c.mu.Unlock()
	if p != nil {
		c.kill(p)
	}
}

func (c *Cluster) kill(p *proc) {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (c *Cluster) spawn(bin, logName string, args ...string) *proc {
	c.t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := c.command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.t.Fatalf("start %s: %v", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p
}

// waitReady polls /readyz until it answers 200: the first start on a busy
// machine takes a while (etcd, then every built-in controller's first list).
func (c *Cluster) waitReady(p *proc) {
	c.t.Helper()
	tr, err := rest.TransportFor(c.rest)
	if err != nil {
		c.t.Fatal(err)
	}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	deadline := time.Now().Add(3 * time.Minute)
	start := time.Now()
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			c.t.Fatalf("kube-apiserver exited during start:\n%s", c.tail(c.log))
		default:
		}
		resp, err := hc.Get(c.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				c.t.Logf("kube-apiserver ready after %v", time.Since(start).Round(time.Millisecond))
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("kube-apiserver not ready after 3 minutes:\n%s", c.tail(c.log))
}

func (c *Cluster) tail(name string) string {
	data, _ := os.ReadFile(filepath.Join(c.dir, name))
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// RESTConfig is a copy of the admin client's config, e.g. for a client
// with another request rate.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Dir is the cluster's temporary directory, where kubeconfigs are written.
func (c *Cluster) Dir() string { return c.dir }

// Apply creates every object of a YAML manifest (several documents), as
// `kubectl create -f` would, with the admin client.
func (c *Cluster) Apply(path string) {
	c.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	ctx := context.Background()
	for {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if err.Error() == "EOF" {
				return
			}
			c.t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 || string(bytes.TrimSpace(raw.Raw)) == "null" {
			continue
		}
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			c.t.Fatalf("%s: %v", path, err)
		}
		if err := c.create(ctx, obj); err != nil {
			c.t.Fatalf("%s: create %s: %v", path, gvk.Kind, err)
		}
	}
}

func (c *Cluster) create(ctx context.Context, obj runtime.Object) error {
	var err error
	opts := metav1.CreateOptions{}
	switch o := obj.(type) {
	case *corev1.Namespace:
		_, err = c.Admin.CoreV1().Namespaces().Create(ctx, o, opts)
	case *corev1.ServiceAccount:
		_, err = c.Admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		_, err = c.Admin.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	case *rbacv1.Role:
		_, err = c.Admin.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.RoleBinding:
		_, err = c.Admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
	default:
		return fmt.Errorf("kubetest cannot create a %T", obj)
	}
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Kubeconfig writes a kubeconfig for the service account ns/name, with a
// token the apiserver issues for it, and returns its path: the test then
// runs with exactly the rights the manifests give.
func (c *Cluster) Kubeconfig(ns, name string) string {
	c.t.Helper()
	exp := int64(3600)
	tok, err := c.Admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("token for service account %s/%s: %v", ns, name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.rest.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: name}
	cfg.CurrentContext = "kubetest"
	path := filepath.Join(c.dir, "kubeconfig-"+ns+"-"+name)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		c.t.Fatal(err)
	}
	return path
}

// AddNode creates a Node with InternalIPs addrs (and labels), and sets its
// status as a kubelet would.
func (c *Cluster) AddNode(name string, labels map[string]string, addrs ...netip.Addr) *corev1.Node {
	c.t.Helper()
	ctx := context.Background()
	n, err := c.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create node %s: %v", name, err)
	}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	n, err = c.Admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		c.t.Fatalf("set the status of node %s: %v", name, err)
	}
	return n
}

// Endpoint is one endpoint of an EndpointSlice.
type Endpoint struct {
	Addr        netip.Addr
	Node        string
	Ready       bool
	Serving     bool
	Terminating bool
}

// SetEndpoints creates or replaces the EndpointSlice ns/<svc>-kubetest of
// Service svc, with one port per name in ports, as the EndpointSlice
// controller would.
func (c *Cluster) SetEndpoints(ns, svc string, ports map[string]int32, eps ...Endpoint) {
	c.t.Helper()
	ctx := context.Background()
	at := discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && eps[0].Addr.Is6() {
		at = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-kubetest", Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "kubetest"}},
		AddressType: at,
	}
	for name, p := range ports {
		tcp := corev1.ProtocolTCP
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Port: &p, Protocol: &tcp})
	}
	for _, e := range eps {
		node := e.Node
		ep := discoveryv1.Endpoint{Addresses: []string{e.Addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &e.Ready, Serving: &e.Serving, Terminating: &e.Terminating}}
		if node != "" {
			ep.NodeName = &node
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	cur, err := c.Admin.DiscoveryV1().EndpointSlices(ns).Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, s, metav1.CreateOptions{})
	case err == nil:
		s.ResourceVersion = cur.ResourceVersion
		_, err = c.Admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatalf("endpoints of %s/%s: %v", ns, svc, err)
	}
}

func freePort(t TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type pki struct {
	caCert, serverCert, serverKey, adminCert, adminKey, saKey string
}

// writePKI makes a CA, the apiserver's serving certificate for 127.0.0.1,
// an admin client certificate (group system:masters) and the service
// account signing key, all valid for a day.
func writePKI(t TB, dir string) pki {
	t.Helper()
	p := pki{
		caCert: filepath.Join(dir, "ca.crt"), serverCert: filepath.Join(dir, "server.crt"), serverKey: filepath.Join(dir, "server.key"),
		adminCert: filepath.Join(dir, "admin.crt"), adminKey: filepath.Join(dir, "admin.key"), saKey: filepath.Join(dir, "sa.key"),
	}
	caKey := newKey(t)
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubetest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caParsed, _ := x509.ParseCertificate(caDER)
	writePEM(t, p.caCert, "CERTIFICATE", caDER)
	issue := func(serial int64, subj pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, certPath, keyPath string) {
		k := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: subj, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
			DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caParsed, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, certPath, "CERTIFICATE", der)
		kd, _ := x509.MarshalECPrivateKey(k)
		writePEM(t, keyPath, "EC PRIVATE KEY", kd)
	}
	issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")}, p.serverCert, p.serverKey)
	issue(3, pkix.Name{CommonName: "kubetest-admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, p.adminCert, p.adminKey)
	sa := newKey(t)
	sd, _ := x509.MarshalECPrivateKey(sa)
	writePEM(t, p.saKey, "EC PRIVATE KEY", sd)
	return p
}

func newKey(t TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
