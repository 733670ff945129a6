// SPDX-License-Identifier: Apache-2.0

package daemon

import (
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

// indexProgrammed indexes what a pass programmed by frontend. programmed
// are the services as handed to the reconciler (health applied), whose
// eligible backends the fingerprint covers.
func indexProgrammed(seed maglev.Seed, st reconciler.State, programmed []lb.Service) map[lb.Frontend]*programmedService {
	idx := make(map[lb.Frontend]*programmedService, len(st.Services))
	for _, s := range st.Services {
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
		if ps, ok := idx[svc.Frontend]; ok {
			ps.fingerprint = maglev.Fingerprint(seed, svc.TableSize, eligible(svc))
		}
	}
	return idx
}
