// SPDX-License-Identifier: Apache-2.0

// Package e2e runs l4lbd for real: namespaces built by the tests (a client,
// LB boxes and backends on one segment), the daemon and the backend
// companion as processes, and real TCP and UDP connections through them.
package e2e

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

// bin holds l4lbd and l4lbctl built from this tree for the run.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() || os.Geteuid() != 0 && os.Getenv(testnet.PrivilegedEnv) == "" {
		// Every test here skips with a reason (-short is make check,
		// which runs no test that needs root): no need to build.
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

// scrape reads /metrics from addr in h's namespace.
func scrape(t *testing.T, h *topo.Host, addr string) string {
	t.Helper()
	var body string
	err := h.NS.Do(func() error {
		// Dial here, on the thread that is in the namespace; the HTTP
		// transport would dial from another one.
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.0\r\nHost: l4lbd\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("scrape %s on %s: %v", addr, h.Name, err)
	}
	return body
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
