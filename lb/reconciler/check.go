// SPDX-License-Identifier: Apache-2.0

package reconciler

import (
	"fmt"
	"slices"

	"github.com/l4lb/l4lb/lb"
)

// The self-check reads the datapath back and compares it with the record of
// what the reconciler programmed (the service records of reconciler.go),
// because nothing else would notice a map changed behind l4lbd's back: an
// operator's bpftool, a second tool on the pins, a half-applied write after
// a crash, a kernel or l4lbd bug. Whatever differs is written again from the
// record, through the same Datapath calls as a pass (a table before its
// entry; strays are removed, never an entry of the record), and reported as
// a Drift. Backend entries are read by id range in a phase of their own, so
// that a pass reads each once and in order: a changed backend is written
// back a moment after its service's table and entry were compared; it
// was wrong before either way, and every write leaves it right.
//
// A check runs in steps, each over a bounded slice of ids, and each holds
// the reconciler's lock for its read, compare and repair: a Reconcile or
// Update runs between two steps, never during one, so a step compares with
// the record as of its own read and can never write back an older state than
// a concurrent pass wrote. Steps cover, in order: the services by id (each
// one's entry, source ranges and table, and tables in slots that the record
// holds none for), then the backend entries by id (each service's, and
// entries in use at ids no service holds), then every service entry of the
// datapath (entries at frontends the record has none for), and last what
// the datapath derives from the entries (DerivedChecker). Ids above the
// highest ever handed out are not read: the datapath reaches a table or
// backend only through a service entry, and every entry is read.

// Slice sizes of one step. A step over services reads up to checkServices
// entries and tables (a table is up to 64 KiB at the largest table size), so
// it holds the lock for about a millisecond at the default table size.
const (
	checkServices = 128
	checkBackends = 4096
	checkEntries  = 1024
)

// The datapath maps a Drift can name.
const (
	MapServices     = "services"
	MapSourceRanges = "src_ranges"
	MapBackends     = "backends"
	MapMaglev       = "maglev"
)

// Reader is implemented by a datapath whose contents the self-check can read
// back (lb/datapath on BPF maps, reconcilertest.Fake in memory). Reads see
// the maps as they are; they never change them.
type Reader interface {
	// ReadServices reads what the datapath holds for each of want, in
	// order: the service entry keyed by want[i].Frontend (none when the
	// frontend is the zero value) and the table in slot want[i].ID, and
	// the backend entries at the ids of want[i].Backends when it lists
	// any (the self-check reads backends by id range instead).
	ReadServices(want []Expected) ([]Found, error)
	// ReadStrayTables returns those of ids whose Maglev slot holds a
	// table, in order. The ids are those no service holds.
	ReadStrayTables(ids []ServiceID) ([]ServiceID, error)
	// ReadBackends returns the backend entries in use at ids in [lo, hi),
	// in order. A check calls it for consecutive ranges from id 1 up,
	// which a datapath may read in one walk.
	ReadBackends(lo, hi BackendID) ([]BackendEntry, error)
	// ScanEntries starts a walk over every service entry.
	ScanEntries() EntryScan
	// DeleteStrayEntry removes the service entry keyed by fe, which the
	// record does not hold, and nothing else: no counters, ranges or
	// words of the id it names, which may be another service's.
	DeleteStrayEntry(fe lb.Frontend) error
}

// DerivedChecker is implemented by a Reader whose datapath keeps maps of its
// own making from the service entries (lb/datapath's frontend filter): a
// check's last step has it compare them with what the entries make them,
// write back what differs, and report each difference (Drift.Map names the
// map).
type DerivedChecker interface {
	CheckDerived() []Drift
}

// EntryScan walks the service entries of a datapath. Entries written or
// deleted during the walk may be seen or not.
type EntryScan interface {
	// Next returns the frontends and ids of up to n more entries; done is
	// true once the walk is over (the last entries may come with it).
	Next(n int) (fes []lb.Frontend, ids []ServiceID, done bool, err error)
}

