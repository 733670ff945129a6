// SPDX-License-Identifier: Apache-2.0

// Package daemon wires l4lbd together: it owns the configuration file,
// loads the datapath (adopting pinned state after a restart), runs the
// discovery sources, merges their snapshots, resolves defaults, reconciles
// the result into the datapath, and serves the admin API. The control loop is
// the only writer of its state; the API reads immutable snapshots of it.
package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/file"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/announce"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/plan"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/selfcheck"
)

// Version is set at build time (-ldflags -X).
var Version = "dev"

// Options are l4lbd's command-line settings.
type Options struct {
	ConfigPath string
	Config     config.Options
	Log        *slog.Logger
	// Initial, when set, is the already loaded configuration of ConfigPath.
	Initial *config.Config
	// Parser, when set, is the parser that loaded Initial: what it kept
	// of the file's service blocks spares the first reload decoding them
	// all again.
	Parser *config.Parser
}

// Daemon is a running l4lbd.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	started time.Time

	cfg *config.Config // last good configuration; control loop only
	// parser re-reads the file on reloads, decoding only the service
	// blocks that changed; control loop only.
	parser *config.Parser
	dp     *datapath.LB
	rec    *reconciler.Reconciler
	// plan is the pipeline from the merge to the datapath and the view;
	// control loop only.
	plan      *plan.Plan
	merger    *discovery.Merger
	file      *file.Source
	snaps     chan discovery.Snapshot
	reload    chan chan error
	requests  chan request
	overrides *overrides

	view atomic.Pointer[view]

	health *health.Manager
	// drainTimer fires at the next drain timeout the plan reported.
	drainTimer *time.Timer
	// waitingFor are the sources that adopted services may belong to
	// and that have not answered yet; while any is, the reconciler keeps
	// unclaimed services.
	waitingFor map[string]bool
	// adopted are the frontends pinned in the datapath at start;
	// lastGood keeps the watched sources' last snapshots on disk
	// (lastgood.go).
	adopted  map[lb.Frontend]bool
	lastGood *lastGoodWriter
	metrics  *metrics.Recorder
	// selfCheck re-reads the datapath (selfcheck.go); nil before Run
	// starts it.
	selfCheck atomic.Pointer[selfcheck.Checker]

	// ann announces the VIPs (announce.go); nil before the first pass.
	ann *announcers
	// fleet is the fleet check (fleet.go); nil when off.
	fleet *fleetRun
	// ipfix is the flow export; nil when [ipfix] is off (ipfix.go).
	ipfix *ipfixRun

	// The Consul and Kubernetes sources, when configured (consul.go,
	// kubernetes.go), and the context they run in (sources.go).
	consulRun atomic.Pointer[consulRun]
	kubeRun   atomic.Pointer[kubeRun]
	sourceCtx context.Context // control loop only

	// loaded is the digest of the configuration file as the last reload
	// found it, so that the file watch does not reload what a SIGHUP
	// already read.
	loaded atomic.Pointer[string]
	// watching is daemon.watch_config of the configuration in force: the
	// file watch reloads only while it is set (a reload turns it on or
	// off at once).
	watching atomic.Bool

	mu         sync.Mutex
	lastReload api.Reload
	// pending are the settings of the file in force that wait for a
	// restart (keepRunning).
	pending []string
}

// view is what the API reads: replaced as a whole after every change.
type view struct {
	*plan.View
	cfg *config.Config
	// bgpVIPs and l2VIPs are the announcers' decisions for this view.
	bgpVIPs, l2VIPs []announce.VIP
}

// New loads and validates the configuration; nothing touches the kernel yet.
func New(opts Options) (*Daemon, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	cfg := opts.Initial
	parser := opts.Parser
	if parser == nil {
		parser = config.NewParser()
	}
	if cfg == nil {
		var err error
		if cfg, err = parser.Load(opts.ConfigPath, opts.Config); err != nil {
			return nil, err
		}
	}
	d := &Daemon{
		opts:       opts,
		log:        opts.Log,
		started:    time.Now(),
		cfg:        cfg,
		parser:     parser,
		merger:     discovery.NewMerger(),
		file:       file.New(opts.ConfigPath),
		snaps:      make(chan discovery.Snapshot, 16),
		reload:     make(chan chan error),
		requests:   make(chan request),
		drainTimer: time.NewTimer(time.Hour),
		metrics:    metrics.NewRecorder(),
		lastGood:   newLastGoodWriter(opts.Log, cfg.Daemon.AdminSocket),
	}
	d.drainTimer.Stop()
	d.watching.Store(cfg.Daemon.WatchConfig)
	d.metrics.ConfigLoaded(time.Now())
	// Run reads the saved overrides once it holds the lock.
	d.overrides = &overrides{path: OverridesPath(cfg.Daemon.AdminSocket), m: plan.Overrides{}}
	d.lastReload = api.Reload{Time: time.Now(), OK: true, Count: 0}
	d.plan = plan.New(plan.Config{Seed: cfg.Maglev.Seed, Merger: d.merger, ProbeMark: datapath.HealthMarkFor, Log: d.log})
	d.plan.SetDefaults(cfg.Defaults())
	d.plan.SetLocal(plan.LocalAddrs(opts.Config.Host))
	d.plan.SetOverrides(d.overrides.m)
	d.view.Store(&view{View: d.plan.View(), cfg: cfg})
	return d, nil
}

