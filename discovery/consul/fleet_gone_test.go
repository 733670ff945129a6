// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"maps"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/fleet"
)

func TestGoneBoxes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	seen := func(name string, at time.Time) fleet.Box { return fleet.Box{Name: name, Seen: at} }
	tests := []struct {
		name      string
		gone      map[string]time.Time
		prev, cur []fleet.Box
		now       time.Time
		want      map[string]time.Time
	}{
		{
			name: "a box that disappears is gone since it was last seen",
			prev: []fleet.Box{seen("a", t0), seen("b", t0)},
			cur:  []fleet.Box{seen("a", t0.Add(time.Minute))},
			now:  t0.Add(time.Minute),
			want: map[string]time.Time{"b": t0},
		},
		{
			name: "a box that comes back is no longer gone",
			gone: map[string]time.Time{"b": t0},
			prev: []fleet.Box{seen("a", t0)},
			cur:  []fleet.Box{seen("a", t0.Add(time.Minute)), seen("b", t0.Add(time.Minute))},
			now:  t0.Add(time.Minute),
			want: map[string]time.Time{},
		},
		{
			name: "gone boxes are forgotten after goneFor",
			gone: map[string]time.Time{"b": t0, "c": t0.Add(30 * time.Minute)},
			now:  t0.Add(goneFor),
			want: map[string]time.Time{"c": t0.Add(30 * time.Minute)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := goneBoxes(tt.gone, tt.prev, tt.cur, tt.now); !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
