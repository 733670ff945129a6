// SPDX-License-Identifier: Apache-2.0

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestSystemdUnits checks the units with systemd-analyze: verify finds no
// problem, and the sandbox keeps the exposure score low. The binaries are
// built here and the units pointed at them, because verify checks that
// every Exec path exists.
func TestSystemdUnits(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode (make check): builds the binaries; make test runs it")
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("L4LB_PRIVILEGED_TESTS") != "" {
			t.Fatal("systemd-analyze is missing (Debian package systemd); .ci/run installs it")
		}
		t.Skip("systemd-analyze is missing (Debian package systemd)")
	}
	dir := t.TempDir()
	for _, cmd := range []string{"l4lbd", "l4lbctl"} {
		out, err := exec.Command("go", "build", "-C", "..", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", cmd, err, out)
		}
	}
	env, err := filepath.Abs("../etc/default/l4lb-backend")
	if err != nil {
		t.Fatal(err)
	}
	for _, unit := range []string{"l4lb.service", "l4lb-backend.service"} {
		t.Run(unit, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("../systemd", unit))
			if err != nil {
				t.Fatal(err)
			}
			s := strings.NewReplacer(
				"/usr/local/sbin/l4lbd", filepath.Join(dir, "l4lbd"),
				"/usr/local/bin/l4lbctl", filepath.Join(dir, "l4lbctl"),
				"/etc/default/l4lb-backend", env,
			).Replace(string(b))
			path := filepath.Join(dir, unit)
			if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
			if err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
			}
			out, err = exec.Command("systemd-analyze", "security", "--offline=true", path).CombinedOutput()
			if err != nil {
				t.Fatalf("systemd-analyze security: %v\n%s", err, out)
			}
			m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
			if m == nil {
				t.Fatalf("no exposure level in:\n%s", out)
			}
			score, _ := strconv.ParseFloat(string(m[1]), 64)
			t.Logf("%s: exposure %.1f", unit, score)
			// 0 is a fully sandboxed unit, 10 an unsandboxed one; a
			// datapath loader needs CAP_BPF and CAP_NET_ADMIN.
			if score > 3.0 {
				t.Errorf("%s: exposure %.1f, want <= 3.0: the sandbox regressed", unit, score)
			}
		})
	}
}