// Config returns the configuration in force.
func (d *Daemon) Config() *config.Config { return d.view.Load().cfg }

func datapathConfig(cfg *config.Config, log *slog.Logger) datapath.Config {
	return datapath.Config{
		PinPath:        cfg.Daemon.BPFFS,
		Seed:           cfg.Maglev.Seed,
		MaxServices:    cfg.Datapath.MaxServices,
		MaxBackends:    cfg.Datapath.MaxBackends,
		ConntrackMax:   cfg.Datapath.ConntrackMax,
		KeepNeighbours: true,
		SNATAddresses:  cfg.Datapath.SNATAddresses,
		SNATInterfaces: cfg.Datapath.Interfaces,
		SNATPortMin:    cfg.Datapath.SNATPortMin,
		SNATPortMax:    cfg.Datapath.SNATPortMax,
		SNATMax:        cfg.Datapath.SNATMax,
		ICMPRateLimit:  cfg.Datapath.ICMPRateLimit,
		FlowInsertRate: cfg.Datapath.FlowInsertRate,
		// Counted only for IPFIX records: nothing else reads them.
		FlowCounts: cfg.IPFIX != nil && cfg.IPFIX.Counts,
		SNATTimeouts: datapath.SNATTimeouts{
			TCP:        cfg.Datapath.SNATTimeouts.TCP,
			TCPClosing: cfg.Datapath.SNATTimeouts.TCPClosing,
			UDP:        cfg.Datapath.SNATTimeouts.UDP,
		},
		Log: log,
	}
}

