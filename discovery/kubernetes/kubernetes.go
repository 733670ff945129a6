// SPDX-License-Identifier: Apache-2.0

// Package kubernetes is the discovery source for a Kubernetes cluster's
// Services of type LoadBalancer, and the only package of l4lb that imports
// k8s.io. It stands where the cluster's data enters the control plane:
// client-go informers watch Services, Nodes and EndpointSlices; every
// change re-translates the whole view into lb.Services (VIPs from the
// Service or the configured pools, backends the eligible Nodes at the
// NodePort or the ready pod endpoints, settings from l4lb.io/ annotations
// validated by the config file's own rules), published as one snapshot
// with Source "kubernetes". No Kubernetes type leaves this package.
//
// The way back: the daemon tells the source which frontends the datapath
// holds (SetProgrammed), and one box, elected with a Lease, writes each
// Service's status.loadBalancer.ingress, its l4lb.io/Programmed condition
// and Events, and releases the finalizer of a deleted Service once its VIP
// is gone from the datapath. docs/kubernetes.md is the contract.
//
// When the apiserver cannot be reached the source fails static: the last
// snapshot keeps serving, nothing is withdrawn because of an API error, no
// new address is handed out, Status shows how stale the view is; the
// informers relist when the apiserver is back and the difference is
// published then.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/internal/reset"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// SourceName is the Snapshot.Source (and lb.Service.Source) of everything
// this package publishes.
const SourceName = "kubernetes"

