// SPDX-License-Identifier: Apache-2.0

// Package reconciler owns the step between the merged desired state and the
// datapath: it diffs the services the control plane wants against what is
// programmed, gives services and backends the small integer ids the datapath
// indexes arrays with, builds each service's Maglev table, and issues the
// fewest datapath operations that get from one to the other.
//
// Writes are make-before-break: for each added or changed service the new and
// changed backends go first, then the table, then the service entry, and the
// backends the table stopped using are deleted last; a removed service loses
// its entry, then its table, then its backends. Whatever operation fails, the
// datapath never holds a service entry without its table or a table that
// names a backend the service does not own, and the next Reconcile picks up
// where the failed one stopped.
//
// A pass runs those steps in phases across services rather than service by
// service, because swapping a table is the expensive step: in the BPF
// datapath a new table of a new size is a write to a map-in-map, after which
// the kernel waits for an RCU grace period (about 9 ms), while a batch of
// writes waits only once (a table of the same size is rewritten in place,
// which waits for nothing). So
// removals run as three phases (every entry, then every table, then every
// backend), and additions and changes as three more: per service, validate,
// reserve ids, write its backends and build its table; then one table phase
// for all of them; then per service its entry and the deletion of backends it
// no longer uses. With a datapath that implements TableBatcher, a table
// phase of more than one table is a single SetTables or DeleteTables call;
// a lone table still goes through SetTable or DeleteTable, so a one-backend
// change costs what it always did. Make-before-break holds per service at
// every point, since each phase only runs for services whose earlier phases
// succeeded. A service whose step fails stops there and the others go on.
//
// The table phase of additions and changes holds every table it swaps in
// memory, so a pass with very many of them runs in chunks (at most 1024
// tables or 4Mi slots, about 16 MiB): each chunk goes through its three
// phases before the next one starts, and pays one grace period.
//
// A table carries its own size (the Datapath contract), so even a new table
// size is make-before-break: the new table is swapped in, then the entry.
//
// Ids come from first-in first-out free lists. A service or backend keeps its
// id for as long as it stays programmed; a released id is handed out again
// only after every other free id, so a stale connection-tracking entry is
// unlikely to find a new backend behind an old id.
//
// The package talks to the kernel only through the Datapath interface (BPF
// maps in lb/datapath, an in-memory fake in reconcilertest), so it imports no
// kernel code.
package reconciler

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/l4lb/l4lb/internal/reset"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// Config sizes the id spaces and seeds the Maglev tables.
type Config struct {
	// Seed is the Maglev hash seed; every LB box must use the same one.
	Seed maglev.Seed
	// MaxServices and MaxBackends are the sizes of the datapath's service
	// and backend arrays (datapath.max_services, datapath.max_backends).
	// Ids are allocated in 1..Max; a zero maximum refuses every service.
	MaxServices uint32
	MaxBackends uint32
}

// Limits of one chunk of additions and changes (see the package doc). The
// slot limit bounds the memory the chunk's tables take; the table limit
// bounds the inner maps (and file descriptors) a batching datapath holds
// open at once; the service limit bounds the bookkeeping of services that
// need no new table.
const (
	chunkTables   = 1024
	chunkSlots    = 1 << 22
	chunkServices = 4096
)

