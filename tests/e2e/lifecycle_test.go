// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/tests/topo"
)

// vip4Rig is one LB box running l4lbd with cfg, in front of n backends
// that hold vip4 and serve it on port 80 through the companion.
func vip4Rig(t *testing.T, n int, cfg string) (*topo.Topology, *topo.L4LBD) {
	t.Helper()
	tp := vip4Topo(t, n)
	return tp, tp.LBs[0].StartL4LBD(l4lbd(), cfg)
}

// vip4Topo is vip4Rig before l4lbd starts.
func vip4Topo(t *testing.T, n int) *topo.Topology {
	t.Helper()
	tp := topo.New(t, topo.Options{LBs: 1, Backends: n})
	for _, be := range tp.Backends {
		be.HoldVIPs(vip4)
		be.StartCompanion(l4lbd(), vip4.String())
		be.Serve(netip.AddrPortFrom(vip4, 80))
	}
	tp.RouteVIPs(tp.LBs[0], vip4)
	return tp
}

// lifecycleRig is one LB box serving web4 over DSR from one backend.
func lifecycleRig(t *testing.T) (*topo.Topology, *topo.L4LBD) {
	t.Helper()
	return vip4Rig(t, 1, oneBackendConfig())
}

func oneBackendConfig() string {
	return strings.ReplaceAll(dsrConfig(21), `"10.100.0.22"`, `"10.100.0.21"`)
}

// xdpProgID is the id of the XDP program attached to the host's eth0.
func xdpProgID(t *testing.T, h *topo.Host) string {
	t.Helper()
	out := h.NS.Run(t, "ip", "-d", "link", "show", "eth0")
	m := regexp.MustCompile(`prog/xdp id (\d+)`).FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	return m[1]
}

// runToExit runs l4lbd in h's namespace and waits (up to 30 s) for it to
// exit; it must exit.
func runToExit(t *testing.T, h *topo.Host, args ...string) (string, error) {
	t.Helper()
	p := h.Start(l4lbd(), args...)
	deadline := time.Now().Add(30 * time.Second)
	for !p.Exited() {
		if time.Now().After(deadline) {
			t.Fatalf("l4lbd %v still running after 30s:\n%s", args, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p.Log(), p.Stop()
}

func serves(t *testing.T, tp *topo.Topology) error {
	t.Helper()
	c, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip4, 80))
	if err != nil {
		return err
	}
	defer c.Abort()
	return c.Echo("still there?")
}

// TestSecondDaemonRefused: a second l4lbd on the same state, whether it
// shares the socket or only the pins, exits with the documented error
// before touching anything: the first keeps its socket, its program and
// its traffic.
func TestSecondDaemonRefused(t *testing.T) {
	tp, d := lifecycleRig(t)
	lb := tp.LBs[0]
	st, err := d.API().Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	prog := xdpProgID(t, lb)
	if prog == "" {
		t.Fatal("no XDP program attached")
	}
	sockInfo, err := os.Stat(d.Socket)
	if err != nil {
		t.Fatal(err)
	}

	// Same config: the lock next to the socket is held.
	log, err := runToExit(t, lb, "--config", d.Config)
	if err == nil {
		t.Fatalf("a second l4lbd with the same config started:\n%s", log)
	}
	want := fmt.Sprintf("l4lbd already running (pid %d, lock %s)", st.PID, strings.TrimSuffix(d.Socket, ".sock")+".lock")
	if !strings.Contains(log, want) {
		t.Errorf("second l4lbd said:\n%s\nwant %q", log, want)
	}

	// Another socket, the same pins: the bpffs directory is locked.
	other := filepath.Join(t.TempDir(), "other.toml")
	cfg, err := os.ReadFile(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, other, strings.Replace(string(cfg), d.Socket, filepath.Join(t.TempDir(), "other.sock"), 1))
	log, err = runToExit(t, lb, "--config", other)
	want = fmt.Sprintf("l4lbd already running (pid %d, lock %s)", st.PID, d.PinDir)
	if err == nil || !strings.Contains(log, want) {
		t.Errorf("l4lbd sharing only the pins: err %v, said:\n%s\nwant %q", err, log, want)
	}

	// Its own socket and pins, the same interface at tc (what the XDP
	// attach error suggests): the interface is locked.
	pins := filepath.Join(tp.PinRoot, "lb-tc")
	t.Cleanup(func() {
		runQuiet(l4lbd(), "--bpffs", pins, "--admin-socket", filepath.Join(filepath.Dir(other), "tc.sock"), "--cleanup")
	})
	writeFile(t, other, strings.NewReplacer(d.Socket, filepath.Join(filepath.Dir(other), "tc.sock"), d.PinDir, pins,
		`attach        = "xdp"`, `attach        = "tc"`).Replace(string(cfg)))
	log, err = runToExit(t, lb, "--config", other)
	want = fmt.Sprintf("interface eth0 is served by another l4lbd (pid %d, lock /run/l4lb/interfaces/", st.PID)
	if err == nil || !strings.Contains(log, want) || !strings.Contains(log, "one load balancer per interface") {
		t.Errorf("l4lbd at tc on the same interface: err %v, said:\n%s\nwant %q", err, log, want)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("the refused l4lbd created %s: %v", pins, err)
	}

	// Nothing of the first daemon was touched.
	if after, err := os.Stat(d.Socket); err != nil || !os.SameFile(sockInfo, after) {
		t.Errorf("the running daemon's socket was replaced or removed: %v", err)
	}
	if got := xdpProgID(t, lb); got != prog {
		t.Errorf("XDP program changed from id %s to %q", prog, got)
	}
	if st2, err := d.API().Status(t.Context()); err != nil || st2.PID != st.PID {
		t.Errorf("first daemon unreachable after the attempts: %v", err)
	}
	if err := serves(t, tp); err != nil {
		t.Errorf("traffic after the attempts: %v", err)
	}
}

// TestStopIsLogged: SIGTERM is in l4lbd's log, with what stopping means,
// and a stopped l4lbd leaves no lock file; its datapath keeps forwarding.
func TestStopIsLogged(t *testing.T) {
	tp, d := lifecycleRig(t)
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, d.Log())
	}
	for _, want := range []string{"l4lbd stopping; the datapath stays attached and keeps forwarding", "signal=terminated", "l4lbd stopped"} {
		if !strings.Contains(d.Log(), want) {
			t.Errorf("log lacks %q:\n%s", want, d.Log())
		}
	}
	lock := strings.TrimSuffix(d.Socket, ".sock") + ".lock"
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Errorf("lock file %s left after the stop: %v", lock, err)
	}
	if err := serves(t, tp); err != nil {
		t.Errorf("traffic with l4lbd stopped: %v", err)
	}
}