// Defaults of Options.
const (
	DefaultProbeInterval = time.Second
	DefaultDrainLinger   = 5 * time.Minute
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Options tune the source; the zero value of each field takes its default.
type Options struct {
	// Defaults are the daemon's service defaults; Services are validated
	// against them, not resolved.
	Defaults lb.Defaults
	Log      *slog.Logger
	// Identity names this box in the Lease (default: host name and pid).
	Identity string
	// ProbeInterval is how often the apiserver is asked whether it answers,
	// which is how an outage that breaks no open watch is noticed, and how
	// the end of one is.
	ProbeInterval time.Duration
	// DrainLinger is how long a backend that left a Service stays draining
	// when neither the Service nor the daemon sets a drain timeout.
	DrainLinger time.Duration
	// Lease timing of the status writer's election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// BoxReportGrace is how long a Service may be missing from this box's
	// datapath, while another box holds the Lease, before this box says
	// so in an Event (see boxReport).
	BoxReportGrace time.Duration
}

func (o *Options) fill() {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Identity == "" {
		h, _ := os.Hostname()
		o.Identity = fmt.Sprintf("%s_%d", h, os.Getpid())
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.DrainLinger <= 0 {
		o.DrainLinger = DefaultDrainLinger
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline <= 0 || o.RenewDeadline >= o.LeaseDuration {
		o.RenewDeadline = o.LeaseDuration * 2 / 3
	}
	if o.BoxReportGrace <= 0 {
		o.BoxReportGrace = DefaultBoxReportGrace
	}
	if o.RetryPeriod <= 0 || o.RetryPeriod >= o.RenewDeadline {
		o.RetryPeriod = o.RenewDeadline / 5
	}
}

// Status is what the source reports for `l4lbctl status` and metrics.
// LastSync is when the apiserver last answered (every ProbeInterval while
// Healthy); after an outage, Healthy returns once everything has been
// listed afresh. Errors name the Service or Node of each part left out.
type Status struct {
	discovery.Status
	// Leader is true while this box writes status and Events.
	Leader bool
}

// Source watches one cluster. Its Run may be called once.
type Source struct {
	cfg    config.Kubernetes
	opts   Options
	client kubernetes.Interface
	log    *slog.Logger
	host   string // the apiserver, for messages

	changed chan struct{} // the view changed: translate again
	write   chan struct{} // something status depends on changed
	boxKick chan struct{} // the same, for the box-local report

	mu         sync.Mutex
	running    bool
	view       *view     // the informers read; nil until the first full list
	cutFirst   func()    // ends the attempt at the first full list
	synced     bool      // the first full list is in
	failing    error     // nil while the apiserver answers
	lastSync   time.Time // last answer
	logged     int       // stateStarting, stateOK, stateFailing: as last logged
	result     *result   // latest translation
	frontends  map[key][]lb.Frontend
	programmed map[lb.Frontend]bool
	leader     bool
	problems   []string

	// EndpointSlice events since the last build, by Service; full says
	// that something else changed (a Service, a Node, a new view, a
	// lingering backend's end), which only a whole translation follows.
	dirty map[key]bool
	full  bool
	// The Services whose status the writer must look at again, or
	// statusAll for every one (a whole translation, a new set of
	// programmed frontends, a new term as the writer): an EndpointSlice
	// event then costs the writer its own Service, not a walk of all.
	statusDirty map[key]bool
	statusAll   bool

	// Run's goroutine only.
	assigned map[key][]netip.Addr
	linger   lingering
	// built is what the last build published, from view builtFrom with
	// allocation builtAllocate.
	built         []lb.Service
	builtFrom     *view
	builtAllocate bool
}

const (
	stateStarting = iota
	stateOK
	stateFailing
)

var klogOnce sync.Once

// New prepares a source for the [discovery.kubernetes] settings cfg. The
// kubeconfig is read now, so a missing or broken one is reported at start
// and on reload.
func New(cfg *config.Kubernetes, opts Options) (*Source, error) {
	if cfg == nil {
		return nil, errors.New("kubernetes: no [discovery.kubernetes] settings given")
	}
	opts.fill()
	// client-go logs through klog: into l4lbd's structured log instead of
	// its own format on stderr. klog's logger is one global, read by the
	// informers of a source that may still be running (a reload starts a
	// new source before the old one is gone): it is set once.
	klogOnce.Do(func() { klog.SetSlogLogger(opts.Log.With("source", SourceName, "component", "client-go")) })
	rc, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: cannot set up the client for %s: %v (check discovery.kubernetes.kubeconfig)", rc.Host, err)
	}
	return &Source{
		cfg:         *cfg,
		opts:        opts,
		client:      client,
		log:         opts.Log.With("source", SourceName),
		host:        rc.Host,
		changed:     make(chan struct{}, 1),
		write:       make(chan struct{}, 1),
		boxKick:     make(chan struct{}, 1),
		frontends:   map[key][]lb.Frontend{},
		programmed:  map[lb.Frontend]bool{},
		linger:      newLingering(),
		dirty:       map[key]bool{},
		statusDirty: map[key]bool{},
		statusAll:   true,
	}, nil
}

func restConfig(cfg *config.Kubernetes) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: no kubeconfig given and not running in a cluster: %v (set discovery.kubernetes.kubeconfig)", err)
		}
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: cannot load the kubeconfig %s: %v (check discovery.kubernetes.kubeconfig and that l4lbd may read it)", cfg.Kubeconfig, err)
		}
	}
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = float32(cfg.QPS), cfg.Burst
	rc.UserAgent = "l4lbd"
	return rc, nil
}

// Name implements discovery.Source.
func (s *Source) Name() string { return SourceName }

