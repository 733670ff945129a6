// SPDX-License-Identifier: Apache-2.0

// Package change says what a change of the desired services does before it
// is applied: per service, the backends added, removed, reweighted or put in
// another state, and the share of flows whose backend changes. It sits
// beside the reconciler in the data flow and reads the same inputs:
// `l4lbctl config diff` compares two files with it, l4lbd compares its
// programmed tables with the ones a reloaded file would give (also for the
// daemon.max_flow_move guard). Tables are built with lb/maglev exactly as
// the reconciler builds them, so the share is what the datapath would do.
package change

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// Table is one service's Maglev table: the owner of every slot, and the
// seed its flow hash uses. An empty Owners means no backend is eligible.
type Table struct {
	Seed   maglev.Seed
	Owners []netip.AddrPort
}

// Build returns the table the reconciler programs for svc (defaults
// resolved): the active backends with a weight, over svc.TableSize slots.
func Build(seed maglev.Seed, svc lb.Service) (Table, error) {
	var elig []maglev.Backend
	for _, b := range svc.Backends {
		if b.State == lb.Active && b.Weight > 0 {
			elig = append(elig, maglev.Backend{Addr: b.Addr, Weight: b.Weight})
		}
	}
	maglev.SortBackends(elig)
	idx, err := maglev.Build(seed, svc.TableSize, elig)
	if err != nil {
		return Table{}, fmt.Errorf("service %q: build Maglev table (table_size = %d): %w", svc.Name, svc.TableSize, err)
	}
	t := Table{Seed: seed, Owners: make([]netip.AddrPort, len(idx))}
	for i, j := range idx {
		t.Owners[i] = elig[j].Addr
	}
	return t, nil
}

// Moved is the share of flows whose backend differs between two tables.
// With the same seed and size, a flow keeps its slot: the share is the
// share of slots that change owner, exactly. Otherwise a flow's slot in the
// new table is independent of its slot in the old one (another modulus, or
// another hash), so the share is 1 - Σ p_old(b)·p_new(b) over the backends
// b, where p(b) is b's share of a table's slots. A table without backends
// serves no flow: losing every backend moves all of them, gaining the
// first moves none.
func Moved(old, cur Table) float64 {
	switch {
	case len(old.Owners) == 0:
		return 0
	case len(cur.Owners) == 0:
		return 1
	case old.Seed == cur.Seed && len(old.Owners) == len(cur.Owners):
		n := 0
		for i := range old.Owners {
			if old.Owners[i] != cur.Owners[i] {
				n++
			}
		}
		return float64(n) / float64(len(old.Owners))
	}
	po, pc := shares(old.Owners), shares(cur.Owners)
	same := 0.0
	for b, p := range po {
		same += p * pc[b]
	}
	return max(0, 1-same)
}

func shares(owners []netip.AddrPort) map[netip.AddrPort]float64 {
	out := map[netip.AddrPort]float64{}
	for _, o := range owners {
		out[o]++
	}
	for b := range out {
		out[b] /= float64(len(owners))
	}
	return out
}

// Side is one service on one side of a change: its definition and its
// table (built with Build, or read back from the datapath).
type Side struct {
	Service lb.Service
	Table   Table
}

// Reweight is a backend whose weight changes.
type Reweight struct {
	Backend  netip.AddrPort
	Old, New uint32
}

// Restate is a backend whose state changes.
type Restate struct {
	Backend  netip.AddrPort
	Old, New lb.BackendState
}

// Service is what the change does to one service.
type Service struct {
	Name string
	// Status is "added", "removed", "changed" or "unchanged".
	Status     string
	Added      []netip.AddrPort
	Removed    []netip.AddrPort
	Reweighted []Reweight
	Restated   []Restate
	// Other lists the changed settings other than backends (mode,
	// table_size, …).
	Other []string
	// Moved is the share of the service's flows whose backend changes
	// (see Moved); 0 for added and removed services.
	Moved float64
}

// Compare lists, by service name in name order, what going from old to cur
// does. Services only in old are removed, only in cur added.
func Compare(old, cur map[string]Side) []Service {
	names := make([]string, 0, len(old)+len(cur))
	for n := range old {
		names = append(names, n)
	}
	for n := range cur {
		if _, ok := old[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	out := make([]Service, 0, len(names))
	for _, n := range names {
		o, inOld := old[n]
		c, inCur := cur[n]
		s := Service{Name: n}
		switch {
		case !inOld:
			s.Status = "added"
			for _, b := range c.Service.Backends {
				s.Added = append(s.Added, b.Addr)
			}
		case !inCur:
			s.Status = "removed"
			for _, b := range o.Service.Backends {
				s.Removed = append(s.Removed, b.Addr)
			}
		default:
			backends(&s, o.Service.Backends, c.Service.Backends)
			s.Other = settings(o.Service, c.Service)
			s.Moved = Moved(o.Table, c.Table)
			s.Status = "unchanged"
			if len(s.Added)+len(s.Removed)+len(s.Reweighted)+len(s.Restated)+len(s.Other) > 0 || s.Moved > 0 {
				s.Status = "changed"
			}
		}
		out = append(out, s)
	}
	return out
}

func backends(s *Service, old, cur []lb.Backend) {
	byAddr := map[netip.AddrPort]lb.Backend{}
	for _, b := range old {
		byAddr[b.Addr] = b
	}
	seen := map[netip.AddrPort]bool{}
	for _, b := range cur {
		seen[b.Addr] = true
		ob, ok := byAddr[b.Addr]
		switch {
		case !ok:
			s.Added = append(s.Added, b.Addr)
		default:
			if ob.Weight != b.Weight {
				s.Reweighted = append(s.Reweighted, Reweight{Backend: b.Addr, Old: ob.Weight, New: b.Weight})
			}
			if ob.State != b.State {
				s.Restated = append(s.Restated, Restate{Backend: b.Addr, Old: ob.State, New: b.State})
			}
		}
	}
	for _, b := range old {
		if !seen[b.Addr] {
			s.Removed = append(s.Removed, b.Addr)
		}
	}
	slices.SortFunc(s.Added, netip.AddrPort.Compare)
	slices.SortFunc(s.Removed, netip.AddrPort.Compare)
}

// settings names the service settings besides backends that differ.
func settings(a, b lb.Service) []string {
	var out []string
	add := func(name string, changed bool) {
		if changed {
			out = append(out, name)
		}
	}
	add("vip/port/protocol", a.Frontend != b.Frontend)
	add("mode", a.Mode != b.Mode)
	add("dsr_dispatch", a.Dispatch != b.Dispatch)
	add("table_size", a.TableSize != b.TableSize)
	add("algorithm", a.Algorithm != b.Algorithm)
	add("affinity", a.Affinity != b.Affinity)
	add("source_ranges", !slices.Equal(a.SourceRanges, b.SourceRanges))
	add("drain_timeout", a.DrainTimeout != b.DrainTimeout)
	add("health", a.Health != b.Health)
	return out
}

// Percent formats a share for people: "12.34%".
func Percent(share float64) string {
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.2f", 100*share), "0"), ".0") + "%"
}
