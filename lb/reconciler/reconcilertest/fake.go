// SPDX-License-Identifier: Apache-2.0

// Package reconcilertest provides an in-memory reconciler.Datapath for tests
// of the reconciler and of the packages that drive it. The Fake holds the
// same three maps the BPF datapath holds (service entries by frontend,
// backends by id, Maglev tables by service id), records every operation,
// injects failures, checks the rules a half-programmed datapath would break,
// and prints its maps as a stable text dump for golden files. It also reads
// its maps back for the self-check (it implements reconciler.Reader), and
// Tamper changes them behind the reconciler's back as an operator or a
// bug would change the kernel's.
//
// Like the BPF datapath, the Fake batches table swaps (it implements
// reconciler.TableBatcher); Unbatched hides that, so tests can drive both
// of the reconciler's paths.
package reconcilertest

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

var (
	_ reconciler.Datapath     = (*Fake)(nil)
	_ reconciler.TableBatcher = (*Fake)(nil)
)

type entry struct {
	id  reconciler.ServiceID
	svc lb.Service
}

// Fake is an in-memory datapath. Like the kernel maps it stands for, it
// rejects ids it has no slot for and deletions of missing entries, and a
// failed operation changes nothing. The zero value is not usable; call
// NewFake. All methods are safe for concurrent use.
//
// A batch (SetTables, DeleteTables) is recorded as one op that opens it
// (OpSetTables, OpDeleteTables) followed by one op per entry, and applied
// entry by entry as the kernel applies one. Every recorded op counts for
// FailNth and is shown to FailOn: failing the opening op fails the whole
// batch (every entry returns that error and none is recorded or applied);
// failing an entry fails that entry alone.
type Fake struct {
	mu       sync.Mutex
	services map[lb.Frontend]entry
	backends map[reconciler.BackendID]reconciler.Backend
	tables   map[reconciler.ServiceID][]reconciler.BackendID

	maxServices, maxBackends uint32

	ops     []Op
	failOn  func(Op) error
	failNth int
	failErr error

	checkEach  bool
	violations []error
}

// NewFake returns an empty datapath with no limit on ids.
func NewFake() *Fake {
	return &Fake{
		services: make(map[lb.Frontend]entry),
		backends: make(map[reconciler.BackendID]reconciler.Backend),
		tables:   make(map[reconciler.ServiceID][]reconciler.BackendID),
	}
}

// SetLimits makes the fake refuse service ids above maxServices and backend
// ids above maxBackends, as fixed-size BPF arrays do. Zero means no limit.
func (f *Fake) SetLimits(maxServices, maxBackends uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maxServices, f.maxBackends = maxServices, maxBackends
}

// FailOn installs fn, which sees every later operation before it is applied;
// a non-nil result fails the operation with that error. nil removes it. fn
// runs with the fake locked and must not call its methods.
func (f *Fake) FailOn(fn func(op Op) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOn = fn
}

// FailNth makes the n-th operation from now (1 is the next one) fail with
// err. n <= 0 cancels a pending failure.
func (f *Fake) FailNth(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNth, f.failErr = n, err
}

// CheckEachOp makes the fake run CheckInvariants after every successful
// operation and remember what it finds; CheckInvariants then reports those
// past violations too. It catches orderings that break the rules only
// between two operations of one pass. In a batch it checks after every
// entry, since a packet may arrive between two entries; the state after
// the batch is the state after its last entry.
func (f *Fake) CheckEachOp(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkEach = on
}

// Ops returns a copy of the operations recorded since the last ResetOps,
// failed ones included (their Err is set).
func (f *Fake) Ops() []Op {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Op, len(f.ops))
	for i, op := range f.ops {
		out[i] = op.clone()
	}
	return out
}

// Failed returns the recorded operations that failed.
func (f *Fake) Failed() []Op {
	var out []Op
	for _, op := range f.Ops() {
		if op.Err != nil {
			out = append(out, op)
		}
	}
	return out
}

// ResetOps forgets the recorded operations.
func (f *Fake) ResetOps() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.ops)
	f.ops = f.ops[:0]
}

