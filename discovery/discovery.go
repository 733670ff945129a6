// SPDX-License-Identifier: Apache-2.0

// Package discovery is where service definitions enter the control plane.
// A Source (the TOML file, Consul, Kubernetes) publishes whole snapshots of
// the services it knows, already translated into the lb model; the Merger
// combines the latest snapshot of every source into one desired state for
// the reconciler.
//
// A frontend (VIP, port, protocol) or a service name claimed by two sources
// is a conflict: the earlier claim keeps serving, the later one is left out
// and reported (log, status, metrics) until the first claim goes away.
package discovery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
)

// Snapshot is everything one source knows at one moment. It replaces the
// source's previous snapshot as a whole.
type Snapshot struct {
	// Source names the origin, e.g. "file:/etc/l4lb/l4lb.toml" or "consul".
	Source   string
	Services []lb.Service
	// Changed, when not nil, says that the snapshot is the source's
	// previous one with at most the services named changed, each in
	// place (same position, same count): a source that patches its last
	// snapshot knows this, and the merger then looks at those services
	// alone instead of comparing every one. nil: compare them all.
	Changed []string
}

// Status is what a source that watches something outside l4lbd (Consul,
// Kubernetes) reports for `l4lbctl status` and metrics: how current its
// snapshots are, and what it left out.
type Status struct {
	// LastSync is when the source last knew its view to be complete and
	// current. During an outage it stays put and Staleness grows. Zero
	// until the first full view.
	LastSync time.Time
	// Healthy is true while the first full view is in and what the
	// source watches answers.
	Healthy bool
	// Error says why the source is not Healthy.
	Error string
	// Errors are the definitions left out (or partly left out), one line
	// per problem, each naming where it comes from, sorted.
	Errors []string
}

// Staleness is how long the published services may have missed changes:
// zero while Healthy, else the time since LastSync.
func (s Status) Staleness(now time.Time) time.Duration {
	if s.Healthy || s.LastSync.IsZero() {
		return 0
	}
	return now.Sub(s.LastSync)
}

// Source publishes snapshots until its context ends.
type Source interface {
	// Name is the Snapshot.Source of everything it publishes.
	Name() string
	// Run sends a snapshot whenever the source's view changes, the first
	// one as soon as it has one. It returns when ctx is done.
	Run(ctx context.Context, out chan<- Snapshot) error
}

// Conflict is a service left out of the desired state because another
// source claimed its frontend or name first.
type Conflict struct {
	Service      string // the service left out
	Source       string // its source
	Winner       string // the service that keeps serving
	WinnerSource string // and its source
	Frontend     lb.Frontend
	// Reason says what collides: "frontend" or "name".
	Reason string
}

// String describes the conflict for logs and status.
func (c Conflict) String() string {
	if c.Reason == "name" {
		return fmt.Sprintf("service %q from %s: name already used by the service from %s", c.Service, c.Source, c.WinnerSource)
	}
	return fmt.Sprintf("service %q from %s: frontend %s already served by %q from %s", c.Service, c.Source, c.Frontend, c.Winner, c.WinnerSource)
}

type claim struct {
	source  string
	service string
	seq     uint64 // order in which claims were made
}

// Merger combines sources' snapshots. It is not safe for concurrent use; the
// daemon's control loop owns it.
type Merger struct {
	snapshots map[string]stored
	// live are the frontends of each source's services by name, made
	// when its snapshot arrives (replaced, never modified) rather than
	// for every source on every Desired.
	live      map[string]map[string]lb.Frontend
	frontends map[lb.Frontend]claim
	names     map[string]claim
	seq       uint64

	// merged and conflicts are the last merge, valid while fresh: no
	// snapshot changed since, but for changes within services that
	// Update applied to merged itself. A pass that changes no snapshot
	// (a health flip, an override) then costs a copy of the merge, not a
	// merge. merged shares memory with the snapshots and with clones of
	// the merger: never written, only replaced.
	merged    cow.Slice[lb.Service]
	conflicts []Conflict
	fresh     bool
	// byName indexes merged by service name.
	byName map[string]int

	// changed are the services whose merged definition Update changed
	// since the last Changes; all says that the changes went further
	// (services came, went, moved or collided) and only a full merge
	// says what changed.
	changed []string
	all     bool
}