// Run implements discovery.Source. The first snapshot is sent once
// Services, Nodes and EndpointSlices have been listed in full, so a start
// never publishes half a cluster (nor allocates an address another Service
// holds). It returns when ctx is done.
func (s *Source) Run(ctx context.Context, out chan<- discovery.Snapshot) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("kubernetes: Run called twice on one source")
	}
	s.running = true
	s.mu.Unlock()

	s.log.Info("watching Kubernetes", "apiserver", s.host, "load_balancer_class", s.cfg.LoadBalancerClass, "include_classless", s.cfg.IncludeClassless, "backends", s.cfg.Backends)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
		if v := s.current(); v != nil {
			v.stop()
		}
	}()
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.probe(ctx)
	}()
	go func() {
		defer wg.Done()
		s.writer(ctx)
	}()

	var v *view
	for v == nil {
		// The probe cuts an attempt short when the apiserver answers
		// again after it did not: the informers would only retry after
		// their backoff.
		attempt, cut := context.WithCancel(ctx)
		s.mu.Lock()
		s.cutFirst = cut
		s.mu.Unlock()
		var err error
		v, err = s.watch(ctx, attempt)
		cut()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	s.mu.Lock()
	s.cutFirst = nil
	s.view = v
	s.synced = true
	s.lastSync = time.Now()
	s.mu.Unlock()
	s.succeeded()

	var last []lb.Service
	sent := false
	expire := time.NewTimer(time.Hour)
	defer expire.Stop()
	for {
		svcs, next, patched, changed := s.build(time.Now())
		expire.Stop()
		if !next.IsZero() {
			expire.Reset(time.Until(next))
		}
		if !sent || !discovery.SameServices(svcs, last) && (patched || !slices.EqualFunc(svcs, last, lb.Service.Equal)) {
			select {
			case out <- discovery.Snapshot{Source: SourceName, Services: svcs, Changed: changed}:
				last, sent = svcs, true
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		case <-expire.C:
			s.mu.Lock()
			s.full = true
			s.mu.Unlock()
		}
	}
}

// view is one set of informers on Services, Nodes and EndpointSlices.
type view struct {
	services  listerscorev1.ServiceLister
	nodes     listerscorev1.NodeLister
	endpoints listersdiscoveryv1.EndpointSliceLister
	// byService indexes the EndpointSlices by their Service's key
	// (indexService).
	byService cache.Indexer
	// stop ends the informers and waits for them.
	stop func()
}

// watch starts a view that runs until ctx ends or it is stopped, and waits
// until each informer has listed in full. It returns nil when attempt (ctx,
// or a context derived from it) ends first.
func (s *Source) watch(ctx, attempt context.Context) (*view, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(s.client, 0)
	svcInf := f.Core().V1().Services()
	nodeInf := f.Core().V1().Nodes()
	epInf := f.Discovery().V1().EndpointSlices()
	if err := epInf.Informer().AddIndexers(cache.Indexers{indexService: sliceService}); err != nil {
		cancel()
		return nil, fmt.Errorf("kubernetes: endpointslices informer: %w", err)
	}
	v := &view{services: svcInf.Lister(), nodes: nodeInf.Lister(), endpoints: epInf.Lister(), byService: epInf.Informer().GetIndexer(),
		stop: func() { cancel(); f.Shutdown() }}
	whole := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.heardAll() },
		UpdateFunc: func(any, any) { s.heardAll() },
		DeleteFunc: func(any) { s.heardAll() },
	}
	// An EndpointSlice event concerns its Service alone.
	slice := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.heardSlice(obj) },
		UpdateFunc: func(_, obj any) { s.heardSlice(obj) },
		DeleteFunc: func(obj any) { s.heardSlice(obj) },
	}
	for name, inf := range map[string]cache.SharedIndexInformer{"services": svcInf.Informer(), "nodes": nodeInf.Informer(), "endpointslices": epInf.Informer()} {
		handler := whole
		if name == "endpointslices" {
			handler = slice
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			v.stop()
			return nil, fmt.Errorf("kubernetes: %s informer: %w", name, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) { s.watchFailed(v, name, err) }); err != nil {
			v.stop()
			return nil, fmt.Errorf("kubernetes: %s informer: %w", name, err)
		}
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(attempt.Done(), svcInf.Informer().HasSynced, nodeInf.Informer().HasSynced, epInf.Informer().HasSynced) {
		v.stop()
		return nil, nil
	}
	return v, nil
}

func (s *Source) current() *view {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view
}

// resync replaces the view after an outage with one listed afresh, so that
// what changed while the apiserver was out of reach is in it, and only
// then ends the outage: until the new lists are in, the old view keeps
// serving and no address is handed out. Informers left to themselves
// would resume their watches after a backoff of up to a minute, while the
// apiserver already answers.
func (s *Source) resync(ctx context.Context) {
	v, err := s.watch(ctx, ctx)
	if err != nil {
		s.log.Error("cannot watch Kubernetes again after the outage", "error", err)
		return
	}
	if v == nil {
		return
	}
	s.mu.Lock()
	old := s.view
	s.view = v
	s.mu.Unlock()
	old.stop()
	s.succeeded()
}

// heard is every informer event: the view changed, and the apiserver
// answered.
func (s *Source) heard() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// heardAll is an event that only a whole translation follows.
func (s *Source) heardAll() {
	s.mu.Lock()
	s.full = true
	s.mu.Unlock()
	s.heard()
}

