// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"net/netip"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// programmedService is what the datapath holds for one frontend, indexed
// for the readers of a view (status, metrics, health targets): computed
// once per control-loop pass rather than on every request or scrape.
type programmedService struct {
	reconciler.ServiceState
	// ids are the programmed backends' ids by address.
	ids map[netip.AddrPort]reconciler.BackendID
	// slots counts each backend id's slots in the Maglev table.
	slots map[reconciler.BackendID]int
	// fingerprint identifies (seed, table size, eligible backends) of the
	// service as programmed, for comparing boxes.
	fingerprint string
}

// index is what the datapath holds, by frontend, as of one pass, with the
// totals status and metrics report. It is immutable: a pass makes a new
// one that shares every unchanged service's entry with the last.
type index struct {
	byFrontend cow.Map[lb.Frontend, *programmedService]
	// services, backends and tables count the indexed services, their
	// programmed backend entries and their tables.
	services, backends, tables int
}

// get returns what is programmed for fe, if anything is.
func (x index) get(fe lb.Frontend) (*programmedService, bool) { return x.byFrontend.Get(fe) }

// updateIndex indexes what a pass programmed by frontend. changed and gone
// are what reconciler.Changes reported since prev was made; programmed are
// the services as handed to the reconciler (health applied), whose
// eligible backends the fingerprint covers: at least those of changed.
// The result is prev (which it does not modify: a view may still hold it)
// with those services indexed again, so a pass that changed one service
// indexes one service.
func updateIndex(prev index, seed maglev.Seed, changed []reconciler.ServiceState, gone []lb.Frontend, programmed []lb.Service) index {
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
	todo := make(map[lb.Frontend]*programmedService, len(changed))
	for _, s := range changed {
		fe := s.Service.Frontend
		drop(fe)
		// Pieces without a frontend (orphans) are never indexed.
		if !fe.Addr.IsValid() {
			continue
		}
		ps := &programmedService{
			ServiceState: s,
			ids:          make(map[netip.AddrPort]reconciler.BackendID, len(s.Backends)),
			slots:        map[reconciler.BackendID]int{},
		}
		for _, b := range s.Backends {
			ps.ids[b.Addr] = b.ID
		}
		for _, id := range s.Table {
			ps.slots[id]++
		}
		e.Set(fe, ps)
		next.count(ps, 1)
		todo[fe] = ps
	}
	for _, svc := range programmed {
		if ps, ok := todo[svc.Frontend]; ok {
			ps.fingerprint = maglev.Fingerprint(seed, svc.TableSize, eligible(svc))
		}
	}
	next.byFrontend = e.Map()
	return next
}

// count adds ps to the totals (sign 1) or takes it out (-1).
func (x *index) count(ps *programmedService, sign int) {
	x.services += sign
	x.backends += sign * len(ps.Backends)
	if ps.HasTable {
		x.tables += sign
	}
}