// stored is a source's last snapshot as the merger keeps it: copy on
// write, so that a snapshot that changes a few services costs those, and
// indexed by name.
type stored struct {
	svcs cow.Slice[lb.Service]
	// at is the position of each name in svcs (the first of a
	// duplicate); never modified, replaced.
	at map[string]int
}

// NewMerger returns an empty merger.
func NewMerger() *Merger {
	return &Merger{
		snapshots: map[string]stored{},
		live:      map[string]map[string]lb.Frontend{},
		frontends: map[lb.Frontend]claim{},
		names:     map[string]claim{},
	}
}

// Update replaces the snapshot of s.Source. A service the source had
// before, unchanged, keeps the copy the merger made of it then. When the
// snapshot changes services of the source only within themselves (same
// names and frontends, none in conflict), the last merge is updated for
// those services alone and Changes names them. With s.Changed set, only
// the services it names are looked at.
func (m *Merger) Update(s Snapshot) {
	if s.Changed != nil && m.patch(s) {
		return
	}
	old := m.snapshots[s.Source]
	svcs := make([]lb.Service, len(s.Services))
	var (
		changed []string
		at      []int // svcs[at[k]] is changed[k]
	)
	structural := len(s.Services) != old.svcs.Len()
	for i, svc := range s.Services {
		if svc.Source == "" {
			svc.Source = s.Source
		}
		j, had := old.at[svc.Name]
		var prev lb.Service
		if had {
			prev = old.svcs.At(j)
		}
		switch {
		case had && prev.Equal(svc):
			svcs[i] = prev
			continue
		case !had || prev.Frontend != svc.Frontend:
			structural = true
		}
		svcs[i] = svc.Clone()
		changed = append(changed, svc.Name)
		at = append(at, i)
	}
	pos := make(map[string]int, len(svcs))
	names := make(map[string]lb.Frontend, len(svcs))
	for i, svc := range svcs {
		if _, dup := pos[svc.Name]; !dup {
			pos[svc.Name] = i
		}
		names[svc.Name] = svc.Frontend
	}
	m.snapshots[s.Source] = stored{svcs: cow.SliceOf(svcs), at: pos}
	m.live[s.Source] = names
	if !m.fresh || structural || len(m.conflicts) > 0 {
		m.fresh, m.all = false, true
		return
	}
	m.within(s.Source, changed, func(k int) lb.Service { return svcs[at[k]] })
}

// patch is Update for a snapshot that says which services changed: it
// looks at those alone, and answers false, having changed nothing, when
// the snapshot does not fit the last one (another count, a name not where
// it was) or changes more than services within themselves; Update then
// compares everything.
func (m *Merger) patch(s Snapshot) bool {
	old, ok := m.snapshots[s.Source]
	if !ok || old.svcs.Len() != len(s.Services) || !m.fresh || len(m.conflicts) > 0 {
		return false
	}
	var changed []string
	var now []lb.Service
	next := old.svcs
	for _, name := range s.Changed {
		i, ok := old.at[name]
		if !ok || s.Services[i].Name != name || slices.Contains(changed, name) {
			return false
		}
		svc, prev := s.Services[i], old.svcs.At(i)
		if svc.Source == "" {
			svc.Source = s.Source
		}
		if prev.Equal(svc) {
			continue
		}
		if prev.Frontend != svc.Frontend {
			return false
		}
		svc = svc.Clone()
		next = next.With(i, svc)
		changed = append(changed, name)
		now = append(now, svc)
	}
	for _, name := range changed {
		if k, ok := m.byName[name]; !ok || m.merged.At(k).Source != s.Source {
			return false
		}
	}
	m.snapshots[s.Source] = stored{svcs: next, at: old.at}
	m.within(s.Source, changed, func(k int) lb.Service { return now[k] })
	return true
}

// within updates the last merge for services of source that changed
// within themselves: changed[k] is now svc(k).
func (m *Merger) within(source string, changed []string, svc func(k int) lb.Service) {
	// Every name and frontend stays where it was and nothing collides,
	// so the claims hold: the merge changes in these services only.
	merged := m.merged
	for k, name := range changed {
		i, ok := m.byName[name]
		if !ok || merged.At(i).Source != source {
			m.fresh, m.all = false, true
			return
		}
		merged = merged.With(i, svc(k))
	}
	m.merged = merged
	m.changed = append(m.changed, changed...)
}