// Reconciler keeps the datapath in step with the desired services. Its
// methods serialize on an internal lock: one Reconcile runs at a time, and
// Programmed called from another goroutine waits for it to finish.
type Reconciler struct {
	mu  sync.Mutex
	cfg Config
	dp  Datapath
	tb  TableBatcher // dp when it batches table swaps, else nil
	log *slog.Logger

	svcIDs idQueue
	beIDs  idQueue

	// services is the programmed view, keyed like the datapath's service
	// map. It also holds services whose entry is not (or no longer) in the
	// datapath but whose table, backends or reserved ids are.
	services map[lb.Frontend]*service
	// orphans are restored tables and backends whose service entry was
	// gone: nothing desired can claim them, so they are deleted.
	orphans []*service
	gen     uint64

	// byID and beOwner index the services (orphans included) by service
	// id and by the backend ids they hold, reserved ones included, for
	// the self-check (check.go), which walks the datapath by id.
	byID    map[ServiceID]*service
	beOwner map[BackendID]*service

	// touched are the frontends a pass may have changed since the last
	// Changes, and changesAll is set until the first Changes.
	touched    map[lb.Frontend]struct{}
	changesAll bool

	builder maglev.Builder

	// keepUnclaimed leaves programmed services that desired does not name
	// in place (SetKeepUnclaimed).
	keepUnclaimed bool

	// Chunk limits, the constants above except in tests.
	maxTables, maxSlots, maxServices int

	// Scratch space reused by every pass, so that a pass that changes one
	// service allocates little whatever the number of services.
	names   map[string]int
	fresh   map[lb.Frontend]int
	work    []*lb.Service
	gone    []*service
	prev    []*service // service claimed by desired[i] in the last pass, if any
	want    []lb.Backend
	elig    []maglev.Backend
	eligIdx []int
	slots   []int32
	errs    []error

	// The chunk of additions and changes in progress: its services in
	// frontend order, their target tables back to back in targets, and
	// the indexes of their eligible backends back to back in eligs.
	chunk       []pending
	targets     []BackendID
	eligs       []int
	chunkTables int
	releases    int // backend ids the chunk's services will release

	// Scratch of the table phases.
	at      []int
	ids     []ServiceID
	tables  [][]BackendID
	removed []error
}

// pending is one added or changed service of the chunk in progress, between
// the phases of a pass.
type pending struct {
	d   *lb.Service
	v   *service // nil when the service was refused before it got one
	err error    // why the service stopped; it goes no further this pass

	entry      lb.Service // Entry(*d)
	needTable  bool
	needEntry  bool
	added      bool
	tOff, tEnd int // its target table, r.targets[tOff:tEnd], when needTable
	eOff, eEnd int // its eligible backends, r.eligs[eOff:eEnd], when needTable
	ops        int
}

// service is the reconciler's record of one service in the datapath. It
// records exactly the operations that succeeded, plus ids reserved for
// backends whose SetBackend has not succeeded yet: keeping those reserved
// makes a retried pass hand out the same ids as a pass that never failed.
type service struct {
	id   ServiceID
	fe   lb.Frontend
	name string

	entry    lb.Service // the programmed entry, valid when hasEntry
	hasEntry bool
	table    []BackendID // the programmed table, valid when hasTable
	hasTable bool
	backends []backend // sorted by address

	// tableKey and tableSize are the inputs the programmed table was built
	// from; when the next pass has the same inputs it skips the build.
	tableKey   []tableInput
	tableSize  uint32
	tableKeyOK bool

	// want is a private copy of the desired service the datapath matches,
	// valid when clean: an equal desired service needs no work at all.
	want  lb.Service
	clean bool

	seen  uint64 // pass in which a desired service claimed the frontend
	claim int    // index of that service in the pass's desired list
}

type backend struct {
	addr       netip.AddrPort
	id         BackendID
	state      lb.BackendState // programmed state, valid when programmed
	programmed bool

	// Filled by each pass from the desired service.
	wanted    bool
	wantState lb.BackendState
	weight    uint32
}

type tableInput struct {
	addr   netip.AddrPort
	weight uint32
	id     BackendID
}

// New returns a reconciler for an empty datapath. A nil log discards output.
// When dp also implements TableBatcher, passes that swap several tables use
// it.
func New(cfg Config, dp Datapath, log *slog.Logger) *Reconciler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tb, _ := dp.(TableBatcher)
	return &Reconciler{
		cfg:         cfg,
		dp:          dp,
		tb:          tb,
		log:         log,
		svcIDs:      newIDQueue(cfg.MaxServices),
		beIDs:       newIDQueue(cfg.MaxBackends),
		services:    make(map[lb.Frontend]*service),
		byID:        make(map[ServiceID]*service),
		beOwner:     make(map[BackendID]*service),
		maxTables:   chunkTables,
		maxSlots:    chunkSlots,
		maxServices: chunkServices,
		names:       make(map[string]int),
		fresh:       make(map[lb.Frontend]int),
		touched:     make(map[lb.Frontend]struct{}),
		changesAll:  true,
	}
}