// TestOfflineReading: with l4lbd stopped (its datapath still forwarding),
// l4lbctl reads services, counters and the connection table from the pins,
// saying so on stderr; --offline does the same while it runs. What needs
// the daemon (a drain) still fails.
func TestOfflineReading(t *testing.T) {
	tp, d := lifecycleRig(t)
	if err := serves(t, tp); err != nil {
		t.Fatal(err)
	}
	ctl := func(args ...string) (stdout, stderr string, err error) {
		cmd := exec.Command(filepath.Join(bin, "l4lbctl"), append([]string{"--socket", d.Socket, "--config", d.Config}, args...)...)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}
	out, errOut, err := ctl("--offline", "service", "list")
	if err != nil || !strings.Contains(out, "web4") || !strings.Contains(errOut, "reading the datapath pinned under "+d.PinDir) {
		t.Errorf("--offline while running: %v\n%s%s", err, out, errOut)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = ctl("service", "list", "--backends")
	if err != nil || !strings.Contains(errOut, "no l4lbd answers on "+d.Socket) || !strings.Contains(errOut, "service names from "+d.Config) {
		t.Errorf("service list with l4lbd stopped: %v\n%s%s", err, out, errOut)
	}
	for _, want := range []string{"web4", "dns6", topo.Prefix4 + "21:80"} {
		if !strings.Contains(out, want) {
			t.Errorf("service list lacks %q:\n%s", want, out)
		}
	}
	out, _, err = ctl("-o", "json", "service", "get", "web4")
	var svc api.Service
	if err != nil || json.Unmarshal([]byte(out), &svc) != nil || svc.Frontend != vip4.String()+":80/tcp" || len(svc.Backends) != 1 ||
		svc.Backends[0].Slots != 1021 || svc.Counters.Packets == 0 || svc.Source != "pinned ("+d.PinDir+")" {
		t.Errorf("service get web4 -o json with l4lbd stopped: %v\n%s", err, out)
	}
	out, _, err = ctl("conntrack", "stats")
	if err != nil || !regexp.MustCompile(`entries [1-9]\d* of 65536`).MatchString(out) {
		t.Errorf("conntrack stats with l4lbd stopped: %v\n%s", err, out)
	}
	out, errOut, err = ctl("conntrack", "list", "--service", "web4")
	if err != nil || !strings.Contains(out, vip4.String()+":80") || !strings.Contains(out, topo.Prefix4+"21:80") {
		t.Errorf("conntrack list --service web4 with l4lbd stopped: %v\n%s%s", err, out, errOut)
	}
	if out, errOut, err := ctl("backend", "drain", "web4", topo.Prefix4+"21:80"); err == nil {
		t.Errorf("a drain without l4lbd succeeded:\n%s%s", out, errOut)
	}
}

// TestSecondCompanionRefused: a second backend companion on a host exits
// naming the first, whatever its --bpffs; the first keeps its pins and its
// traffic.
func TestSecondCompanionRefused(t *testing.T) {
	tp, _ := lifecycleRig(t)
	be := tp.Backends[0]
	pins := filepath.Join(tp.PinRoot, be.Name+"-companion")
	before, err := os.ReadDir(pins)
	if err != nil || len(before) == 0 {
		t.Fatalf("the companion's pins: %v %v", before, err)
	}
	for _, dir := range []string{pins, filepath.Join(tp.PinRoot, be.Name+"-companion2")} {
		log, err := runToExit(t, be, "backend", "--interface", be.Iface, "--bpffs", dir, "--vip", "192.0.2.99")
		if err == nil || !strings.Contains(log, "another backend companion runs on this host (pid ") {
			t.Errorf("second companion on --bpffs %s: %v\n%s", dir, err, log)
		}
	}
	after, err := os.ReadDir(pins)
	if err != nil || len(after) != len(before) {
		t.Errorf("the first companion's pins after the refusals: %d entries (was %d), %v", len(after), len(before), err)
	}
	if err := serves(t, tp); err != nil {
		t.Errorf("traffic after the refusals: %v", err)
	}
}

// TestCleanupRefusedWhileRunning: --cleanup of a running daemon's state
// refuses and removes nothing; --force removes it all and says what.
func TestCleanupRefusedWhileRunning(t *testing.T) {
	tp, d := lifecycleRig(t)
	lb := tp.LBs[0]
	st, err := d.API().Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	be := netip.MustParseAddrPort(topo.Prefix4 + "21:80")
	if err := d.API().Backend(t.Context(), "dns4", netip.AddrPortFrom(be.Addr(), 53), "drain"); err != nil {
		t.Fatal(err)
	}
	overrides := strings.TrimSuffix(d.Socket, ".sock") + ".overrides.json"
	if _, err := os.Stat(overrides); err != nil {
		t.Fatalf("no overrides file after a drain: %v", err)
	}

	out, err := exec.Command(l4lbd(), "--config", d.Config, "--cleanup").CombinedOutput()
	if err == nil {
		t.Fatalf("--cleanup of a running daemon succeeded:\n%s", out)
	}
	if want := fmt.Sprintf("refusing to clean up: l4lbd already running (pid %d", st.PID); !strings.Contains(string(out), want) {
		t.Errorf("--cleanup said:\n%s\nwant %q", out, want)
	}
	if entries, _ := os.ReadDir(d.PinDir); len(entries) == 0 {
		t.Fatal("a refused --cleanup removed the pins")
	}
	if _, err := d.API().Status(t.Context()); err != nil {
		t.Fatalf("a refused --cleanup broke the admin socket: %v", err)
	}
	if err := serves(t, tp); err != nil {
		t.Fatalf("traffic after a refused --cleanup: %v", err)
	}

	out, err = exec.Command(l4lbd(), "--config", d.Config, "--cleanup", "--force").CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup --force: %v\n%s", err, out)
	}
	t.Logf("--cleanup --force:\n%s", out)
	for _, want := range []string{
		"detached xdp program from eth0",
		"detached hc program from eth0",
		"pinned maps under " + d.PinDir,
		fmt.Sprintf("WARNING: l4lbd already running (pid %d", st.PID),
		"it forwards nothing",
		"Its admin socket and runtime files were kept (" + d.Socket + ", " + overrides + ")",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--cleanup --force output lacks %q", want)
		}
	}
	if strings.Contains(string(out), "removed "+d.Socket) {
		t.Error("--cleanup --force says it removed the running daemon's socket")
	}
	if _, err := os.Stat(d.PinDir); !os.IsNotExist(err) {
		t.Errorf("pins left after --cleanup --force: %v", err)
	}
	if id := xdpProgID(t, lb); id != "" {
		t.Errorf("XDP program %s still attached", id)
	}
	// The daemon is not left headless: l4lbctl still reaches it, and
	// stopping it works as ever.
	if st2, err := d.API().Status(t.Context()); err != nil || st2.PID != st.PID {
		t.Errorf("the running daemon is unreachable after --cleanup --force: %v", err)
	}
	if _, err := os.Stat(overrides); err != nil {
		t.Errorf("the running daemon's overrides were removed: %v", err)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(l4lbd(), "--config", d.Config, "--cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup once stopped: %v\n%s", err, out)
	}
	for _, p := range []string{d.Socket, overrides} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after --cleanup of the stopped daemon: %v", p, err)
		}
	}
}