// Run loads the datapath, programs the configuration, attaches to the
// interfaces and serves until ctx ends. On return the program stays attached
// and its maps pinned: a restarted l4lbd adopts them without dropping a
// packet (`l4lbd --cleanup` removes them).
func (d *Daemon) Run(ctx context.Context) error {
	cfg := d.cfg
	if err := datapath.CheckCapabilities("l4lbd"); err != nil {
		return err
	}
	// Nothing of the state (pins, socket, overrides) is touched before the
	// lock is held.
	lock, err := Acquire(cfg)
	if err != nil {
		return err
	}
	defer lock.Release()
	// The sources' last snapshots are on disk before the lock goes.
	defer d.lastGood.flush()
	ov, err := loadOverrides(cfg.Daemon.AdminSocket)
	if err != nil {
		d.log.Warn("backend overrides not restored", "error", err)
	}
	d.overrides = ov
	d.plan.SetOverrides(ov.m)
	if cfg.Maglev.DevSeed {
		d.log.Warn("running with the public development hash seed (--dev): LB boxes will not agree on backends; set maglev.hash_seed for production")
	}
	dp, err := datapath.Load(datapathConfig(cfg, d.log))
	if err != nil {
		return err
	}
	d.dp = dp
	defer dp.Close()

	st, err := dp.State()
	if err != nil {
		return fmt.Errorf("read pinned datapath state: %w", err)
	}
	rcfg := reconciler.Config{Seed: cfg.Maglev.Seed, MaxServices: cfg.Datapath.MaxServices, MaxBackends: cfg.Datapath.MaxBackends}
	rec, err := reconciler.NewFromState(rcfg, dp, d.log, st)
	if err != nil {
		return err
	}
	if n := len(st.Services); n > 0 {
		d.log.Info("adopted pinned datapath state", "services", n)
		// Until Consul and Kubernetes answer, an adopted service missing
		// from the file may be one of theirs: keep it rather than drop
		// its traffic.
		d.adopted = map[lb.Frontend]bool{}
		for _, s := range st.Services {
			if s.HasEntry {
				d.adopted[s.Service.Frontend] = true
			}
		}
		d.waitingFor = map[string]bool{}
		if cfg.Consul != nil {
			d.waitingFor[consulSource] = true
		}
		if cfg.Kubernetes != nil {
			d.waitingFor[kubernetesSource] = true
		}
		if len(d.waitingFor) > 0 {
			rec.SetKeepUnclaimed(true)
		}
	}
	d.rec = rec
	d.health = health.New(health.Options{Log: d.log})
	defer d.health.Stop()
	d.plan.SetDatapath(rec, dp.Supported)
	d.plan.SetHealth(d.health)

	// Everything started below ends with ctx, on any return: the
	// goroutines in wg are waited for once it is cancelled.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	stopSources, err := d.startSources(ctx)
	if err != nil {
		return err
	}
	defer stopSources()

	// Program the configuration before attaching, so the first packet the
	// program sees already finds its service.
	d.merger.Update(discovery.Snapshot{Source: d.file.Name(), Services: cfg.Services})
	d.apply()

	if err := d.attach(cfg); err != nil {
		return err
	}
	// Every interface runs this version's programs now: maps an earlier
	// version pinned under old layouts can go.
	if err := d.dp.Retire(); err != nil {
		d.log.Error("could not finish moving pinned maps to their new layout; the old ones stay pinned", "error", err)
	}
	// Announce only once the datapath forwards what is announced. After a
	// restart the routers kept the routes (graceful restart) meanwhile.
	if err := d.startAnnouncers(ctx, &wg, cfg, len(st.Services) > 0); err != nil {
		return err
	}
	// On any return, before ctx ends: a drain withdraws the VIPs while
	// the datapath, the admin API and the L2 answers still work.
	defer d.stopAnnouncers()
	if err := d.startFleet(ctx, &wg, cfg); err != nil {
		return err
	}
	if err := d.startIPFIX(ctx, &wg, cfg); err != nil {
		return err
	}
	d.apply()

	ln, err := api.Listen(cfg.Daemon.AdminSocket)
	if err != nil {
		return err
	}
	msrv, err := metrics.Listen(cfg.Daemon.MetricsListen, metrics.NewRegistry(d, d.metrics, Version), d.log)
	if err != nil {
		ln.Close()
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := msrv.Serve(ctx); err != nil {
			d.log.Error("metrics server stopped", "error", err)
		}
	}()
	srv := api.NewServer(d, d.log)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ctx, ln); err != nil {
			d.log.Error("admin API stopped", "error", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = d.file.Run(ctx, d.snaps)
	}()
	d.watchdog(ctx, &wg)
	d.watchConfig(ctx, &wg, 2*time.Second)

	d.startSelfCheck(ctx, &wg, cfg, len(st.Services) > 0)
	d.logWarnings(cfg)
	notify(sddaemon.SdNotifyReady + "\n" + d.statusLine())
	d.log.Info("l4lbd ready", "interfaces", cfg.Datapath.Interfaces, "services", d.view.Load().Services.Len(), "watch_config", cfg.Daemon.WatchConfig)
	err = d.loop(ctx)
	notify(sddaemon.SdNotifyStopping)
	return err
}

// attach hooks the datapath to the configured interfaces and removes links
// an earlier l4lbd left on interfaces or hooks no longer configured.
func (d *Daemon) attach(cfg *config.Config) error {
	hook := "xdp"
	if cfg.Datapath.Attach == config.AttachTC {
		hook = "tc"
	}
	for _, ifc := range cfg.Datapath.Interfaces {
		var err error
		if hook == "tc" {
			err = d.dp.AttachTC(ifc)
		} else {
			err = d.dp.AttachXDP(ifc, xdpMode(cfg.Datapath.XDPMode))
		}
		if err != nil {
			return err
		}
		if err := d.dp.AttachHealth(ifc); err != nil {
			return err
		}
	}
	for _, old := range d.dp.PinnedLinks() {
		if (old.Hook == hook || old.Hook == "hc") && slices.Contains(cfg.Datapath.Interfaces, old.Interface) {
			continue
		}
		d.log.Info("detaching from an interface or hook no longer configured", "interface", old.Interface, "hook", old.Hook)
		detach := d.dp.DetachXDP
		switch old.Hook {
		case "tc":
			detach = d.dp.DetachTC
		case "hc":
			detach = d.dp.DetachHealth
		}
		if err := detach(old.Interface); err != nil {
			d.log.Error("detach failed", "interface", old.Interface, "hook", old.Hook, "error", err)
		}
	}
	return nil
}