// SetKeepUnclaimed makes Reconcile leave alone every programmed service
// that the desired state does not name, instead of deleting it. After a
// restart the daemon adopts what the pinned maps hold before every
// discovery source has answered; until then a service absent from the
// desired state may simply belong to a source that has not spoken yet, and
// deleting it would drop its traffic. Services that are named are still
// updated as usual.
func (r *Reconciler) SetKeepUnclaimed(keep bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keepUnclaimed = keep
}

// Reconcile makes the datapath hold desired, a complete set of services with
// defaults resolved (lb.Service.WithDefaults). Services are keyed by frontend;
// a later service that claims a frontend or name already claimed in desired
// is refused. desired is not retained and may be modified afterwards.
//
// Only the services that differ from the last pass cost more than a
// comparison. A service that cannot be programmed (invalid, out of ids, or a
// datapath operation failed) keeps whatever it had, the others proceed, and
// the returned error joins one error per failed service. Calling Reconcile
// again retries what is left.
func (r *Reconciler) Reconcile(desired []lb.Service) error {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.gen++
	r.names = reset.Map(r.names)
	r.fresh = reset.Map(r.fresh)
	work := r.work[:0]
	seen := 0
	prev := r.prev
	r.prev = r.prev[:0]
	for i := range desired {
		d := &desired[i]
		// Callers pass mostly the same list in the same order: try the
		// service found at this position last time before hashing.
		var v *service
		if i < len(prev) && prev[i] != nil && prev[i].fe == d.Frontend && prev[i].id != NoService {
			v = prev[i]
		} else {
			v = r.services[d.Frontend]
		}
		r.prev = append(r.prev, v)
		if v != nil {
			if v.seen == r.gen {
				r.errs = append(r.errs, fmt.Errorf("service %q: frontend %s is already claimed by service %q; give one of them another VIP, port or protocol",
					d.Name, d.Frontend, desired[v.claim].Name))
				continue
			}
			v.seen, v.claim = r.gen, i
			seen++
		} else {
			if j, dup := r.fresh[d.Frontend]; dup {
				r.errs = append(r.errs, fmt.Errorf("service %q: frontend %s is already claimed by service %q; give one of them another VIP, port or protocol",
					d.Name, d.Frontend, desired[j].Name))
				continue
			}
			r.fresh[d.Frontend] = i
		}
		if j, dup := r.names[d.Name]; dup {
			r.errs = append(r.errs, fmt.Errorf("service %q (%s): name already used by the service at %s; service names must be unique",
				d.Name, d.Frontend, desired[j].Frontend))
			continue
		}
		r.names[d.Name] = i
		if v != nil && v.clean && sameService(&v.want, d) {
			continue
		}
		work = append(work, d)
	}

	// Removals go first: they only free ids, and freed ids join the back of
	// the queues, so they are handed out in this pass only when nothing else
	// is left, which is exactly when a full datapath needs them.
	gone := append(r.gone[:0], r.orphans...)
	if seen < len(r.services) && !r.keepUnclaimed {
		n := len(gone)
		for _, v := range r.services {
			if v.seen != r.gen {
				gone = append(gone, v)
			}
		}
		slices.SortFunc(gone[n:], func(a, b *service) int { return a.fe.Compare(b.fe) })
	}
	for _, v := range gone {
		r.touched[v.fe] = struct{}{}
	}
	for _, d := range work {
		r.touched[d.Frontend] = struct{}{}
	}
	if len(gone) > 0 {
		r.removeAll(gone)
		r.orphans = slices.DeleteFunc(r.orphans, func(o *service) bool { return o.id == NoService })
	}
	clear(gone)
	r.gone = gone[:0]

	clear(r.prev[len(r.prev):cap(r.prev)])
	return r.program(work)
}

