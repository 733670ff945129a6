// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/l4lb/l4lb/lb"
)

// Check defaults for a service whose lb.HealthCheck leaves them zero. They
// equal lb/config's, which fills them for every configured service; they
// only matter for services built in code.
const (
	defaultInterval = 5 * time.Second
	defaultTimeout  = 2 * time.Second
	defaultRise     = 2
	defaultFall     = 3
)

// jitterFraction is how far a probe may move off its schedule: each interval
// is stretched or shrunk by up to this fraction, and the first probe comes
// within this fraction of an interval after the prober starts.
const jitterFraction = 0.1

// Options configure a Manager. The zero value is usable.
type Options struct {
	// Initial is the state of a backend before its probes decide; see the
	// package documentation for why the daemon wants Up.
	Initial State
	// Damping holds flapping backends down; zero fields take the defaults.
	Damping Damping
	// Log receives state changes and hold-downs; nil discards them.
	Log *slog.Logger
	// NewChecker builds the Checker of a check; nil means the package's
	// NewChecker. Tests and future check kinds plug in here.
	NewChecker func(lb.HealthCheck) (Checker, error)
}

// Manager keeps one prober per checked (service, backend) of the services it
// was last given, and reports their state. Its methods are safe for
// concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	probers map[Key]*prober
	// bySvc indexes probers' backends by service, for UpdateServices.
	bySvc   map[string]map[netip.AddrPort]bool
	stopped bool

	// Events wait in queue until the dispatcher hands them to out, so that a
	// prober never blocks on a slow reader and none is lost while the
	// Manager runs.
	qmu      sync.Mutex
	queue    []Event
	wake     chan struct{}
	out      chan Event
	quit     chan struct{}
	dispatch sync.WaitGroup
}

// spec is what a prober runs; a change of it restarts the prober.
type spec struct {
	check  lb.HealthCheck
	target Target
}

type prober struct {
	key    Key
	spec   spec
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	tr *tracker
}

// New returns a Manager with no probers; Update starts them.
func New(opts Options) *Manager {
	if opts.NewChecker == nil {
		opts.NewChecker = NewChecker
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		opts:    opts,
		log:     log,
		probers: map[Key]*prober{},
		bySvc:   map[string]map[netip.AddrPort]bool{},
		wake:    make(chan struct{}, 1),
		out:     make(chan Event),
		quit:    make(chan struct{}),
	}
	m.dispatch.Add(1)
	go m.run()
	return m
}

// Events returns the channel on which every change of state is delivered,
// in the order they happened. Events wait in a queue without bound until
// read, so the reader should drain the channel all along (probers never
// block on it). It is closed by Stop; events not yet read then are dropped. Events are hints to recompute: after receiving one, read the
// current state with Up or States, which are the truth, since an event may
// come from a prober that a later Update already replaced.
func (m *Manager) Events() <-chan Event { return m.out }

// Update makes the probers match services: it starts one for every backend
// of every service whose check type is not none, stops those of backends and
// services that are gone, and restarts those whose check or target changed
// (they keep their state; see the package documentation). Untouched probers
// keep running with their state and counts. targets says where to probe
// each backend (nil means Direct); it is called for every checked backend on
// every Update and applies the check's port override itself, as Direct and
// ThroughVIP do. The Manager fills an empty Target.Host with the service's
// VIP:port.
//
// Update returns when the stopped probers have ended and the new ones are in
// place, so Up and States answer for services right after it; new backends
// start in Options.Initial. After Stop, Update does nothing.
func (m *Manager) Update(services []lb.Service, targets func(svc lb.Service, b lb.Backend) Target) {
	m.update(services, targets, nil)
}

// UpdateServices is Update for the services given only: the probers of
// every other service are left as they are, whatever the list holds.
// A change to a few services then costs those services, not a walk of
// every prober's spec.
func (m *Manager) UpdateServices(services []lb.Service, targets func(svc lb.Service, b lb.Backend) Target) {
	only := make(map[string]bool, len(services))
	for _, svc := range services {
		only[svc.Name] = true
	}
	m.update(services, targets, only)
}