// TestCleanupNeedsItsState: --cleanup with a config it cannot read refuses
// and removes nothing (it used to clean the default location instead);
// naming the state with --bpffs and --admin-socket cleans that state; and
// a bpffs mount root is refused, whichever way it is named.
func TestCleanupNeedsItsState(t *testing.T) {
	tp, d := lifecycleRig(t)
	lb := tp.LBs[0]
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "broken.toml")
	writeFile(t, broken, "[daemon\n")
	out, err := lb.NS.Command(l4lbd(), "--config", broken, "--cleanup").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refusing to clean up: cannot read "+broken) || !strings.Contains(string(out), "--bpffs DIR") {
		t.Errorf("--cleanup with a broken config: %v\n%s\nwant a refusal that names --bpffs", err, out)
	}
	if id := xdpProgID(t, lb); id == "" {
		t.Fatal("a refused --cleanup detached the program")
	}
	if entries, _ := os.ReadDir(d.PinDir); len(entries) == 0 {
		t.Fatal("a refused --cleanup removed the pins")
	}

	for _, args := range [][]string{
		{"--config", broken, "--cleanup", "--bpffs", "/sys/fs/bpf"},
		{"--config", writeBPFFSConfig(t, "/sys/fs/bpf"), "--cleanup"},
	} {
		out, err := lb.NS.Command(l4lbd(), args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "bpffs mount itself") || !strings.Contains(string(out), "/sys/fs/bpf/l4lb") {
			t.Errorf("l4lbd %v: %v\n%s\nwant the mount root refused, naming /sys/fs/bpf/l4lb", args, err, out)
		}
	}
	if entries, err := os.ReadDir("/sys/fs/bpf"); err != nil || len(entries) == 0 {
		t.Fatalf("/sys/fs/bpf after the refusals: %v, %d entries", err, len(entries))
	}

	out, err = lb.NS.Command(l4lbd(), "--config", broken, "--cleanup", "--bpffs", d.PinDir, "--admin-socket", d.Socket).CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup --bpffs: %v\n%s", err, out)
	}
	for _, want := range []string{"cleaning the state named on the command line", "detached xdp program from eth0", "pinned maps under " + d.PinDir} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--cleanup --bpffs output lacks %q:\n%s", want, out)
		}
	}
	if id := xdpProgID(t, lb); id != "" {
		t.Errorf("XDP program %s still attached", id)
	}
	if _, err := os.Stat(d.PinDir); !os.IsNotExist(err) {
		t.Errorf("pins left: %v", err)
	}
}

