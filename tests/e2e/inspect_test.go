// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// inspectConfig is a SNAT service on VIP 10.200.3.10:80 to two backends'
// port 8080, with the program attached in generic XDP mode.
func inspectConfig() string {
	head := strings.Replace(boxHead(fmt.Sprintf("[%q]", metricsAddr), "snat", 1021),
		"interfaces    = [\"eth0\"]\n", "interfaces    = [\"eth0\"]\nattach        = \"xdp\"\nxdp_mode      = \"generic\"\nmode          = \"snat\"\n", 1)
	return head + vipService("web", 80, "tcp")
}

// vipService is a [[service]] table: name, at 10.200.3.10:port over
// proto, served by the topology's backends .21 and .22 on port 8080.
func vipService(name string, port int, proto string) string {
	return fmt.Sprintf(`
[[service]]
name     = %q
vip      = "10.200.3.10"
port     = %d
protocol = %q
[[service.backend]]
address = "%s21"
port    = 8080
[[service.backend]]
address = "%s22"
port    = 8080
`, name, port, proto, topo.Prefix4, topo.Prefix4)
}

// TestInspection drives the ipvsadm-like views against a live daemon: a
// live TCP connection shows in conntrack list with its backend and counts
// in service list --backends and the metrics; a flush of its (drained)
// backend removes its entry and binding, after which the connection, moved
// to the other backend, is reset; status shows the XDP mode the kernel
// reports.
func TestInspection(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	vip := netip.MustParseAddr("10.200.3.10")
	for _, be := range tp.Backends {
		be.Serve(netip.AddrPortFrom(be.Addr4, 8080))
	}
	d := tp.LBs[0].StartL4LBD(l4lbd(), inspectConfig())
	tp.RouteVIPs(tp.LBs[0], vip)

	// status: the mode read back from the kernel.
	st, err := d.API().Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Interfaces) != 1 || st.Interfaces[0].Attached != "xdp generic" {
		t.Errorf("status interfaces %+v, want eth0 attached in xdp generic mode", st.Interfaces)
	}
	out, err := l4lbctl(t, d.Socket, "status")
	if err != nil || !regexp.MustCompile(`(?m)^interfaces\s+eth0: xdp generic \(configured xdp generic\)$`).MatchString(out) {
		t.Errorf("l4lbctl status: %v\n%s", err, out)
	}

	conn, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip, 80))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Abort)
	if err := conn.Echo("hello"); err != nil {
		t.Fatal(err)
	}
	client := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	backend := backendAddr(conn.Backend, 8080)
	other := backendAddr(map[string]string{"be1": "be2", "be2": "be1"}[conn.Backend], 8080)

	// conntrack list: the connection, on its backend, established.
	var fl api.FlowList
	out, err = l4lbctl(t, d.Socket, "-o", "json", "conntrack", "list", "--service", "web")
	if err != nil || json.Unmarshal([]byte(out), &fl) != nil {
		t.Fatalf("conntrack list: %v\n%s", err, out)
	}
	flows := fl.Flows
	if fl.Matched != 1 || len(flows) != 1 || flows[0].Client != client.String() || flows[0].VIP != "10.200.3.10:80" || flows[0].Backend != backend ||
		flows[0].State != "established" || !flows[0].Active || flows[0].Proto != "tcp" || flows[0].SNAT == "" {
		t.Errorf("conntrack list shows %+v, want the connection from %s on %s, established, with its SNAT source", flows, client, backend)
	}
	if out, err := l4lbctl(t, d.Socket, "conntrack", "list"); err != nil || !regexp.MustCompile(
		`(?m)^tcp\s+`+regexp.QuoteMeta(client.String())+`\s+10\.200\.3\.10:80\s+web\s+`+regexp.QuoteMeta(backend)+`\s+established\s+`).MatchString(out) {
		t.Errorf("conntrack list (table): %v\n%s", err, out)
	}

	// service list --backends: one active connection on the backend (the
	// count may be a few seconds old).
	waitFor(t, "service list --backends to count the connection", func() (bool, string) {
		out, err := l4lbctl(t, d.Socket, "service", "list", "--backends")
		ok := err == nil && regexp.MustCompile(`(?m)^\s+-> `+regexp.QuoteMeta(backend)+`\s+active\s+\S+\s+1\s+1\s+0\s+`).MatchString(out) &&
			regexp.MustCompile(`(?m)^\s+-> `+regexp.QuoteMeta(other)+`\s+active\s+\S+\s+1\s+0\s+0\s+`).MatchString(out)
		return ok, out
	})
	body := scrape(t, d.Host, metricsAddr)
	for _, want := range []string{
		fmt.Sprintf(`l4lb_backend_connections{backend=%q,service="web",state="active"} 1`, backend),
		fmt.Sprintf(`l4lb_backend_connections{backend=%q,service="web",state="inactive"} 0`, backend),
		fmt.Sprintf(`l4lb_backend_connections{backend=%q,service="web",state="active"} 0`, other),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// Flush refuses to guess what to delete.
	if out, err := l4lbctl(t, d.Socket, "conntrack", "flush"); err == nil || !strings.Contains(out, "--all") {
		t.Errorf("flush without a selection: %v\n%s", err, out)
	}
	// Drain the backend: the connection stays on it through its entry.
	if out, err := l4lbctl(t, d.Socket, "backend", "drain", "web", backend); err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	if err := conn.Echo("still here"); err != nil {
		t.Fatalf("the connection broke when its backend was drained: %v", err)
	}
	out, err = l4lbctl(t, d.Socket, "conntrack", "flush", "--backend", backend)
	if err != nil || strings.TrimSpace(out) != "flushed 1 flows and 1 SNAT bindings" {
		t.Fatalf("flush --backend %s: %v\n%s", backend, err, out)
	}
	out, err = l4lbctl(t, d.Socket, "-o", "json", "conntrack", "list", "--backend", backend)
	if err != nil || json.Unmarshal([]byte(out), &fl) != nil || len(fl.Flows) != 0 || fl.Matched != 0 {
		t.Errorf("after the flush, conntrack list --backend %s: %v\n%s", backend, err, out)
	}
	// Its next packet is balanced again, to the other backend, which
	// knows no such connection and resets it.
	if err := conn.Echo("moved"); err == nil {
		t.Errorf("the flushed connection on drained %s still answered", backend)
	}
	waitFor(t, "service list --backends to show the flushed backend empty", func() (bool, string) {
		out, err := l4lbctl(t, d.Socket, "service", "list", "--backends")
		return err == nil && regexp.MustCompile(`(?m)^\s+-> `+regexp.QuoteMeta(backend)+`\s+draining \(override\)\s+\S+\s+1\s+0\s+0\s+`).MatchString(out), out
	})

	// --limit lists that many and counts the rest.
	for i := range 3 {
		c, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip, 80))
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(c.Abort)
		if err := c.Echo("hello"); err != nil {
			t.Fatal(err)
		}
	}
	out, err = l4lbctl(t, d.Socket, "-o", "json", "conntrack", "list", "--limit", "2")
	if err != nil || json.Unmarshal([]byte(out), &fl) != nil || len(fl.Flows) != 2 || fl.Matched < 3 {
		t.Errorf("conntrack list --limit 2 with 3 connections or more: %v\n%s", err, out)
	}
}

// waitFor polls cond until it holds, for at most 15 seconds (counts may be
// cached for a few), and fails with its last output.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, out := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: gave up; last output:\n%s", what, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
