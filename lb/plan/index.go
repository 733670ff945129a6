// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"iter"
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Programmed is what the datapath holds for one frontend, indexed
// for the readers of a View (status, metrics, health targets): computed
// once per control-loop pass rather than on every request or scrape.
type Programmed struct {
	reconciler.ServiceState
	// IDs are the programmed backends' ids by address.
	IDs map[netip.AddrPort]reconciler.BackendID
	// Slots counts each backend id's slots in the Maglev table.
	Slots map[reconciler.BackendID]int
	// Fingerprint identifies (seed, table size, eligible backends) of the
	// service as programmed, for comparing boxes.
	Fingerprint string
}

// Index is what the datapath holds, by frontend, as of one pass, with the
// totals status and metrics report. It is immutable: a pass makes a new
// one that shares every unchanged service's entry with the last.
type Index struct {
	byFrontend cow.Map[lb.Frontend, *Programmed]
	// Services, Backends and Tables count the indexed services, their
	// programmed backend entries and their tables.
	Services, Backends, Tables int
}

// Get returns what is programmed for fe, if anything is.
func (x Index) Get(fe lb.Frontend) (*Programmed, bool) { return x.byFrontend.Get(fe) }

// updateIndex indexes what a pass programmed by frontend. changed and gone
// are what reconciler.Changes reported since prev was made; programmed are
// the services as handed to the reconciler (health applied), whose
// eligible backends the fingerprint covers: at least those of changed.
// The result is prev (which it does not modify: a view may still hold it)
// with those services indexed again, so a pass that changed one service
// indexes one service.
func updateIndex(prev Index, seed maglev.Seed, changed []reconciler.ServiceState, gone []lb.Frontend, programmed []lb.Service) Index {
	if len(changed) == 0 && len(gone) == 0 {
		return prev
	}
	next := prev
	e := prev.byFrontend.Edit()
	drop := func(fe lb.Frontend) {
		if old, ok := e.Get(fe); ok {
			next.count(old, -1)
			e.Delete(fe)
		}
	}
	for _, fe := range gone {
		drop(fe)
	}
	todo := make(map[lb.Frontend]*Programmed, len(changed))
	for _, s := range changed {
		fe := s.Service.Frontend
		drop(fe)
		// Pieces without a frontend (orphans) are never indexed.
		if !fe.Addr.IsValid() {
			continue
		}
		ps := &Programmed{
			ServiceState: s,
			IDs:          make(map[netip.AddrPort]reconciler.BackendID, len(s.Backends)),
			Slots:        map[reconciler.BackendID]int{},
		}
		for _, b := range s.Backends {
			ps.IDs[b.Addr] = b.ID
		}
		for _, id := range s.Table {
			ps.Slots[id]++
		}
		e.Set(fe, ps)
		next.count(ps, 1)
		todo[fe] = ps
	}
	for _, svc := range programmed {
		if ps, ok := todo[svc.Frontend]; ok {
			ps.Fingerprint = maglev.Fingerprint(seed, svc.TableSize, Eligible(svc))
		}
	}
	next.byFrontend = e.Map()
	return next
}

// count adds ps to the totals (sign 1) or takes it out (-1).
func (x *Index) count(ps *Programmed, sign int) {
	x.Services += sign
	x.Backends += sign * len(ps.Backends)
	if ps.HasTable {
		x.Tables += sign
	}
}

// programmedMoved reports whether changed and gone (reconciler.Changes)
// change which frontends of prev have both their entry and their table:
// the set the Kubernetes source is told of (Index.Programmed), which a pass over a few services
// then need not walk every service to build again.
func programmedMoved(prev Index, changed []reconciler.ServiceState, gone []lb.Frontend) bool {
	was := func(fe lb.Frontend) bool {
		ps, ok := prev.Get(fe)
		return ok && ps.HasEntry && ps.HasTable
	}
	for _, s := range changed {
		if was(s.Service.Frontend) != (s.HasEntry && s.HasTable) {
			return true
		}
	}
	for _, fe := range gone {
		if was(fe) {
			return true
		}
	}
	return false
}

// Eligible are the backends that take part in the Maglev table.
func Eligible(svc lb.Service) []maglev.Backend {
	var out []maglev.Backend
	for _, b := range svc.Backends {
		if b.State == lb.Active && b.Weight > 0 {
			out = append(out, maglev.Backend{Addr: b.Addr, Weight: b.Weight})
		}
	}
	return out
}

// Frontends lists, in order, the frontends that have both their entry and
// their table: those clients can reach.
func (x Index) Frontends() []lb.Frontend {
	var fes []lb.Frontend
	for fe, ps := range x.byFrontend.All() {
		if ps.HasEntry && ps.HasTable {
			fes = append(fes, fe)
		}
	}
	slices.SortFunc(fes, lb.Frontend.Compare)
	return fes
}

// All iterates over the indexed frontends, in no order.
func (x Index) All() iter.Seq2[lb.Frontend, *Programmed] { return x.byFrontend.All() }

// Len is the number of indexed frontends.
func (x Index) Len() int { return x.byFrontend.Len() }

// IndexOf indexes what is programmed for the frontends of m, as a pass
// would have: for readers' tests, which need an index without running
// passes.
func IndexOf(m map[lb.Frontend]*Programmed) Index {
	var x Index
	for _, ps := range m {
		x.count(ps, 1)
	}
	x.byFrontend = cow.MapOf(m)
	return x
}