func xdpMode(m config.XDPMode) datapath.XDPMode {
	switch m {
	case config.XDPNative:
		return datapath.XDPNative
	case config.XDPGeneric:
		return datapath.XDPGeneric
	}
	return datapath.XDPAuto
}

// loop is the control loop: the single writer of the merged state.
func (d *Daemon) loop(ctx context.Context) error {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	backoff := time.Second
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap := <-d.snaps:
			waiting := len(d.waitingFor) > 0
			d.update(snap)
			d.sourceAnswered(snap.Source)
			// Snapshots already queued join this pass: a burst of
			// changes costs one pass, and a single change waits for
			// nothing.
			for drained := false; !drained; {
				select {
				case snap := <-d.snaps:
					d.update(snap)
					d.sourceAnswered(snap.Source)
				default:
					drained = true
				}
			}
			if waiting {
				// The source may have been the last one adopted
				// services waited for: a full pass decides.
				break
			}
			// A source that changed services it had, within
			// themselves, costs a pass over those services.
			if err := d.run(d.plan.Pass(time.Now())); err != nil {
				retry.Reset(backoff)
				backoff = min(backoff*2, 30*time.Second)
			} else {
				backoff = time.Second
			}
			continue
		case ev := <-d.health.Events():
			// Coalesce a burst of health changes into one pass, over
			// the services they touch when they are few.
			flipped := []health.Key{{Service: ev.Service, Backend: ev.Backend}}
			for drained := false; !drained; {
				select {
				case ev := <-d.health.Events():
					flipped = append(flipped, health.Key{Service: ev.Service, Backend: ev.Backend})
				default:
					drained = true
				}
			}
			if d.applyFlips(flipped) {
				backoff = time.Second
				continue
			}
		case <-d.drainTimer.C:
		case <-d.recheckC():
			d.reannounce()
			continue
		case req := <-d.requests:
			err := req.f()
			if req.ping {
				req.done <- err
				continue
			}
			var aerr error
			if req.service == "" || err != nil || !d.applyServices([]string{req.service}, nil) {
				aerr = d.apply()
			}
			req.done <- err
			if aerr != nil {
				retry.Reset(backoff)
				backoff = min(backoff*2, 30*time.Second)
			}
			continue
		case done := <-d.reload:
			// Answer only once the new state is programmed, so that
			// whoever asked for the reload sees its effect.
			err := d.doReload()
			// A file that changed services within themselves, and
			// nothing every service depends on, costs a pass over
			// those services.
			res := d.plan.Pass(time.Now())
			if res.View == nil {
				// No service changed: the view still carries the
				// new configuration to the API and the announcers.
				res.View = d.plan.View()
			}
			aerr := d.run(res)
			d.publishReload(err)
			if err == nil {
				notify(sddaemon.SdNotifyReady + "\n" + d.statusLine())
			} else {
				notify(sddaemon.SdNotifyReady)
			}
			d.metrics.ObserveReload(time.Now(), err)
			done <- err
			if aerr != nil {
				retry.Reset(backoff)
				backoff = min(backoff*2, 30*time.Second)
			}
			continue
		case <-retry.C:
		}
		if err := d.apply(); err != nil {
			retry.Reset(backoff)
			backoff = min(backoff*2, 30*time.Second)
		} else {
			backoff = time.Second
		}
	}
}

// Reload re-reads the configuration file (SIGHUP). An invalid file changes
// nothing: the error is returned, logged and shown in status.
func (d *Daemon) Reload(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case d.reload <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-done
}