// program runs the phases of a pass's added and changed services, in the
// order of their frontends, and returns the pass's errors joined (and
// forgets them).
func (r *Reconciler) program(work []*lb.Service) error {
	slices.SortFunc(work, func(a, b *lb.Service) int { return a.Frontend.Compare(b.Frontend) })
	for _, d := range work {
		r.stage(d)
	}
	r.flush()
	clear(work)
	r.work = work[:0]

	err := errors.Join(r.errs...)
	clear(r.errs)
	r.errs = r.errs[:0]
	return err
}

// Update reconciles only the services in changed, each of which replaces the
// desired service programmed at its frontend under the same name; every
// other service is left as the last pass left it, not even compared. It is
// for a change that touches known services only (a runtime override, a
// health check's verdict): its cost is that of those services, whatever the
// number of others. A service of changed that is not programmed under its
// name (new, renamed, or refused by the last pass) is refused with an error
// and nothing else: a full Reconcile handles it, with its checks across
// services. As with Reconcile, a service that fails keeps what it had and
// the error joins one error per failed service. Services a failed pass left
// unfinished are retried by the next Reconcile, not by Update.
func (r *Reconciler) Update(changed []lb.Service) error {
	r.mu.Lock()
	defer r.mu.Unlock()

	work := r.work[:0]
	r.fresh = reset.Map(r.fresh)
	for i := range changed {
		d := &changed[i]
		if j, dup := r.fresh[d.Frontend]; dup {
			r.errs = append(r.errs, fmt.Errorf("service %q: frontend %s is already claimed by service %q; give one of them another VIP, port or protocol",
				d.Name, d.Frontend, changed[j].Name))
			continue
		}
		r.fresh[d.Frontend] = i
		v := r.services[d.Frontend]
		if v == nil || !v.clean || v.want.Name != d.Name {
			r.errs = append(r.errs, fmt.Errorf("service %q (%s): not programmed under this name, or left unfinished by the last pass; a full reconcile handles it", d.Name, d.Frontend))
			continue
		}
		if sameService(&v.want, d) {
			continue
		}
		r.touched[d.Frontend] = struct{}{}
		work = append(work, d)
	}
	return r.program(work)
}

// MapFullError is a service refused because the service or backend map has
// no room left for it; every other service keeps working.
type MapFullError struct {
	Service string
	// Map is "service" or "backend".
	Map string
	// Max is the map's capacity (datapath.max_services / max_backends).
	Max uint32
}

func (e *MapFullError) Error() string {
	return fmt.Sprintf("service %q: %s map full (max_%ss = %d); raise datapath.max_%ss", e.Service, e.Map, e.Map, e.Max, e.Map)
}

// sameService reports whether a and b are identical in every field, so that
// a desired service equal to the last one programmed costs one comparison.
func sameService(a, b *lb.Service) bool {
	return a.Name == b.Name &&
		a.Frontend == b.Frontend &&
		a.Mode == b.Mode &&
		a.Dispatch == b.Dispatch &&
		a.TableSize == b.TableSize &&
		a.Algorithm == b.Algorithm &&
		a.Affinity == b.Affinity &&
		a.Health == b.Health &&
		a.Source == b.Source &&
		slices.Equal(a.Backends, b.Backends) &&
		slices.Equal(a.SourceRanges, b.SourceRanges)
}

// stage runs the first phase of an added or changed service: it validates
// the service, reserves its ids, writes its new and changed backends and
// builds its table, then adds it to the chunk. A full chunk is flushed.
func (r *Reconciler) stage(d *lb.Service) {
	p := pending{d: d}
	p.err = r.prepare(&p)
	r.chunk = append(r.chunk, p)
	if p.err == nil && p.needTable {
		r.chunkTables++
	}
	if r.chunkTables >= r.maxTables || len(r.targets) >= r.maxSlots || len(r.chunk) >= r.maxServices {
		r.flush()
	}
}

