// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

// TestTracePrinter checks the table lines of a trace's stream: one line per
// event with every field it has, the counts on the notes writer when
// sampling or losses change and at the end.
func TestTracePrinter(t *testing.T) {
	var out, notes bytes.Buffer
	p := &tracePrinter{out: &out, notes: &notes}
	at := time.Date(2026, 12, 3, 16, 40, 1, 123456000, time.Local)
	msgs := []api.TraceMessage{
		{Stats: &api.TraceStats{}},
		{Event: &api.TraceEvent{Time: at, Hook: "xdp", Interface: "eth0", Proto: "tcp", Client: "198.51.100.7:40100", VIP: "192.0.2.10:80",
			Direction: "client", TCPFlags: "SYN", Verdict: "tx", Service: "web", Backend: "10.1.0.11:80", Mode: "dsr", Dispatch: "ipip",
			Conntrack: "miss", Sent: "IPIP encapsulated to 10.1.0.11"}},
		{Event: &api.TraceEvent{Time: at, Hook: "tc", Interface: "eth1", Proto: "udp", Client: "198.51.100.7:53000", VIP: "192.0.2.10:53",
			Direction: "reply", Verdict: "redirect", Service: "dns", Backend: "10.1.0.12:5353", Mode: "snat", SNAT: "10.0.0.1:33000",
			Sent: "SNAT reply rewritten to 192.0.2.10:53 -> 198.51.100.7:53000"}},
		{Event: &api.TraceEvent{Time: at, Hook: "xdp", Interface: "eth0", Proto: "tcp", Client: "198.51.100.8:1", VIP: "192.0.2.10:80",
			Direction: "client", TCPFlags: "ACK", Verdict: "drop", Reason: "drop_no_backend", Service: "web", Mode: "dsr", Dispatch: "ipip"}},
		{Stats: &api.TraceStats{Matched: 9, Sent: 3, Sampled: 6, Reported: 3}},
		{Stats: &api.TraceStats{Matched: 9, Sent: 3, Sampled: 6, Reported: 3}},
		{End: "count"},
	}
	for _, m := range msgs {
		if err := p.message(m); err != nil {
			t.Fatal(err)
		}
	}
	want := `16:40:01.123456 xdp eth0 tcp 198.51.100.7:40100 > 192.0.2.10:80 [SYN] tx service=web backend=10.1.0.11:80 dsr/ipip ct=miss sent: IPIP encapsulated to 10.1.0.11
16:40:01.123456 tc eth1 udp 198.51.100.7:53000 > 192.0.2.10:53 (reply) redirect service=dns backend=10.1.0.12:5353 snat sent: SNAT reply rewritten to 192.0.2.10:53 -> 198.51.100.7:53000
16:40:01.123456 xdp eth0 tcp 198.51.100.8:1 > 192.0.2.10:80 [ACK] drop reason=drop_no_backend service=web dsr/ipip
`
	if out.String() != want {
		t.Errorf("lines:\n%s\nwant:\n%s", out.String(), want)
	}
	wantNotes := "# 9 packets matched, 3 shown, 6 sampled (over --rate), 0 lost (buffer full)\n" +
		"# trace ended (count): 9 packets matched, 3 shown, 6 sampled (over --rate), 0 lost (buffer full)\n"
	if notes.String() != wantNotes {
		t.Errorf("notes:\n%s\nwant:\n%s", notes.String(), wantNotes)
	}

	out.Reset()
	p = &tracePrinter{out: &out, json: true}
	if err := p.message(msgs[1]); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.HasPrefix(s, `{"event":{"time":`) || strings.Count(s, "\n") != 1 {
		t.Errorf("-o json: %q, want one {\"event\":…} line", s)
	}
}

// traceDaemon is one l4lbd run for TestTraceSurvivesRestart: its trace
// streams events, then ends with end ("closed": l4lbd stopped; "": killed,
// the stream just stops; "count": the trace is done).
type traceDaemon struct {
	api.Provider
	events int
	end    string
	asked  chan api.TraceRequest
}

