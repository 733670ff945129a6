// SPDX-License-Identifier: Apache-2.0

// Package consul is the discovery source for services registered in
// Consul. It stands where Consul's data enters the control plane: it
// watches the catalog and the KV store with blocking queries, turns what it
// finds into lb.Service values (validated with the same code as the config
// file), and publishes them as whole snapshots with Source "consul". No
// Consul type leaves this package.
//
// Two kinds of definition are read (docs/consul.md is the contract):
//
//   - A Consul service whose instances carry the configured tag and the
//     l4lb-* meta keys is a frontend; its instances that pass their checks
//     are its backends. The service's name is the Consul service name.
//   - Each key under the KV prefix holds one whole service definition in the
//     file's [[service]] schema (TOML, or JSON); its name is the `name`
//     inside, which must equal the key's last path element.
//
// When Consul cannot be reached the source keeps its last known good
// services, reports how long ago it last heard from Consul (Status), logs
// once when the outage starts and once when it ends, and recovers by itself.
// A definition that does not validate is left out alone, with an error that
// names it; everything else keeps being served.
package consul

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/internal/reset"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// SourceName is the Snapshot.Source (and lb.Service.Source) of everything
// this package publishes.
const SourceName = "consul"

// Defaults of Options.
const (
	DefaultWait         = time.Minute
	DefaultMinInterval  = 100 * time.Millisecond
	DefaultBurst        = 10
	DefaultRetryMin     = 500 * time.Millisecond
	DefaultRetryMax     = 30 * time.Second
	DefaultSelfInterval = 10 * time.Second
)

// Options tune the source; the zero value of each field takes its default.
type Options struct {
	// Defaults are the daemon's service defaults. Definitions are
	// validated against them (some checks depend on the effective mode),
	// but they are not applied: the daemon resolves them after merging.
	Defaults lb.Defaults
	Log      *slog.Logger
	// Wait is the longest a blocking query waits for a change (default
	// DefaultWait). Consul adds up to Wait/16 of its own jitter; the
	// source takes up to another Wait/16 off, so that watchers started
	// together do not stay in step.
	Wait time.Duration
	// MinInterval and Burst are each watch loop's token bucket: at most
	// Burst queries at once, then one every MinInterval. A service that
	// changes all the time costs Consul at most that, and its changes
	// are coalesced.
	MinInterval time.Duration
	Burst       int
	// RetryMin and RetryMax bound the jittered exponential back-off
	// between failed queries.
	RetryMin, RetryMax time.Duration
	// Hostname identifies this box in self-registration (default
	// os.Hostname).
	Hostname string
	// Healthy feeds the TTL check of the self-registration: nil or a nil
	// error passes the check, an error fails it with the error as output.
	Healthy func() error
	// SelfInterval is how often the TTL check is updated; the TTL is three
	// times that (default DefaultSelfInterval).
	SelfInterval time.Duration
}

func (o *Options) fill() {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Wait <= 0 {
		o.Wait = DefaultWait
	}
	if o.MinInterval <= 0 {
		o.MinInterval = DefaultMinInterval
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.RetryMin <= 0 {
		o.RetryMin = DefaultRetryMin
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(DefaultRetryMax, o.RetryMin)
	}
	if o.SelfInterval <= 0 {
		o.SelfInterval = DefaultSelfInterval
	}
}

// Source watches one Consul agent. Its Run may be called once.
type Source struct {
	cfg    config.Consul
	opts   Options
	client *api.Client
	log    *slog.Logger

	changed chan struct{}

	mu         sync.Mutex
	catalog    *catalogView        // nil until the first catalog answer
	catalogRaw []byte              // the catalog answer catalog was made from
	services   map[string]*watched // by Consul service name
	kv         map[string]kvEntry  // by key; nil until the first KV answer
	failing    map[string]error    // watch -> its latest error
	synced     time.Time           // last answer while no watch was failing
	state      int                 // stateStarting, stateOK or stateFailing: as last logged
	problems   map[string][]string // origin -> problems, from the last build
	run        context.Context     // Run's context, for watchers started later
	wg         sync.WaitGroup      // every goroutine Run started
	// serviceWatches counts the services' own watch loops (serviceWait).
	serviceWatches atomic.Int64

	claimSet *claims // Run's goroutine only

	// Watching the services together (aggregate.go).
	aggregate   bool               // more tagged services than maxWatches
	stopHealth  context.CancelFunc // ends the health-state watch
	pending     map[string]bool    // services to read again
	pendingAll  bool               // read every service again
	refreshKick chan struct{}

	// What the last build made, so that the next one can replace the
	// few services whose answers changed (dirty) rather than assemble
	// every one again; reshaped says a full build is needed (the
	// catalog's list or the KV changed).
	dirty    map[string]bool
	reshaped bool
	built    []lb.Service
	builtAt  map[string]int // name -> index in built
}

type catalogView struct {
	names []string // Consul services carrying the tag, sorted
}

// watched is one Consul service under watch.
type watched struct {
	// cancel stops the service's own blocking query; nil while the
	// services are watched together.
	cancel context.CancelFunc
	have   bool   // first answer received
	index  uint64 // Consul's index of that answer
	tr     translation
}

type kvEntry struct {
	modify uint64
	tr     translation
}

// New prepares a source for the [discovery.consul] settings cfg. It reads
// the ACL token file now, so a missing or unreadable file is reported at
// start and on reload; the token itself is never logged or returned.
func New(cfg *config.Consul, opts Options) (*Source, error) {
	if cfg == nil {
		return nil, errors.New("consul: no [discovery.consul] settings given")
	}
	opts.fill()
	ac, err := clientConfig(cfg)
	if err != nil {
		return nil, err
	}
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("consul: cannot set up the client for %s: %v (check discovery.consul address and tls_* settings)", cfg.Address, err)
	}
	return &Source{
		cfg:         *cfg,
		opts:        opts,
		client:      client,
		log:         opts.Log.With("source", SourceName),
		changed:     make(chan struct{}, 1),
		services:    map[string]*watched{},
		failing:     map[string]error{},
		pending:     map[string]bool{},
		refreshKick: make(chan struct{}, 1),
		dirty:       map[string]bool{},
	}, nil
}