func (d *Daemon) doReload() error {
	notify(sddaemon.SdNotifyReloading)
	// One read serves the digest and the parse: the watch compares the
	// file with exactly what this reload read, so a change made after
	// the read is seen and read again, never missed.
	data, err := config.ReadFile(d.opts.ConfigPath)
	digest := digestOf(data, err)
	d.loaded.Store(&digest)
	opts := d.opts.Config
	if opts.Host != nil {
		// The box may have changed since the last load (addresses).
		opts.Host = HostFacts()
	}
	var (
		cfg *config.Config
		st  config.ParseStats
	)
	if err == nil {
		cfg, err = d.parser.Parse(d.opts.ConfigPath, data, opts)
		st = d.parser.Stats()
		d.log.Debug("configuration file parsed", "services", st.Blocks, "decoded", st.Decoded, "whole", st.Whole, "why", st.Why)
	}
	if err != nil {
		d.rejected(err)
		return err
	}
	d.logWarnings(cfg)
	d.plan.SetLocal(plan.LocalAddrs(opts.Host))
	// Settings that need a restart keep their running values.
	pending := keepRunning(d.cfg, cfg)
	if len(pending) > 0 {
		d.log.Warn("settings changed that take effect only after a restart of l4lbd; they keep their running values", "settings", strings.Join(pending, ", "))
	}
	if max := cfg.Daemon.MaxFlowMove; max > 0 {
		if over := OverGuard(d.preview(cfg), max); len(over) > 0 {
			err := guardError(over, max)
			d.rejected(err)
			return err
		}
	}
	// Both sources are prepared before either is swapped, so that a
	// rejected reload changes neither.
	commitConsul, err := d.reloadConsul(cfg)
	if err == nil {
		var commitKubernetes func()
		if commitKubernetes, err = d.reloadKubernetes(cfg); err == nil {
			commitConsul()
			commitKubernetes()
		}
	}
	if err != nil {
		d.rejected(err)
		return err
	}
	for _, w := range d.reloadAnnouncers(cfg) {
		d.log.Warn("setting changed; it takes effect after a restart of l4lbd", "setting", w)
	}
	// The merger holds the services of the configuration in force: when
	// the parse compared this file with that one, it says which services
	// to look at and the merger leaves the others alone. A reload
	// rejected after its parse makes the parser's previous result one the
	// merger never saw, and then Since is not d.cfg.
	snap := discovery.Snapshot{Source: d.file.Name(), Services: cfg.Services}
	if st.Since != nil && st.Since == d.cfg {
		snap.Changed = st.Changed
	}
	d.cfg = cfg
	d.plan.SetDefaults(cfg.Defaults())
	if was := d.watching.Swap(cfg.Daemon.WatchConfig); was != cfg.Daemon.WatchConfig {
		d.log.Info("daemon.watch_config changed", "watch_config", cfg.Daemon.WatchConfig, "file", d.opts.ConfigPath)
	}
	d.mu.Lock()
	d.pending = pending
	d.mu.Unlock()
	d.merger.Update(snap)
	d.log.Info("configuration reloaded", "file", d.opts.ConfigPath, "services", len(cfg.Services))
	return nil
}

// maxLoggedErrors bounds the errors of a rejected file that one log line
// and the status carry; a file with thousands of bad lines must not make
// lines of megabytes. `l4lbctl config check` prints them all.
const maxLoggedErrors = 20

// rejected logs a rejected configuration, once.
func (d *Daemon) rejected(err error) {
	d.log.Error("configuration rejected; the previous one keeps serving", "file", d.opts.ConfigPath, "error", summarize(err))
	notify("STATUS=configuration rejected, the previous one keeps serving: " + firstLine(summarize(err)))
}

// logWarnings logs what the config checks warn about.
func (d *Daemon) logWarnings(cfg *config.Config) {
	for _, w := range cfg.Warnings {
		d.log.Warn("configuration warning", "warning", w.Error())
	}
}