func (d *traceDaemon) Trace(_ context.Context, req api.TraceRequest, emit func(api.TraceMessage) error) error {
	d.asked <- req
	if err := emit(api.TraceMessage{Stats: &api.TraceStats{}}); err != nil {
		return err
	}
	at := time.Date(2026, 12, 3, 16, 40, 1, 0, time.Local)
	for i := range d.events {
		e := api.TraceEvent{Time: at, Hook: "xdp", Interface: "eth0", Proto: "tcp", Client: fmt.Sprintf("198.51.100.7:%d", 40000+i),
			VIP: "192.0.2.10:80", Direction: "client", Verdict: "tx", Service: "web", Backend: "10.1.0.11:80", Mode: "snat"}
		if err := emit(api.TraceMessage{Event: &e}); err != nil {
			return err
		}
	}
	s := api.TraceStats{Matched: uint64(d.events) + 2, Sent: uint64(d.events), Sampled: 2, Reported: d.events}
	if err := emit(api.TraceMessage{Stats: &s}); err != nil {
		return err
	}
	if d.end == "" {
		return nil
	}
	return emit(api.TraceMessage{End: d.end})
}

// TestTraceSurvivesRestart runs a trace across an l4lbd that stops (its
// stream ends "closed") or is killed (the stream just ends) and comes back
// on the same socket: the trace goes on with what is left of its count
// and timeout, says so, and sums the counts of both.
func TestTraceSurvivesRestart(t *testing.T) {
	for _, end := range []string{"closed", ""} {
		t.Run(map[string]string{"closed": "stopped", "": "killed"}[end], func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "l4lb.sock")
			first := &traceDaemon{events: 2, end: end, asked: make(chan api.TraceRequest, 1)}
			second := &traceDaemon{events: 3, end: "count", asked: make(chan api.TraceRequest, 1)}
			stop := serveAPI(t, sock, first)
			var out, notes bytes.Buffer
			p := &tracePrinter{out: &out, notes: &notes}
			req := api.TraceRequest{Service: "web", Count: 5, Timeout: time.Minute}
			done := make(chan error, 1)
			go func() { done <- follow(context.Background(), api.NewClient(sock), req, p, 10*time.Millisecond) }()
			if got := <-first.asked; got != req {
				t.Errorf("first l4lbd was asked %+v, want %+v", got, req)
			}
			// l4lbd goes down once its stream has ended, and a new one
			// comes up on the same socket.
			stop()
			stop = serveAPI(t, sock, second)
			defer stop()
			got := <-second.asked
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got.Service != "web" || got.Count != 3 || got.Timeout <= 0 || got.Timeout >= time.Minute {
				t.Errorf("restarted l4lbd was asked %+v, want the service, 3 events left and less than a minute", got)
			}
			if n := strings.Count(out.String(), "\n"); n != 5 {
				t.Errorf("%d event lines, want 5 (2 before the restart, 3 after):\n%s", n, out.String())
			}
			why := map[string]string{"closed": "stopped", "": "connection lost"}[end]
			wantNotes := "# 4 packets matched, 2 shown, 2 sampled (over --rate), 0 lost (buffer full)\n" +
				"# l4lbd went away (" + why + "): 4 packets matched, 2 shown, 2 sampled (over --rate), 0 lost (buffer full); waiting for it to resume the trace\n" +
				"# l4lbd is back: trace resumed (packets in between were not traced)\n" +
				"# 9 packets matched, 5 shown, 4 sampled (over --rate), 0 lost (buffer full)\n" +
				"# trace ended (count): 9 packets matched, 5 shown, 4 sampled (over --rate), 0 lost (buffer full)\n"
			if notes.String() != wantNotes {
				t.Errorf("notes:\n%s\nwant:\n%s", notes.String(), wantNotes)
			}
		})
	}
}

// TestTraceEndsWhileDown checks that a trace whose l4lbd does not come
// back ends at its timeout, saying why.
func TestTraceEndsWhileDown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "l4lb.sock")
	d := &traceDaemon{events: 1, end: "closed", asked: make(chan api.TraceRequest, 1)}
	stop := serveAPI(t, sock, d)
	var notes bytes.Buffer
	p := &tracePrinter{out: io.Discard, notes: &notes}
	done := make(chan error, 1)
	go func() {
		done <- follow(context.Background(), api.NewClient(sock), api.TraceRequest{Timeout: 300 * time.Millisecond}, p, 10*time.Millisecond)
	}()
	<-d.asked
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(notes.String(), "# trace ended (timeout, l4lbd not back)") || !strings.Contains(notes.String(), "is l4lbd running?") || !p.ended {
		t.Errorf("notes:\n%s\nwant the trace ended at its timeout, with the last attempt's error", notes.String())
	}
}
