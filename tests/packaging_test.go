// SPDX-License-Identifier: Apache-2.0

package tests

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
)

// sizeBudget is the most each packaged binary may weigh, stripped
// (docs/operations.md states it): a dependency that doubles a binary
// fails here instead of reaching every box.
var sizeBudget = map[string]int64{
	"/usr/sbin/l4lbd":  80 << 20,
	"/usr/bin/l4lbctl": 48 << 20,
}

// make runs a Makefile target of the repository with extra variables.
func runMake(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-C", "..", "--no-print-directory"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestInstallPrefix: `make install PREFIX=/usr` points the units at the
// binaries where it put them.
func TestInstallPrefix(t *testing.T) {
	testnet.SkipShort(t, "links both binaries through make")
	dest, bin := t.TempDir(), t.TempDir()
	runMake(t, "install", "PREFIX=/usr", "DESTDIR="+dest, "BIN="+bin)
	for _, p := range []string{"usr/sbin/l4lbd", "usr/bin/l4lbctl", "etc/l4lb/l4lb.toml", "etc/default/l4lb-backend"} {
		if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
			t.Errorf("make install: %v", err)
		}
	}
	for _, u := range []string{"l4lb.service", "l4lb-backend.service"} {
		b, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system", u))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "/usr/local") || !strings.Contains(string(b), "/usr/sbin/l4lbd") {
			t.Errorf("%s still names /usr/local or lacks /usr/sbin/l4lbd:\n%s", u, b)
		}
	}
}

// TestDebianPackage builds the .deb with `make deb`, installs it on this
// machine with dpkg -i, checks what it installed (static, stripped
// binaries within their size budget) and that systemd accepts the units,
// that nothing was enabled or started, that an upgrade keeps a datapath
// attached and a removal takes it away, and that a purge leaves nothing.
func TestDebianPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode (make check): installs a package; make test runs it")
	}
	if os.Geteuid() != 0 {
		if os.Getenv("L4LB_PRIVILEGED_TESTS") != "" {
			t.Fatal("installing the package needs root; run make test as root")
		}
		t.Skip("installing the package needs root")
	}
	for _, tool := range []string{"dpkg", "dpkg-query", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (scripts/deps.sh installs what the tests need)", tool)
		}
	}
	bin := t.TempDir()
	runMake(t, "deb", "BIN="+bin)
	debs, _ := filepath.Glob(filepath.Join(bin, "l4lb_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb made %v", debs)
	}
	purge := func() {
		if out, err := exec.Command("dpkg", "--purge", "l4lb").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge: %v\n%s", err, out)
		}
	}
	t.Cleanup(func() {
		if exec.Command("dpkg-query", "-W", "l4lb").Run() == nil {
			purge()
		}
	})
	if out, err := exec.Command("dpkg", "-i", debs[0]).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i: %v\n%s", err, out)
	}

	for _, p := range []string{
		"/usr/sbin/l4lbd", "/usr/bin/l4lbctl", "/lib/systemd/system/l4lb.service", "/lib/systemd/system/l4lb-backend.service",
		"/etc/l4lb/l4lb.toml", "/etc/default/l4lb-backend", "/usr/share/bash-completion/completions/l4lbctl",
		"/usr/share/zsh/vendor-completions/_l4lbctl", "/usr/share/doc/l4lb/copyright",
	} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	for page, want := range map[string]string{"l4lbd.8.gz": `.TH "L4LBD" "8"`, "l4lbctl.8.gz": `.TH "L4LBCTL" "8"`,
		"l4lbctl-config-diff.8.gz": `.TH "L4LBCTL-CONFIG-DIFF" "8"`, "l4lbctl-reload.8.gz": "wait for the outcome"} {
		if got := gunzip(t, filepath.Join("/usr/share/man/man8", page)); !strings.Contains(got, want) {
			t.Errorf("man page %s lacks %q", page, want)
		}
	}
	out, err := exec.Command("dpkg-query", "-W", "-f=${Conffiles}", "l4lb").Output()
	if err != nil || !strings.Contains(string(out), "/etc/l4lb/l4lb.toml") || !strings.Contains(string(out), "/etc/default/l4lb-backend") {
		t.Errorf("conffiles: %v %q", err, out)
	}
	if fi, err := os.Stat("/etc/l4lb/l4lb.toml"); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("/etc/l4lb/l4lb.toml: %v mode %v, want 0640", err, fi.Mode().Perm())
	}
	for _, u := range []string{"l4lb.service", "l4lb-backend.service"} {
		b, _ := os.ReadFile("/lib/systemd/system/" + u)
		if strings.Contains(string(b), "/usr/local") {
			t.Errorf("%s names /usr/local:\n%s", u, b)
		}
		if out, err := exec.Command("systemd-analyze", "verify", "/lib/systemd/system/"+u).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
		if _, err := os.Lstat("/etc/systemd/system/multi-user.target.wants/" + u); err == nil {
			t.Errorf("the package enabled %s", u)
		}
	}
	if out, err := exec.Command("/usr/sbin/l4lbd", "--version").CombinedOutput(); err != nil || !strings.Contains(string(out), "l4lbd version") {
		t.Errorf("installed l4lbd --version: %v %s", err, out)
	}
	if pids := running("/usr/sbin/l4lbd"); len(pids) > 0 {
		t.Errorf("the package started l4lbd (pids %v)", pids)
	}
	// The shipped config serves nothing: the installed l4lbctl refuses it
	// for want of a seed.
	if out, err := exec.Command("/usr/bin/l4lbctl", "config", "check", "/etc/l4lb/l4lb.toml").CombinedOutput(); err == nil || !strings.Contains(string(out), "hash_seed is missing") {
		t.Errorf("the shipped config: %v\n%s", err, out)
	}

	for exe, budget := range sizeBudget {
		checkPackagedBinary(t, exe, budget)
	}

	pins, socket := packageDatapath(t, debs[0])
	purge()
	for _, p := range []string{"/usr/sbin/l4lbd", "/etc/l4lb/l4lb.toml", "/etc/l4lb", "/lib/systemd/system/l4lb.service", pins, socket} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after purge: %v", p, err)
		}
	}
}

