// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
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