// writeBPFFSConfig writes a config whose daemon.bpffs is dir.
func writeBPFFSConfig(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "l4lb.toml")
	writeFile(t, p, fmt.Sprintf("[daemon]\nbpffs = %q\nadmin_socket = %q\n[datapath]\ninterfaces = [\"eth0\"]\n", dir, filepath.Join(t.TempDir(), "l4lb.sock")))
	return p
}

// TestCleanupRemovesManagedNeighbours: the managed neighbour entries l4lbd
// installed for its backends' next hops go with --cleanup.
func TestCleanupRemovesManagedNeighbours(t *testing.T) {
	tp, d := lifecycleRig(t)
	lb := tp.LBs[0]
	if err := serves(t, tp); err != nil {
		t.Fatal(err)
	}
	managed := func() bool {
		out := lb.NS.Run(t, "ip", "neigh", "show", "dev", "eth0")
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, topo.Prefix4+"21 ") && strings.Contains(l, "managed") {
				return true
			}
		}
		return false
	}
	if !managed() {
		t.Fatalf("no managed neighbour entry for the backend:\n%s", lb.NS.Run(t, "ip", "neigh", "show", "dev", "eth0"))
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	cmd := lb.NS.Command(l4lbd(), "--config", d.Config, "--cleanup")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	if want := "deleted managed neighbour " + topo.Prefix4 + "21 dev eth0"; !strings.Contains(string(out), want) {
		t.Errorf("--cleanup output lacks %q:\n%s", want, out)
	}
	if managed() {
		t.Errorf("managed neighbour entry left after --cleanup:\n%s", lb.NS.Run(t, "ip", "neigh", "show", "dev", "eth0"))
	}
}

// TestAdminSocketNotASocket: daemon.admin_socket naming a regular file is
// refused by `config check` and by l4lbd, and the file survives.
func TestAdminSocketNotASocket(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 1})
	lb := tp.LBs[0]
	dir := t.TempDir()
	victim := filepath.Join(dir, "precious.txt")
	writeFile(t, victim, "do not delete\n")
	cfgPath := filepath.Join(dir, "l4lb.toml")
	pins := filepath.Join(tp.PinRoot, "lb-victim")
	cfg := strings.NewReplacer("{{socket}}", victim, "{{bpffs}}", pins).Replace(oneBackendConfig())
	writeFile(t, cfgPath, cfg)
	t.Cleanup(func() { runQuiet(l4lbd(), "--config", cfgPath, "--cleanup") })

	out, err := exec.Command(filepath.Join(bin, "l4lbctl"), "config", "check", cfgPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not a socket") || !strings.Contains(string(out), cfgPath+":") {
		t.Errorf("config check of admin_socket = a regular file: %v\n%s", err, out)
	}
	log, err := runToExit(t, lb, "--config", cfgPath)
	if err == nil || !strings.Contains(log, "is not a socket") {
		t.Errorf("l4lbd with admin_socket = a regular file: %v\n%s", err, log)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "do not delete\n" {
		t.Errorf("the regular file named by admin_socket was changed: %q, %v", b, err)
	}
}

// TestWorldWritableConfigRefused: a config file every user can write is
// refused by config check and at reload (the running one keeps serving);
// made private again, it reloads.
func TestWorldWritableConfigRefused(t *testing.T) {
	tp, d := lifecycleRig(t)
	if err := os.Chmod(d.Config, 0o666); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "l4lbctl"), "config", "check", d.Config).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the file is writable by every user (mode 0666)") {
		t.Errorf("config check of a world-writable file: %v\n%s", err, out)
	}
	if rl := d.Reload(); rl.OK || !strings.Contains(rl.Error, "writable by every user") {
		t.Errorf("reload of a world-writable file: %+v", rl)
	}
	if err := serves(t, tp); err != nil {
		t.Errorf("traffic after the refused reload: %v", err)
	}
	if err := os.Chmod(d.Config, 0o600); err != nil {
		t.Fatal(err)
	}
	if rl := d.Reload(); !rl.OK {
		t.Errorf("reload of the file made private again: %+v", rl)
	}
}

