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
on Ctrl-C. Each CPU reports at most --rate packets a second; the others are
counted as sampled, and the counts are printed (on stderr) when they change
and at the end. Without a trace running the datapath pays one memory load
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
			err := api.NewClient(g.socket).Trace(ctx, req, p.message)
			if err != nil {
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

// tracePrinter prints a trace's stream: events on out, counts on notes
// (table), or every message as a JSON line.
type tracePrinter struct {
	out, notes io.Writer
	json       bool
	last       api.TraceStats
	ended      bool
}

func (p *tracePrinter) message(m api.TraceMessage) error {
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
		if m.Stats.Sampled != p.last.Sampled || m.Stats.Lost != p.last.Lost {
			fmt.Fprintf(p.notes, "# %s\n", traceCounts(*m.Stats))
		}
		p.last = *m.Stats
	case m.End != "":
		p.ended = true
		fmt.Fprintf(p.notes, "# trace ended (%s): %s\n", m.End, traceCounts(p.last))
	}
	return nil
}

// done notes a trace the user interrupted.
func (p *tracePrinter) done(ctx context.Context) {
	if !p.ended && !p.json && ctx.Err() != nil {
		fmt.Fprintf(p.notes, "# trace interrupted: %s\n", traceCounts(p.last))
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
