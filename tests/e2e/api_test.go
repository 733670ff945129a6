// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/tests/topo"
)

func l4lbctl(t *testing.T, socket string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "l4lbctl"), append([]string{"--socket", socket}, args...)...).CombinedOutput()
	return string(out), err
}

// TestAdminAPI drives the admin API through l4lbctl and its client against a
// live daemon: runtime drain / disable / clear, the live Maglev table and
// lookups, connection-table stats, and the socket's permissions.
func TestAdminAPI(t *testing.T) {
	r := newDSRRig(t)
	d := r.lbs[0]
	ctx := context.Background()
	c := d.API()
	web := netip.AddrPortFrom(vip4, 80)

	// The live table is the one Go's Maglev builds for the configured backends.
	live, err := c.Maglev(ctx, "web4")
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := maglev.ParseSeed(e2eSeed)
	var bs []maglev.Backend
	for _, n := range []int{21, 22, 23} {
		bs = append(bs, maglev.Backend{Addr: netip.MustParseAddrPort(fmt.Sprintf("%s%d:80", topo.Prefix4, n)), Weight: 1})
	}
	want, err := maglev.Build(seed, 1021, bs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if live.Backends[live.Table[i]] != bs[want[i]].Addr.String() {
			t.Fatalf("slot %d: live table has %s, Go's Maglev %s", i, live.Backends[live.Table[i]], bs[want[i]].Addr)
		}
	}

	// Status reads the attachment back from the kernel: lb1 attaches at
	// XDP (xdp_mode auto: native or generic, as the veth driver takes
	// it), lb2 at tc.
	for i, want := range []string{"xdp ", "tc tcx"} {
		st, err := r.lbs[i].API().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Interfaces) != 1 || !strings.HasPrefix(st.Interfaces[0].Attached, want) || st.Interfaces[0].AttachedError != "" {
			t.Errorf("lb%d: status interfaces %+v, want attached %q…", i+1, st.Interfaces, want)
		}
	}

	// Established flows, one of them on be3.
	var onBe3 []*topo.Conn
	var all []*topo.Conn
	for len(onBe3) < 3 {
		conn, err := r.tp.Client.DialTCP(0, web)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.Echo("hi"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Abort)
		all = append(all, conn)
		if conn.Backend == "be3" {
			onBe3 = append(onBe3, conn)
		}
	}
	// Lookup agrees with where the flow went, and sees its connection entry.
	for _, conn := range all {
		local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
		l, err := c.Lookup(ctx, "web4", local)
		if err != nil {
			t.Fatal(err)
		}
		backend := backendAddr(conn.Backend, 80)
		if l.Backend != backend || l.Conntrack != backend {
			t.Errorf("flow %s on %s: lookup says table %s, connection table %q", local, conn.Backend, l.Backend, l.Conntrack)
		}
	}
	out, err := l4lbctl(t, d.Socket, "conntrack", "stats", "-o", "json")
	if err != nil || !strings.Contains(out, `"entries"`) {
		t.Fatalf("conntrack stats: %v\n%s", err, out)
	}
	ct, err := c.Conntrack(ctx)
	// The kernel rounds per-CPU LRU tables up to a multiple of the CPUs.
	if err != nil || ct.Entries < len(all) || ct.Capacity < 65536 || ct.Capacity > 65536+1024 {
		t.Fatalf("conntrack %+v (%v), want >= %d entries of about 65536", ct, err, len(all))
	}

	// Drain be3: established flows stay, new ones avoid it.
	be3 := netip.MustParseAddrPort(topo.Prefix4 + "23:80")
	if out, err := l4lbctl(t, d.Socket, "backend", "drain", "web4", be3.String()); err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	svc, err := c.Service(ctx, "web4")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range svc.Backends {
		if b.Address == be3.String() && (!b.Override || b.State != "draining" || b.ConfigState != "active" || b.Slots != 0) {
			t.Errorf("drained backend shows %+v", b)
		}
	}
	for _, conn := range onBe3 {
		if err := conn.Echo("still here"); err != nil {
			t.Errorf("established flow on draining be3 broke: %v", err)
		}
	}
	for i := range 30 {
		conn, err := r.tp.Client.DialTCP(0, web)
		if err != nil {
			t.Fatalf("new flow %d while draining: %v", i, err)
		}
		if conn.Backend == "be3" {
			t.Errorf("new flow %d went to draining be3", i)
		}
		conn.Abort()
	}

	// Disable: be3's flows are re-balanced (and reset by their new backend).
	if err := c.Backend(ctx, "web4", be3, api.ActionDisable); err != nil {
		t.Fatal(err)
	}
	for _, conn := range onBe3 {
		if err := conn.Echo("gone"); err == nil {
			t.Errorf("flow on disabled be3 still answered")
		}
	}
	// Clear: be3 takes new flows again.
	if err := c.Backend(ctx, "web4", be3, api.ActionClear); err != nil {
		t.Fatal(err)
	}
	got := 0
	for range 30 {
		conn, err := r.tp.Client.DialTCP(0, web)
		if err != nil {
			t.Fatal(err)
		}
		if conn.Backend == "be3" {
			got++
		}
		conn.Abort()
	}
	if got == 0 {
		t.Error("be3 took no new flow after its override was cleared")
	}

	// Errors name what is wrong.
	if err := c.Backend(ctx, "nope", be3, api.ActionDrain); err == nil || !strings.Contains(err.Error(), `no service "nope"`) {
		t.Errorf("unknown service: %v", err)
	}
	if err := c.Backend(ctx, "web4", netip.MustParseAddrPort("10.9.9.9:80"), api.ActionDrain); err == nil || !strings.Contains(err.Error(), "has no backend") {
		t.Errorf("unknown backend: %v", err)
	}

	// Only root (the socket's owner) may use the socket.
	fi, err := os.Stat(d.Socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", fi.Mode(), err)
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		filepath.Join(bin, "l4lbctl"), "--socket", d.Socket, "status")
	out2, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out2), "permission denied") {
		t.Errorf("a non-root user used the admin socket: %v\n%s", err, out2)
	}
}

func backendAddr(name string, port int) string {
	var n int
	fmt.Sscanf(name, "be%d", &n)
	return fmt.Sprintf("%s%d:%d", topo.Prefix4, 20+n, port)
}