// TestConfigNotARegularFile: a config path that becomes a FIFO or a device
// is refused at once on reload; the control loop stays responsive and
// SIGTERM still stops the daemon.
func TestConfigNotARegularFile(t *testing.T) {
	tp, d := lifecycleRig(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		make func(path string) error
		want string
	}{
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "is not a regular file"},
		{"/dev/zero", func(p string) error { return os.Symlink("/dev/zero", p) }, "is not a regular file"},
		// Sparse: the size is refused before a byte is read.
		{"too big", func(p string) error { return os.Truncate(p, config.MaxFileSize+1) }, "MiB a config file may have"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Remove(d.Config); err != nil {
				t.Fatal(err)
			}
			if tc.name == "too big" {
				if err := os.WriteFile(d.Config, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.make(d.Config); err != nil {
				t.Fatal(err)
			}
			rl := d.Reload()
			if rl.OK || !strings.Contains(rl.Error, tc.want) {
				t.Fatalf("reload of a %s: ok=%v %q, want a rejection containing %q", tc.name, rl.OK, rl.Error, tc.want)
			}
			// The control loop answers: an override goes through.
			be := netip.MustParseAddrPort(topo.Prefix4 + "21:53")
			if err := d.API().Backend(ctx, "dns4", be, "drain"); err != nil {
				t.Fatalf("drain after the rejected reload: %v", err)
			}
			if err := d.API().Backend(ctx, "dns4", be, "clear"); err != nil {
				t.Fatalf("clear after the rejected reload: %v", err)
			}
			if err := serves(t, tp); err != nil {
				t.Fatalf("traffic after the rejected reload: %v", err)
			}
			os.Remove(d.Config)
			d.WriteConfig(oneBackendConfig())
		})
	}
	if err := os.Remove(d.Config); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(d.Config, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	start := time.Now()
	if err := d.Stop(); err != nil {
		t.Fatalf("SIGTERM with a FIFO as the config: %v\n%s", err, d.Log())
	}
	t.Logf("stopped %s after SIGTERM", time.Since(start).Round(time.Millisecond))

	// Nor does a FIFO or a device hang a start or a check: both refuse
	// it at once (runToExit fails the test if l4lbd does not exit).
	for _, path := range []string{d.Config, "/dev/zero"} {
		if log, err := runToExit(t, tp.LBs[0], "--config", path); err == nil || !strings.Contains(log, "is not a regular file") {
			t.Errorf("l4lbd --config %s: %v\n%s", path, err, log)
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "l4lbctl"), "config", "check", path).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "is not a regular file") {
			t.Errorf("config check %s: %v\n%s", path, err, out)
		}
	}
	os.Remove(d.Config)
	d.WriteConfig(oneBackendConfig())
}

