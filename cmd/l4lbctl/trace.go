// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
)

func traceCmd(g *globals) *cobra.Command {
	var req api.TraceRequest
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "show what the datapath does with the packets of a client, VIP, port, protocol or backend, live",
		Long: `Streams one line per packet the filter selects, as the datapath handles it:
time, hook and interface, the flow, the verdict and its reason, the service,
backend, mode and dispatch, what the connection table did (hit, miss,
created), and what was sent (encapsulation, SNAT rewrite, ICMP answer).
A backend's reply to a SNAT flow is shown as the flow it belongs to
(direction reply).

The trace ends after --count events or --timeout, whichever comes first, or
on Ctrl-C. When l4lbd stops or restarts in the middle, the trace waits for
it to answer again and resumes with what is left of --count and --timeout,
saying so on stderr (packets in between are not traced). Each CPU reports
at most --rate packets a second; the others are counted as sampled, and
the counts are printed (on stderr) when they change and at the end. Without a trace running the datapath pays one memory load
per packet. One trace runs at a time. -o json prints the stream as
newline-delimited JSON ({"event":…}, {"stats":…}, {"end":…}). See
docs/observability.md.`,
		Example: `  l4lbctl trace --client 198.51.100.7 --service web
  l4lbctl trace --vip 192.0.2.10 --port 80 --proto tcp --count 20
  l4lbctl trace --client 198.51.100.0/24 --backend 10.1.0.11 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Count < 0 || req.Timeout < 0 {
				return usageError("--count and --timeout must not be negative")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			p := &tracePrinter{out: out, notes: cmd.ErrOrStderr(), json: g.output == "json"}
			if err := follow(ctx, api.NewClient(g.socket), req, p, traceRetry); err != nil {
				return err
			}
			p.done(ctx)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Client, "client", "", "client address or prefix (198.51.100.7, 198.51.100.0/24)")
	f.StringVar(&req.VIP, "vip", "", "frontend address")
	f.Uint16Var(&req.Port, "port", 0, "frontend port")
	f.StringVar(&req.Proto, "proto", "", "frontend protocol: tcp or udp")
	f.StringVar(&req.Service, "service", "", "the frontend of this service (sets --vip, --port and --proto)")
	f.StringVar(&req.Backend, "backend", "", "backend address, or address:port")
	f.IntVar(&req.Count, "count", 100, "stop after this many events (0: no limit)")
	f.DurationVar(&req.Timeout, "timeout", time.Minute, "stop after this long (0: no limit)")
	f.Uint32Var(&req.Rate, "rate", 100, "events per second and CPU; packets over it are counted as sampled (0: no limit)")
	return cmd
}

// traceRetry is how often a trace whose l4lbd went away asks whether it
// is back.
const traceRetry = 250 * time.Millisecond

// follow runs the trace req through c. When l4lbd goes away in the middle
// (stopped: its stream ends "closed"; killed: the stream just ends), it
// asks again every retry until l4lbd takes the trace, then goes on with
// what is left of req's count and timeout. l4lbd keeps no trace across a
// restart (its trace maps are not pinned), so the client carries it over.
// Only the first request's refusal is an error: a restarting l4lbd may
// refuse until it is ready. A stream that breaks is l4lbd going away.
func follow(ctx context.Context, c *api.Client, req api.TraceRequest, p *tracePrinter, retry time.Duration) error {
	var deadline time.Time
	if req.Timeout > 0 {
		deadline = time.Now().Add(req.Timeout)
	}
	count := req.Count
	resuming, lastErr, streamed := false, error(nil), false
	fn := func(m api.TraceMessage) error {
		streamed = true
		if resuming {
			resuming = false
			p.resume()
		}
		return p.message(m)
	}
	for first := true; ; first = false {
		streamed = false
		err := c.Trace(ctx, req, fn)
		switch {
		case err != nil && first && !streamed:
			return err
		case err != nil && !streamed:
			lastErr = err
		case ctx.Err() != nil || err == nil && p.end != "" && p.end != "closed":
			return nil
		case !resuming:
			why := "stopped"
			if err != nil {
				why = "connection lost: " + err.Error()
			} else if p.end == "" {
				why = "connection lost"
			}
			p.note(fmt.Sprintf("l4lbd went away (%s): %s; waiting for it to resume the trace", why, traceCounts(p.total())))
			resuming = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			msg := "trace ended (timeout, l4lbd not back): " + traceCounts(p.total())
			if lastErr != nil {
				msg += "; last attempt: " + lastErr.Error()
			}
			p.note(msg)
			p.ended = true
			return nil
		}
		if count > 0 {
			req.Count = count - p.events
		}
		if !deadline.IsZero() {
			req.Timeout = time.Until(deadline)
		}
	}
}

// tracePrinter prints a trace's stream: events on out, counts on notes
// (table), or every message as a JSON line. Its counts run across the
// l4lbd restarts a trace survives (follow).
type tracePrinter struct {
	out, notes io.Writer
	json       bool
	// last are the counts of the l4lbd streaming now, before the sums
	// of those the trace ran on earlier; events counts every event.
	last, before api.TraceStats
	events       int
	// end is the current stream's end ("count", "timeout", "closed").
	end   string
	ended bool
}

// traceResumed is the line -o json prints when a trace resumes after an
// l4lbd restart: the counts of the lines after it start again from 0.
type traceResumed struct {
	Resumed bool `json:"resumed"`
}

// total is the counts across every l4lbd the trace ran on.
func (p *tracePrinter) total() api.TraceStats {
	return api.TraceStats{
		Matched: p.before.Matched + p.last.Matched, Sent: p.before.Sent + p.last.Sent,
		Sampled: p.before.Sampled + p.last.Sampled, Lost: p.before.Lost + p.last.Lost,
		Reported: p.before.Reported + p.last.Reported,
	}
}

// resume starts the counts of a restarted l4lbd's stream.
func (p *tracePrinter) resume() {
	p.before, p.last, p.end = p.total(), api.TraceStats{}, ""
	if p.json {
		b, _ := json.Marshal(traceResumed{Resumed: true})
		fmt.Fprintf(p.out, "%s\n", b)
	}
	p.note("l4lbd is back: trace resumed (packets in between were not traced)")
}

// note writes a line on the notes writer (stderr).
func (p *tracePrinter) note(s string) {
	if p.notes != nil {
		fmt.Fprintf(p.notes, "# %s\n", s)
	}
}

func (p *tracePrinter) message(m api.TraceMessage) error {
	if m.Event != nil {
		p.events++
	}
	if m.End != "" {
		p.end = m.End
	}
	if m.Stats != nil && p.json {
		p.last = *m.Stats
	}
	if p.json {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.out, "%s\n", b)
		return err
	}
	switch {
	case m.Event != nil:
		_, err := fmt.Fprintln(p.out, traceLine(*m.Event))
		return err
	case m.Stats != nil:
		changed := m.Stats.Sampled != p.last.Sampled || m.Stats.Lost != p.last.Lost
		p.last = *m.Stats
		if changed {
			p.note(traceCounts(p.total()))
		}
	case m.End == "closed":
		// l4lbd stopped: follow says so, and resumes.
	case m.End != "":
		p.ended = true
		p.note(fmt.Sprintf("trace ended (%s): %s", m.End, traceCounts(p.total())))
	}
	return nil
}

// done notes a trace the user interrupted.
func (p *tracePrinter) done(ctx context.Context) {
	if !p.ended && !p.json && ctx.Err() != nil {
		p.note("trace interrupted: " + traceCounts(p.total()))
	}
}

func traceCounts(s api.TraceStats) string {
	return fmt.Sprintf("%d packets matched, %d shown, %d sampled (over --rate), %d lost (buffer full)", s.Matched, s.Reported, s.Sampled, s.Lost)
}

// traceLine is one event as `l4lbctl trace` prints it:
//
//	16:40:01.123456 xdp eth0 tcp 198.51.100.7:40100 > 192.0.2.10:80 [SYN] tx service=web backend=10.1.0.11:80 dsr/ipip ct=miss sent: IPIP encapsulated to 10.1.0.11
func traceLine(e api.TraceEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s %s %s > %s", e.Time.Local().Format("15:04:05.000000"), e.Hook, e.Interface, e.Proto, e.Client, e.VIP)
	if e.Direction == "reply" {
		b.WriteString(" (reply)")
	}
	if e.TCPFlags != "" {
		fmt.Fprintf(&b, " [%s]", e.TCPFlags)
	}
	fmt.Fprintf(&b, " %s", e.Verdict)
	if e.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", e.Reason)
	}
	if e.Service != "" {
		fmt.Fprintf(&b, " service=%s", e.Service)
	}
	if e.Backend != "" {
		fmt.Fprintf(&b, " backend=%s", e.Backend)
	}
	if e.Mode != "" {
		b.WriteString(" " + e.Mode)
		if e.Dispatch != "" {
			b.WriteString("/" + e.Dispatch)
		}
	}
	if e.Conntrack != "" {
		fmt.Fprintf(&b, " ct=%s", e.Conntrack)
	}
	if e.SNAT != "" && e.Direction != "reply" {
		fmt.Fprintf(&b, " snat=%s", e.SNAT)
	}
	if e.Sent != "" {
		fmt.Fprintf(&b, " sent: %s", e.Sent)
	}
	return b.String()
}
