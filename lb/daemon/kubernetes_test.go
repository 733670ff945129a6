// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/discovery/kubernetes/kubetest"
	"github.com/l4lb/l4lb/lb/config"
)

// TestKubernetesLifecycle drives the daemon's side of the Kubernetes source
// against a real apiserver: the first snapshot before the first apply, a
// reload that keeps, restarts or stops the source, and a rejected reload
// that changes neither source.
func TestKubernetesLifecycle(t *testing.T) {
	old := sourceStartWait
	sourceStartWait = 30 * time.Second
	t.Cleanup(func() { sourceStartWait = old })

	c := kubetest.Start(t)
	c.Apply(filepath.Join("..", "..", "etc", "kubernetes", "rbac.yaml"))
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	copyFile(t, c.Kubeconfig("kube-system", "l4lb"), kc)
	class := "l4lb.io/l4lb"
	if _, err := c.Admin.CoreV1().Services("default").Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	consulAddr := standInConsul(t)
	path := filepath.Join(t.TempDir(), "l4lb.toml")
	socket := filepath.Join(t.TempDir(), "l4lb.sock")
	write := func(consulTag, kubeconfig, qps string, kube bool) {
		t.Helper()
		doc := "[daemon]\nadmin_socket = \"" + socket + "\"\n[datapath]\ninterfaces = [\"lo\"]\n" +
			"[[service]]\nname = \"from-file\"\nvip = \"198.51.100.1\"\nport = 80\nprotocol = \"tcp\"\n" +
			"[discovery.consul]\naddress = \"" + consulAddr + "\"\ntag = \"" + consulTag + "\"\n"
		if kube {
			doc += "[discovery.kubernetes]\nkubeconfig = \"" + kubeconfig + "\"\npools = [\"192.0.2.0/28\"]\nqps = " + qps + "\n"
		}
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("l4lb", kc, "20", true)
	opts := config.Options{Dev: true}
	cfg, err := config.Load(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{ConfigPath: path, Config: opts, Initial: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := d.startSources(ctx)
	if err != nil {
		t.Fatalf("startSources: %v", err)
	}
	defer stop()

	// Both first snapshots reached the merger before startSources
	// returned, so the first apply programs the cluster's Service.
	desired, _ := d.merger.Desired()
	if len(desired) != 1 || desired[0].Name != "default.web.80-tcp" || desired[0].Frontend.Addr != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("desired after start = %+v, want default.web.80-tcp on 192.0.2.1", desired)
	}
	d.merger.Update(discovery.Snapshot{Source: d.file.Name(), Services: cfg.Services})
	if st := d.discoveryStatus(); len(st) != 2 || st[1].Name != kubernetes.SourceName || st[1].Stale || st[1].LastSync.IsZero() {
		t.Fatalf("discovery status = %+v, want consul and kubernetes, fresh", st)
	}
	// The only box takes the Lease and says so.
	for deadline := time.Now().Add(30 * time.Second); !d.discoveryStatus()[1].StatusWriter; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("discovery status = %+v, want this box as the status writer", d.discoveryStatus())
		}
	}

	first := d.kubeRun.Load()
	if err := d.doReload(); err != nil || d.kubeRun.Load() != first {
		t.Fatalf("reload without change: err %v, restarted %v", err, d.kubeRun.Load() != first)
	}
	// A changed setting restarts the source.
	write("l4lb", kc, "50", true)
	if err := d.doReload(); err != nil || d.kubeRun.Load() == first {
		t.Fatalf("reload with a new qps: err %v, restarted %v", err, d.kubeRun.Load() != first)
	}
	second := d.kubeRun.Load()
	// So does new content in the kubeconfig (rotated credentials).
	data, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, append(data, "\n# rotated\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.doReload(); err != nil || d.kubeRun.Load() == second {
		t.Fatalf("reload with a rewritten kubeconfig: err %v, restarted %v", err, d.kubeRun.Load() != second)
	}
	third, consulRun := d.kubeRun.Load(), d.consulRun.Load()
	// A kubeconfig that cannot be read rejects the whole reload: the
	// Consul change in it is not applied either.
	write("edge", filepath.Join(t.TempDir(), "missing"), "50", true)
	if err := d.doReload(); err == nil || !strings.Contains(err.Error(), "kubeconfig") || d.kubeRun.Load() != third || d.consulRun.Load() != consulRun {
		t.Fatalf("reload with a missing kubeconfig: err %v, Kubernetes replaced %v, Consul replaced %v", err, d.kubeRun.Load() != third, d.consulRun.Load() != consulRun)
	}

	// Turning Kubernetes off forgets its services, a queued snapshot
	// included, and keeps the others'.
	d.snaps <- discovery.Snapshot{Source: kubernetes.SourceName, Services: desired}
	write("l4lb", kc, "50", false)
	if err := d.doReload(); err != nil || d.kubeRun.Load() != nil {
		t.Fatalf("reload without [discovery.kubernetes]: err %v, still running %v", err, d.kubeRun.Load() != nil)
	}
	got, _ := d.merger.Desired()
	if len(got) != 1 || got[0].Name != "from-file" {
		t.Errorf("desired after turning Kubernetes off = %+v, want only from-file", got)
	}
	if len(d.snaps) != 0 {
		t.Errorf("%d snapshots still queued", len(d.snaps))
	}
	if st := d.discoveryStatus(); len(st) != 1 || st[0].Name != "consul" {
		t.Errorf("discovery status with Kubernetes off = %+v, want consul only", st)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
