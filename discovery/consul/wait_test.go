// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"testing"
	"time"
)

// TestServiceWait: the services' own watches wait Options.Wait while few,
// longer as they grow (20 timed-out answers a second in all), never past
// Consul's 10 minutes; a configured wait above that is kept.
func TestServiceWait(t *testing.T) {
	for _, tt := range []struct {
		wait    time.Duration
		watches int64
		want    time.Duration
	}{
		{time.Minute, 0, time.Minute},
		{time.Minute, 1000, time.Minute},
		{time.Minute, 2000, 100 * time.Second},
		{time.Minute, 10000, 500 * time.Second},
		{time.Minute, 100000, 10 * time.Minute},
		{200 * time.Millisecond, 2, 200 * time.Millisecond},
		{200 * time.Millisecond, 10, 500 * time.Millisecond},
		{15 * time.Minute, 10000, 15 * time.Minute},
	} {
		s := &Source{opts: Options{Wait: tt.wait}}
		s.serviceWatches.Store(tt.watches)
		if got := s.serviceWait(); got != tt.want {
			t.Errorf("wait %v, %d watches: %v, want %v", tt.wait, tt.watches, got, tt.want)
		}
	}
}