// do records op, decides whether it fails, and applies it when not.
func (f *Fake) do(op Op, apply func() error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.doLocked(op, apply)
}

func (f *Fake) doLocked(op Op, apply func() error) error {
	var err error
	if f.failNth > 0 {
		f.failNth--
		if f.failNth == 0 {
			err = f.failErr
			if err == nil {
				err = errors.New("injected failure")
			}
		}
	}
	if err == nil && f.failOn != nil {
		err = f.failOn(op)
	}
	if err == nil {
		err = apply()
	}
	op.Err = err
	f.ops = append(f.ops, op)
	if err == nil && f.checkEach && !op.IsBatch() {
		if v := f.check(); v != nil {
			f.violations = append(f.violations, fmt.Errorf("after op %d %s: %w", len(f.ops), op, v))
		}
	}
	return err
}

func (f *Fake) serviceID(id reconciler.ServiceID) error {
	if id == reconciler.NoService || (f.maxServices > 0 && uint32(id) > f.maxServices) {
		return fmt.Errorf("service id %d has no slot (1..%d)", id, f.maxServices)
	}
	return nil
}

func (f *Fake) backendID(id reconciler.BackendID) error {
	if id == reconciler.NoBackend || (f.maxBackends > 0 && uint32(id) > f.maxBackends) {
		return fmt.Errorf("backend id %d has no slot (1..%d)", id, f.maxBackends)
	}
	return nil
}

// SetBackend implements reconciler.Datapath.
func (f *Fake) SetBackend(id reconciler.BackendID, b reconciler.Backend) error {
	op := Op{Kind: OpSetBackend, Backend: id, Service: b.Service, Addr: b.Addr, State: b.State}
	return f.do(op, func() error {
		if err := f.backendID(id); err != nil {
			return err
		}
		f.backends[id] = b
		return nil
	})
}

// DeleteBackend implements reconciler.Datapath.
func (f *Fake) DeleteBackend(id reconciler.BackendID) error {
	return f.do(Op{Kind: OpDeleteBackend, Backend: id}, func() error {
		if _, ok := f.backends[id]; !ok {
			return fmt.Errorf("backend id %d: no such entry", id)
		}
		delete(f.backends, id)
		return nil
	})
}

// SetTable implements reconciler.Datapath.
func (f *Fake) SetTable(svc reconciler.ServiceID, table []reconciler.BackendID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.setTable(svc, table, 0)
}

// setTable records and applies one table swap; batch is its position in
// a batch, or 0.
func (f *Fake) setTable(svc reconciler.ServiceID, table []reconciler.BackendID, batch int) error {
	t := slices.Clone(table)
	if t == nil {
		t = []reconciler.BackendID{}
	}
	return f.doLocked(Op{Kind: OpSetTable, Service: svc, Table: t, Batch: batch}, func() error {
		if err := f.serviceID(svc); err != nil {
			return err
		}
		f.tables[svc] = slices.Clone(t)
		return nil
	})
}

// DeleteTable implements reconciler.Datapath.
func (f *Fake) DeleteTable(svc reconciler.ServiceID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deleteTable(svc, 0)
}

func (f *Fake) deleteTable(svc reconciler.ServiceID, batch int) error {
	return f.doLocked(Op{Kind: OpDeleteTable, Service: svc, Batch: batch}, func() error {
		if _, ok := f.tables[svc]; !ok {
			return fmt.Errorf("table of service id %d: no such entry", svc)
		}
		delete(f.tables, svc)
		return nil
	})
}

// SetTables implements reconciler.TableBatcher.
func (f *Fake) SetTables(svcs []reconciler.ServiceID, tables [][]reconciler.BackendID) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batch(OpSetTables, svcs, func() error {
		if len(tables) != len(svcs) {
			return fmt.Errorf("SetTables: %d service ids for %d tables", len(svcs), len(tables))
		}
		return nil
	}, func(i int) error { return f.setTable(svcs[i], tables[i], i+1) })
}

// DeleteTables implements reconciler.TableBatcher.
func (f *Fake) DeleteTables(svcs []reconciler.ServiceID) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batch(OpDeleteTables, svcs, func() error { return nil }, func(i int) error { return f.deleteTable(svcs[i], i+1) })
}

