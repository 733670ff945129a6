// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"maps"
	"net/netip"

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

// updateIndex indexes what a pass programmed by frontend. programmed are
// the services as handed to the reconciler (health applied), whose
// eligible backends the fingerprint covers. The result is prev (which it
// does not modify: a view may still hold it) with the services of changed
// indexed again from st; the others keep their entries, so a pass that
// changed one service indexes one service. changed must name every
// frontend whose state or desired service differs from the pass prev was
// indexed from: reconciler.View says which.
func updateIndex(prev map[lb.Frontend]*programmedService, seed maglev.Seed, st reconciler.State, changed []lb.Frontend, programmed []lb.Service) map[lb.Frontend]*programmedService {
	if len(changed) == 0 && prev != nil {
		return prev
	}
	idx := make(map[lb.Frontend]*programmedService, max(len(prev), len(st.Services)))
	maps.Copy(idx, prev)
	todo := make(map[lb.Frontend]bool, len(changed))
	for _, fe := range changed {
		todo[fe] = true
		delete(idx, fe)
	}
	for _, s := range st.Services {
		// Pieces without a frontend (orphans) are never indexed.
		if !todo[s.Service.Frontend] || !s.Service.Frontend.Addr.IsValid() {
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
		idx[s.Service.Frontend] = ps
	}
	for _, svc := range programmed {
		if ps, ok := idx[svc.Frontend]; ok && todo[svc.Frontend] {
			ps.fingerprint = maglev.Fingerprint(seed, svc.TableSize, eligible(svc))
		}
	}
	return idx
}
