// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// healthConfig serves web (DSR, checked through the VIP) and api (SNAT,
// checked on the backends' own address, port 8080) from three backends.
func healthConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, `
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = ["127.0.0.1:9842"]
bpffs          = "{{bpffs}}"

[datapath]
interfaces    = ["eth0"]
conntrack_max = 65536
max_services  = 16
max_backends  = 64

[maglev]
hash_seed  = %q
table_size = 251
`, e2eSeed)
	for _, svc := range []struct {
		name, mode  string
		port, bport int
	}{{"web", "dsr", 80, 80}, {"api", "snat", 81, 8080}} {
		fmt.Fprintf(&b, `
[[service]]
name = %q
vip = "%s"
port = %d
protocol = "tcp"
mode = %q
[service.health]
type = "tcp"
interval = "200ms"
timeout = "150ms"
rise = 2
fall = 2
`, svc.name, vip4, svc.port, svc.mode)
		for n := 21; n <= 23; n++ {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"%s%d\"\nport = %d\n", topo.Prefix4, n, svc.bport)
		}
	}
	return b.String()
}

func backendState(t *testing.T, d *topo.L4LBD, service, backend string) api.Backend {
	t.Helper()
	svc, err := d.API().Service(context.Background(), service)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range svc.Backends {
		if b.Address == backend {
			return b
		}
	}
	t.Fatalf("service %s has no backend %s", service, backend)
	return api.Backend{}
}

func waitHealth(t *testing.T, d *topo.L4LBD, service, backend, want string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if b := backendState(t, d, service, backend); b.Health == want {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s %s not %s after %s: %+v\n%s", service, backend, want, within, backendState(t, d, service, backend), d.Log())
	return 0
}

// TestHealthChecks kills a backend's server: it leaves the table within
// fall x interval (plus the probe timeout), only its flows move, the others
// keep theirs; brought back, it returns after rise successes. The DSR
// service is checked through the VIP (the path clients use), the SNAT one
// on the backend's own address.
func TestHealthChecks(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 3})
	var servers []*topo.Server
	for _, be := range tp.Backends {
		be.HoldVIPs(vip4)
		be.StartCompanion(l4lbd(), vip4.String())
		servers = append(servers, be.Serve(netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(be.Addr4, 8080)))
	}
	// Probes of DSR backends leave towards the VIP: the LB box needs a
	// route for it (usually its default route).
	tp.LBs[0].NS.Run(t, "ip", "route", "add", "default", "via", tp.Client.Addr4.String())
	tp.RouteVIPs(tp.LBs[0], vip4)
	d := tp.LBs[0].StartL4LBD(l4lbd(), healthConfig())

	for _, svc := range []struct {
		name  string
		port  uint16
		bport int
	}{{"web", 80, 80}, {"api", 81, 8080}} {
		t.Run(svc.name, func(t *testing.T) {
			be2 := fmt.Sprintf("%s22:%d", topo.Prefix4, svc.bport)
			for n := 21; n <= 23; n++ {
				waitHealth(t, d, svc.name, fmt.Sprintf("%s%d:%d", topo.Prefix4, n, svc.bport), "healthy", 5*time.Second)
			}
			// Established flows on every backend.
			var conns []*topo.Conn
			for len(conns) < 30 {
				c, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip4, svc.port))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Abort)
				conns = append(conns, c)
			}

			// be2's service stops listening (its established connections
			// stay open on the backend).
			servers[1].Close()
			took := waitHealth(t, d, svc.name, be2, "unhealthy", 5*time.Second)
			t.Logf("%s: be2 marked unhealthy %s after its server stopped (fall 2 x interval 200ms, timeout 150ms)", svc.name, took.Round(10*time.Millisecond))
			if b := backendState(t, d, svc.name, be2); b.Slots != 0 || b.HealthError == "" {
				t.Errorf("unhealthy be2: %d slots, error %q; want out of the table with the probe's error", b.Slots, b.HealthError)
			}
			for _, c := range conns {
				if c.Backend == "be2" {
					continue
				}
				if err := c.Echo("still here"); err != nil {
					t.Errorf("flow on %s broke when be2 failed: %v", c.Backend, err)
				}
			}
			for i := range 30 {
				c, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip4, svc.port))
				if err != nil {
					t.Fatalf("new flow %d while be2 is down: %v", i, err)
				}
				if c.Backend == "be2" {
					t.Errorf("new flow %d went to unhealthy be2", i)
				}
				c.Abort()
			}

			// Back: listening again, it returns after rise successes.
			servers[1] = tp.Backends[1].Serve(netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(tp.Backends[1].Addr4, 8080))
			took = waitHealth(t, d, svc.name, be2, "healthy", 5*time.Second)
			t.Logf("%s: be2 healthy again %s after its server came back (rise 2)", svc.name, took.Round(10*time.Millisecond))
			if b := backendState(t, d, svc.name, be2); b.Slots == 0 {
				t.Error("be2 is healthy but has no slot")
			}
		})
	}

	// The metrics follow, and pass Prometheus' lint. (Stopping be2's
	// server for api also took web's listener down: wait for web's check.)
	waitHealth(t, d, "web", topo.Prefix4+"22:80", "healthy", 5*time.Second)
	body := scrape(t, tp.LBs[0], "127.0.0.1:9842")
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("metrics lint: %v %v", err, problems)
	}
	for _, want := range []string{
		`l4lb_service_packets_total{service="web"}`,
		`l4lb_backend_health_state{backend="10.100.0.22:80",service="web",state="healthy"} 1`,
		`l4lb_conntrack_capacity 655`, // 65536 rounded up to a multiple of the CPUs
		`l4lb_build_info{`,
		`l4lb_reconcile_duration_seconds_count`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
