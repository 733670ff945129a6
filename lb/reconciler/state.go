// SPDX-License-Identifier: Apache-2.0

package reconciler

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/internal/reset"
	"github.com/l4lb/l4lb/lb"
)

// State is what a datapath holds, service by service. Programmed returns the
// reconciler's view of it for status, metrics and l4lbctl; a datapath reports
// its pinned maps in the same form so that NewFromState can adopt them after
// a restart.
type State struct {
	// Services are ordered by frontend; pieces without a known frontend
	// (a table or backends whose entry is gone) come last, by id.
	Services []ServiceState
}

// ServiceState is one service id and everything programmed under it.
type ServiceState struct {
	ID ServiceID
	// Service is the programmed entry in the form Entry returns. The
	// reconciler also fills Name, which the datapath does not store. When
	// HasEntry is false only Frontend (and Name) are meaningful, and the
	// Frontend is the zero value if it is unknown.
	Service  lb.Service
	HasEntry bool
	// Table is the programmed Maglev table when HasTable; it may be empty
	// (the service has no eligible backend).
	Table    []BackendID
	HasTable bool
	// Backends are the programmed backend entries owned by ID, by address.
	Backends []BackendEntry
}

// BackendEntry is one programmed backend and its id.
type BackendEntry struct {
	ID BackendID
	Backend
}

// Programmed returns a deep copy of what the reconciler has programmed:
// exactly the operations that succeeded. Ids reserved for a service or
// backend whose first operation has not succeeded yet are not listed.
func (r *Reconciler) Programmed() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	var st State
	for _, v := range r.services {
		if s := v.state(); s.listed() {
			st.Services = append(st.Services, s)
		}
	}
	slices.SortFunc(st.Services, func(a, b ServiceState) int { return a.Service.Frontend.Compare(b.Service.Frontend) })
	for _, o := range r.orphans {
		st.Services = append(st.Services, o.state())
	}
	return st
}

// Changes returns what the passes since the last call may have changed
// (every service on the first call): the state of each frontend that still
// has something programmed, ordered by frontend, and the frontends that
// have nothing any more. Pieces without a known frontend (restored
// orphans) are never reported. It costs the changed services' copies, not
// a walk of every service, so that a pass that changed one service is
// published for the price of one.
func (r *Reconciler) Changes() (changed []ServiceState, gone []lb.Frontend) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changesAll {
		for fe := range r.services {
			r.touched[fe] = struct{}{}
		}
		r.changesAll = false
	}
	for fe := range r.touched {
		var s ServiceState
		if v := r.services[fe]; v != nil {
			s = v.state()
		}
		if s.listed() {
			changed = append(changed, s)
		} else {
			gone = append(gone, fe)
		}
	}
	r.touched = reset.Map(r.touched)
	slices.SortFunc(changed, func(a, b ServiceState) int { return a.Service.Frontend.Compare(b.Service.Frontend) })
	slices.SortFunc(gone, lb.Frontend.Compare)
	return changed, gone
}

// listed reports whether a service has anything in the datapath, and so a
// place in State.
func (s ServiceState) listed() bool { return s.HasEntry || s.HasTable || len(s.Backends) > 0 }

func (v *service) state() ServiceState {
	s := ServiceState{ID: v.id, HasEntry: v.hasEntry, HasTable: v.hasTable}
	if v.hasEntry {
		s.Service = v.entry
		s.Service.SourceRanges = slices.Clone(v.entry.SourceRanges)
	}
	s.Service.Frontend = v.fe
	s.Service.Name = v.name
	if v.hasTable {
		s.Table = append([]BackendID{}, v.table...)
	}
	for _, b := range v.backends {
		if b.programmed {
			s.Backends = append(s.Backends, BackendEntry{ID: b.id, Backend: Backend{Addr: b.addr, Service: v.id, State: b.state}})
		}
	}
	return s
}

