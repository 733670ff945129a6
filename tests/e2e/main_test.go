// SPDX-License-Identifier: Apache-2.0

// Package e2e runs l4lbd for real: namespaces built by the tests (a client,
// LB boxes and backends on one segment), the daemon and the backend
// companion as processes, and real TCP and UDP connections through them.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

// bin holds l4lbd and l4lbctl built from this tree for the run.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 && os.Getenv(testnet.PrivilegedEnv) == "" {
		// Every test here skips with a reason; no need to build.
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "l4lb-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := topo.BuildBinaries("../..", dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	bin = dir
	return m.Run()
}

func l4lbd() string { return filepath.Join(bin, "l4lbd") }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func runQuiet(name string, args ...string) {
	_ = exec.Command(name, args...).Run()
}

// boxHead is the start of an e2e l4lbd config: the daemon, datapath and
// maglev tables, small maps, the test seed. metrics is daemon.metrics_listen
// as TOML ("[]" for none), mode the datapath mode ("dsr" gets IPIP).
func boxHead(metrics, mode string, tableSize int) string {
	dsr := ""
	if mode == "dsr" {
		dsr = "mode          = \"dsr\"\ndsr_dispatch  = \"ipip\"\n"
	}
	return fmt.Sprintf(`
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = %s
bpffs          = "{{bpffs}}"

[datapath]
interfaces    = ["eth0"]
%sconntrack_max = 65536
max_services  = 16
max_backends  = 64

[maglev]
hash_seed  = %q
table_size = %d
`, metrics, dsr, e2eSeed, tableSize)
}