// summarize keeps the first maxLoggedErrors errors of a config error list.
func summarize(err error) string {
	var list config.ErrorList
	if errors.As(err, &list) && len(list) > maxLoggedErrors {
		return list[:maxLoggedErrors].Error() + fmt.Sprintf("\n… and %d more errors (l4lbctl config check FILE lists them all)", len(list)-maxLoggedErrors)
	}
	return err.Error()
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// sourceAnswered ends the wait for sources after a restart once the last
// source that could own adopted services (Consul, Kubernetes) has answered.
func (d *Daemon) sourceAnswered(source string) {
	if !d.waitingFor[source] {
		return
	}
	delete(d.waitingFor, source)
	if len(d.waitingFor) == 0 {
		d.rec.SetKeepUnclaimed(false)
		d.log.Info("every discovery source answered; services no source claims are removed")
	}
}

// publishReload records the outcome of a reload for status.
func (d *Daemon) publishReload(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastReload.Count++
	d.lastReload.Time = time.Now()
	d.lastReload.OK = err == nil
	d.lastReload.Error = ""
	if err != nil {
		d.lastReload.Error = summarize(err)
	}
}

// keepRunning gives cur the running values of the settings that apply only
// at start (they size or name kernel objects, sockets and the seed every
// table is built with), and returns the names of those whose value in cur
// differs: they wait for a restart. Status and metrics show them.
func keepRunning(running, cur *config.Config) []string {
	var out []string
	diff := func(name string, changed bool) {
		if changed {
			out = append(out, name)
		}
	}
	rd, cd := running.Daemon, cur.Daemon
	diff("daemon.admin_socket", rd.AdminSocket != cd.AdminSocket)
	diff("daemon.metrics_listen", !slices.Equal(rd.MetricsListen, cd.MetricsListen))
	diff("daemon.bpffs", rd.BPFFS != cd.BPFFS)
	diff("daemon.log_level", rd.LogLevel != cd.LogLevel)
	diff("daemon.self_check_interval", rd.SelfCheckInterval != cd.SelfCheckInterval)
	// These apply at once: the guard of the new file, and whether the
	// file is watched from now on.
	maxMove, watch := cd.MaxFlowMove, cd.WatchConfig
	cur.Daemon = rd
	cur.Daemon.MaxFlowMove, cur.Daemon.WatchConfig = maxMove, watch

	r, c := running.Datapath, cur.Datapath
	diff("datapath.interfaces", !slices.Equal(r.Interfaces, c.Interfaces))
	diff("datapath.attach", r.Attach != c.Attach)
	diff("datapath.xdp_mode", r.XDPMode != c.XDPMode)
	diff("datapath.snat_addresses", !slices.Equal(r.SNATAddresses, c.SNATAddresses))
	diff("datapath.snat_port_range", r.SNATPortMin != c.SNATPortMin || r.SNATPortMax != c.SNATPortMax)
	diff("datapath.conntrack_max", r.ConntrackMax != c.ConntrackMax)
	diff("datapath.max_services", r.MaxServices != c.MaxServices)
	diff("datapath.max_backends", r.MaxBackends != c.MaxBackends)
	diff("datapath.snat_max", r.SNATMax != c.SNATMax)
	diff("datapath.snat_timeouts.tcp", r.SNATTimeouts.TCP != c.SNATTimeouts.TCP)
	diff("datapath.snat_timeouts.tcp_closing", r.SNATTimeouts.TCPClosing != c.SNATTimeouts.TCPClosing)
	diff("datapath.snat_timeouts.udp", r.SNATTimeouts.UDP != c.SNATTimeouts.UDP)
	diff("datapath.icmp_rate_limit", r.ICMPRateLimit != c.ICMPRateLimit)
	diff("datapath.flow_insert_rate", r.FlowInsertRate != c.FlowInsertRate)
	// What a reload does apply: the service defaults.
	r.Mode, r.Dispatch, r.DrainTimeout = c.Mode, c.Dispatch, c.DrainTimeout
	cur.Datapath = r

	diff("maglev.hash_seed", running.Maglev.Seed != cur.Maglev.Seed)
	cur.Maglev.Seed, cur.Maglev.DevSeed = running.Maglev.Seed, running.Maglev.DevSeed

	// The fleet check keeps its agent and token until a restart; the
	// Consul source itself follows a reload at once.
	sameFleet := reflect.DeepEqual(running.Fleet, cur.Fleet)
	diff("[fleet]", !sameFleet)
	diff("[discovery.consul] for the fleet check", sameFleet && cur.Fleet != nil && !reflect.DeepEqual(running.Consul, cur.Consul))
	// The export keeps its collectors and timers until a restart.
	diff("[ipfix]", !reflect.DeepEqual(running.IPFIX, cur.IPFIX))
	cur.IPFIX = running.IPFIX
	return out
}

// apply runs a full pass (plan.Plan.Full) and publishes its view.
func (d *Daemon) apply() error { return d.run(d.plan.Full(time.Now())) }

// run publishes what a pass did (nothing when no pass ran) and returns its
// error, for the control loop to retry.
func (d *Daemon) run(res plan.Result) error {
	if res.View == nil {
		return nil
	}
	if res.Full {
		d.metrics.ObserveReconcile(res.Took, res.Err)
	}
	d.publish(res)
	return res.Err
}

// applyServices runs a pass over the services named (plan.Plan.Services),
// and publishes its view; false, having changed nothing, when a full pass
// must run instead.
func (d *Daemon) applyServices(names []string, flipped []health.Key) bool {
	res, ok := d.plan.Services(names, flipped, time.Now())
	if ok {
		d.publish(res)
	}
	return ok
}

// applyFlips is applyServices for the backends whose checks flipped.
func (d *Daemon) applyFlips(flipped []health.Key) bool {
	res, ok := d.plan.Flips(flipped, time.Now())
	if ok {
		d.publish(res)
	}
	return ok
}

// publish does a pass's I/O: it saves pruned overrides, sets the drain
// timer, tells the Kubernetes source and the metrics what changed, and
// hands the new view to the announcers, the fleet record and the API.
func (d *Daemon) publish(res plan.Result) {
	if res.OverridesPruned {
		if err := d.overrides.save(); err != nil {
			d.log.Error("backend overrides", "error", err)
		}
	}
	if !res.NextDrain.IsZero() {
		d.drainTimer.Reset(time.Until(res.NextDrain))
	}
	if res.ProgrammedMoved {
		d.reportProgrammed(res.View.Index)
	}
	for _, r := range res.NewRefusals {
		d.metrics.ServiceRefused(r.Reason)
	}
	v, prev := &view{View: res.View, cfg: d.cfg}, d.view.Load()
	apply := d.announce(v, prev, res.Changed)
	d.view.Store(v)
	apply()
	d.publishFleet(v, prev, res.Changed)
}

// statusLine is the STATUS= text systemctl status shows.
func (d *Daemon) statusLine() string {
	v := d.view.Load()
	line := fmt.Sprintf("STATUS=serving %d services on %s", v.Services.Len(), strings.Join(v.cfg.Datapath.Interfaces, ", "))
	if n := len(v.Rejected); n > 0 {
		line += fmt.Sprintf("; %d refused", n)
	}
	d.mu.Lock()
	if len(d.pending) > 0 {
		line += "; pending restart: " + strings.Join(d.pending, ", ")
	}
	d.mu.Unlock()
	return line
}

func notify(state string) {
	// Outside systemd NOTIFY_SOCKET is unset and this is a no-op.
	_, _ = sddaemon.SdNotify(false, state)
}

// watchdog pings systemd at half the WatchdogSec interval, each time after
// the control loop answered a no-op: a wedged loop stops the pings and
// systemd restarts l4lbd (the datapath forwards meanwhile).
func (d *Daemon) watchdog(ctx context.Context, wg *sync.WaitGroup) {
	interval, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil || interval == 0 {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				pctx, cancel := context.WithTimeout(ctx, interval/2)
				err := d.ping(pctx)
				cancel()
				if err == nil {
					notify(sddaemon.SdNotifyWatchdog)
				} else if ctx.Err() == nil {
					d.log.Error("control loop did not answer; not feeding the systemd watchdog", "error", err)
				}
			}
		}
	}()
}

