// SPDX-License-Identifier: Apache-2.0

package reconcilertest

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

var _ reconciler.Reader = (*Fake)(nil)

// ReadServices implements reconciler.Reader.
func (f *Fake) ReadServices(want []reconciler.Expected) ([]reconciler.Found, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]reconciler.Found, len(want))
	for i, w := range want {
		o := &out[i]
		if w.Frontend.Addr.IsValid() {
			e, ok := f.services[w.Frontend]
			switch {
			case !ok && w.Entry != nil:
				o.EntryDrift, o.EntryWas = reconciler.MapServices, "no entry"
			case ok && w.Entry == nil:
				o.EntryDrift, o.EntryWas = reconciler.MapServices, reconciler.DescribeEntry(e.id, e.svc)
			case ok && (e.id != w.ID || !sameEntry(e.svc, *w.Entry)):
				o.EntryDrift, o.EntryWas = reconciler.MapServices, reconciler.DescribeEntry(e.id, e.svc)
				if e.id == w.ID && sameEntry(withRanges(e.svc, w.Entry.SourceRanges), *w.Entry) {
					o.EntryDrift = reconciler.MapSourceRanges
				}
			}
		}
		if t, ok := f.tables[w.ID]; ok {
			o.HasTable, o.Table = true, slices.Clone(t)
		}
		o.BackendWas = make([]string, len(w.Backends))
		for k, b := range w.Backends {
			got, ok := f.backends[b.ID]
			switch {
			case !ok:
				o.BackendWas[k] = "no entry"
			case got != b.Backend:
				o.BackendWas[k] = reconciler.DescribeBackend(got)
			}
		}
	}
	return out, nil
}

func withRanges(s lb.Service, r []netip.Prefix) lb.Service {
	s.SourceRanges = r
	return s
}

// sameEntry compares two outputs of reconciler.Entry.
func sameEntry(a, b lb.Service) bool {
	return formatEntry(a) == formatEntry(b)
}

// ReadStrayTables implements reconciler.Reader.
func (f *Fake) ReadStrayTables(ids []reconciler.ServiceID) ([]reconciler.ServiceID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []reconciler.ServiceID
	for _, id := range ids {
		if _, ok := f.tables[id]; ok {
			out = append(out, id)
		}
	}
	return out, nil
}

// ReadBackends implements reconciler.Reader.
func (f *Fake) ReadBackends(lo, hi reconciler.BackendID) ([]reconciler.BackendEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []reconciler.BackendEntry
	for _, id := range slices.Sorted(maps.Keys(f.backends)) {
		if id >= lo && id < hi {
			out = append(out, reconciler.BackendEntry{ID: id, Backend: f.backends[id]})
		}
	}
	return out, nil
}

// ScanEntries implements reconciler.Reader: the walk goes over the
// frontends held when it starts, in order, each as it is when reached.
func (f *Fake) ScanEntries() reconciler.EntryScan {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &entryScan{f: f, fes: slices.SortedFunc(maps.Keys(f.services), lb.Frontend.Compare)}
}

type entryScan struct {
	f   *Fake
	fes []lb.Frontend
}

func (s *entryScan) Next(n int) ([]lb.Frontend, []reconciler.ServiceID, bool, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var (
		fes []lb.Frontend
		ids []reconciler.ServiceID
	)
	for len(s.fes) > 0 && len(fes) < n {
		fe := s.fes[0]
		s.fes = s.fes[1:]
		if e, ok := s.f.services[fe]; ok {
			fes, ids = append(fes, fe), append(ids, e.id)
		}
	}
	return fes, ids, len(s.fes) == 0, nil
}

// DeleteStrayEntry implements reconciler.Reader. It is recorded as an
// OpDeleteService with no service id.
func (f *Fake) DeleteStrayEntry(fe lb.Frontend) error {
	return f.do(Op{Kind: OpDeleteService, Frontend: fe}, func() error {
		if _, ok := f.services[fe]; !ok {
			return fmt.Errorf("service %s: no such entry", fe)
		}
		delete(f.services, fe)
		return nil
	})
}

// Tamper changes the fake's maps behind the reconciler's back, as an
// operator's bpftool or a bug would change the kernel's, without recording
// an operation: fn gets the service entries by frontend, the backends by
// id and the tables by service id, and may change them in place.
func (f *Fake) Tamper(fn func(services map[lb.Frontend]Entry, backends map[reconciler.BackendID]reconciler.Backend, tables map[reconciler.ServiceID][]reconciler.BackendID)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	svcs := make(map[lb.Frontend]Entry, len(f.services))
	for fe, e := range f.services {
		svcs[fe] = Entry{ID: e.id, Service: e.svc}
	}
	fn(svcs, f.backends, f.tables)
	clear(f.services)
	for fe, e := range svcs {
		f.services[fe] = entry{id: e.ID, svc: e.Service}
	}
}

// Entry is a service entry as Tamper shows it.
type Entry struct {
	ID      reconciler.ServiceID
	Service lb.Service
}