// batch records the op opening a batch of svcs, then runs entry for each of
// them unless the whole batch failed. check refuses malformed batches.
func (f *Fake) batch(kind OpKind, svcs []reconciler.ServiceID, check func() error, entry func(i int) error) []error {
	errs := make([]error, len(svcs))
	err := f.doLocked(Op{Kind: kind, Batch: len(svcs)}, func() error {
		if err := check(); err != nil {
			return err
		}
		seen := make(map[reconciler.ServiceID]bool, len(svcs))
		for _, id := range svcs {
			if seen[id] {
				return fmt.Errorf("%s: service id %d appears twice in one batch", kind, id)
			}
			seen[id] = true
		}
		return nil
	})
	for i := range errs {
		if err != nil {
			errs[i] = err
		} else {
			errs[i] = entry(i)
		}
	}
	return errs
}

// Unbatched returns dp without its reconciler.TableBatcher methods, if it
// has any: a reconciler driving the result swaps tables one by one.
func Unbatched(dp reconciler.Datapath) reconciler.Datapath { return unbatched{dp} }

// unbatched embeds the interface, not the concrete type, so that only the
// reconciler.Datapath methods are promoted.
type unbatched struct{ reconciler.Datapath }

// SetService implements reconciler.Datapath. It keeps only the fields
// reconciler.Entry keeps, as the BPF entry would.
func (f *Fake) SetService(id reconciler.ServiceID, svc lb.Service) error {
	e := reconciler.Entry(svc)
	return f.do(Op{Kind: OpSetService, Service: id, Frontend: svc.Frontend, Entry: e}, func() error {
		if err := f.serviceID(id); err != nil {
			return err
		}
		f.services[svc.Frontend] = entry{id: id, svc: reconciler.Entry(svc)}
		return nil
	})
}

// DeleteService implements reconciler.Datapath.
func (f *Fake) DeleteService(id reconciler.ServiceID, fe lb.Frontend) error {
	return f.do(Op{Kind: OpDeleteService, Service: id, Frontend: fe}, func() error {
		e, ok := f.services[fe]
		if !ok {
			return fmt.Errorf("service %s: no such entry", fe)
		}
		if e.id != id {
			return fmt.Errorf("service %s holds id %d, not %d", fe, e.id, id)
		}
		delete(f.services, fe)
		return nil
	})
}

// CheckInvariants returns what makes the datapath half-programmed: a service
// entry without a table, a table whose length is neither 0 nor the entry's
// table size, a table slot naming a missing backend or one owned by another
// service, two frontends sharing an id. With CheckEachOp it also returns the
// violations seen after earlier operations.
func (f *Fake) CheckInvariants() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(append(slices.Clone(f.violations), f.check())...)
}