func clientConfig(cfg *config.Consul) (*api.Config, error) {
	ac := &api.Config{
		Address:    cfg.Address,
		Scheme:     "http",
		Datacenter: cfg.Datacenter,
		TLSConfig: api.TLSConfig{
			Address:  cfg.TLSServerName,
			CAFile:   cfg.TLSCAFile,
			CertFile: cfg.TLSCertFile,
			KeyFile:  cfg.TLSKeyFile,
		},
	}
	if cfg.TLSCAFile != "" || cfg.TLSCertFile != "" || cfg.TLSServerName != "" {
		ac.Scheme = "https"
	}
	if localAgent(cfg.Address) {
		// Consul gzips answers for clients that accept it, which Go's
		// transport says by default. To an agent on the same box that
		// is CPU on both ends for nothing: at 10,000 services the
		// decompression alone was 6% of l4lbd's CPU under changes.
		tr := api.DefaultConfig().Transport
		tr.DisableCompression = true
		ac.Transport = tr
	}
	if cfg.TokenFile != "" {
		data, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("consul: cannot read the ACL token file: %v (check discovery.consul.token_file and that l4lbd may read it)", err)
		}
		tok := strings.TrimSpace(string(data))
		if tok == "" {
			return nil, fmt.Errorf("consul: the ACL token file %s is empty: write the token into it, or set token_file = \"\" for no token", cfg.TokenFile)
		}
		ac.Token = tok
	}
	return ac, nil
}

// localAgent says whether address (discovery.consul.address) is an agent
// on this box: a Unix socket or a loopback address.
func localAgent(address string) bool {
	if strings.HasPrefix(address, "unix://") {
		return true
	}
	host := address
	if h, _, err := net.SplitHostPort(address); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && a.IsLoopback()
}

// Name implements discovery.Source.
func (s *Source) Name() string { return SourceName }

// Run implements discovery.Source. The first snapshot is sent once the
// catalog, every tagged service and the KV prefix have been read, so a
// start never publishes half of Consul. It returns when ctx is done, after
// deregistering this box if it registered it.
func (s *Source) Run(ctx context.Context, out chan<- discovery.Snapshot) error {
	s.mu.Lock()
	if s.run != nil {
		s.mu.Unlock()
		return errors.New("consul: Run called twice on one source")
	}
	s.run = ctx
	s.mu.Unlock()

	s.log.Info("watching Consul", "address", s.cfg.Address, "datacenter", s.cfg.Datacenter, "tag", s.cfg.Tag, "kv_prefix", s.cfg.KVPrefix, "stale", s.cfg.Stale)
	s.spawn("catalog", s.watchCatalog)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.refresher(ctx)
	}()
	if s.cfg.KVPrefix != "" {
		s.spawn("kv", s.watchKV)
	}
	if s.cfg.RegisterSelf {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.registerSelf(ctx)
		}()
	}
	defer s.wg.Wait()

	var last []lb.Service
	sent := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		}
		svcs, ready, patched, changed := s.build(!sent)
		if !ready {
			continue
		}
		if sent && (discovery.SameServices(svcs, last) || !patched && slices.EqualFunc(svcs, last, lb.Service.Equal)) {
			// The same services: keep the new build as the last one,
			// which the next patch starts from.
			last = svcs
			continue
		}
		snap := discovery.Snapshot{Source: SourceName, Services: svcs}
		if patched {
			// The last snapshot sent with these services replaced in
			// place: the merger looks at them alone.
			snap.Changed = changed
		}
		select {
		case out <- snap:
			last, sent = svcs, true
		case <-ctx.Done():
			return nil
		}
	}
}

// spawn starts one watch loop under Run's context.
func (s *Source) spawn(watch string, fetch fetchFunc) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.loop(s.run, watch, s.optsWait, fetch)
	}()
}

