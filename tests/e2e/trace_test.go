// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"encoding/json"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// TestTrace runs `l4lbctl trace -o json` against a live daemon while a
// client opens a TCP connection through a SNAT service: the stream starts
// with the trace's counts, then shows the connection's packets both ways
// with its service, backend, SNAT binding and what the connection table
// did, and ends after --count events with the counts and the reason.
func TestTrace(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	for _, be := range tp.Backends {
		be.Serve(netip.AddrPortFrom(be.Addr4, 8080))
	}
	d := tp.LBs[0].StartL4LBD(l4lbd(), inspectConfig())
	tp.RouteVIPs(tp.LBs[0], netip.MustParseAddr("10.200.3.10"))

	const count = 6
	tr := startTrace(t, d.Socket, "--client", tp.Client.Addr4.String(), "--service", "web", "--count", "6", "--timeout", "60s")
	next := tr.message
	if m := next("start"); m.Stats == nil || m.Stats.Matched != 0 {
		t.Fatalf("first message %+v, want the trace's zero counts", m)
	}

	conn, err := tp.Client.DialTCP(0, netip.MustParseAddrPort("10.200.3.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Abort)
	if err := conn.Echo("traced"); err != nil {
		t.Fatal(err)
	}
	client := conn.LocalAddr().(*net.TCPAddr).AddrPort().String()
	backend := backendAddr(conn.Backend, 8080)

	var events []api.TraceEvent
	var stats *api.TraceStats
	end := ""
	for end == "" {
		m := next("events")
		switch {
		case m.Event != nil:
			events = append(events, *m.Event)
		case m.Stats != nil:
			stats = m.Stats
		default:
			end = m.End
		}
	}
	if end != "count" || len(events) != count {
		t.Fatalf("trace ended %q after %d events, want count after %d: %+v", end, len(events), count, events)
	}
	if stats == nil || stats.Reported != count || stats.Matched < count {
		t.Errorf("last counts %+v, want %d reported of at least as many matched", stats, count)
	}
	syn, replies := events[0], 0
	if syn.TCPFlags != "SYN" || syn.Direction != "client" || syn.Client != client || syn.VIP != "10.200.3.10:80" ||
		syn.Service != "web" || syn.Backend != backend || syn.Mode != "snat" || syn.Conntrack != "miss" ||
		syn.SNAT == "" || !strings.HasPrefix(syn.Sent, "SNAT rewritten to "+syn.SNAT+" -> "+backend) ||
		syn.Hook != "xdp" || syn.Interface != "eth0" || syn.Reason != "" {
		t.Errorf("first event %+v, want the client's SYN to %s through its SNAT binding, no entry yet", syn, backend)
	}
	for _, ev := range events {
		if ev.Client != client || ev.Backend != backend || ev.Service != "web" {
			t.Errorf("event %+v is not of the connection %s -> %s", ev, client, backend)
		}
		switch {
		case ev.Direction == "reply":
			replies++
			if ev.SNAT != syn.SNAT || !strings.HasPrefix(ev.Sent, "SNAT reply rewritten to 10.200.3.10:80 -> "+client) {
				t.Errorf("reply event %+v, want the binding %s rewritten back to the client", ev, syn.SNAT)
			}
		case ev.TCPFlags == "ACK":
			if ev.Conntrack != "created" && ev.Conntrack != "hit" {
				t.Errorf("client ACK %+v: conntrack %q, want created or hit", ev, ev.Conntrack)
			}
		}
	}
	if replies == 0 {
		t.Errorf("no reply among %+v", events)
	}
	for _, ev := range events {
		b, _ := json.Marshal(ev)
		t.Logf("traced: %s", b)
	}
	tr.wait()

	// The replies the trace saw are counted per service (SNAT only).
	out, err := l4lbctl(t, d.Socket, "-o", "json", "service", "get", "web")
	var svc api.Service
	if err != nil || json.Unmarshal([]byte(out), &svc) != nil {
		t.Fatalf("service get web: %v\n%s", err, out)
	}
	if c := svc.Counters; c.ReplyPackets < uint64(replies) || c.ReplyBytes < 40*c.ReplyPackets {
		t.Errorf("service web counts %d replies of %d bytes, want at least the %d traced, of 40 bytes or more each", c.ReplyPackets, c.ReplyBytes, replies)
	}

	// The table output, of a trace no packet matches (the connection is
	// still open: its late ACKs would match a trace of the service).
	out, err = l4lbctl(t, d.Socket, "trace", "--service", "web", "--client", "198.51.100.99", "--count", "1", "--timeout", "2s")
	if err != nil || !strings.Contains(out, "# trace ended (timeout): 0 packets matched") {
		t.Errorf("an idle trace: %v\n%s", err, out)
	}
}

// TestTraceAcrossRestart starts `l4lbctl trace -o json`, restarts l4lbd
// under it, then opens a connection: the trace says l4lbd stopped, resumes
// on the new l4lbd, and shows the connection's packets.
func TestTraceAcrossRestart(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 2})
	for _, be := range tp.Backends {
		be.Serve(netip.AddrPortFrom(be.Addr4, 8080))
	}
	d := tp.LBs[0].StartL4LBD(l4lbd(), inspectConfig())
	tp.RouteVIPs(tp.LBs[0], netip.MustParseAddr("10.200.3.10"))

	tr := startTrace(t, d.Socket, "--client", tp.Client.Addr4.String(), "--service", "web", "--count", "2", "--timeout", "60s")
	next := tr.next
	if l := next("start"); !strings.HasPrefix(l, `{"stats":`) {
		t.Fatalf("first line %q, want the trace's counts", l)
	}
	d.Restart()
	// Counts, maybe the old l4lbd's last words (a stop may cut the
	// stream before them), then the resumed trace's zero counts.
	for l := next("restart"); l != `{"resumed":true}`; l = next("restart") {
		if !strings.HasPrefix(l, `{"stats":`) && l != `{"end":"closed"}` {
			t.Fatalf("line %q while l4lbd restarted, want counts until the trace resumed", l)
		}
	}
	if l := next("resumed"); !strings.HasPrefix(l, `{"stats":`) {
		t.Fatalf("first line after resuming %q, want the new trace's counts", l)
	}

	conn, err := tp.Client.DialTCP(0, netip.MustParseAddrPort("10.200.3.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Abort)
	if err := conn.Echo("traced after a restart"); err != nil {
		t.Fatal(err)
	}
	client := conn.LocalAddr().(*net.TCPAddr).AddrPort().String()
	var events []api.TraceEvent
	for end := ""; end == ""; {
		m := tr.message("events")
		if m.Event != nil {
			events = append(events, *m.Event)
		}
		end = m.End
		if end != "" && end != "count" {
			t.Fatalf("trace ended %q, want count", end)
		}
	}
	if len(events) != 2 || events[0].Client != client || events[0].TCPFlags != "SYN" || events[0].Service != "web" {
		t.Errorf("events after the restart %+v, want the SYN of %s and one more", events, client)
	}
	tr.wait()
	for _, want := range []string{"# l4lbd went away (", "# l4lbd is back: trace resumed"} {
		if !strings.Contains(tr.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, tr.stderr.String())
		}
	}
}

// tracing is a running `l4lbctl -o json trace`, read line by line.
type tracing struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string
	stderr strings.Builder
}

