// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"regexp"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

// TestStatusL2Failover: the status lines name this box's role and every
// box of its group it hears, and say when it has no standby.
func TestStatusL2Failover(t *testing.T) {
	since := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	st := api.Status{L2: &api.L2Status{
		VIPs:       []api.AnnouncedVIP{{VIP: "10.0.0.200", Announced: true, Services: []string{"web"}}},
		Interfaces: []api.L2Interface{{Name: "eth0", ARPReplies: 3}},
		Failover: &api.L2Failover{
			Name: "lb-a", Group: 1, Priority: 100, Role: "active", Since: since, Ready: true, Interval: "200ms", DetectMultiplier: 3,
			Peers: []api.L2Peer{{Name: "lb-b", MAC: "02:00:00:00:00:02", Interface: "eth0", Priority: 100, Role: "standby", LastSeen: time.Now()}},
		},
	}}
	render := func(st api.Status) string {
		var b bytes.Buffer
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		announceSummary(tw, st)
		tw.Flush()
		return b.String()
	}
	out := render(st)
	for _, w := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^l2\s+1 of 1 VIPs answered on eth0`),
		regexp.MustCompile(`(?m)^\s+failover: active since 2026-12-03T20:00:00Z \(lb-a, group 1, priority 100, 3 × 200ms\)$`),
		regexp.MustCompile(`(?m)^\s+peer lb-b 02:00:00:00:00:02: standby, priority 100 \(still probing its backends\), heard (\d+ms|0s) ago on eth0$`),
	} {
		if !w.MatchString(out) {
			t.Errorf("status lacks %s:\n%s", w, out)
		}
	}
	st.L2.Failover.Peers = nil
	if out := render(st); !regexp.MustCompile(`(?m)^\s+no other box of group 1 heard: no standby$`).MatchString(out) {
		t.Errorf("status without peers does not say there is no standby:\n%s", out)
	}
}
