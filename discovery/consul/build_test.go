// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
)

// testSource is a source holding n answered services of 10 backends,
// built once.
func testSource(n int) (*Source, []string) {
	s := &Source{log: slog.New(slog.NewTextHandler(io.Discard, nil)), services: map[string]*watched{}, failing: map[string]error{}, dirty: map[string]bool{}}
	var names []string
	for i := range n {
		name := fmt.Sprintf("s%05d", i)
		names = append(names, name)
		svc := lb.Service{Name: name, Source: SourceName, Frontend: lb.Frontend{Addr: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Port: 80, Proto: lb.TCP}}
		for j := range 10 {
			svc.Backends = append(svc.Backends, lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), uint16(8000+j)), Weight: 1})
		}
		s.services[name] = &watched{have: true, tr: translation{svc: svc, ok: true}}
	}
	s.catalog = &catalogView{names: names}
	return s, names
}

// TestBuildPatches: a build after answers that changed services within
// themselves replaces those services in the last build; anything that
// may move a claim or a problem builds everything again, and both give
// the same services.
func TestBuildPatches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(s *Source, w *watched)
		patched bool
	}{
		{"backend weight", func(s *Source, w *watched) { w.tr.svc.Backends[0].Weight = 5 }, true},
		{"same answer again", func(s *Source, w *watched) {}, true},
		{"frontend moved", func(s *Source, w *watched) { w.tr.svc.Frontend.Port = 81 }, false},
		{"definition with a problem", func(s *Source, w *watched) { w.tr.problems = []string{"bad meta"} }, false},
		{"catalog list changed", func(s *Source, w *watched) { s.reshaped = true }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, names := testSource(20)
			last, _, _, _ := s.build(true)
			w := s.services[names[3]]
			w.tr.svc.Backends = slices.Clone(w.tr.svc.Backends)
			tc.change(s, w)
			s.dirty[names[3]] = true
			got, ready, patched, changed := s.build(false)
			if !ready || patched != tc.patched {
				t.Fatalf("build: ready %v, patched %v; want ready, patched %v", ready, patched, tc.patched)
			}
			s.reshaped = true
			full, _, _, _ := s.build(false)
			if !slices.EqualFunc(got, full, lb.Service.Equal) {
				t.Errorf("patched build differs from a full one:\n%v\n%v", got, full)
			}
			// What the merger is told changed is exactly what differs.
			if patched {
				var differ []string
				for i := range got {
					if !got[i].Equal(last[i]) {
						differ = append(differ, got[i].Name)
					}
				}
				if !slices.Equal(changed, differ) {
					t.Errorf("the snapshot says %v changed; %v did", changed, differ)
				}
			}
			if tc.name == "same answer again" && !discovery.SameServices(got, last) {
				t.Errorf("an unchanged answer gave a new slice: Run would publish it again")
			}
		})
	}
}

// BenchmarkBuild is the source's work after one service's answer changed,
// at 10,000 services of 10 backends: build the snapshot and compare it
// with the last one, as Run does.
func BenchmarkBuild(b *testing.B) {
	const n = 10000
	s, names := testSource(n)
	last, _, _, _ := s.build(false)
	b.ResetTimer()
	for i := range b.N {
		w := s.services[names[i%n]]
		w.tr.svc.Backends = append([]lb.Backend(nil), w.tr.svc.Backends...)
		w.tr.svc.Backends[0].Weight = uint32(i%7 + 2)
		s.dirty[names[i%n]] = true
		svcs, _, patched, _ := s.build(false)
		if !patched || discovery.SameServices(svcs, last) {
			b.Fatal("no change seen")
		}
		last = svcs
	}
}