// Expected is what the record says one service id holds.
type Expected struct {
	ID ServiceID
	// Frontend keys the service entry; the zero value for a service whose
	// entry has no known frontend (a restored orphan).
	Frontend lb.Frontend
	// Entry is the entry as Entry returns it, or nil when the record holds
	// no entry at Frontend.
	Entry *lb.Service
	// Backends are the programmed backend entries.
	Backends []BackendEntry
	// HasTable and Table are the programmed table, which a datapath may
	// compare where it lives rather than hand it back (Found.TableSame).
	// The slice is the record's: read it, never keep or change it.
	HasTable bool
	Table    []BackendID
}

// Found is what the datapath holds for one Expected.
type Found struct {
	// EntryDrift is "" when the entry at the frontend is what Expected
	// says (absent when Expected.Entry is nil), else the map that differs:
	// MapServices, or MapSourceRanges when only the source ranges do.
	// EntryWas then says what the datapath held.
	EntryDrift string
	EntryWas   string
	// TableSame is true when the datapath compared the slot's table with
	// Expected.Table and found it the same; HasTable and Table are then
	// not set. Else HasTable and Table are the slot's table.
	TableSame bool
	HasTable  bool
	Table     []BackendID
	// BackendWas[k] is "" when the entry at Expected.Backends[k].ID is as
	// expected, else what it held.
	BackendWas []string
}

// Drift is one difference the self-check found between the datapath and the
// record, and how its repair went.
type Drift struct {
	// Map is MapServices, MapSourceRanges, MapBackends or MapMaglev.
	Map string
	// Service names the service the difference belongs to, when known.
	Service  string
	Frontend lb.Frontend
	// ID is the service id (MapServices, MapSourceRanges, MapMaglev) or
	// the backend id (MapBackends).
	ID uint32
	// Found says what the datapath held, Want what the record holds.
	Found, Want string
	// Err is why the repair failed; nil when it succeeded. A failed repair
	// is tried again by the next check.
	Err error
}

func (d Drift) String() string {
	s := fmt.Sprintf("%s id %d", d.Map, d.ID)
	if d.Frontend.Addr.IsValid() {
		s += fmt.Sprintf(" (%s", d.Frontend)
		if d.Service != "" {
			s += fmt.Sprintf(", service %q", d.Service)
		}
		s += ")"
	}
	s += ": found " + d.Found + ", want " + d.Want
	if d.Err != nil {
		s += fmt.Sprintf("; repair failed: %v", d.Err)
	}
	return s
}

// Check is one pass of the self-check, taken a step at a time (NewCheck).
type Check struct {
	r  *Reconciler
	rd Reader

	phase int
	next  uint32
	scan  EntryScan

	want  []Expected
	owned []*service
	ids   []ServiceID
}

// The phases of a Check.
const (
	phaseServices = iota
	phaseBackends
	phaseEntries
	phaseDone
)

// NewCheck starts a self-check pass of the datapath rd, which must be the
// datapath the reconciler writes.
func (r *Reconciler) NewCheck(rd Reader) *Check {
	return &Check{r: r, rd: rd, next: 1}
}

// Step checks one slice of ids, repairs what differs and returns the
// differences; done is true once the pass is over. An error is a read that
// failed: the step's slice is left for the next pass and the pass goes on
// with the next slice, so one unreadable entry does not stop the check.
func (c *Check) Step() (drifts []Drift, done bool, err error) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	switch c.phase {
	case phaseServices:
		top := ServiceID(r.svcIDs.next - 1)
		lo := ServiceID(c.next)
		hi := min(lo+checkServices, top+1)
		if lo > top {
			c.phase, c.next = phaseBackends, 1
			return nil, false, nil
		}
		c.next = uint32(hi)
		drifts, err = c.services(lo, hi)
	case phaseBackends:
		top := BackendID(r.beIDs.next - 1)
		lo := BackendID(c.next)
		hi := min(lo+checkBackends, top+1)
		if lo > top {
			c.phase = phaseEntries
			c.scan = c.rd.ScanEntries()
			return nil, false, nil
		}
		c.next = uint32(hi)
		drifts, err = c.backends(lo, hi)
	case phaseEntries:
		var last bool
		drifts, last, err = c.entries()
		if last || err != nil {
			// A failed walk cannot resume: the next pass starts over.
			c.phase = phaseDone
			if dc, ok := c.rd.(DerivedChecker); ok {
				drifts = append(drifts, dc.CheckDerived()...)
			}
		}
	}
	return drifts, c.phase == phaseDone, err
}