func (r *Reconciler) prepare(p *pending) error {
	d := p.d
	if err := validate(d); err != nil {
		return err
	}

	// The backends that get an entry (every state), by address.
	want := append(r.want[:0], d.Backends...)
	slices.SortFunc(want, func(a, b lb.Backend) int { return a.Addr.Compare(b.Addr) })
	r.want = want
	for k := 1; k < len(want); k++ {
		if want[k].Addr == want[k-1].Addr {
			return fmt.Errorf("service %q (%s): backend %s is listed twice; list each backend once", d.Name, d.Frontend, want[k].Addr)
		}
	}
	// Disabled backends keep their entry (marked so the datapath follows
	// no connection to them) and so their id: their counters survive
	// while they are in the service.

	v := r.services[d.Frontend]
	var cur []backend
	if v != nil {
		cur = v.backends
	}
	next := make([]backend, 0, len(want)+len(cur))
	newIDs, releases := 0, 0
	i, j := 0, 0
	for i < len(cur) || j < len(want) {
		var c int
		switch {
		case i == len(cur):
			c = 1
		case j == len(want):
			c = -1
		default:
			c = cur[i].addr.Compare(want[j].Addr)
		}
		switch {
		case c < 0:
			b := cur[i]
			b.wanted = false
			next = append(next, b)
			releases++
			i++
		case c > 0:
			next = append(next, backend{addr: want[j].Addr, wanted: true, wantState: want[j].State, weight: want[j].Weight})
			newIDs++
			j++
		default:
			b := cur[i]
			b.wanted, b.wantState, b.weight = true, want[j].State, want[j].Weight
			next = append(next, b)
			i, j = i+1, j+1
		}
	}

	if v == nil && r.svcIDs.len() == 0 {
		return &MapFullError{Service: d.Name, Map: "service", Max: r.cfg.MaxServices}
	}
	if newIDs > r.beIDs.len() && r.releases > 0 {
		// Services earlier in the chunk will release backend ids in
		// their last phase. Run it now, so this service may have them
		// as it would if services were programmed one by one.
		r.flush()
	}
	if newIDs > r.beIDs.len() {
		return &MapFullError{Service: d.Name, Map: "backend", Max: r.cfg.MaxBackends}
	}

	// The table holds the active backends with a weight; reuse the
	// programmed one when its inputs are unchanged.
	elig, eligIdx := r.elig[:0], r.eligIdx[:0]
	for k := range next {
		b := &next[k]
		if b.wanted && b.wantState == lb.Active && b.weight > 0 {
			elig = append(elig, maglev.Backend{Addr: b.addr, Weight: b.weight})
			eligIdx = append(eligIdx, k)
		}
	}
	r.elig, r.eligIdx = elig, eligIdx
	reuse := v != nil && v.hasTable && v.tableKeyOK && v.tableSize == d.TableSize && sameInputs(v.tableKey, next, eligIdx)
	if !reuse {
		slots, err := r.builder.Build(r.cfg.Seed, d.TableSize, elig, r.slots)
		if err != nil {
			return fmt.Errorf("service %q: build Maglev table (table_size = %d, %d eligible backends): %w", d.Name, d.TableSize, len(elig), err)
		}
		r.slots = slots
	}

	// Nothing can be refused any more: take the ids.
	if v == nil {
		id, _ := r.svcIDs.pop()
		v = &service{id: ServiceID(id), fe: d.Frontend, seen: r.gen}
		r.services[d.Frontend] = v
		r.byID[v.id] = v
	}
	for k := range next {
		if next[k].id == NoBackend {
			id, _ := r.beIDs.pop()
			next[k].id = BackendID(id)
			r.beOwner[next[k].id] = v
		}
	}
	v.backends = next
	v.name = d.Name
	v.clean = false
	p.v = v
	r.releases += releases

	p.tOff = len(r.targets)
	if !reuse {
		for _, s := range r.slots {
			r.targets = append(r.targets, next[eligIdx[s]].id)
		}
		p.tEnd = len(r.targets)
		p.needTable = !v.hasTable || !slices.Equal(v.table, r.targets[p.tOff:p.tEnd])
	}
	if p.needTable {
		p.eOff = len(r.eligs)
		r.eligs = append(r.eligs, eligIdx...)
		p.eEnd = len(r.eligs)
	} else {
		r.targets = r.targets[:p.tOff]
		p.tEnd = p.tOff
		v.setTableKey(d.TableSize, next, eligIdx)
	}
	p.entry = Entry(*d)
	p.needEntry = !v.hasEntry || !entryEqual(&v.entry, &p.entry)
	p.added = !v.hasEntry

	for k := range v.backends {
		b := &v.backends[k]
		if !b.wanted || (b.programmed && b.state == b.wantState) {
			continue
		}
		if err := r.dp.SetBackend(b.id, Backend{Addr: b.addr, Service: v.id, State: b.wantState}); err != nil {
			return fmt.Errorf("service %q: SetBackend %d (%s, %s): %w; the next reconcile retries", d.Name, b.id, b.addr, b.wantState, err)
		}
		b.programmed, b.state = true, b.wantState
		p.ops++
		r.log.Debug("backend set", "service", d.Name, "backend", b.addr, "id", b.id, "state", b.wantState)
	}
	return nil
}

