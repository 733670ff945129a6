// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

// Rates is a service's or backend's counters per second over an interval
// (`service list --rate`, like ipvsadm --rate): new flows, packets and
// bytes the datapath forwarded (client to backend), and for a SNAT
// service the replies it sent back (ipvsadm's OutPPS and OutBPS; DSR
// replies never pass the box, and replies are counted per service only).
type Rates struct {
	ConnsPerSec        float64 `json:"conns_per_sec"`
	PacketsPerSec      float64 `json:"packets_per_sec"`
	BytesPerSec        float64 `json:"bytes_per_sec"`
	ReplyPacketsPerSec float64 `json:"reply_packets_per_sec,omitempty"`
	ReplyBytesPerSec   float64 `json:"reply_bytes_per_sec,omitempty"`
}

// ServiceRates is one service's rates, and its backends' by address.
type ServiceRates struct {
	Name     string           `json:"name"`
	Frontend string           `json:"frontend"`
	Rates    Rates            `json:"rates"`
	Backends map[string]Rates `json:"backends"`
}

func ratesOf(a, b api.Counters, d time.Duration) Rates {
	per := func(x, y uint64) float64 {
		if y < x { // the counters were reset (the service or backend was re-created)
			return 0
		}
		return float64(y-x) / d.Seconds()
	}
	return Rates{
		ConnsPerSec: per(a.NewFlows, b.NewFlows), PacketsPerSec: per(a.Packets, b.Packets), BytesPerSec: per(a.Bytes, b.Bytes),
		ReplyPacketsPerSec: per(a.ReplyPackets, b.ReplyPackets), ReplyBytesPerSec: per(a.ReplyBytes, b.ReplyBytes),
	}
}

// serviceRates computes the rates between two listings taken d apart;
// services and backends missing from either are left out.
func serviceRates(before, after []api.Service, d time.Duration) []ServiceRates {
	prev := map[string]api.Service{}
	for _, s := range before {
		prev[s.Name] = s
	}
	var out []ServiceRates
	for _, s := range after {
		p, ok := prev[s.Name]
		if !ok {
			continue
		}
		r := ServiceRates{Name: s.Name, Frontend: s.Frontend, Rates: ratesOf(p.Counters, s.Counters, d), Backends: map[string]Rates{}}
		pb := map[string]api.Counters{}
		for _, b := range p.Backends {
			pb[b.Address] = b.Counters
		}
		for _, b := range s.Backends {
			if c, ok := pb[b.Address]; ok {
				r.Backends[b.Address] = ratesOf(c, b.Counters, d)
			}
		}
		out = append(out, r)
	}
	return out
}

func printServiceRates(out io.Writer, svcs []api.Service, rates []ServiceRates) error {
	by := map[string]ServiceRates{}
	for _, r := range rates {
		by[r.Name] = r
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE / BACKEND\tFRONTEND\tCONNS/S\tPKTS/S\tBYTES/S\tREPLY PKTS/S\tREPLY BYTES/S")
	line := func(name, fe string, r Rates, replies bool) {
		out := "-\t-"
		if replies {
			out = fmt.Sprintf("%.1f\t%.0f", r.ReplyPacketsPerSec, r.ReplyBytesPerSec)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.0f\t%s\n", name, fe, r.ConnsPerSec, r.PacketsPerSec, r.BytesPerSec, out)
	}
	for _, s := range svcs {
		r, ok := by[s.Name]
		if !ok {
			continue
		}
		// Only SNAT replies pass the box, counted per service.
		line(s.Name, s.Frontend, r.Rates, s.Mode == "snat")
		for _, b := range s.Backends {
			if br, ok := r.Backends[b.Address]; ok {
				line("  -> "+b.Address, "", br, false)
			}
		}
	}
	return tw.Flush()
}