// update is Update over the probers of the services in only (every
// prober when only is nil).
func (m *Manager) update(services []lb.Service, targets func(svc lb.Service, b lb.Backend) Target, only map[string]bool) {
	if targets == nil {
		targets = Direct
	}
	want := map[Key]spec{}
	for _, svc := range services {
		if svc.Health.Type == lb.HealthNone {
			continue
		}
		hc := withDefaults(svc.Health)
		for _, b := range svc.Backends {
			k := Key{Service: svc.Name, Backend: b.Addr}
			if _, dup := want[k]; dup {
				continue
			}
			t := targets(svc, b)
			if t.Host == "" {
				t.Host = frontendHost(svc)
			}
			want[k] = spec{check: hc, target: t}
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	replaced := map[Key]*prober{}
	var ending []*prober
	consider := func(yield func(Key, *prober) bool) {
		if only == nil {
			for k, p := range m.probers {
				if !yield(k, p) {
					return
				}
			}
			return
		}
		var keys []Key
		for name := range only {
			for b := range m.bySvc[name] {
				keys = append(keys, Key{Service: name, Backend: b})
			}
		}
		for _, k := range keys {
			if !yield(k, m.probers[k]) {
				return
			}
		}
	}
	for k, p := range consider {
		s, ok := want[k]
		if ok && s == p.spec {
			continue
		}
		p.cancel()
		ending = append(ending, p)
		delete(m.probers, k)
		if bs := m.bySvc[k.Service]; bs != nil {
			delete(bs, k.Backend)
			if len(bs) == 0 {
				delete(m.bySvc, k.Service)
			}
		}
		if ok {
			replaced[k] = p
		}
	}
	// Cancelled probes end at once, so this wait is short; it keeps the
	// carried state final and the goroutine count honest.
	for _, p := range ending {
		<-p.done
	}
	now := time.Now()
	for k, s := range want {
		if _, ok := m.probers[k]; ok {
			continue
		}
		m.start(k, s, replaced[k], now)
	}
}

// Up says whether a backend of a service may receive traffic as far as
// health is concerned: false only while its prober has it Down. Backends
// that are not checked (type none, or unknown to the Manager) are up.
func (m *Manager) Up(service string, backend netip.AddrPort) bool {
	m.mu.Lock()
	p := m.probers[Key{Service: service, Backend: backend}]
	m.mu.Unlock()
	if p == nil {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tr.state == Up
}

// Status returns the status of one checked backend, and false when it is
// not checked.
func (m *Manager) Status(k Key) (Status, bool) {
	m.mu.Lock()
	p := m.probers[k]
	m.mu.Unlock()
	if p == nil {
		return Status{}, false
	}
	return p.status(time.Now()), true
}

// States returns the status of every checked backend.
func (m *Manager) States() map[Key]Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := make(map[Key]Status, len(m.probers))
	for k, p := range m.probers {
		out[k] = p.status(now)
	}
	return out
}

// Stop ends every prober, waits for them, and closes the Events channel.
// It may be called more than once.
func (m *Manager) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	m.stopped = true
	for _, p := range m.probers {
		p.cancel()
	}
	for k, p := range m.probers {
		<-p.done
		delete(m.probers, k)
	}
	close(m.quit)
	m.dispatch.Wait()
}

// withDefaults resolves what a check leaves zero and keeps the timeout
// within the interval, so that probes of one backend never overlap.
func withDefaults(hc lb.HealthCheck) lb.HealthCheck {
	if hc.Interval <= 0 {
		hc.Interval = defaultInterval
	}
	if hc.Timeout <= 0 {
		hc.Timeout = defaultTimeout
	}
	hc.Timeout = min(hc.Timeout, hc.Interval)
	if hc.Rise <= 0 {
		hc.Rise = defaultRise
	}
	if hc.Fall <= 0 {
		hc.Fall = defaultFall
	}
	return hc
}

// start runs a prober for k; m.mu is held.
func (m *Manager) start(k Key, s spec, old *prober, now time.Time) {
	tr := newTracker(s.check.Rise, s.check.Fall, m.opts.Damping, m.opts.Initial, now)
	if old != nil {
		tr.carry(old.tr)
	}
	checker, err := m.opts.NewChecker(s.check)
	if err != nil {
		// Configs are validated before they get here; should one slip
		// through, the backend fails its checks with the reason rather
		// than being trusted unchecked.
		m.log.Error("health check cannot run", "service", k.Service, "backend", k.Backend, "error", err)
		checker = failing{err}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{key: k, spec: s, cancel: cancel, done: make(chan struct{}), tr: tr}
	m.probers[k] = p
	if m.bySvc[k.Service] == nil {
		m.bySvc[k.Service] = map[netip.AddrPort]bool{}
	}
	m.bySvc[k.Service][k.Backend] = true
	go m.probe(ctx, p, checker)
}

// probe is a prober's goroutine: one probe at a time, on a jittered
// schedule, until ctx ends.
func (m *Manager) probe(ctx context.Context, p *prober, c Checker) {
	defer close(p.done)
	interval, timeout := p.spec.check.Interval, p.spec.check.Timeout
	t := time.NewTimer(firstDelay(interval, randFloat()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.Check(pctx, p.spec.target)
		cancel()
		if ctx.Err() != nil {
			// Stopped mid-probe: the result says nothing about the backend.
			return
		}
		now := time.Now()
		p.mu.Lock()
		out, reason := p.tr.observe(now, err)
		p.mu.Unlock()
		m.report(p, out, reason, now)
		t.Reset(max(jittered(interval, randFloat())-now.Sub(start), 0))
	}
}

func (m *Manager) report(p *prober, out outcome, reason string, now time.Time) {
	attrs := []any{"service", p.key.Service, "backend", p.key.Backend, "target", p.spec.target.String(), "reason", reason}
	switch out {
	case steady:
		return
	case heldDown:
		m.log.Warn("backend held down", attrs...)
		return
	case wentUp:
		m.log.Info("backend up", attrs...)
		m.emit(Event{Service: p.key.Service, Backend: p.key.Backend, State: Up, Reason: reason, Time: now})
	case wentDown:
		m.log.Warn("backend down", attrs...)
		m.emit(Event{Service: p.key.Service, Backend: p.key.Backend, State: Down, Reason: reason, Time: now})
	}
}

func (m *Manager) emit(e Event) {
	m.qmu.Lock()
	m.queue = append(m.queue, e)
	m.qmu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run is the dispatcher: it moves queued events to the Events channel.
func (m *Manager) run() {
	defer m.dispatch.Done()
	defer close(m.out)
	for {
		m.qmu.Lock()
		if len(m.queue) == 0 {
			m.qmu.Unlock()
			select {
			case <-m.wake:
				continue
			case <-m.quit:
				return
			}
		}
		e := m.queue[0]
		m.queue[0] = Event{}
		m.queue = m.queue[1:]
		m.qmu.Unlock()
		select {
		case m.out <- e:
		case <-m.quit:
			return
		}
	}
}

func (p *prober) status(now time.Time) Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tr
	return Status{
		Service:     p.key.Service,
		Backend:     p.key.Backend,
		Check:       p.spec.check,
		Target:      p.spec.target,
		State:       t.state,
		LastChange:  t.lastChange,
		LastCheck:   t.lastCheck,
		LastError:   t.lastErr,
		Successes:   t.succ,
		Failures:    t.fail,
		Passed:      t.passed,
		Transitions: t.transitions(now),
		HeldUntil:   t.heldUntil,
	}
}

// jittered returns d stretched or shrunk by up to jitterFraction; r in
// [0, 1) picks where.
func jittered(d time.Duration, r float64) time.Duration {
	return time.Duration(float64(d) * (1 - jitterFraction + 2*jitterFraction*r))
}

// firstDelay is how long a new prober waits before its first probe: a point
// within the first jitterFraction of an interval picked by r in [0, 1), so
// that probers started together spread out while a new backend is still
// checked promptly.
func firstDelay(d time.Duration, r float64) time.Duration {
	return time.Duration(float64(d) * jitterFraction * r)
}

// failing is the Checker of a check that cannot run.
type failing struct{ err error }

func (f failing) Check(context.Context, Target) error { return f.err }

// randFloat picks where in its jitter range a delay falls.
var randFloat = rand.Float64