// TestPendingRestart: a reload that changes settings applying only at start
// is accepted, keeps their running values, and status names them.
func TestPendingRestart(t *testing.T) {
	_, d := vip4Rig(t, 1, withMetrics(oneBackendConfig()))
	cfg := withMetrics(oneBackendConfig())
	cfg = strings.Replace(cfg, e2eSeed, "ffeeddccbbaa99887766554433221100", 1)
	cfg = strings.Replace(cfg, "conntrack_max = 65536", "conntrack_max = 131072", 1)
	d.WriteConfig(cfg)
	rl := d.Reload()
	if !rl.OK {
		t.Fatalf("reload rejected: %s", rl.Error)
	}
	st, err := d.API().Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.PendingRestart, []string{"datapath.conntrack_max", "maglev.hash_seed"}) {
		t.Errorf("pending restart = %q, want datapath.conntrack_max and maglev.hash_seed", st.PendingRestart)
	}
	ct, err := d.API().Conntrack(t.Context())
	if err != nil || ct.Capacity != 65536 {
		t.Errorf("conntrack capacity %d (%v): the running value must stay until a restart", ct.Capacity, err)
	}
	out, err := l4lbctl(t, d.Socket, "status")
	if err != nil || !strings.Contains(out, "pending restart") || !strings.Contains(out, "maglev.hash_seed") {
		t.Errorf("l4lbctl status does not show the pending settings: %v\n%s", err, out)
	}
	body := scrape(t, d.Host, metricsAddr)
	for _, want := range []string{
		`l4lb_config_pending_restart{setting="datapath.conntrack_max"} 1`,
		`l4lb_config_pending_restart{setting="maglev.hash_seed"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Back to the running values: nothing pending.
	d.WriteConfig(withMetrics(oneBackendConfig()))
	if rl := d.Reload(); !rl.OK {
		t.Fatal(rl.Error)
	}
	if st, _ := d.API().Status(t.Context()); len(st.PendingRestart) != 0 {
		t.Errorf("pending restart after restoring the values: %q", st.PendingRestart)
	}
	if body := scrape(t, d.Host, metricsAddr); strings.Contains(body, "l4lb_config_pending_restart{") {
		t.Errorf("pending-restart series left after restoring the values")
	}
}

// metricsAddr is where withMetrics makes l4lbd listen, in its namespace.
const metricsAddr = "127.0.0.1:9842"

// withMetrics turns on the metrics listener of an e2e config.
func withMetrics(cfg string) string {
	return strings.Replace(cfg, "metrics_listen = []", fmt.Sprintf("metrics_listen = [%q]", metricsAddr), 1)
}

// notifications listens where NOTIFY_SOCKET will point, as systemd does for
// a Type=notify unit, and hands on each datagram l4lbd sends.
func notifications(t *testing.T) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := make(chan string, 64)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(ch)
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return path, ch
}

// nextNotify waits (up to 10 s) for a datagram containing every one of
// want, and returns it.
func nextNotify(t *testing.T, ch <-chan string, want ...string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	var seen []string
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatalf("notify socket closed; saw %q", seen)
			}
			seen = append(seen, m)
			all := true
			for _, w := range want {
				all = all && strings.Contains(m, w)
			}
			if all {
				return m
			}
		case <-timeout:
			t.Fatalf("no notification with %q within 10s; saw %q", want, seen)
		}
	}
}

// TestSystemdNotify: under a Type=notify unit, l4lbd says READY with a
// STATUS= line systemctl status shows (what it serves, and after a reload
// the settings waiting for a restart), RELOADING and READY around each
// reload, the rejection of a bad file in STATUS=, and STOPPING.
func TestSystemdNotify(t *testing.T) {
	sock, ch := notifications(t)
	tp := vip4Topo(t, 1)
	d := tp.LBs[0].StartL4LBDWrapped([]string{"env", "NOTIFY_SOCKET=" + sock}, l4lbd(), oneBackendConfig())

	m := nextNotify(t, ch, "READY=1")
	if !regexp.MustCompile(`(?m)^STATUS=serving 4 services on eth0$`).MatchString(m) {
		t.Errorf("READY without the expected STATUS line: %q", m)
	}

	d.WriteConfig(strings.Replace(oneBackendConfig(), e2eSeed, "ffeeddccbbaa99887766554433221100", 1))
	if rl := d.Reload(); !rl.OK {
		t.Fatal(rl.Error)
	}
	nextNotify(t, ch, "RELOADING=1")
	m = nextNotify(t, ch, "READY=1")
	if !strings.Contains(m, "STATUS=serving 4 services on eth0; pending restart: maglev.hash_seed") {
		t.Errorf("READY after a reload with a new seed: %q, want the pending restart in STATUS=", m)
	}

	d.WriteConfig(strings.Replace(oneBackendConfig(), `protocol = "tcp"`, `protocol = "sctp"`, 1))
	if rl := d.Reload(); rl.OK {
		t.Fatal("an invalid file was accepted")
	}
	m = nextNotify(t, ch, "STATUS=configuration rejected, the previous one keeps serving: "+d.Config+":")
	if strings.Contains(m, "\n") {
		t.Errorf("STATUS= of a rejection spans lines: %q", m)
	}
	t.Logf("rejection: %s", m)
	nextNotify(t, ch, "READY=1")
	if err := serves(t, tp); err != nil {
		t.Errorf("traffic after the rejection: %v", err)
	}

	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	nextNotify(t, ch, "STOPPING=1")
}

// TestVIPOfTheBox: a VIP that is an address of the box, or the broadcast
// address of one of its subnets, is refused against the box's real
// interfaces: by config check, at start (nothing is created), and on
// reload (the running services keep serving).
func TestVIPOfTheBox(t *testing.T) {
	tp, d := lifecycleRig(t)
	lb := tp.LBs[0]
	own := lb.Addr4.String()
	bcast := topo.Prefix4 + "255"
	extra := fmt.Sprintf("\n[[service]]\nname = \"ssh\"\nvip = %q\nport = 22\nprotocol = \"tcp\"\n[[service.backend]]\naddress = \"%s21\"\n"+
		"\n[[service]]\nname = \"bcast\"\nvip = %q\nport = 80\nprotocol = \"tcp\"\n[[service.backend]]\naddress = \"%s21\"\n",
		own, topo.Prefix4, bcast, topo.Prefix4)
	wantErrs := []string{
		fmt.Sprintf("vip %s is an address of this box (eth0): l4lb would take over tcp port 22", own),
		fmt.Sprintf("vip %s is the broadcast address of %s0/24 on eth0", bcast, topo.Prefix4),
	}

	// config check, run on the box.
	dir := t.TempDir()
	path := filepath.Join(dir, "l4lb.toml")
	pins := filepath.Join(tp.PinRoot, "lb-own-vip")
	writeFile(t, path, strings.NewReplacer("{{socket}}", filepath.Join(dir, "x.sock"), "{{bpffs}}", pins).Replace(oneBackendConfig()+extra))
	t.Cleanup(func() { runQuiet(l4lbd(), "--config", path, "--cleanup") })
	out, err := lb.NS.Command(filepath.Join(bin, "l4lbctl"), "config", "check", path).CombinedOutput()
	for _, w := range wantErrs {
		if err == nil || !strings.Contains(string(out), w) {
			t.Errorf("config check on the box: %v, output lacks %q:\n%s", err, w, out)
		}
	}
	// The same file checked for another box passes.
	if out, err := exec.Command(filepath.Join(bin, "l4lbctl"), "config", "check", "--no-host-checks", path).CombinedOutput(); err != nil {
		t.Errorf("config check --no-host-checks: %v\n%s", err, out)
	}

	// l4lbd refuses to start with it and creates nothing.
	log, err := runToExit(t, lb, "--config", path)
	if err == nil || !strings.Contains(log, wantErrs[0]) {
		t.Errorf("l4lbd with a VIP of the box: %v\n%s", err, log)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("%s exists after the refusal: %v", pins, err)
	}

	// A reload adding it is rejected; the running services keep serving.
	d.WriteConfig(oneBackendConfig() + extra)
	rl := d.Reload()
	if rl.OK || !strings.Contains(rl.Error, wantErrs[0]) {
		t.Errorf("reload with a VIP of the box: ok=%v %q", rl.OK, rl.Error)
	}
	if _, err := d.API().Service(t.Context(), "ssh"); err == nil {
		t.Error("service ssh was programmed")
	}
	if err := serves(t, tp); err != nil {
		t.Errorf("traffic after the rejected reload: %v", err)
	}
}

// TestOversizedMapsRefused: a config whose maps need more kernel memory than
// the machine has is refused at start, before anything is created.
func TestOversizedMapsRefused(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 1})
	dir := t.TempDir()
	pins := filepath.Join(tp.PinRoot, "lb-big")
	cfg := strings.NewReplacer("{{socket}}", filepath.Join(dir, "big.sock"), "{{bpffs}}", pins,
		"conntrack_max = 65536", "conntrack_max = 134217728\nsnat_max = 134217728").Replace(oneBackendConfig())
	path := filepath.Join(dir, "big.toml")
	writeFile(t, path, cfg)
	t.Cleanup(func() { runQuiet(l4lbd(), "--config", path, "--cleanup") })
	start := time.Now()
	log, err := runToExit(t, tp.LBs[0], "--config", path)
	if err == nil || !strings.Contains(log, "the datapath maps need ≈") {
		t.Fatalf("l4lbd with 2^27-entry tables: %v\n%s", err, log)
	}
	t.Logf("refused in %s: %s", time.Since(start).Round(time.Millisecond), firstLines(log, 1))
	for _, p := range []string{pins, filepath.Join(dir, "big.sock"), filepath.Join(dir, "big.lock")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after the refusal: %v", p, err)
		}
	}
}

// TestBPFFSHiddenByIPNetnsExec: under `ip netns exec`, which hides the
// host's bpffs, l4lbd fails with the documented error and its nsenter hint
// and creates nothing.
func TestBPFFSHiddenByIPNetnsExec(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 1})
	dir := t.TempDir()
	pins := filepath.Join(tp.PinRoot, "lb-netns-exec")
	path := filepath.Join(dir, "l4lb.toml")
	writeFile(t, path, strings.NewReplacer("{{socket}}", filepath.Join(dir, "x.sock"), "{{bpffs}}", pins).Replace(oneBackendConfig()))
	t.Cleanup(func() { runQuiet(l4lbd(), "--config", path, "--cleanup") })
	out, err := exec.Command("ip", "netns", "exec", tp.LBs[0].NS.Name, l4lbd(), "--config", path).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not on a bpffs mount") || !strings.Contains(string(out), "nsenter --net=/run/netns/NAME") {
		t.Fatalf("l4lbd under ip netns exec: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	for _, p := range []string{pins, filepath.Join(dir, "x.sock"), filepath.Join(dir, "x.lock")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after the refusal: %v", p, err)
		}
	}
}

// waitLogged waits (up to 10 s) for d's log past offset from to hold want.
func waitLogged(t *testing.T, d *topo.L4LBD, from int, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(d.Log()[from:], want) {
			return
		}
	}
	t.Errorf("l4lbd did not log %q:\n%s", want, d.Log()[from:])
}

// TestReloadCommand: `l4lbctl reload` (the unit's ExecReload) waits for the
// outcome and fails on a rejected file, which the daemon logs once.
func TestReloadCommand(t *testing.T) {
	_, d := lifecycleRig(t)
	if out, err := l4lbctl(t, d.Socket, "reload"); err != nil || !strings.Contains(out, "reloaded") {
		t.Fatalf("reload of a valid file: %v\n%s", err, out)
	}
	d.WriteConfig(strings.Replace(oneBackendConfig(), `protocol = "tcp"`, `protocol = "sctp"`, 1))
	out, err := l4lbctl(t, d.Socket, "reload")
	if err == nil || !strings.Contains(out, "configuration rejected") || !strings.Contains(out, ".toml:") || !strings.Contains(out, "sctp") {
		t.Fatalf("reload of an invalid file: %v\n%s", err, out)
	}
	// The file is not watched (daemon.watch_config unset): the one
	// reload asked for is the only one. The log reaches the test
	// through a pipe: wait for the line first.
	waitLogged(t, d, 0, "configuration rejected")
	if n := strings.Count(d.Log(), "configuration rejected"); n != 1 {
		t.Errorf("the rejection is logged %d times, want once for the one reload:\n%s", n, d.Log())
	}
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, "reload failed") || strings.Contains(l, "reload after a change") {
			t.Errorf("rejection logged again: %s", l)
		}
	}

	// A file with a megabyte-long value and dozens of errors makes a
	// bounded log line: values cut, errors beyond the first 20 counted.
	// `l4lbctl reload` prints every error, values cut alike.
	var b strings.Builder
	b.WriteString(strings.Replace(oneBackendConfig(), `protocol = "tcp"`, `protocol = "`+strings.Repeat("x", 1<<20)+`"`, 1))
	for i := range 30 {
		fmt.Fprintf(&b, "\n[[service]]\nname = \"bad%d\"\nvip = \"%s\"\nport = %d\nprotocol = \"sctp\"\n", i, vip4, 1000+i)
	}
	d.WriteConfig(b.String())
	logged := len(d.Log())
	out, err = l4lbctl(t, d.Socket, "reload")
	if err == nil || !strings.Contains(out, "… (1048576 bytes)") || strings.Count(out, `"sctp"`) != 30 || len(out) > 16<<10 {
		t.Errorf("reload of a file with a 1 MiB value and 31 errors: %v, %d bytes:\n%.2000s", err, len(out), out)
	}
	waitLogged(t, d, logged, "configuration rejected")
	lines := 0
	for _, l := range strings.Split(d.Log()[logged:], "\n") {
		if !strings.Contains(l, "configuration rejected") {
			continue
		}
		lines++
		if len(l) > 16<<10 || !strings.Contains(l, "… (1048576 bytes)") || !strings.Contains(l, "and 11 more errors (l4lbctl config check FILE lists them all)") {
			t.Errorf("rejection logged in a line of %d bytes: %.2000s", len(l), l)
		}
	}
	if lines == 0 {
		t.Error("the rejection was not logged")
	}
	t.Logf("reply to the reload: %d bytes", len(out))
}

// TestConfigDiffAndFlowGuard: `l4lbctl config diff FILE` shows what a change
// would do against the running daemon, with the share of flows that would
// move matching what the traffic then does, and daemon.max_flow_move
// refuses a reload that would move more.
func TestConfigDiffAndFlowGuard(t *testing.T) {
	tp, d := vip4Rig(t, 3, dsrConfig(21, 22, 23))

	// Removing be3 moves about a third of web4's flows.
	next := strings.Replace(dsrConfig(21, 22), "[daemon]\n", "[daemon]\nmax_flow_move = 0.2\n", 1)
	file := filepath.Join(t.TempDir(), "next.toml")
	writeFile(t, file, strings.NewReplacer("{{socket}}", d.Socket, "{{bpffs}}", d.PinDir).Replace(next))
	out, err := l4lbctl(t, d.Socket, "config", "diff", file, "-o", "json")
	if err == nil {
		t.Fatalf("config diff of a change over max_flow_move exited 0:\n%s", out)
	}
	var diff struct {
		Refused  []string `json:"refused"`
		Services []struct {
			Name       string   `json:"name"`
			Status     string   `json:"status"`
			Removed    []string `json:"removed"`
			MovedFlows float64  `json:"moved_flows"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(out), &diff); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var web4 float64
	for _, s := range diff.Services {
		if s.Status != "changed" || len(s.Removed) != 1 || !strings.HasPrefix(s.Removed[0], "10.100.0.23:") && !strings.HasPrefix(s.Removed[0], "[fd10::23]:") {
			t.Errorf("service %s: %+v, want changed with be3 removed", s.Name, s)
		}
		if s.Name == "web4" {
			web4 = s.MovedFlows
		}
	}
	if web4 < 0.25 || web4 > 0.42 || len(diff.Refused) != 4 {
		t.Fatalf("web4 would move %v, refused %q; want about a third and every service refused", web4, diff.Refused)
	}
	text, _ := l4lbctl(t, d.Socket, "config", "diff", file)
	t.Logf("config diff:\n%s", text)

	// The guard refuses the reload, naming the services; nothing changes.
	d.WriteConfig(next)
	rl := d.Reload()
	if rl.OK || !strings.Contains(rl.Error, `service "web4" would move`) || !strings.Contains(rl.Error, "max_flow_move = 0.2") {
		t.Fatalf("reload over the guard: ok=%v %q", rl.OK, rl.Error)
	}
	svc, err := d.API().Service(t.Context(), "web4")
	if err != nil || len(svc.Backends) != 3 {
		t.Fatalf("a refused reload changed web4: %+v %v", svc, err)
	}

	// The share is what traffic does: new flows from fixed source ports
	// before and after the change, counted by the backend they reach.
	before := map[uint16]string{}
	const flows = 150
	for i := range flows {
		port := uint16(20000 + i)
		c, err := tp.Client.DialTCP(port, netip.AddrPortFrom(vip4, 80))
		if err != nil {
			t.Fatal(err)
		}
		before[port] = c.Backend
		c.Abort()
	}
	d.WriteConfig(strings.Replace(next, "max_flow_move = 0.2", "max_flow_move = 0.5", 1))
	if rl := d.Reload(); !rl.OK {
		t.Fatalf("reload under a raised guard: %s", rl.Error)
	}
	moved := 0
	for i := range flows {
		port := uint16(20000 + i)
		// TIME_WAIT on the client: reuse is fine with a fresh socket
		// as the tests' dialer sets SO_REUSEADDR/aborts with RST.
		c, err := tp.Client.DialTCP(port, netip.AddrPortFrom(vip4, 80))
		if err != nil {
			t.Fatal(err)
		}
		if c.Backend != before[port] {
			moved++
		}
		c.Abort()
	}
	share := float64(moved) / flows
	t.Logf("predicted %.1f%% of web4's flows to move, %d of %d flows (%.1f%%) did", 100*web4, moved, flows, 100*share)
	if diff := share - web4; diff > 0.12 || diff < -0.12 {
		t.Errorf("%.1f%% of flows moved, config diff predicted %.1f%%", 100*share, 100*web4)
	}
}