// heardSlice is an EndpointSlice event: its Service is dirty.
func (s *Source) heardSlice(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	e, ok := obj.(*discoveryv1.EndpointSlice)
	s.mu.Lock()
	if !ok {
		s.full = true
	} else if k, ok := sliceKey(e); ok {
		s.dirty[k] = true
	}
	s.mu.Unlock()
	s.heard()
}

// sliceKey is the key of the Service an EndpointSlice belongs to, by its
// service-name label; false for a slice that names none.
func sliceKey(e *discoveryv1.EndpointSlice) (key, bool) {
	name := e.Labels[labelServiceName]
	return key{e.Namespace, name}, name != ""
}

// indexService is the EndpointSlice index by the key of the Service a
// slice belongs to.
const indexService = "service"

func sliceService(obj any) ([]string, error) {
	if e, ok := obj.(*discoveryv1.EndpointSlice); ok {
		if k, ok := sliceKey(e); ok {
			return []string{k.String()}, nil
		}
	}
	return nil, nil
}

func (s *Source) kickWriter() {
	for _, ch := range []chan struct{}{s.write, s.boxKick} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// build translates the informers' view and returns the services to
// publish, and when a lingering backend expires (zero: none). patched says
// that only the Services of EndpointSlice events were translated again
// (patch); the result is then the very same slice as the last one when none
// of them changed, and changed names the services it replaced (nil after
// a whole translation).
func (s *Source) build(now time.Time) ([]lb.Service, time.Time, bool, []string) {
	v := s.current()
	s.mu.Lock()
	allocate := s.synced && s.failing == nil
	full := s.full || s.built == nil || s.builtFrom != v || s.builtAllocate != allocate
	keys := slices.Collect(maps.Keys(s.dirty))
	s.dirty = reset.Map(s.dirty)
	s.full = false
	s.mu.Unlock()
	if !full {
		if svcs, next, changed, ok := s.patch(v, keys, now); ok {
			return svcs, next, true, changed
		}
	}
	svcs, next := s.translateAll(v, allocate, now)
	s.built, s.builtFrom, s.builtAllocate = svcs, v, allocate
	return svcs, next, false, nil
}

// patch is build after EndpointSlice events only: the last translation
// with those Services translated again (translator.retranslate). It
// answers false when only a whole translation can tell. changed names the
// services of the last translation it replaced.
func (s *Source) patch(v *view, keys []key, now time.Time) ([]lb.Service, time.Time, []string, bool) {
	svcs := make(map[key]*corev1.Service, len(keys))
	eps := make(map[key][]*discoveryv1.EndpointSlice, len(keys))
	for _, k := range keys {
		svc, err := v.services.Services(k.ns).Get(k.name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				continue // a Service event follows, or was seen: a full build
			}
			return nil, time.Time{}, nil, false
		}
		svcs[k] = svc
		objs, err := v.byService.ByIndex(indexService, k.String())
		if err != nil {
			return nil, time.Time{}, nil, false
		}
		for _, o := range objs {
			if e, ok := o.(*discoveryv1.EndpointSlice); ok {
				eps[k] = append(eps[k], e)
			}
		}
	}
	t := translator{cfg: s.cfg, defaults: s.opts.Defaults, prev: s.assigned, allocate: s.builtAllocate}
	s.mu.Lock()
	prev := s.result
	s.mu.Unlock()
	res, moved, ok := t.retranslate(prev, svcs, eps, keys)
	if !ok {
		return nil, time.Time{}, nil, false
	}
	out := s.built
	changed := []string{}
	for _, i := range moved {
		svc := s.linger.one(res.services[i], s.opts.Defaults, s.opts.DrainLinger, now)
		if out[i].Equal(svc) {
			continue
		}
		if len(changed) == 0 {
			out = slices.Clone(out)
		}
		out[i] = svc
		changed = append(changed, svc.Name)
	}
	s.mu.Lock()
	s.result = &res
	for _, k := range keys {
		s.statusDirty[k] = true
	}
	s.mu.Unlock()
	s.kickWriter()
	s.built = out
	return out, s.linger.next(), changed, true
}

