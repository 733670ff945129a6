// SPDX-License-Identifier: Apache-2.0

package tests

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

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
// machine with dpkg -i, checks what it installed and that systemd accepts
// the units, that nothing was enabled or started, and purges it again.
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

	purge()
	for _, p := range []string{"/usr/sbin/l4lbd", "/etc/l4lb/l4lb.toml", "/lib/systemd/system/l4lb.service"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after purge: %v", p, err)
		}
	}
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