// Changes returns the services whose merged definition changed since the
// last call, or all = true when only a full merge can tell (services came,
// went, changed frontend or collided; a source was removed; the first
// merge). It forgets them.
func (m *Merger) Changes() (names []string, all bool) {
	names, all = m.changed, m.all
	m.changed, m.all = nil, false
	if all {
		names = nil
	}
	return names, all
}

// Clone returns an independent copy of m, for asking what Desired would
// return after an Update without making it (a preview of a change).
func (m *Merger) Clone() *Merger {
	return &Merger{snapshots: maps.Clone(m.snapshots), live: maps.Clone(m.live), frontends: maps.Clone(m.frontends), names: maps.Clone(m.names), seq: m.seq,
		merged: m.merged, conflicts: m.conflicts, fresh: m.fresh, byName: m.byName, changed: slices.Clone(m.changed), all: m.all}
}

// Remove forgets a source (it stopped, or was removed from the config).
func (m *Merger) Remove(source string) {
	delete(m.snapshots, source)
	delete(m.live, source)
	m.fresh, m.all = false, true
}

// Desired returns the merged services, sorted by frontend, and the
// conflicts that kept services out. Both are the caller's to modify.
func (m *Merger) Desired() ([]lb.Service, []Conflict) {
	m.merge()
	out := make([]lb.Service, m.merged.Len())
	for i, svc := range m.merged.All() {
		out[i] = svc.Clone()
	}
	if len(out) == 0 {
		out = nil
	}
	return out, slices.Clone(m.conflicts)
}

// Service returns the merged service named name, if one is.
func (m *Merger) Service(name string) (lb.Service, bool) {
	m.merge()
	if i, ok := m.byName[name]; ok {
		return m.merged.At(i).Clone(), true
	}
	return lb.Service{}, false
}

// merge brings merged and conflicts up to date with the snapshots.
func (m *Merger) merge() {
	if m.fresh {
		return
	}
	// Release claims that their source no longer makes.
	live := m.live
	for fe, c := range m.frontends {
		if got, ok := live[c.source][c.service]; !ok || got != fe {
			delete(m.frontends, fe)
		}
	}
	for name, c := range m.names {
		if _, ok := live[c.source][name]; !ok {
			delete(m.names, name)
		}
	}

	// Visit sources in a fixed order so new claims made in one pass are
	// deterministic.
	sources := make([]string, 0, len(m.snapshots))
	for src := range m.snapshots {
		sources = append(sources, src)
	}
	slices.Sort(sources)

	var (
		out       []lb.Service
		conflicts []Conflict
	)
	for _, src := range sources {
		for _, svc := range m.snapshots[src].svcs.All() {
			fc, fok := m.frontends[svc.Frontend]
			nc, nok := m.names[svc.Name]
			switch {
			case fok && (fc.source != src || fc.service != svc.Name):
				conflicts = append(conflicts, Conflict{Service: svc.Name, Source: src, Winner: fc.service, WinnerSource: fc.source, Frontend: svc.Frontend, Reason: "frontend"})
				continue
			case nok && nc.source != src:
				conflicts = append(conflicts, Conflict{Service: svc.Name, Source: src, Winner: nc.service, WinnerSource: nc.source, Frontend: svc.Frontend, Reason: "name"})
				continue
			}
			if !fok {
				m.seq++
				m.frontends[svc.Frontend] = claim{source: src, service: svc.Name, seq: m.seq}
			}
			if !nok {
				m.seq++
				m.names[svc.Name] = claim{source: src, service: svc.Name, seq: m.seq}
			}
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b lb.Service) int { return a.Frontend.Compare(b.Frontend) })
	slices.SortFunc(conflicts, func(a, b Conflict) int { return strings.Compare(a.String(), b.String()) })
	byName := make(map[string]int, len(out))
	for i, svc := range out {
		// Names are unique across sources; within one source the
		// first of a duplicate wins, as the reconciler decides.
		if _, dup := byName[svc.Name]; !dup {
			byName[svc.Name] = i
		}
	}
	m.merged, m.conflicts, m.fresh, m.byName = cow.SliceOf(out), conflicts, true, byName
}

// SameServices reports whether a and b are one slice (not merely equal
// contents): a source that patches its last snapshot returns that very
// slice when nothing changed, which costs no comparison.
func SameServices(a, b []lb.Service) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
