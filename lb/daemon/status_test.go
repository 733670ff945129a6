// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/health"
)

// TestHealthErrorIsCurrent: the health column of a backend that is down
// shows its latest probe's error, not the one that took it down.
func TestHealthErrorIsCurrent(t *testing.T) {
	wentDown := health.Status{State: health.Down, LastError: "dial tcp 10.1.0.11:80: connection refused"}
	rise := lb.HealthCheck{Rise: 2}
	tests := []struct {
		name string
		cur  health.Status
		ok   bool
		want string
	}{
		{"the error changed", health.Status{State: health.Down, LastError: "dial tcp 10.1.0.11:80: i/o timeout", Failures: 7}, true, "dial tcp 10.1.0.11:80: i/o timeout"},
		{"recovering", health.Status{State: health.Down, Successes: 1, Check: rise}, true, "recovering: 1 of 2 successful checks (last error: dial tcp 10.1.0.11:80: connection refused)"},
		{"no prober any more", health.Status{}, false, wentDown.LastError},
	}
	for _, tt := range tests {
		if got := currentHealthError(wentDown, tt.cur, tt.ok); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