// NewFromState returns a reconciler that adopts what the datapath already
// holds, typically pinned maps found after a daemon restart. Ids are kept and
// the free lists are rebuilt around them, so a Reconcile with the desired
// state that produced st issues no operation at all. Tables and backends
// without a service entry or frontend are deleted by the next Reconcile.
//
// st is validated first: ids in range and unique, every entry with a table of
// its size, every table naming only backends of its own service. An
// inconsistent state is refused rather than guessed at.
func NewFromState(cfg Config, dp Datapath, log *slog.Logger, st State) (*Reconciler, error) {
	if err := validateState(cfg, st); err != nil {
		return nil, err
	}
	r := New(cfg, dp, log)
	var svcIDs, beIDs []uint32
	for _, s := range st.Services {
		svcIDs = append(svcIDs, uint32(s.ID))
		v := &service{id: s.ID, fe: s.Service.Frontend, name: s.Service.Name, hasEntry: s.HasEntry, hasTable: s.HasTable}
		if s.HasEntry {
			v.entry = Entry(s.Service)
		}
		if s.HasTable {
			v.table = append([]BackendID{}, s.Table...)
		}
		for _, b := range s.Backends {
			beIDs = append(beIDs, uint32(b.ID))
			v.backends = append(v.backends, backend{addr: b.Addr, id: b.ID, state: b.State, programmed: true})
			r.beOwner[b.ID] = v
		}
		r.byID[v.id] = v
		slices.SortFunc(v.backends, func(a, b backend) int { return a.addr.Compare(b.addr) })
		if v.fe.Addr.IsValid() {
			r.services[v.fe] = v
		} else {
			r.orphans = append(r.orphans, v)
		}
	}
	slices.SortFunc(r.orphans, func(a, b *service) int { return cmp.Compare(a.id, b.id) })
	r.svcIDs = rebuildIDQueue(cfg.MaxServices, svcIDs)
	r.beIDs = rebuildIDQueue(cfg.MaxBackends, beIDs)
	return r, nil
}

const stateAdvice = "the datapath state is inconsistent; run `l4lbd --cleanup` to start from empty maps, or raise the datapath limits if they were lowered"

func validateState(cfg Config, st State) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("restore datapath state: "+format, args...))
	}
	svcSeen := make(map[ServiceID]bool)
	feSeen := make(map[lb.Frontend]ServiceID)
	beSeen := make(map[BackendID]ServiceID)
	for _, s := range st.Services {
		where := fmt.Sprintf("service id %d", s.ID)
		if s.Service.Frontend.Addr.IsValid() {
			where = fmt.Sprintf("service id %d (%s)", s.ID, s.Service.Frontend)
		}
		if s.ID == NoService || uint32(s.ID) > cfg.MaxServices {
			bad("%s: id out of range 1..%d (max_services)", where, cfg.MaxServices)
		}
		if svcSeen[s.ID] {
			bad("%s: id listed twice", where)
		}
		svcSeen[s.ID] = true
		if fe := s.Service.Frontend; fe.Addr.IsValid() {
			if other, dup := feSeen[fe]; dup {
				bad("%s: frontend also held by service id %d", where, other)
			}
			feSeen[fe] = s.ID
		} else if s.HasEntry {
			bad("%s: service entry without a frontend", where)
		}
		if s.HasEntry && !s.HasTable {
			bad("%s: service entry without a Maglev table", where)
		}
		if s.HasEntry && s.HasTable && len(s.Table) != 0 && uint32(len(s.Table)) != s.Service.TableSize {
			bad("%s: table has %d slots but the entry says table_size = %d", where, len(s.Table), s.Service.TableSize)
		}
		own := make(map[BackendID]bool, len(s.Backends))
		addrs := make(map[netip.AddrPort]bool, len(s.Backends))
		for _, b := range s.Backends {
			if b.ID == NoBackend || uint32(b.ID) > cfg.MaxBackends {
				bad("%s: backend id %d (%s) out of range 1..%d (max_backends)", where, b.ID, b.Addr, cfg.MaxBackends)
			}
			if other, dup := beSeen[b.ID]; dup {
				bad("%s: backend id %d (%s) also listed under service id %d", where, b.ID, b.Addr, other)
			}
			beSeen[b.ID] = s.ID
			if b.Service != s.ID {
				bad("%s: backend id %d (%s) is owned by service id %d", where, b.ID, b.Addr, b.Service)
			}
			if !b.Addr.Addr().IsValid() {
				bad("%s: backend id %d has no address", where, b.ID)
			}
			if addrs[b.Addr] {
				bad("%s: backend %s programmed twice", where, b.Addr)
			}
			addrs[b.Addr] = true
			own[b.ID] = true
		}
		for slot, id := range s.Table {
			if !own[id] {
				bad("%s: table slot %d names backend id %d, which is not a backend of this service", where, slot, id)
				break
			}
		}
	}
	if len(errs) > 0 {
		errs = append(errs, errors.New(stateAdvice))
	}
	return errors.Join(errs...)
}