// flush runs the last two phases of the chunk: the table phase for all its
// services that need a new table, then each service's entry and the
// deletion of the backends it no longer uses. It reports the chunk's errors
// in frontend order and empties it.
func (r *Reconciler) flush() {
	r.swapTables()
	for i := range r.chunk {
		p := &r.chunk[i]
		if p.err == nil {
			p.err = r.finish(p)
		}
		if p.err != nil {
			r.errs = append(r.errs, p.err)
		}
	}
	clear(r.chunk)
	r.chunk = r.chunk[:0]
	r.targets = r.targets[:0]
	r.eligs = r.eligs[:0]
	r.chunkTables, r.releases = 0, 0
}

// swapTables is the table phase of a chunk: one SetTables for all the
// tables when the datapath batches and there is more than one, else one
// SetTable per table.
func (r *Reconciler) swapTables() {
	at := r.at[:0]
	for i := range r.chunk {
		if p := &r.chunk[i]; p.err == nil && p.needTable {
			at = append(at, i)
		}
	}
	r.at = at
	if r.tb == nil || len(at) < 2 {
		for _, i := range at {
			p := &r.chunk[i]
			t := r.targets[p.tOff:p.tEnd]
			if err := r.dp.SetTable(p.v.id, t); err != nil {
				p.err = fmt.Errorf("service %q: SetTable %d (%d slots): %w; the next reconcile retries", p.d.Name, p.v.id, len(t), err)
				continue
			}
			r.tableSet(p)
		}
		return
	}

	ids, tables := r.ids[:0], r.tables[:0]
	for _, i := range at {
		p := &r.chunk[i]
		ids = append(ids, p.v.id)
		tables = append(tables, r.targets[p.tOff:p.tEnd])
	}
	res := r.tb.SetTables(ids, tables)
	r.log.Debug("tables swapped in one batch", "tables", len(ids))
	for k, i := range at {
		p := &r.chunk[i]
		if err := batchResult(res, k, len(ids)); err != nil {
			p.err = fmt.Errorf("service %q: SetTables entry %d of %d (id %d, %d slots): %w; the next reconcile retries",
				p.d.Name, k+1, len(ids), p.v.id, len(tables[k]), err)
			continue
		}
		r.tableSet(p)
	}
	clear(tables)
	r.ids, r.tables = ids[:0], tables[:0]
}

// batchResult returns the outcome of entry k of a batch of n from res,
// treating every entry as failed when the datapath broke the contract of one
// result per entry.
func batchResult(res []error, k, n int) error {
	if len(res) != n {
		return fmt.Errorf("datapath returned %d results for a batch of %d, so the outcome is unknown", len(res), n)
	}
	return res[k]
}

// tableSet records that p's target table is in place.
func (r *Reconciler) tableSet(p *pending) {
	v := p.v
	v.table = append(v.table[:0], r.targets[p.tOff:p.tEnd]...)
	v.hasTable = true
	v.setTableKey(p.d.TableSize, v.backends, r.eligs[p.eOff:p.eEnd])
	p.ops++
	r.log.Debug("table set", "service", p.d.Name, "id", v.id, "slots", p.tEnd-p.tOff)
}

