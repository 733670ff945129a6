// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

func TestSelfCheckLine(t *testing.T) {
	at := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		sc   api.SelfCheckStatus
		want []string
	}{
		{"before the first pass", api.SelfCheckStatus{IntervalSeconds: 10}, []string{"no pass yet (every 10s)"}},
		{"clean", api.SelfCheckStatus{IntervalSeconds: 10, Passes: 3, LastPass: at, LastPassSeconds: 0.25},
			[]string{"last pass 2026-12-03T17:00:00Z (0.25s, every 10s)", "maps match what l4lbd programmed"}},
		{"repaired", api.SelfCheckStatus{IntervalSeconds: 10, Passes: 3, LastPass: at, LastPassDrifts: 2, Drifts: map[string]uint64{"maglev": 2, "backends": 1}},
			[]string{"DRIFT: 2 differences found and repaired", "3 since start (backends 1, maglev 2)"}},
		{"unrepaired", api.SelfCheckStatus{IntervalSeconds: 10, Passes: 3, LastPass: at, LastPassDrifts: 2, LastPassUnrepaired: 1, Drifts: map[string]uint64{"services": 2}},
			[]string{"DRIFT NOT REPAIRED: 1 of 2 differences", "2 since start (services 2)"}},
		{"drift in an earlier pass", api.SelfCheckStatus{IntervalSeconds: 10, Passes: 3, LastPass: at, Drifts: map[string]uint64{"services": 1}, LastPassError: "read backend 7: boom"},
			[]string{"maps match", "1 since start (services 1)", "read failed: read backend 7: boom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := selfCheckLine(&tc.sc)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("line %q lacks %q", got, w)
				}
			}
		})
	}
}