// TestConfigCheckAsUser: an operator checking a file as themselves, who
// cannot see into a root-only bpffs directory, gets a warning for that
// check and the verdict of all the others, not a permission error.
func TestConfigCheckAsUser(t *testing.T) {
	testnet.RequireRoot(t)
	root, err := os.MkdirTemp("/sys/fs/bpf", "l4lb-e2e-private-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o700); err != nil {
		t.Fatal(err)
	}
	// A directory the user can read, for the file.
	dir, err := os.MkdirTemp("", "l4lb-e2e-user-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "l4lb.toml")
	// The check runs on the host: name an interface every host has.
	cfg := strings.NewReplacer("{{socket}}", filepath.Join(dir, "l4lb.sock"), "{{bpffs}}", filepath.Join(root, "l4lb"),
		`interfaces    = ["eth0"]`, `interfaces    = ["lo"]`).Replace(oneBackendConfig())
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "l4lbctl"), append([]string{"config", "check"}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The binary must be reachable for the user too.
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := check(path)
	if err != nil || !strings.Contains(out, "valid (4 services)") || !strings.Contains(out, "could not be checked as this user") {
		t.Errorf("config check as nobody: %v\n%s", err, out)
	}
	// Errors the user can see still fail the check.
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte(strings.Replace(cfg, `protocol = "tcp"`, `protocol = "sctp"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := check(bad); err == nil || !strings.Contains(out, `unknown protocol "sctp"`) {
		t.Errorf("config check of a bad file as nobody: %v\n%s", err, out)
	}
}