// checkPackagedBinary: exe is static (no interpreter, no shared library:
// the package needs no Depends:), stripped (no symbol table, no DWARF),
// built with -trimpath (no build directory in it) and within budget.
func checkPackagedBinary(t *testing.T, exe string, budget int64) {
	t.Helper()
	fi, err := os.Stat(exe)
	if err != nil {
		t.Error(err)
		return
	}
	if fi.Size() > budget {
		t.Errorf("%s is %.1f MiB, over its budget of %d MiB (docs/operations.md)", exe, float64(fi.Size())/(1<<20), budget>>20)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (it has an interpreter): build it with CGO_ENABLED=0, or give the package the Depends: its libraries need", exe)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v", exe, libs)
	}
	for _, name := range []string{".symtab", ".debug_info", ".zdebug_info"} {
		if f.Section(name) != nil {
			t.Errorf("%s has a %s section: not stripped (-ldflags '-s -w')", exe, name)
		}
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Error(err)
		return
	}
	if wd, _ := os.Getwd(); bytes.Contains(b, []byte(filepath.Dir(wd)+"/lb/")) {
		t.Errorf("%s holds paths of the build tree: build it with -trimpath", exe)
	}
}

// packageDatapath runs the installed l4lbd on a veth of its own namespace,
// stops it (the datapath stays attached, as after any stop), then checks
// that reinstalling the package (an upgrade's maintainer scripts) keeps
// the datapath and that removing it detaches and unpins it. It returns
// the bpffs directory and the admin socket it used, for the purge checks.
func packageDatapath(t *testing.T, deb string) (pins, socket string) {
	t.Helper()
	ns := testnet.NewNS(t, "pkg")
	peer := testnet.NewNS(t, "pkgpeer")
	testnet.Veth(t, ns, "eth0", peer, "peer0")
	pins = fmt.Sprintf("/sys/fs/bpf/l4lb-pkg-test-%d", os.Getpid())
	socket = fmt.Sprintf("/run/l4lb-pkg-test-%d/l4lb.sock", os.Getpid())
	t.Cleanup(func() {
		_ = exec.Command("/usr/sbin/l4lbd", "--cleanup", "--bpffs", pins, "--admin-socket", socket).Run()
		_ = os.RemoveAll(filepath.Dir(socket))
	})
	cfg := fmt.Sprintf("[daemon]\nbpffs = %q\nadmin_socket = %q\nmetrics_listen = []\n"+
		"[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \"5f1c0ffee0ddba11deadbeef00c0ffee\"\n", pins, socket)
	if err := os.WriteFile("/etc/l4lb/l4lb.toml", []byte(cfg), 0o640); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net="+ns.Path(), "/usr/sbin/l4lbd", "--config", "/etc/l4lb/l4lb.toml")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the installed l4lbd did not start:\n%s", log.String())
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the installed l4lbd: %v\n%s", err, log.String())
	}
	attached := func() bool { return strings.Contains(ns.Run(t, "ip", "link", "show", "eth0"), "xdp") }
	if !attached() {
		t.Fatalf("no XDP program on eth0 after l4lbd stopped:\n%s", log.String())
	}

	// An upgrade (the same package again: prerm upgrade, postinst
	// configure) keeps the datapath: the next l4lbd adopts it.
	if out, err := exec.Command("dpkg", "-i", "--force-confold", deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i again (upgrade): %v\n%s", err, out)
	}
	if !attached() {
		t.Error("an upgrade detached the datapath")
	}
	if _, err := os.Stat(filepath.Join(pins, "services")); err != nil {
		t.Errorf("an upgrade removed the pins: %v", err)
	}

	// A removal takes it away, while the binary is still there.
	out, err := exec.Command("dpkg", "--remove", "l4lb").CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg --remove: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "detached xdp program from eth0") {
		t.Errorf("dpkg --remove did not say it detached the datapath:\n%s", out)
	}
	if attached() {
		t.Errorf("XDP still attached after dpkg --remove:\n%s", out)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("%s left after dpkg --remove: %v\n%s", pins, err, out)
	}
	return pins, socket
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Error(err)
		return ""
	}
	b, _ := io.ReadAll(z)
	return string(b)
}

// running lists the pids whose executable is exe.
func running(exe string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if target, err := os.Readlink(filepath.Join(d, "exe")); err == nil && target == exe {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}
