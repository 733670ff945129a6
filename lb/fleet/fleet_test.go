// SPDX-License-Identifier: Apache-2.0

package fleet_test

import (
	"bytes"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/fleet"
	"github.com/l4lb/l4lb/lb/metrics"
)

func box(name, seed string, svcs ...string) fleet.Box {
	b := fleet.Box{Name: name, SeedFingerprint: seed}
	for _, s := range svcs {
		// name=frontend=fingerprint
		p := strings.Split(s, "=")
		b.Services = append(b.Services, fleet.Service{Name: p[0], Frontend: p[1], Fingerprint: p[2]})
	}
	return b
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name       string
		boxes      []fleet.Box
		mismatches []string
		warnings   int
		missing    map[string][]string
		mismatched map[string]bool // of box "a"
	}{
		{
			name: "identical boxes",
			boxes: []fleet.Box{
				box("a", "s1", "web=10.0.0.10:80/tcp=f1", "dns=10.0.0.10:53/udp=f2"),
				box("b", "s1", "web=10.0.0.10:80/tcp=f1", "dns=10.0.0.10:53/udp=f2"),
			},
			missing:    map[string][]string{},
			mismatched: map[string]bool{"web": false, "dns": false},
		},
		{
			name: "one table differs",
			boxes: []fleet.Box{
				box("a", "s1", "web=10.0.0.10:80/tcp=f1", "dns=10.0.0.10:53/udp=f2"),
				box("b", "s1", "web=10.0.0.10:80/tcp=f9", "dns=10.0.0.10:53/udp=f2"),
				box("c", "s1", "web=10.0.0.10:80/tcp=f1", "dns=10.0.0.10:53/udp=f2"),
			},
			mismatches: []string{"service web (10.0.0.10:80/tcp): fingerprints differ between boxes: a=f1, b=f9, c=f1"},
			warnings:   1,
			missing:    map[string][]string{},
			mismatched: map[string]bool{"web": true, "dns": false},
		},
		{
			name: "seeds differ",
			boxes: []fleet.Box{
				box("a", "s1", "web=10.0.0.10:80/tcp=f1"),
				box("b", "s2", "web=10.0.0.10:80/tcp=f7"),
			},
			mismatches: []string{"service web (10.0.0.10:80/tcp): fingerprints differ between boxes: a=f1, b=f7"},
			warnings:   2,
			missing:    map[string][]string{},
			mismatched: map[string]bool{"web": true},
		},
		{
			name: "a frontend one box lacks is reported, not a mismatch",
			boxes: []fleet.Box{
				box("a", "s1", "web=10.0.0.10:80/tcp=f1", "new=10.0.0.11:80/tcp=f3"),
				box("b", "s1", "web=10.0.0.10:80/tcp=f1"),
			},
			missing:    map[string][]string{"10.0.0.11:80/tcp": {"b"}},
			mismatched: map[string]bool{"web": false, "new": false},
		},
		{
			name: "services named differently on one frontend",
			boxes: []fleet.Box{
				box("a", "s1", "web=10.0.0.10:80/tcp=f1"),
				box("b", "s1", "www=10.0.0.10:80/tcp=f2"),
			},
			mismatches: []string{"service web/www (10.0.0.10:80/tcp): fingerprints differ between boxes: a=f1, b=f2"},
			warnings:   1,
			missing:    map[string][]string{},
			mismatched: map[string]bool{"web": true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := fleet.Compare(tt.boxes)
			var got []string
			for _, m := range r.Mismatches {
				got = append(got, m.String())
			}
			if !slices.Equal(got, tt.mismatches) {
				t.Errorf("mismatches = %q, want %q", got, tt.mismatches)
			}
			if w := r.Warnings(); len(w) != tt.warnings {
				t.Errorf("warnings = %q, want %d", w, tt.warnings)
			}
			if !reflect.DeepEqual(r.Missing, tt.missing) {
				t.Errorf("missing = %v, want %v", r.Missing, tt.missing)
			}
			if m := r.Mismatched("a"); !reflect.DeepEqual(m, tt.mismatched) {
				t.Errorf("Mismatched(a) = %v, want %v", m, tt.mismatched)
			}
		})
	}
}

// TestFromMetrics reads a box back from the exposition l4lbd serves.
func TestFromMetrics(t *testing.T) {
	snap := metrics.Snapshot{
		SeedFingerprint: "a1b2c3d4e5f6",
		Services: []metrics.Service{
			{Name: "web", Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80, Proto: lb.TCP}, Mode: lb.ModeDSR, Fingerprint: "0123456789ab"},
			{Name: "pending", Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.11"), Port: 80, Proto: lb.TCP}, Mode: lb.ModeSNAT},
		},
	}
	reg := metrics.NewRegistry(metrics.SourceFunc(func() metrics.Snapshot { return snap }), nil, "v9")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			t.Fatal(err)
		}
	}
	b, err := fleet.FromMetrics("lb1:9842", &buf)
	if err != nil {
		t.Fatal(err)
	}
	want := fleet.Box{Name: "lb1:9842", Version: "v9", SeedFingerprint: "a1b2c3d4e5f6",
		Services: []fleet.Service{{Name: "web", Frontend: "10.0.0.10:80/tcp", Fingerprint: "0123456789ab"}}}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("FromMetrics = %+v, want %+v", b, want)
	}
	if _, err := fleet.FromMetrics("x", strings.NewReader("# not l4lbd\nup 1\n")); err == nil {
		t.Error("FromMetrics accepted an exposition without l4lb_maglev_seed_info")
	}
}
