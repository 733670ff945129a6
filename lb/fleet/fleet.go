// SPDX-License-Identifier: Apache-2.0

// Package fleet checks that LB boxes agree. Boxes behind one ECMP group
// must send a flow to the same backend, which they do only with the same
// hash seed, table sizes and eligible backends: the per-service fingerprint
// (lb/maglev) covers exactly that. Each box describes itself as a Box; the
// daemon publishes its Box through Consul (discovery/consul) and compares
// it with the others' as they change; `l4lbctl fleet compare` gathers Boxes
// from boxes' admin sockets or metrics endpoints on demand (fetch.go).
// Compare is the one rule both use.
package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

// Box is what one LB box says about itself. Its JSON is what the boxes
// publish in Consul: add fields, never rename them.
type Box struct {
	Name            string    `json:"name"`
	Version         string    `json:"version,omitempty"`
	SeedFingerprint string    `json:"seed_fingerprint"`
	Services        []Service `json:"services"`
	// Shards is how many KV values the services are split across where
	// the box publishes its record in Consul (discovery/consul): 0 when
	// they are in Services. Readers get Services whole either way.
	Shards int `json:"shards,omitempty"`
	// Updated is when the box last changed its record.
	Updated time.Time `json:"updated,omitzero"`
	// Seen is when the reader last found the record held by a running
	// box (Consul answered with it; its metrics or socket answered). It is
	// the reader's, not published.
	Seen time.Time `json:"-"`
}

// Service is one service a box serves, as programmed.
type Service struct {
	Name     string `json:"name"`
	Frontend string `json:"frontend"`
	// Fingerprint identifies (seed, table size, eligible backends).
	Fingerprint string `json:"fingerprint"`
}

// Frontend is one frontend as the boxes that serve it see it.
type Frontend struct {
	Frontend string
	// Services are the service names the boxes use for the frontend.
	Services []string
	// Fingerprints maps each box serving the frontend to its fingerprint.
	Fingerprints map[string]string
	// Differ is true when the fingerprints are not all the same: the
	// boxes send the same flow to different backends.
	Differ bool
}

// String names the frontend, the services and each box's fingerprint.
func (m Frontend) String() string {
	var parts []string
	for _, box := range slices.Sorted(maps.Keys(m.Fingerprints)) {
		parts = append(parts, box+"="+m.Fingerprints[box])
	}
	return fmt.Sprintf("service %s (%s): fingerprints differ between boxes: %s", strings.Join(m.Services, "/"), m.Frontend, strings.Join(parts, ", "))
}

// Report is the comparison of a set of boxes.
type Report struct {
	// Boxes are the boxes compared, sorted by name.
	Boxes []Box
	// Seeds maps each seed fingerprint to the boxes using it; more than
	// one key means the boxes cannot agree on any service.
	Seeds map[string][]string
	// Frontends are every frontend any box serves, sorted.
	Frontends []Frontend
	// Mismatches are the frontends whose fingerprints differ.
	Mismatches []Frontend
	// Missing maps a frontend to the boxes that do not serve it while
	// others do: flows that reach them are not forwarded. It is reported
	// but not a mismatch, since boxes may serve different sets on purpose
	// (and do, for a moment, while a change rolls out).
	Missing map[string][]string
}

// Compare compares boxes frontend by frontend.
func Compare(boxes []Box) Report {
	r := Report{Boxes: slices.Clone(boxes), Seeds: map[string][]string{}, Missing: map[string][]string{}}
	slices.SortFunc(r.Boxes, func(a, b Box) int { return strings.Compare(a.Name, b.Name) })
	type served struct {
		names map[string]bool
		fps   map[string]string
	}
	fronts := map[string]*served{}
	for _, b := range r.Boxes {
		r.Seeds[b.SeedFingerprint] = append(r.Seeds[b.SeedFingerprint], b.Name)
		for _, s := range b.Services {
			f := fronts[s.Frontend]
			if f == nil {
				f = &served{names: map[string]bool{}, fps: map[string]string{}}
				fronts[s.Frontend] = f
			}
			f.names[s.Name] = true
			f.fps[b.Name] = s.Fingerprint
		}
	}
	for _, fe := range slices.Sorted(maps.Keys(fronts)) {
		f := fronts[fe]
		distinct := map[string]bool{}
		for _, fp := range f.fps {
			distinct[fp] = true
		}
		ff := Frontend{Frontend: fe, Services: slices.Sorted(maps.Keys(f.names)), Fingerprints: f.fps, Differ: len(distinct) > 1}
		r.Frontends = append(r.Frontends, ff)
		if ff.Differ {
			r.Mismatches = append(r.Mismatches, ff)
		}
		for _, b := range r.Boxes {
			if _, ok := f.fps[b.Name]; !ok {
				r.Missing[fe] = append(r.Missing[fe], b.Name)
			}
		}
	}
	return r
}

// Warnings are the report's findings as sentences, for status and logs.
func (r Report) Warnings() []string {
	var out []string
	if len(r.Seeds) > 1 {
		var parts []string
		for _, fp := range slices.Sorted(maps.Keys(r.Seeds)) {
			parts = append(parts, fmt.Sprintf("%s on %s", fp, strings.Join(r.Seeds[fp], ",")))
		}
		out = append(out, "boxes use different hash seeds (maglev.hash_seed): "+strings.Join(parts, "; "))
	}
	for _, m := range r.Mismatches {
		out = append(out, m.String())
	}
	return out
}

// Mismatched reports, for every service of the box named self, whether
// another box has a different fingerprint for its frontend.
func (r Report) Mismatched(self string) map[string]bool {
	bad := map[string]bool{}
	for _, m := range r.Mismatches {
		bad[m.Frontend] = true
	}
	out := map[string]bool{}
	for _, b := range r.Boxes {
		if b.Name != self {
			continue
		}
		for _, s := range b.Services {
			out[s.Name] = bad[s.Frontend]
		}
	}
	return out
}

// API is the report in the admin API's shape; self names this box (empty
// for an on-demand comparison).
func (r Report) API(self string) api.Fleet {
	out := api.Fleet{Self: self, Boxes: []api.FleetBox{}, Frontends: []api.FleetFrontend{}, Mismatches: []api.FleetFrontend{}, Warnings: r.Warnings()}
	for _, b := range r.Boxes {
		ab := api.FleetBox{Name: b.Name, Version: b.Version, SeedFingerprint: b.SeedFingerprint, Updated: b.Updated, LastSeen: b.Seen, Services: []api.FleetService{}}
		for _, s := range b.Services {
			ab.Services = append(ab.Services, api.FleetService{Name: s.Name, Frontend: s.Frontend, Fingerprint: s.Fingerprint})
		}
		out.Boxes = append(out.Boxes, ab)
	}
	for _, f := range r.Frontends {
		af := api.FleetFrontend{Frontend: f.Frontend, Services: f.Services, Fingerprints: f.Fingerprints, Differ: f.Differ}
		out.Frontends = append(out.Frontends, af)
		if f.Differ {
			out.Mismatches = append(out.Mismatches, af)
		}
	}
	if len(r.Missing) > 0 {
		out.Missing = r.Missing
	}
	return out
}