// startTrace starts `l4lbctl -o json trace args…` against socket.
func startTrace(t *testing.T, socket string, args ...string) *tracing {
	t.Helper()
	tr := &tracing{t: t, lines: make(chan string, 64)}
	tr.cmd = exec.Command(filepath.Join(bin, "l4lbctl"), append([]string{"--socket", socket, "-o", "json", "trace"}, args...)...)
	stdout, err := tr.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	tr.cmd.Stderr = &tr.stderr
	if err := tr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.cmd.Process.Kill(); _ = tr.cmd.Wait() })
	go func() {
		defer close(tr.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			tr.lines <- sc.Text()
		}
	}()
	return tr
}

// next is the stream's next line; what says what the test waits for.
func (tr *tracing) next(what string) string {
	tr.t.Helper()
	select {
	case l, ok := <-tr.lines:
		if !ok {
			tr.t.Fatalf("%s: trace stream ended; stderr:\n%s", what, tr.stderr.String())
		}
		return l
	case <-time.After(30 * time.Second):
		tr.t.Fatalf("%s: no trace line; stderr:\n%s", what, tr.stderr.String())
	}
	return ""
}

// message is the stream's next line, decoded.
func (tr *tracing) message(what string) api.TraceMessage {
	tr.t.Helper()
	l := tr.next(what)
	var m api.TraceMessage
	if err := json.Unmarshal([]byte(l), &m); err != nil {
		tr.t.Fatalf("%s: trace line %q is not a message: %v", what, l, err)
	}
	return m
}

// wait waits for l4lbctl to exit, which must be a success.
func (tr *tracing) wait() {
	tr.t.Helper()
	if err := tr.cmd.Wait(); err != nil {
		tr.t.Errorf("l4lbctl trace: %v\n%s", err, tr.stderr.String())
	}
}