// translateAll translates the whole view.
func (s *Source) translateAll(v *view, allocate bool, now time.Time) ([]lb.Service, time.Time) {
	var w world
	all, _ := v.services.List(labels.Everything())
	w.services = all
	w.nodes, _ = v.nodes.List(labels.Everything())
	w.slices = map[key][]*discoveryv1.EndpointSlice{}
	eps, _ := v.endpoints.List(labels.Everything())
	for _, e := range eps {
		if k, ok := sliceKey(e); ok {
			w.slices[k] = append(w.slices[k], e)
		}
	}
	t := translator{cfg: s.cfg, defaults: s.opts.Defaults, prev: s.assigned, allocate: allocate}
	res := t.translate(w)
	// Keep the earlier assignment of a Service the translation could not
	// place now (a refused Service keeps its address for when it is fixed),
	// and forget the Services that are gone.
	live := map[key]bool{}
	for _, svc := range all {
		if t.selected(svc) {
			live[keyOf(svc)] = true
		}
	}
	for k, a := range s.assigned {
		if _, ok := res.assigned[k]; !ok && live[k] {
			res.assigned[k] = a
		}
	}
	s.assigned = res.assigned
	svcs, next := s.linger.apply(res.services, s.opts.Defaults, s.opts.DrainLinger, now)

	var problems []string
	for k, o := range res.outcomes {
		if !o.served() {
			problems = append(problems, fmt.Sprintf("Service %s: %s: %s", k, o.reason, o.message))
		}
	}
	problems = append(problems, res.problems...)
	slices.Sort(problems)

	s.mu.Lock()
	old := s.problems
	s.problems = problems
	s.result = &res
	s.statusAll = true
	for k, o := range res.outcomes {
		if len(o.frontends) > 0 {
			s.frontends[k] = o.frontends
		}
	}
	s.mu.Unlock()
	for _, p := range problems {
		if !slices.Contains(old, p) {
			s.log.Error("Kubernetes Service refused or partly left out", "problem", p)
		}
	}
	s.kickWriter()
	return svcs, next
}

// SetProgrammed tells the source which frontends the datapath holds, after
// every pass of the daemon's control loop. Status written back follows it.
func (s *Source) SetProgrammed(fes []lb.Frontend) {
	m := make(map[lb.Frontend]bool, len(fes))
	for _, fe := range fes {
		m[fe] = true
	}
	s.mu.Lock()
	same := reflect.DeepEqual(m, s.programmed)
	s.programmed = m
	if !same {
		s.statusAll = true
	}
	s.mu.Unlock()
	if !same {
		s.kickWriter()
	}
}

// Status reports the source's health for the daemon's status and metrics.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Status: discovery.Status{LastSync: s.lastSync, Healthy: s.synced && s.failing == nil}, Leader: s.leader}
	switch {
	case s.failing != nil:
		st.Error = s.failing.Error()
	case !s.synced:
		st.Error = fmt.Sprintf("waiting for the first full list of Services, Nodes and EndpointSlices from %s", s.host)
	}
	st.Errors = slices.Clone(s.problems)
	return st
}

// watchFailed is a list or watch error of an informer of v: the apiserver
// did not answer (or refused). A watch the server closed, or one whose
// resource version expired, is routine and relisted without an outage.
// The errors of a view being replaced, or not yet in use after an outage,
// change nothing.
func (s *Source) watchFailed(v *view, informer string, err error) {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	if cur := s.current(); cur != nil && cur != v {
		return
	}
	s.failed(fmt.Errorf("%s: %w", informer, err))
}

func (s *Source) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = err
	if s.logged != stateFailing {
		s.logged = stateFailing
		s.log.Warn("the Kubernetes apiserver is not answering; the last known services keep serving and no VIP is handed out",
			"apiserver", s.host, "error", err, "last_sync", s.lastSync)
	}
}

func (s *Source) succeeded() {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.lastSync
	s.lastSync = time.Now()
	wasFailing := s.failing != nil
	s.failing = nil
	if !s.synced || s.logged == stateOK {
		return
	}
	if s.logged == stateFailing && !prev.IsZero() {
		s.log.Info("the Kubernetes apiserver answers again and everything is listed afresh; services follow it", "apiserver", s.host, "stale_for", s.lastSync.Sub(prev).Round(time.Millisecond))
	} else {
		s.log.Info("Kubernetes view complete", "apiserver", s.host)
	}
	s.logged = stateOK
	if wasFailing {
		// Addresses may be handed out again.
		s.heard()
	}
}