// watchConfig reloads when the configuration file's content changes, as
// SIGHUP does, while daemon.watch_config is on (off by default: saving a
// file is not applying it). The reload is the one SIGHUP runs, with the
// same validation and daemon.max_flow_move guard. It polls (every
// `every`): that also catches editors that replace the file, and costs a
// read of a small file. A content that failed to load is not retried until
// it changes again.
func (d *Daemon) watchConfig(ctx context.Context, wg *sync.WaitGroup, every time.Duration) {
	last := fileDigest(d.opts.ConfigPath)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !d.watchWants(&last) {
				continue
			}
			d.log.Info("configuration file changed; reloading", "file", d.opts.ConfigPath)
			// A rejection is logged once, by the reload itself.
			_ = d.Reload(ctx)
		}
	}()
}

// watchWants is one look of the watch: whether to reload now, which needs
// daemon.watch_config on and content no reload has read (configChanged).
// With the watch off the file is not even read.
func (d *Daemon) watchWants(last *string) bool {
	return d.watching.Load() && d.configChanged(last)
}

// configChanged reports whether the file's content differs from last, the
// content the watch saw before (which it then updates), and from what the
// last reload read: a file saved and then signalled (systemctl reload) is
// read once, not once more by the watch.
func (d *Daemon) configChanged(last *string) bool {
	cur := fileDigest(d.opts.ConfigPath)
	if cur == "" || cur == *last {
		return false
	}
	*last = cur
	loaded := d.loaded.Load()
	return loaded == nil || *loaded != cur
}

func fileDigest(path string) string {
	// The same guarded read as Load: a FIFO or a device in place of the
	// file must not hang or bloat the watcher either.
	return digestOf(config.ReadFile(path))
}