// finish is the last phase of an added or changed service: its entry, then
// the deletion of the backends its table no longer names.
func (r *Reconciler) finish(p *pending) error {
	v, d := p.v, p.d
	if p.needEntry {
		if err := r.dp.SetService(v.id, p.entry); err != nil {
			return fmt.Errorf("service %q: SetService %d (%s): %w; the next reconcile retries", d.Name, v.id, d.Frontend, err)
		}
		v.entry, v.hasEntry = p.entry, true
		p.ops++
		r.log.Debug("service entry set", "service", d.Name, "id", v.id)
	}

	var err error
	kept := v.backends[:0]
	for _, b := range v.backends {
		if !b.wanted && err == nil {
			if !b.programmed {
				r.releaseBackend(b.id)
				continue
			}
			if e := r.dp.DeleteBackend(b.id); e != nil {
				err = fmt.Errorf("service %q: DeleteBackend %d (%s): %w; the next reconcile retries", d.Name, b.id, b.addr, e)
			} else {
				r.releaseBackend(b.id)
				p.ops++
				r.log.Debug("backend deleted", "service", d.Name, "backend", b.addr, "id", b.id)
				continue
			}
		}
		kept = append(kept, b)
	}
	clear(v.backends[len(kept):])
	v.backends = kept
	if err != nil {
		return err
	}

	v.want = d.Clone()
	v.clean = true
	if p.added {
		r.log.Info("service added", "service", d.Name, "frontend", d.Frontend, "id", v.id, "ops", p.ops)
	} else {
		r.log.Debug("service updated", "service", d.Name, "frontend", d.Frontend, "id", v.id, "ops", p.ops)
	}
	return nil
}

func (v *service) setTableKey(size uint32, bs []backend, idx []int) {
	v.tableKey = v.tableKey[:0]
	for _, k := range idx {
		v.tableKey = append(v.tableKey, tableInput{addr: bs[k].addr, weight: bs[k].weight, id: bs[k].id})
	}
	v.tableSize = size
	v.tableKeyOK = true
}

// sameInputs reports whether the eligible backends bs[idx] are the ones key
// was built from, with the same weights and ids.
func sameInputs(key []tableInput, bs []backend, idx []int) bool {
	if len(key) != len(idx) {
		return false
	}
	for i, k := range idx {
		b := &bs[k]
		if key[i] != (tableInput{addr: b.addr, weight: b.weight, id: b.id}) {
			return false
		}
	}
	return true
}

// removeAll takes services that are no longer desired out of the datapath
// in three phases: every entry, then every table (one DeleteTables when the
// datapath batches and more than one goes), then every backend. A service
// that fails a phase keeps what is left for the next pass; the others go on.
// On success a service's ids are released and it is forgotten.
func (r *Reconciler) removeAll(vs []*service) {
	errs := slices.Grow(r.removed[:0], len(vs))[:len(vs)]
	for i, v := range vs {
		if !v.hasEntry {
			continue
		}
		if err := r.dp.DeleteService(v.id, v.fe); err != nil {
			errs[i] = fmt.Errorf("%s: DeleteService %d: %w; the next reconcile retries", v.label(), v.id, err)
			continue
		}
		v.hasEntry = false
		v.clean = false
	}

	at := r.at[:0]
	for i, v := range vs {
		if errs[i] == nil && v.hasTable {
			at = append(at, i)
		}
	}
	r.at = at
	if r.tb == nil || len(at) < 2 {
		for _, i := range at {
			v := vs[i]
			if err := r.dp.DeleteTable(v.id); err != nil {
				errs[i] = fmt.Errorf("%s: DeleteTable %d: %w; the next reconcile retries", v.label(), v.id, err)
				continue
			}
			v.hasTable, v.table, v.tableKeyOK = false, nil, false
		}
	} else {
		ids := r.ids[:0]
		for _, i := range at {
			ids = append(ids, vs[i].id)
		}
		r.ids = ids[:0]
		res := r.tb.DeleteTables(ids)
		r.log.Debug("tables deleted in one batch", "tables", len(ids))
		for k, i := range at {
			v := vs[i]
			if err := batchResult(res, k, len(ids)); err != nil {
				errs[i] = fmt.Errorf("%s: DeleteTables entry %d of %d (id %d): %w; the next reconcile retries", v.label(), k+1, len(ids), v.id, err)
				continue
			}
			v.hasTable, v.table, v.tableKeyOK = false, nil, false
		}
	}

	for i, v := range vs {
		if errs[i] == nil {
			errs[i] = r.dropBackends(v)
		}
		if errs[i] != nil {
			r.errs = append(r.errs, errs[i])
		}
	}
	clear(errs)
	r.removed = errs[:0]
}