// probe asks the apiserver for its version every ProbeInterval: a dead
// apiserver behind a load balancer, or a partition, can leave watches open
// and silent for minutes. The first answer after a failure starts a
// resync, and the outage ends when it is done; before the first full list,
// it starts the list again at once.
func (s *Source) probe(ctx context.Context) {
	t := time.NewTicker(s.opts.ProbeInterval)
	defer t.Stop()
	down := false // the last probe failed
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, s.opts.ProbeInterval)
		err := s.client.CoreV1().RESTClient().Get().AbsPath("/version").Do(pctx).Error()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.failed(fmt.Errorf("GET %s/version: %w", strings.TrimSuffix(s.host, "/"), err))
			down = true
			continue
		}
		back := down
		down = false
		s.mu.Lock()
		synced, failing, cut := s.synced, s.failing != nil, s.cutFirst
		s.mu.Unlock()
		switch {
		case synced && failing:
			s.resync(ctx)
		case synced:
			s.succeeded()
		case back && cut != nil:
			cut()
		}
	}
}

// lingering keeps backends that left a Service draining for its drain
// timeout, so their established flows finish instead of being cut.
type lingering struct {
	byService map[string]map[netip.AddrPort]lingerEntry
	// expiry is each Service's earliest lingering backend's end, for
	// the Services that have one.
	expiry map[string]time.Time
}

type lingerEntry struct {
	until   time.Time
	backend lb.Backend
	present bool // in the latest translation
}

func newLingering() lingering {
	return lingering{byService: map[string]map[netip.AddrPort]lingerEntry{}, expiry: map[string]time.Time{}}
}

// apply adds the lingering backends to svcs (as draining) and returns the
// next expiry. Services not in svcs are forgotten.
func (l lingering) apply(svcs []lb.Service, defs lb.Defaults, fallback time.Duration, now time.Time) ([]lb.Service, time.Time) {
	names := make(map[string]bool, len(svcs))
	out := make([]lb.Service, len(svcs))
	for i, svc := range svcs {
		names[svc.Name] = true
		out[i] = l.one(svc, defs, fallback, now)
	}
	for name := range l.byService {
		if !names[name] {
			delete(l.byService, name)
			delete(l.expiry, name)
		}
	}
	return out, l.next()
}

// one is apply for one Service that the last translation kept.
func (l lingering) one(in lb.Service, defs lb.Defaults, fallback time.Duration, now time.Time) lb.Service {
	d := in.WithDefaults(defs).DrainTimeout
	if d <= 0 {
		d = fallback
	}
	m := l.byService[in.Name]
	if m == nil {
		m = map[netip.AddrPort]lingerEntry{}
		l.byService[in.Name] = m
	}
	have := map[netip.AddrPort]bool{}
	for _, b := range in.Backends {
		have[b.Addr] = true
	}
	for a, e := range m {
		switch {
		case have[a]:
			delete(m, a)
		case e.present:
			// It left just now.
			e.present, e.until = false, now.Add(d)
			m[a] = e
		}
	}
	svc := in.Clone()
	var next time.Time
	for a, e := range m {
		if !e.until.After(now) {
			delete(m, a)
			continue
		}
		b := e.backend
		b.State = lb.Draining
		svc.Backends = append(svc.Backends, b)
		if next.IsZero() || e.until.Before(next) {
			next = e.until
		}
	}
	if next.IsZero() {
		delete(l.expiry, in.Name)
	} else {
		l.expiry[in.Name] = next
	}
	for _, b := range in.Backends {
		m[b.Addr] = lingerEntry{backend: b, present: true}
	}
	slices.SortFunc(svc.Backends, func(a, b lb.Backend) int { return a.Addr.Compare(b.Addr) })
	return svc
}

// next is the earliest end of any lingering backend (zero: none).
func (l lingering) next() time.Time {
	var next time.Time
	for _, t := range l.expiry {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next
}