func (f *Fake) check() error {
	var errs []error
	ids := make(map[reconciler.ServiceID]lb.Frontend)
	for _, fe := range slices.SortedFunc(maps.Keys(f.services), lb.Frontend.Compare) {
		e := f.services[fe]
		if other, dup := ids[e.id]; dup {
			errs = append(errs, fmt.Errorf("service %s: id %d is also the id of %s", fe, e.id, other))
		}
		ids[e.id] = fe
		if e.svc.Frontend != fe {
			errs = append(errs, fmt.Errorf("service %s: entry says frontend %s", fe, e.svc.Frontend))
		}
		if _, ok := f.tables[e.id]; !ok {
			errs = append(errs, fmt.Errorf("service %s (id %d): entry present but no table", fe, e.id))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(f.tables)) {
		for slot, bid := range f.tables[id] {
			b, ok := f.backends[bid]
			if !ok {
				errs = append(errs, fmt.Errorf("table of service id %d: slot %d names backend id %d, which is not programmed", id, slot, bid))
				break
			}
			if b.Service != id {
				errs = append(errs, fmt.Errorf("table of service id %d: slot %d names backend id %d (%s), owned by service id %d", id, slot, bid, b.Addr, b.Service))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// State returns the fake's contents in the form a real datapath reports its
// pinned maps, for reconciler.NewFromState. Tables and backends whose service
// id has no entry come last with a zero frontend.
func (f *Fake) State() reconciler.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	byID := make(map[reconciler.ServiceID]*reconciler.ServiceState)
	get := func(id reconciler.ServiceID) *reconciler.ServiceState {
		s := byID[id]
		if s == nil {
			s = &reconciler.ServiceState{ID: id}
			byID[id] = s
		}
		return s
	}
	for _, e := range f.services {
		s := get(e.id)
		s.Service = cloneEntry(e.svc)
		s.HasEntry = true
	}
	for id, t := range f.tables {
		s := get(id)
		s.Table = slices.Clone(t)
		s.HasTable = true
	}
	for id, b := range f.backends {
		s := get(b.Service)
		s.Backends = append(s.Backends, reconciler.BackendEntry{ID: id, Backend: b})
	}
	var st reconciler.State
	for _, s := range byID {
		slices.SortFunc(s.Backends, func(a, b reconciler.BackendEntry) int { return a.Addr.Compare(b.Addr) })
		st.Services = append(st.Services, *s)
	}
	slices.SortFunc(st.Services, func(a, b reconciler.ServiceState) int {
		if a.HasEntry != b.HasEntry {
			if a.HasEntry {
				return -1
			}
			return 1
		}
		if a.HasEntry {
			return a.Service.Frontend.Compare(b.Service.Frontend)
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return st
}

func cloneEntry(s lb.Service) lb.Service {
	s.SourceRanges = slices.Clone(s.SourceRanges)
	return s
}

// Dump prints the three maps in a stable text form, one entry per line,
// sorted by key, for golden files and test failure messages.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var sb strings.Builder
	sb.WriteString("services:\n")
	for _, fe := range slices.SortedFunc(maps.Keys(f.services), lb.Frontend.Compare) {
		e := f.services[fe]
		fmt.Fprintf(&sb, "  %s id=%d %s\n", fe, e.id, formatEntry(e.svc))
	}
	sb.WriteString("backends:\n")
	for _, id := range slices.Sorted(maps.Keys(f.backends)) {
		b := f.backends[id]
		fmt.Fprintf(&sb, "  %d %s service=%d %s\n", id, b.Addr, b.Service, b.State)
	}
	sb.WriteString("tables:\n")
	for _, id := range slices.Sorted(maps.Keys(f.tables)) {
		t := f.tables[id]
		fmt.Fprintf(&sb, "  %d size=%d", id, len(t))
		if len(t) > 0 {
			counts := make(map[reconciler.BackendID]int)
			for _, b := range t {
				counts[b]++
			}
			sb.WriteString(" slots:")
			for _, b := range slices.Sorted(maps.Keys(counts)) {
				fmt.Fprintf(&sb, " %d=%d", b, counts[b])
			}
			if len(t) <= maxListed {
				fmt.Fprintf(&sb, " table: %s", formatTable(t))
			}
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// maxListed is the largest table printed slot by slot; bigger ones are
// summarized by their per-backend slot counts only.
const maxListed = 64

func formatTable(t []reconciler.BackendID) string {
	var sb strings.Builder
	for i, b := range t {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprint(&sb, b)
	}
	return sb.String()
}

// formatEntry prints the fields of a service entry that matter, leaving out
// those at their zero value except mode and table size.
func formatEntry(s lb.Service) string {
	var parts []string
	parts = append(parts, "mode="+s.Mode.String())
	if s.Dispatch != lb.DispatchDefault {
		parts = append(parts, "dispatch="+s.Dispatch.String())
	}
	parts = append(parts, fmt.Sprintf("table_size=%d", s.TableSize))
	if s.Algorithm != lb.Maglev {
		parts = append(parts, "algorithm="+s.Algorithm.String())
	}
	if s.Affinity.ClientIP {
		parts = append(parts, "affinity=client-ip/"+s.Affinity.Timeout.String())
	}
	if len(s.SourceRanges) > 0 {
		var rs []string
		for _, p := range s.SourceRanges {
			rs = append(rs, p.String())
		}
		parts = append(parts, "source_ranges="+strings.Join(rs, ","))
	}
	return strings.Join(parts, " ")
}