// Run takes a whole pass at once and returns every difference, and the
// read errors joined.
func (c *Check) Run() ([]Drift, error) {
	var (
		all  []Drift
		errs []error
	)
	for {
		d, done, err := c.Step()
		all = append(all, d...)
		if err != nil {
			errs = append(errs, err)
		}
		if done {
			return all, joinErrors(errs)
		}
	}
}

func joinErrors(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("self-check: %d reads failed, first: %w", len(errs), errs[0])
}

// services checks the services with ids in [lo, hi) and the table slots of
// that range. The caller holds r.mu.
func (c *Check) services(lo, hi ServiceID) ([]Drift, error) {
	r := c.r
	c.want, c.owned = c.want[:0], c.owned[:0]
	for id := lo; id < hi; id++ {
		v := r.byID[id]
		if v == nil {
			continue
		}
		e := Expected{ID: id, Frontend: v.fe}
		if v.hasEntry {
			e.Entry = &v.entry
		}
		e.HasTable, e.Table = v.hasTable, v.table
		c.want = append(c.want, e)
		c.owned = append(c.owned, v)
	}
	var drifts []Drift
	if len(c.want) > 0 {
		found, err := c.rd.ReadServices(c.want)
		if err != nil {
			return nil, fmt.Errorf("self-check: read services %d..%d: %w", lo, hi-1, err)
		}
		if len(found) != len(c.want) {
			return nil, fmt.Errorf("self-check: read services %d..%d: %d answers for %d services (a datapath bug)", lo, hi-1, len(found), len(c.want))
		}
		for i := range c.want {
			drifts = append(drifts, c.repair(c.owned[i], &c.want[i], &found[i])...)
		}
	}
	c.ids = c.ids[:0]
	for id := lo; id < hi; id++ {
		// A service's own slot is compared by repair.
		if r.byID[id] == nil {
			c.ids = append(c.ids, id)
		}
	}
	if len(c.ids) == 0 {
		return drifts, nil
	}
	slots, err := c.rd.ReadStrayTables(c.ids)
	if err != nil {
		return drifts, fmt.Errorf("self-check: read Maglev slots %d..%d: %w", lo, hi-1, err)
	}
	for _, id := range slots {
		d := Drift{Map: MapMaglev, ID: uint32(id), Found: "a table", Want: "none (no service holds the id)"}
		d.Err = r.dp.DeleteTable(id)
		drifts = append(drifts, d)
	}
	return drifts, nil
}

// repair writes again what of v differs from the record: its backends,
// then its table, then its entry, as a pass writes them. The caller holds
// r.mu.
func (c *Check) repair(v *service, e *Expected, f *Found) []Drift {
	r := c.r
	var drifts []Drift
	drift := func(m string, id uint32, found, want string) *Drift {
		drifts = append(drifts, Drift{Map: m, Service: v.name, Frontend: v.fe, ID: id, Found: found, Want: want})
		return &drifts[len(drifts)-1]
	}
	for k, b := range e.Backends {
		if k >= len(f.BackendWas) || f.BackendWas[k] == "" {
			continue
		}
		d := drift(MapBackends, uint32(b.ID), f.BackendWas[k], DescribeBackend(b.Backend))
		d.Err = r.dp.SetBackend(b.ID, b.Backend)
	}
	var tableErr error
	switch {
	case v.hasTable && f.TableSame:
	case v.hasTable && !f.HasTable:
		d := drift(MapMaglev, uint32(v.id), "no table", fmt.Sprintf("%d slots", len(v.table)))
		d.Err = r.dp.SetTable(v.id, v.table)
		tableErr = d.Err
	case v.hasTable && !slices.Equal(v.table, f.Table):
		d := drift(MapMaglev, uint32(v.id), tableDiff(f.Table, v.table), fmt.Sprintf("the programmed %d slots", len(v.table)))
		d.Err = r.dp.SetTable(v.id, v.table)
		tableErr = d.Err
	case !v.hasTable && f.HasTable && !v.hasEntry:
		// A table without an entry; were there an entry, the table
		// could not go first (make-before-break): the entry is dealt
		// with below and the table by the next pass.
		d := drift(MapMaglev, uint32(v.id), fmt.Sprintf("a table of %d slots", len(f.Table)), "none")
		d.Err = r.dp.DeleteTable(v.id)
	}
	if f.EntryDrift != "" {
		if e.Entry != nil {
			d := drift(f.EntryDrift, uint32(v.id), f.EntryWas, DescribeEntry(v.id, *e.Entry))
			if tableErr != nil {
				// Never an entry without its table: the next check
				// writes both.
				d.Err = fmt.Errorf("not written, its table could not be: %w", tableErr)
			} else {
				d.Err = r.dp.SetService(v.id, *e.Entry)
			}
		} else {
			d := drift(MapServices, uint32(v.id), f.EntryWas, "no entry")
			d.Err = c.rd.DeleteStrayEntry(v.fe)
		}
	}
	return drifts
}