// dropBackends is the last phase of a removal: the service's backends, then
// its id.
func (r *Reconciler) dropBackends(v *service) error {
	for len(v.backends) > 0 {
		b := v.backends[0]
		if b.programmed {
			if err := r.dp.DeleteBackend(b.id); err != nil {
				return fmt.Errorf("%s: DeleteBackend %d (%s): %w; the next reconcile retries", v.label(), b.id, b.addr, err)
			}
		}
		r.releaseBackend(b.id)
		v.backends = v.backends[1:]
	}
	r.svcIDs.push(uint32(v.id))
	delete(r.byID, v.id)
	if r.services[v.fe] == v {
		delete(r.services, v.fe)
	}
	r.log.Info("service removed", "service", v.name, "frontend", v.fe, "id", v.id)
	v.id = NoService
	return nil
}

// releaseBackend returns a backend id to the free list.
func (r *Reconciler) releaseBackend(id BackendID) {
	r.beIDs.push(uint32(id))
	delete(r.beOwner, id)
}

// label names a service in errors about removing it; a restored service may
// have no name yet, and an orphan not even a frontend.
func (v *service) label() string {
	switch {
	case v.name != "":
		return fmt.Sprintf("service %q", v.name)
	case v.fe.Addr.IsValid():
		return fmt.Sprintf("service %s (id %d)", v.fe, v.id)
	}
	return fmt.Sprintf("orphaned service id %d", v.id)
}

// validate refuses what the datapath could not represent, before any
// operation is issued for the service.
func validate(d *lb.Service) error {
	fe := d.Frontend
	if !fe.Addr.IsValid() {
		return fmt.Errorf("service %q: frontend has no VIP; set its vip", d.Name)
	}
	if fe.Proto != lb.TCP && fe.Proto != lb.UDP {
		return fmt.Errorf("service %q (%s): protocol %s is not supported; use tcp or udp", d.Name, fe, fe.Proto)
	}
	switch d.Mode {
	case lb.ModeDefault:
		return fmt.Errorf("service %q (%s): mode is unresolved; apply lb.Service.WithDefaults before reconciling", d.Name, fe)
	case lb.ModeSNAT:
	case lb.ModeDSR, lb.ModeHybrid:
		if d.Dispatch == lb.DispatchDefault {
			return fmt.Errorf("service %q (%s): dsr_dispatch is unresolved; apply lb.Service.WithDefaults before reconciling", d.Name, fe)
		}
	default:
		return fmt.Errorf("service %q (%s): unknown mode %s", d.Name, fe, d.Mode)
	}
	if d.Dispatch > lb.DispatchOpt {
		return fmt.Errorf("service %q (%s): unknown dsr_dispatch %s", d.Name, fe, d.Dispatch)
	}
	if d.TableSize == 0 {
		return fmt.Errorf("service %q (%s): table size is 0; apply lb.Service.WithDefaults before reconciling", d.Name, fe)
	}
	for i, b := range d.Backends {
		if !b.Addr.Addr().IsValid() {
			return fmt.Errorf("service %q (%s): backend %d has no address", d.Name, fe, i)
		}
		if b.Addr.Addr().Is4() != fe.Addr.Is4() {
			return fmt.Errorf("service %q (%s): backend %s is not in the VIP's address family", d.Name, fe, b.Addr)
		}
		if b.State > lb.Disabled {
			return fmt.Errorf("service %q (%s): backend %s has unknown state %s", d.Name, fe, b.Addr, b.State)
		}
	}
	return nil
}