// digestOf identifies what a read of the config file (config.ReadFile)
// returned: its content, or its error.
func digestOf(b []byte, err error) string {
	if errors.Is(err, os.ErrNotExist) {
		return "" // an editor replacing the file: wait for the new one
	}
	if err != nil {
		// A file that became unreadable (a FIFO, a device, too big)
		// is a change too: the reload reports it.
		b = []byte("unreadable: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// Cleaned is what Cleanup removed, and what it left on purpose.
type Cleaned struct {
	datapath.Removed
	// Files are the runtime files removed: the admin socket, the
	// backend overrides, the last snapshots of Consul and Kubernetes.
	Files []string
	// Kept are the runtime files of a running l4lbd that a forced
	// cleanup left in place, so that the daemon stays reachable.
	Kept []string
	// Left says what l4lbd changed that stays, and why.
	Left []string
	// Forced is set when a running l4lbd held the lock (--force).
	Forced *RunningError
}

// Cleanup removes everything l4lbd leaves behind on purpose when it stops
// (`l4lbd --cleanup`): it detaches the programs, removes the pins l4lbd
// made under daemon.bpffs (by name: anything else there stays and is
// reported), deletes the managed neighbour entries of the backends' next
// hops, and removes the admin socket and the runtime overrides. It refuses
// while an l4lbd holds the lock, unless force is set; forced, it removes
// the datapath only: the running daemon keeps its admin socket and runtime
// files, so that `l4lbctl` still reaches it and `systemctl restart l4lb`
// attaches a datapath again.
func Cleanup(cfg *config.Config, force bool) (Cleaned, error) {
	var c Cleaned
	if msg := config.BPFFSProblem(cfg.Daemon.BPFFS); msg != "" {
		return c, fmt.Errorf("refusing to clean up: bpffs directory %q %s", cfg.Daemon.BPFFS, msg)
	}
	// No directory, no datapath: nothing under bpffs to lock or remove,
	// and a box without a bpffs mount (a container removing the
	// package) can still remove the runtime files.
	_, serr := os.Stat(cfg.Daemon.BPFFS)
	pins := !errors.Is(serr, os.ErrNotExist)
	lock, err := acquire(cfg, pins)
	var running *RunningError
	switch {
	case errors.As(err, &running) && force:
		c.Forced = running
	case errors.As(err, &running):
		return c, fmt.Errorf("refusing to clean up: %w; stop it first (systemctl stop l4lb), or add --force to remove its datapath from under it", err)
	case err != nil:
		return c, fmt.Errorf("refusing to clean up: %w", err)
	}
	defer lock.Release()
	var errs []error
	if pins {
		removed, err := datapath.Cleanup(cfg.Daemon.BPFFS)
		c.Removed = removed
		if err != nil {
			errs = append(errs, err)
		}
	}
	files := []string{OverridesPath(cfg.Daemon.AdminSocket),
		LastGoodPath(cfg.Daemon.AdminSocket, consulSource), LastGoodPath(cfg.Daemon.AdminSocket, kubernetesSource)}
	if c.Forced != nil {
		// Its socket is how the operator reaches and stops it, and
		// its overrides are what it applies: both stay with it.
		for _, f := range append([]string{cfg.Daemon.AdminSocket}, files...) {
			if _, serr := os.Lstat(f); serr == nil {
				c.Kept = append(c.Kept, f)
			}
		}
		return c, errors.Join(errs...)
	}
	// Only ever a socket: daemon.admin_socket naming another file is
	// refused by validation, and never deleted here either.
	if fi, serr := os.Lstat(cfg.Daemon.AdminSocket); serr == nil && fi.Mode()&os.ModeSocket != 0 {
		if rerr := os.Remove(cfg.Daemon.AdminSocket); rerr != nil {
			errs = append(errs, rerr)
		} else {
			c.Files = append(c.Files, cfg.Daemon.AdminSocket)
		}
	}
	for _, f := range files {
		if rerr := os.Remove(f); rerr == nil {
			c.Files = append(c.Files, f)
		} else if !errors.Is(rerr, os.ErrNotExist) {
			errs = append(errs, rerr)
		}
	}
	for _, ifc := range cfg.Datapath.Interfaces {
		c.Left = append(c.Left, fmt.Sprintf("forwarding on %s (net.ipv4.conf.%s.forwarding, net.ipv6.conf.%s.forwarding and force_forwarding, which l4lbd turned on) stays on: turn it off with sysctl if nothing else on the box routes", ifc, ifc, ifc))
	}
	return c, errors.Join(errs...)
}

// seedFingerprint identifies a seed without revealing it.
func seedFingerprint(s maglev.Seed) string {
	h := maglev.SipHash24(s, []byte("l4lb seed fingerprint"))
	return fmt.Sprintf("%016x", h)[:12]
}