// DescribeEntry says what a service entry under id holds, for a Drift.
func DescribeEntry(id ServiceID, s lb.Service) string {
	return fmt.Sprintf("id %d, mode %s, dispatch %s, table_size %d, %s, source ranges %v", id, s.Mode, s.Dispatch, s.TableSize, s.Algorithm, s.SourceRanges)
}

// DescribeBackend says what a backend entry holds, for a Drift.
func DescribeBackend(b Backend) string {
	return fmt.Sprintf("%s of service id %d, %s", b.Addr, b.Service, b.State)
}

// tableDiff says how table got differs from want, for a Drift.
func tableDiff(got, want []BackendID) string {
	if len(got) != len(want) {
		return fmt.Sprintf("a table of %d slots", len(got))
	}
	first, n := -1, 0
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	return fmt.Sprintf("%d slots changed, first slot %d holding backend id %d instead of %d", n, first, got[first], want[first])
}

// backends compares the backend entries at ids in [lo, hi) with the
// record: an entry a service programmed is written again when it differs
// or is gone, an entry in use at an id no service programmed is cleared.
// The caller holds r.mu.
func (c *Check) backends(lo, hi BackendID) ([]Drift, error) {
	r := c.r
	in, err := c.rd.ReadBackends(lo, hi)
	if err != nil {
		return nil, fmt.Errorf("self-check: read backends %d..%d: %w", lo, hi-1, err)
	}
	var drifts []Drift
	k := 0
	for id := lo; id < hi; id++ {
		var got *BackendEntry
		if k < len(in) && in[k].ID == id {
			got = &in[k]
			k++
		}
		var want *backend
		v := r.beOwner[id]
		if v != nil {
			want = v.programmed(id)
		}
		switch {
		case want == nil && got == nil:
		case want == nil:
			d := Drift{Map: MapBackends, ID: uint32(id), Found: DescribeBackend(got.Backend), Want: "no entry (no service holds the id)"}
			d.Err = r.dp.DeleteBackend(id)
			drifts = append(drifts, d)
		default:
			b := Backend{Addr: want.addr, Service: v.id, State: want.state}
			if got != nil && got.Backend == b {
				continue
			}
			d := Drift{Map: MapBackends, Service: v.name, Frontend: v.fe, ID: uint32(id), Found: "no entry", Want: DescribeBackend(b)}
			if got != nil {
				d.Found = DescribeBackend(got.Backend)
			}
			d.Err = r.dp.SetBackend(id, b)
			drifts = append(drifts, d)
		}
	}
	return drifts, nil
}

// programmed returns v's programmed backend at id, or nil.
func (v *service) programmed(id BackendID) *backend {
	for i := range v.backends {
		if b := &v.backends[i]; b.id == id && b.programmed {
			return b
		}
	}
	return nil
}

// entries walks the next slice of service entries and removes those at
// frontends the record holds no entry for. The caller holds r.mu.
func (c *Check) entries() ([]Drift, bool, error) {
	r := c.r
	fes, ids, done, err := c.scan.Next(checkEntries)
	if err != nil {
		return nil, true, fmt.Errorf("self-check: walk service entries: %w", err)
	}
	var drifts []Drift
	for i, fe := range fes {
		if v := r.services[fe]; v != nil && v.hasEntry {
			// Compared with the record in the first phase.
			continue
		}
		d := Drift{Map: MapServices, Frontend: fe, ID: uint32(ids[i]), Found: fmt.Sprintf("an entry naming service id %d", ids[i]), Want: "no entry (no service holds the frontend)"}
		d.Err = c.rd.DeleteStrayEntry(fe)
		drifts = append(drifts, d)
	}
	return drifts, done, nil
}
