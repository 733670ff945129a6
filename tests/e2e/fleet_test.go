// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// startConsul runs the Consul agent `make` builds (bin/consul) as a dev
// server inside h's namespace, bound to h's segment address.
func startConsul(t *testing.T, h *topo.Host) string {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("..", "..", "bin", "consul"))
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		t.Fatalf("no Consul agent at bin/consul (`make bin/consul` builds it): %v", err)
	}
	dir := t.TempDir()
	addr := h.Addr4.String()
	p := h.Start(bin, "agent", "-dev", "-node", "fleet-test",
		"-bind", addr, "-client", addr, "-advertise", addr,
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		"-data-dir", filepath.Join(dir, "data"),
		"-hcl", "disable_update_check = true", "-log-level", "warn")
	deadline := time.Now().Add(60 * time.Second)
	for !consulUp(h, addr) {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("consul agent did not come up:\n%s", p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return addr + ":8500"
}

func consulUp(h *topo.Host, addr string) bool {
	body, err := httpGetIn(h.NS, "http://"+addr+":8500/v1/status/leader")
	return err == nil && strings.Contains(body, ":")
}

// httpGetIn fetches url from inside ns (the test process stays in its own).
func httpGetIn(ns *testnet.NS, url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := ns.Do(func() error {
				var err error
				conn, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func fleetBoxConfig(box *topo.Host, consulAddr string, tableSize int) string {
	var b strings.Builder
	b.WriteString(boxHead(fmt.Sprintf("[%q]", box.Addr4.String()+":9842"), "snat", 251))
	fmt.Fprintf(&b, `
[discovery.consul]
address = %q

[fleet]
name = %q
`, consulAddr, box.Name)
	for _, svc := range []struct {
		name string
		port int
		size int
	}{{"web", 80, tableSize}, {"api", 81, 251}} {
		fmt.Fprintf(&b, "\n[[service]]\nname = %q\nvip = \"%s\"\nport = %d\nprotocol = \"tcp\"\nmode = \"snat\"\ntable_size = %d\n", svc.name, vip4, svc.port, svc.size)
		for n := 21; n <= 22; n++ {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"%s%d\"\n", topo.Prefix4, n)
		}
	}
	return b.String()
}

// waitFleet polls a box's fleet view until ok accepts it.
func waitFleet(t *testing.T, d *topo.L4LBD, what string, within time.Duration, ok func(api.Fleet, api.Status) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		f, ferr := d.API().Fleet(context.Background())
		st, serr := d.API().Status(context.Background())
		if ferr == nil && serr == nil && ok(f, st) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never %s within %s: %+v %v; status warnings %q %v\n%s", d.Host.Name, what, within, f, ferr, st.FleetWarnings, serr, d.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fleetctl(t *testing.T, ns *testnet.NS, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "l4lbctl"), args...)
	if ns != nil {
		cmd = ns.Command(filepath.Join(bin, "l4lbctl"), args...)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestFleetCheck runs two boxes publishing through a real Consul agent:
// identical boxes are not flagged; a box whose table size for one service
// differs is flagged on the other box (status, metric, l4lbctl fleet) as
// soon as Consul has its record, and cleared when it agrees again; `l4lbctl
// fleet compare` finds the same without Consul; a stopped box's record goes.
func TestFleetCheck(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 2})
	consulAddr := startConsul(t, tp.Client)
	lb1, lb2 := tp.LBs[0], tp.LBs[1]
	d1 := lb1.StartL4LBD(l4lbd(), fleetBoxConfig(lb1, consulAddr, 251))
	d2 := lb2.StartL4LBD(l4lbd(), fleetBoxConfig(lb2, consulAddr, 251))

	both := func(f api.Fleet, _ api.Status) bool { return len(f.Boxes) == 2 }
	waitFleet(t, d1, "seeing both boxes", 60*time.Second, both)
	waitFleet(t, d2, "seeing both boxes", 60*time.Second, both)
	// Identical boxes: watched for a while, never flagged.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for _, d := range []*topo.L4LBD{d1, d2} {
			st, err := d.API().Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(st.FleetWarnings) > 0 {
				t.Fatalf("%s flags identical boxes: %q", d.Host.Name, st.FleetWarnings)
			}
		}
	}
	metrics1 := "http://" + lb1.Addr4.String() + ":9842/metrics"
	if m, err := httpGetIn(lb1.NS, metrics1); err != nil || !strings.Contains(m, `l4lb_fleet_mismatch{service="web"} 0`) || !strings.Contains(m, "l4lb_fleet_boxes 2") {
		t.Errorf("lb1's metrics before the change: %v\n%s", err, grepLines(m, "l4lb_fleet"))
	}
	targets := []string{"http://" + lb1.Addr4.String() + ":9842", "http://" + lb2.Addr4.String() + ":9842"}
	if out, err := fleetctl(t, tp.Client.NS, append([]string{"fleet", "compare"}, targets...)...); err != nil {
		t.Errorf("l4lbctl fleet compare of identical boxes failed: %v\n%s", err, out)
	}

	// lb2 gets another table size for web.
	d2.WriteConfig(fleetBoxConfig(lb2, consulAddr, 509))
	changed := time.Now()
	d2.Reload()
	flagged := waitFleet(t, d1, "flagging web on lb2", 60*time.Second, func(f api.Fleet, st api.Status) bool {
		for _, w := range st.FleetWarnings {
			if strings.Contains(w, "service web") && strings.Contains(w, "lb1=") && strings.Contains(w, "lb2=") {
				return true
			}
		}
		return false
	})
	t.Logf("MEASURE fleet mismatch detection (lb2 reload -> lb1 status warning): %s", flagged.Sub(changed).Round(time.Millisecond))
	st, _ := d1.API().Status(context.Background())
	if len(st.FleetWarnings) != 1 {
		t.Errorf("lb1 warnings = %q, want only web's", st.FleetWarnings)
	}
	if m, err := httpGetIn(lb1.NS, metrics1); err != nil || !strings.Contains(m, `l4lb_fleet_mismatch{service="web"} 1`) || !strings.Contains(m, `l4lb_fleet_mismatch{service="api"} 0`) {
		t.Errorf("lb1's metrics after the change: %v\n%s", err, grepLines(m, "l4lb_fleet"))
	}
	out, err := fleetctl(t, nil, "--socket", d1.Socket, "fleet")
	if err != nil || !strings.Contains(out, "MISMATCH service web") || !strings.Contains(out, "LB2") {
		t.Errorf("l4lbctl fleet: %v\n%s", err, out)
	}
	t.Logf("l4lbctl fleet on lb1:\n%s", out)
	out, err = fleetctl(t, tp.Client.NS, append([]string{"fleet", "compare"}, targets...)...)
	if err == nil || !strings.Contains(out, "MISMATCH service web") {
		t.Errorf("l4lbctl fleet compare over metrics did not flag web: %v\n%s", err, out)
	}
	out, err = fleetctl(t, nil, "fleet", "compare", "unix:"+d1.Socket, "unix:"+d2.Socket)
	if err == nil || !strings.Contains(out, "MISMATCH service web") {
		t.Errorf("l4lbctl fleet compare over the admin sockets did not flag web: %v\n%s", err, out)
	}

	// Agreeing again clears it.
	d2.WriteConfig(fleetBoxConfig(lb2, consulAddr, 251))
	d2.Reload()
	waitFleet(t, d1, "clearing the mismatch", 60*time.Second, func(_ api.Fleet, st api.Status) bool { return len(st.FleetWarnings) == 0 })

	// A stopped box's record goes with its session.
	if err := d2.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFleet(t, d1, "forgetting lb2", 60*time.Second, func(f api.Fleet, _ api.Status) bool { return len(f.Boxes) == 1 && f.Boxes[0].Name == "lb1" })
	out, err = fleetctl(t, nil, "--socket", d1.Socket, "fleet")
	if err != nil || !strings.Contains(out, "LAST SEEN") || !strings.Contains(out, "lb2") || !strings.Contains(out, "gone") {
		t.Errorf("l4lbctl fleet does not list lb2 as gone: %v\n%s", err, out)
	}
	t.Logf("l4lbctl fleet on lb1 after lb2 stopped:\n%s", out)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestFleetFlagsUnrepairedDrift: two boxes agree on paper (the same
// config), but on lb2 a row of web's Maglev table is changed behind
// l4lbd's back and the maps are frozen (BPF_MAP_FREEZE, as `bpftool map
// freeze` does), so the self-check finds the change and cannot write the
// table back. lb2 then publishes for web a fingerprint of what its kernel
// holds rather than what it programmed, lb1 flags web on lb2 (status and
// `l4lbctl fleet`), and api, untouched, stays in agreement.
func TestFleetFlagsUnrepairedDrift(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 2})
	consulAddr := startConsul(t, tp.Client)
	lb1, lb2 := tp.LBs[0], tp.LBs[1]
	cfg := func(h *topo.Host) string {
		return strings.Replace(fleetBoxConfig(h, consulAddr, 251), "[daemon]\n", "[daemon]\nself_check_interval = \"500ms\"\n", 1)
	}
	d1 := lb1.StartL4LBD(l4lbd(), cfg(lb1))
	d2 := lb2.StartL4LBD(l4lbd(), cfg(lb2))
	both := func(f api.Fleet, st api.Status) bool { return len(f.Boxes) == 2 && len(st.FleetWarnings) == 0 }
	waitFleet(t, d1, "seeing both boxes in agreement", 60*time.Second, both)

	p := pins{t: t, dir: d2.PinDir}
	web := lb.Frontend{Addr: vip4, Port: 80, Proto: lb.TCP}
	s, err := p.snapshot(web)
	if err != nil {
		t.Fatal(err)
	}
	table := p.open("maglev_tables", strconv.FormatUint(uint64(s.entry.Id), 10))
	p.rotateRow(s, 2)
	changed := time.Now()
	for _, m := range []*ebpf.Map{table, p.open(bpf.LbMapMaglev)} {
		if err := m.Freeze(); err != nil {
			t.Fatalf("freeze %v: %v", m, err)
		}
	}
	flagged := waitFleet(t, d1, "flagging web on lb2", 60*time.Second, func(_ api.Fleet, st api.Status) bool {
		for _, w := range st.FleetWarnings {
			if strings.Contains(w, "service web") && strings.Contains(w, "lb2=drift-") {
				return true
			}
		}
		return false
	})
	t.Logf("MEASURE unrepaired drift on lb2 -> lb1 flags it: %s", flagged.Sub(changed).Round(time.Millisecond))
	st, err := d1.API().Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.FleetWarnings) != 1 {
		t.Errorf("lb1 warnings = %q, want only web's", st.FleetWarnings)
	}
	out, err := fleetctl(t, nil, "--socket", d1.Socket, "fleet")
	if err != nil || !strings.Contains(out, "MISMATCH service web") || !strings.Contains(out, "drift-") || strings.Contains(out, "MISMATCH service api") {
		t.Errorf("l4lbctl fleet on lb1 does not name web on lb2 alone: %v\n%s", err, out)
	}
	t.Logf("l4lbctl fleet on lb1:\n%s", out)
	m, err := httpGetIn(lb2.NS, "http://"+lb2.Addr4.String()+":9842/metrics")
	if err != nil || !regexp.MustCompile(`(?m)^l4lb_datapath_drift_repair_failures_total\{map="maglev"\} [1-9]`).MatchString(m) {
		t.Errorf("lb2 counts no failed maglev repair: %v\n%s", err, grepLines(m, "drift"))
	}
	if now, err := p.snapshot(web); err != nil || now.equal(s) {
		t.Errorf("web's table on lb2 was written back through frozen maps (%v): the test does not test an unrepaired drift", err)
	}
}
