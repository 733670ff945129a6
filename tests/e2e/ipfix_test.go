// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
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
// when it ended (its client closed it, then it went idle). A UDP flow's
// records add up to the datagrams its backend received and their IP
// octets; a TCP connection's count packets.
func TestIPFIXToNfdump(t *testing.T) {
	requireNfdump(t)
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	var servers []*topo.Server
	for _, be := range tp.Backends {
		servers = append(servers, be.Serve(netip.AddrPortFrom(be.Addr4, 8080)))
	}
	dir := t.TempDir()
	collector := tp.LBs[0].Start(nfdumpBins[0], "-w", dir, "-b", "127.0.0.1", "-p", "4739", "-t", "60")
	cfg := inspectConfig() + fmt.Sprintf(`
[ipfix]
collectors = [%q]
scan_interval = "1s"
active_timeout = "30s"
idle_timeout = "2s"
`, ipfixCollector) + vipService("dns", 53, "udp")
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
	// One UDP flow of datagrams of one size; the backends count what
	// reaches them (a retried datagram included).
	const datagram = "a counted datagram"
	u, err := tp.Client.DialUDP(0, netip.MustParseAddrPort("10.200.3.10:53"))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := u.Ask(datagram); err != nil {
			t.Fatal(err)
		}
	}
	udpClient := netip.AddrPortFrom(tp.Client.Addr4, u.LocalPort()).String()
	u.Close()
	// Created within a scan; ended once idle past idle_timeout.
	waitFor(t, "the flows to end", func() (bool, string) {
		body := scrape(t, d.Host, metricsAddr)
		return strings.Contains(body, fmt.Sprintf(`l4lb_ipfix_records_total{event="ended"} %d`, len(conns)+1)), body
	})
	if err := collector.Stop(); err != nil {
		t.Fatalf("nfcapd: %v\n%s", err, collector.Log())
	}
	out, err := exec.Command(nfdumpBins[1], "-R", dir, "-q", "-N", "-o", "fmt:%sa|%sp|%da|%dp|%pr|%xsa|%xsp|%xda|%xdp|%pkt|%byt").CombinedOutput()
	if err != nil {
		t.Fatalf("nfdump: %v\n%s", err, out)
	}
	t.Logf("nfdump -R:\n%s", out)

	// client -> records seen, each the same flow, and their counts.
	seen := map[string]int{}
	packets, bytes := map[string]uint64{}, map[string]uint64{}
	byBackend := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if len(f) != 11 {
			t.Errorf("nfdump line %q: want 11 fields", line)
			continue
		}
		client := net.JoinHostPort(f[0], f[1])
		backend := net.JoinHostPort(f[7], f[8])
		port, proto := "80", "6"
		if client == udpClient {
			port, proto = "53", "17"
		}
		if f[2] != "10.200.3.10" || f[3] != port || f[4] != proto || f[5] != tp.LBs[0].Addr4.String() || f[6] == "0" {
			t.Errorf("record %q: want the flow to 10.200.3.10:%s (protocol %s) through the SNAT source %s", line, port, proto, tp.LBs[0].Addr4)
		}
		p, perr := strconv.ParseUint(f[9], 10, 64)
		b, berr := strconv.ParseUint(f[10], 10, 64)
		if perr != nil || berr != nil {
			t.Errorf("record %q: packets %q, bytes %q: want numbers", line, f[9], f[10])
		}
		packets[client] += p
		bytes[client] += b
		seen[client]++
		if client == udpClient {
			continue
		}
		if byBackend[backend] == nil {
			byBackend[backend] = map[string]bool{}
		}
		byBackend[backend][client] = true
	}
	for _, c := range conns {
		if seen[c.client] != 2 {
			t.Errorf("connection %s: %d records, want 2 (created, ended)", c.client, seen[c.client])
		}
		// At least the ACK that made its entry, the line it sent and
		// its FIN (the SYN makes no entry and is not counted), each of
		// at least 40 bytes of headers.
		if packets[c.client] < 3 || bytes[c.client] < 40*packets[c.client]+uint64(len("exported\n")) {
			t.Errorf("connection %s: %d packets, %d bytes; want 3 or more, each of 40 bytes or more, and its payload", c.client, packets[c.client], bytes[c.client])
		}
		if !byBackend[c.backend][c.client] {
			t.Errorf("connection %s: no record names its backend %s", c.client, c.backend)
		}
	}
	var got int64
	for _, s := range servers {
		got += s.Datagram.Load()
	}
	// IPv4 and UDP headers, 28 bytes, and the payload.
	if want := uint64(got); seen[udpClient] != 2 || packets[udpClient] != want || bytes[udpClient] != want*uint64(28+len(datagram)) {
		t.Errorf("UDP flow %s: %d records, %d packets, %d bytes; want 2 records, the %d datagrams the backends received, %d bytes",
			udpClient, seen[udpClient], packets[udpClient], bytes[udpClient], want, want*uint64(28+len(datagram)))
	}
	for be, n := range perBackend {
		if len(byBackend[be]) != n {
			t.Errorf("backend %s: records of %d flows, want the %d connections it served", be, len(byBackend[be]), n)
		}
	}
}
