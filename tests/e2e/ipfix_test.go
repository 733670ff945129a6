// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

// nfdumpBins are Debian's nfdump package: the collector and the reader.
var nfdumpBins = []string{"/usr/bin/nfcapd", "/usr/bin/nfdump"}

// requireNfdump finds nfdump; without it the test skips, or fails under
// `make test`, where scripts/deps.sh installs it.
func requireNfdump(t *testing.T) {
	t.Helper()
	testnet.SkipShort(t, "runs nfcapd")
	for _, p := range nfdumpBins {
		if _, err := os.Stat(p); err != nil {
			msg := fmt.Sprintf("%s not found: install Debian's nfdump (scripts/deps.sh test does)", p)
			if os.Getenv(testnet.PrivilegedEnv) != "" {
				t.Fatalf("%s; %s is set, so this is a failure", msg, testnet.PrivilegedEnv)
			}
			t.Skipf("skipping: %s", msg)
		}
	}
}

// ipfixCollector is the collector's address, in the LB box's namespace.
const ipfixCollector = "127.0.0.1:4739"

// TestIPFIXToNfdump exports the flows of real connections through a SNAT
// service to Debian's nfcapd and reads them back with nfdump: each
// connection shows with its client, the VIP, its backend (post-NAT
// destination), its SNAT source, a record when it was created and one
// when it ended (its client closed it, then it went idle).
func TestIPFIXToNfdump(t *testing.T) {
	requireNfdump(t)
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	for _, be := range tp.Backends {
		be.Serve(netip.AddrPortFrom(be.Addr4, 8080))
	}
	dir := t.TempDir()
	collector := tp.LBs[0].Start(nfdumpBins[0], "-w", dir, "-b", "127.0.0.1", "-p", "4739", "-t", "60")
	cfg := inspectConfig() + fmt.Sprintf(`
[ipfix]
collectors = [%q]
scan_interval = "1s"
active_timeout = "30s"
idle_timeout = "2s"
`, ipfixCollector)
	d := tp.LBs[0].StartL4LBD(l4lbd(), cfg)
	tp.RouteVIPs(tp.LBs[0], netip.MustParseAddr("10.200.3.10"))

	type conn struct{ client, backend string }
	var conns []conn
	perBackend := map[string]int{}
	for range 4 {
		c, err := tp.Client.DialTCP(0, netip.MustParseAddrPort("10.200.3.10:80"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Echo("exported"); err != nil {
			t.Fatal(err)
		}
		cl := conn{c.LocalAddr().(*net.TCPAddr).AddrPort().String(), backendAddr(c.Backend, 8080)}
		conns = append(conns, cl)
		perBackend[cl.backend]++
		c.Close()
	}
	// Created within a scan; ended once idle past idle_timeout.
	waitFor(t, "the flows to end", func() (bool, string) {
		body := scrape(t, d.Host, metricsAddr)
		return strings.Contains(body, fmt.Sprintf(`l4lb_ipfix_records_total{event="ended"} %d`, len(conns))), body
	})
	if err := collector.Stop(); err != nil {
		t.Fatalf("nfcapd: %v\n%s", err, collector.Log())
	}
	out, err := exec.Command(nfdumpBins[1], "-R", dir, "-q", "-N", "-o", "fmt:%sa|%sp|%da|%dp|%pr|%xsa|%xsp|%xda|%xdp").CombinedOutput()
	if err != nil {
		t.Fatalf("nfdump: %v\n%s", err, out)
	}
	t.Logf("nfdump -R:\n%s", out)

	// client -> records seen, each the same flow.
	seen := map[string]int{}
	byBackend := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if len(f) != 9 {
			t.Errorf("nfdump line %q: want 9 fields", line)
			continue
		}
		client := net.JoinHostPort(f[0], f[1])
		backend := net.JoinHostPort(f[7], f[8])
		if f[2] != "10.200.3.10" || f[3] != "80" || f[4] != "6" || f[5] != tp.LBs[0].Addr4.String() || f[6] == "0" {
			t.Errorf("record %q: want the flow to 10.200.3.10:80/TCP (protocol 6) through the SNAT source %s", line, tp.LBs[0].Addr4)
		}
		seen[client]++
		if byBackend[backend] == nil {
			byBackend[backend] = map[string]bool{}
		}
		byBackend[backend][client] = true
	}
	for _, c := range conns {
		if seen[c.client] != 2 {
			t.Errorf("connection %s: %d records, want 2 (created, ended)", c.client, seen[c.client])
		}
		if !byBackend[c.backend][c.client] {
			t.Errorf("connection %s: no record names its backend %s", c.client, c.backend)
		}
	}
	for be, n := range perBackend {
		if len(byBackend[be]) != n {
			t.Errorf("backend %s: records of %d flows, want the %d connections it served", be, len(byBackend[be]), n)
		}
	}
}