func (s *Source) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// build assembles the services to publish from the latest answers. For
// the first snapshot (first) ready is false until every watch has answered
// or failed; later, a service whose watch has not answered yet is simply
// not published yet. patched says the result is the last one with the
// services named in changed replaced (patchLocked), and is the very same
// slice when none changed.
func (s *Source) build(first bool) (svcs []lb.Service, ready, patched bool, changed []string) {
	s.mu.Lock()
	if !first {
		if patch, changed, ok := s.patchLocked(); ok {
			s.mu.Unlock()
			return patch, true, true, changed
		}
	}
	s.dirty = reset.Map(s.dirty)
	s.reshaped = false
	ready = s.catalog != nil && (s.cfg.KVPrefix == "" || s.kv != nil)
	var cands []candidate
	problems := map[string][]string{}
	if s.catalog != nil {
		for _, name := range s.catalog.names {
			w := s.services[name]
			if w == nil || !w.have {
				if _, failed := s.failing[serviceWatch(name)]; first && !failed {
					ready = false
				}
				continue
			}
			origin := fmt.Sprintf("consul service %q", name)
			if len(w.tr.problems) > 0 {
				problems[origin] = append(problems[origin], w.tr.problems...)
			}
			if w.tr.ok {
				cands = append(cands, candidate{origin: origin, svc: w.tr.svc})
			}
		}
	}
	for key, e := range s.kv {
		origin := "consul KV " + key
		if len(e.tr.problems) > 0 {
			problems[origin] = append(problems[origin], e.tr.problems...)
		}
		if e.tr.ok {
			cands = append(cands, candidate{origin: origin, svc: e.tr.svc})
		}
	}
	s.mu.Unlock()
	if !ready {
		return nil, false, false, nil
	}

	svcs, conflicts := s.claims().resolve(cands)
	for o, p := range conflicts {
		problems[o] = append(problems[o], p...)
	}
	s.mu.Lock()
	old := s.problems
	s.problems = problems
	s.mu.Unlock()
	// Log a definition's problems when they change, not on every build.
	for o, p := range problems {
		if !slices.Equal(old[o], p) {
			s.log.Error("Consul definition rejected or partly left out", "origin", o, "problems", strings.Join(p, "; "))
		}
	}
	for o := range old {
		if _, still := problems[o]; !still {
			s.log.Info("Consul definition problems resolved", "origin", o)
		}
	}
	at := make(map[string]int, len(svcs))
	for i, svc := range svcs {
		at[svc.Name] = i
	}
	s.mu.Lock()
	s.built, s.builtAt = svcs, at
	s.mu.Unlock()
	return svcs, true, false, nil
}

// patchLocked is build for answers that changed services within
// themselves: the last build with those services replaced, when that is
// what a full build would make. That holds when the catalog's list and the
// KV are as they were, no definition had a problem, and each changed
// service translates without problems to the same name and frontend (so
// no claim moves). It answers false otherwise. When no service differs
// from the last build, the last build itself is returned. changed names
// the services replaced.
func (s *Source) patchLocked() ([]lb.Service, []string, bool) {
	if s.reshaped || s.built == nil || len(s.problems) > 0 {
		return nil, nil, false
	}
	svcs := s.built
	changed := []string{}
	for name := range s.dirty {
		i, ok := s.builtAt[name]
		w := s.services[name]
		if !ok || w == nil || !w.have || !w.tr.ok || len(w.tr.problems) > 0 ||
			w.tr.svc.Name != name || w.tr.svc.Frontend != svcs[i].Frontend {
			return nil, nil, false
		}
		if svcs[i].Equal(w.tr.svc) {
			continue
		}
		if len(changed) == 0 {
			svcs = slices.Clone(svcs)
		}
		svcs[i] = w.tr.svc
		changed = append(changed, name)
	}
	s.dirty = reset.Map(s.dirty)
	s.built = svcs
	return svcs, changed, true
}

// claims is only used from Run's goroutine.
func (s *Source) claims() *claims {
	if s.claimSet == nil {
		s.claimSet = newClaims()
	}
	return s.claimSet
}

// Status reports the source's health for the daemon's status and metrics.
// LastSync is when Consul last answered every watch without error: while
// Healthy it is at most about Options.Wait old (blocking queries answer at
// least that often). Healthy means the last query of every watch succeeded
// and the first full view has been read; Errors name the Consul service or
// KV key of each definition left out.
func (s *Source) Status() discovery.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := discovery.Status{LastSync: s.synced, Healthy: s.state == stateOK && len(s.failing) == 0}
	if !st.Healthy {
		st.Error = fmt.Sprintf("waiting for the first answers from Consul at %s", s.cfg.Address)
		if ws := slices.Sorted(maps.Keys(s.failing)); len(ws) > 0 {
			st.Error = fmt.Sprintf("%s watch: %v", ws[0], s.failing[ws[0]])
		}
	}
	for _, p := range s.problems {
		st.Errors = append(st.Errors, p...)
	}
	slices.Sort(st.Errors)
	return st
}
