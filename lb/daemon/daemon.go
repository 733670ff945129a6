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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/file"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/reconciler"
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
}

// Daemon is a running l4lbd.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	started time.Time

	cfg       *config.Config // last good configuration; control loop only
	dp        *datapath.LB
	rec       *reconciler.Reconciler
	merger    *discovery.Merger
	file      *file.Source
	snaps     chan discovery.Snapshot
	reload    chan chan error
	requests  chan request
	overrides *overrides

	view atomic.Pointer[view]

	health *health.Manager
	// Drain timeouts (health.go): when each draining backend started
	// draining, which ones were cut, and the timer of the next deadline.
	drainSince map[overrideKey]time.Time
	drainCut   map[overrideKey]bool
	drainTimer *time.Timer
	// waiting is set while adopted services may belong to a source that
	// has not answered yet (the reconciler keeps unclaimed services).
	waiting bool
	metrics *metrics.Recorder

	// The Consul source, when configured (consul.go).
	consulRun atomic.Pointer[consulRun]
	consulCtx context.Context // control loop only

	// loaded is the digest of the configuration file as the last reload
	// found it, so that the file watch does not reload what a SIGHUP
	// already read.
	loaded atomic.Pointer[string]

	mu         sync.Mutex
	lastReload api.Reload
}

// view is what the API reads: replaced as a whole after every change.
type view struct {
	services []lb.Service // desired, defaults resolved, overrides applied
	// index is what the datapath holds per frontend, as of this view.
	index map[lb.Frontend]*programmedService
	// configStates are the sources' states of overridden backends.
	configStates   map[overrideKey]lb.BackendState
	conflicts      []string
	conflictList   []discovery.Conflict
	rejected       []string
	refused        []metrics.Refusal
	healthWarnings []string
	// health is the checks' state when services was programmed.
	health map[health.Key]health.Status
	recErr string
	state  reconciler.State
	cfg    *config.Config
}

// New loads and validates the configuration; nothing touches the kernel yet.
func New(opts Options) (*Daemon, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	cfg := opts.Initial
	if cfg == nil {
		var err error
		if cfg, err = config.Load(opts.ConfigPath, opts.Config); err != nil {
			return nil, err
		}
	}
	d := &Daemon{
		opts:       opts,
		log:        opts.Log,
		started:    time.Now(),
		cfg:        cfg,
		merger:     discovery.NewMerger(),
		file:       file.New(opts.ConfigPath),
		snaps:      make(chan discovery.Snapshot, 16),
		reload:     make(chan chan error),
		requests:   make(chan request),
		drainSince: map[overrideKey]time.Time{},
		drainCut:   map[overrideKey]bool{},
		drainTimer: time.NewTimer(time.Hour),
		metrics:    metrics.NewRecorder(),
	}
	d.drainTimer.Stop()
	d.metrics.ConfigLoaded(time.Now())
	ov, err := loadOverrides(cfg.Daemon.AdminSocket)
	if err != nil {
		d.log.Warn("backend overrides not restored", "error", err)
	}
	d.overrides = ov
	d.lastReload = api.Reload{Time: time.Now(), OK: true, Count: 0}
	d.view.Store(&view{cfg: cfg})
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
		if cfg.Consul != nil {
			// Until Consul answers, an adopted service missing from the
			// file may be one of Consul's: keep it rather than drop
			// its traffic.
			d.waiting = true
			rec.SetKeepUnclaimed(true)
		}
	}
	d.rec = rec
	d.health = health.New(health.Options{Log: d.log})
	defer d.health.Stop()

	stopConsul, err := d.startConsul(ctx)
	if err != nil {
		return err
	}
	defer stopConsul()

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

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

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

	notify(sddaemon.SdNotifyReady)
	d.log.Info("l4lbd ready", "interfaces", cfg.Datapath.Interfaces, "services", len(d.view.Load().services))
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
			d.merger.Update(snap)
			d.sourceAnswered(snap.Source)
		case <-d.health.Events():
			// Coalesce a burst of health changes into one pass.
			for drained := false; !drained; {
				select {
				case <-d.health.Events():
				default:
					drained = true
				}
			}
		case <-d.drainTimer.C:
		case req := <-d.requests:
			err := req.f()
			if req.ping {
				req.done <- err
				continue
			}
			aerr := d.apply()
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
			aerr := d.apply()
			d.publishReload(err)
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
	defer notify(sddaemon.SdNotifyReady)
	// Taken before the read: a change in between is then seen by the
	// watch and read again, never missed.
	digest := fileDigest(d.opts.ConfigPath)
	d.loaded.Store(&digest)
	cfg, err := config.Load(d.opts.ConfigPath, d.opts.Config)
	if err != nil {
		d.log.Error("configuration rejected; the previous one keeps serving", "file", d.opts.ConfigPath, "error", err)
		return err
	}
	for _, w := range restartOnly(d.cfg, cfg) {
		d.log.Warn("setting changed; it takes effect after a restart of l4lbd", "setting", w)
	}
	// Settings that need a restart keep their running values.
	cfg.Daemon = d.cfg.Daemon
	cfg.Datapath.Interfaces = d.cfg.Datapath.Interfaces
	cfg.Maglev.Seed = d.cfg.Maglev.Seed
	if err := d.reloadConsul(cfg); err != nil {
		d.log.Error("configuration rejected; the previous one keeps serving", "file", d.opts.ConfigPath, "error", err)
		return err
	}
	d.cfg = cfg
	d.merger.Update(discovery.Snapshot{Source: d.file.Name(), Services: cfg.Services})
	d.log.Info("configuration reloaded", "file", d.opts.ConfigPath, "services", len(cfg.Services))
	return nil
}

// sourceAnswered ends the wait for sources after a restart once the last
// source that could own adopted services (Consul) has answered.
func (d *Daemon) sourceAnswered(source string) {
	if d.waiting && source == consulSource {
		d.waiting = false
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
		d.lastReload.Error = err.Error()
	}
}

// restartOnly lists settings that differ and only apply at start.
func restartOnly(old, cur *config.Config) []string {
	var out []string
	if old.Maglev.Seed != cur.Maglev.Seed {
		out = append(out, "maglev.hash_seed")
	}
	if !slices.Equal(old.Datapath.Interfaces, cur.Datapath.Interfaces) {
		out = append(out, "datapath.interfaces")
	}
	if old.Datapath.Attach != cur.Datapath.Attach || old.Datapath.XDPMode != cur.Datapath.XDPMode {
		out = append(out, "datapath.attach / xdp_mode")
	}
	if old.Datapath.ConntrackMax != cur.Datapath.ConntrackMax || old.Datapath.MaxServices != cur.Datapath.MaxServices ||
		old.Datapath.MaxBackends != cur.Datapath.MaxBackends {
		out = append(out, "datapath capacities (conntrack_max, max_services, max_backends)")
	}
	if !slices.Equal(old.Datapath.SNATAddresses, cur.Datapath.SNATAddresses) || old.Datapath.SNATPortMin != cur.Datapath.SNATPortMin ||
		old.Datapath.SNATPortMax != cur.Datapath.SNATPortMax || old.Datapath.SNATMax != cur.Datapath.SNATMax ||
		old.Datapath.SNATTimeouts != cur.Datapath.SNATTimeouts {
		out = append(out, "datapath SNAT settings (snat_addresses, snat_port_range, snat_max, snat_timeouts)")
	}
	if old.Datapath.ICMPRateLimit != cur.Datapath.ICMPRateLimit {
		out = append(out, "datapath.icmp_rate_limit")
	}
	if old.Datapath.FlowInsertRate != cur.Datapath.FlowInsertRate {
		out = append(out, "datapath.flow_insert_rate")
	}
	if old.Daemon.AdminSocket != cur.Daemon.AdminSocket || old.Daemon.BPFFS != cur.Daemon.BPFFS ||
		!slices.Equal(old.Daemon.MetricsListen, cur.Daemon.MetricsListen) {
		out = append(out, "daemon.*")
	}
	return out
}

// apply merges, resolves defaults, drops what the datapath cannot serve
// and reconciles; it publishes a new view for the API.
func (d *Daemon) apply() error {
	merged, conflicts := d.merger.Desired()
	defs := d.cfg.Defaults()
	var (
		desired  []lb.Service
		rejected []string
		refused  []metrics.Refusal
	)
	seen := map[overrideKey]bool{}
	configStates := map[overrideKey]lb.BackendState{}
	for _, svc := range merged {
		svc = normalize(svc.WithDefaults(defs))
		for _, b := range svc.Backends {
			k := overrideKey{Service: svc.Name, Backend: b.Addr}
			if _, ok := d.overrides.m[k]; ok {
				configStates[k] = b.State
			}
		}
		svc = d.overrides.apply(svc, seen)
		// The datapath's own check also knows its SNAT addresses.
		if err := d.dp.Supported(svc); err != nil {
			rejected = append(rejected, fmt.Sprintf("service %q (%s): %v", svc.Name, svc.Source, err))
			refused = append(refused, metrics.Refusal{Service: svc.Name, Source: svc.Source, Reason: metrics.RefusedUnsupported})
			continue
		}
		desired = append(desired, svc)
	}
	if d.overrides.prune(seen) {
		if err := d.overrides.save(); err != nil {
			d.log.Error("backend overrides", "error", err)
		}
	}
	for _, c := range conflicts {
		d.log.Warn("service conflict", "conflict", c.String())
	}
	for _, r := range rejected {
		d.log.Error("service refused", "reason", r)
	}
	if next := d.applyDrainTimeouts(desired, time.Now()); !next.IsZero() {
		d.drainTimer.Reset(time.Until(next))
	}
	// One snapshot of the checks serves both the reconcile and the view,
	// so status never shows a state this pass did not program.
	healthStates := d.health.States()
	programmed, warnings := d.applyHealth(desired, healthStates)
	for _, w := range warnings {
		d.log.Warn(w)
	}
	start := time.Now()
	err := d.rec.Reconcile(programmed)
	d.metrics.ObserveReconcile(time.Since(start), err)
	if err != nil {
		d.log.Error("reconcile failed; retrying", "error", err)
	}
	state := d.rec.Programmed()
	index := indexProgrammed(d.cfg.Maglev.Seed, state, programmed)
	// Probe every backend that has an entry, healthy or not: a backend
	// that failed must be able to come back.
	d.health.Update(desired, healthTargets(index))
	// The view shows the states this pass programmed; backends the update
	// just started probing show their initial state, which is what they
	// were programmed with (a backend not probed yet counts as up).
	for k, st := range d.health.States() {
		if _, ok := healthStates[k]; !ok {
			healthStates[k] = st
		}
	}
	refused = append(refused, mapFull(err, desired)...)
	d.countNewRefusals(refused)
	v := &view{services: desired, index: index, configStates: configStates, rejected: rejected, refused: refused,
		conflictList: conflicts, state: state, cfg: d.cfg, healthWarnings: warnings, health: healthStates}
	for _, c := range conflicts {
		v.conflicts = append(v.conflicts, c.String())
	}
	if err != nil {
		v.recErr = err.Error()
	}
	d.view.Store(v)
	return err
}

// normalize resolves what the datapath stores per frontend: a frontend has
// one protocol, so hybrid becomes DSR (TCP) or SNAT (UDP), and SNAT has no
// dispatch. The reconciler then compares like with like after a restart.
func normalize(s lb.Service) lb.Service {
	s.Mode = s.ModeFor(s.Frontend.Proto)
	if s.Mode == lb.ModeSNAT {
		s.Dispatch = lb.DispatchDefault
	}
	return s
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
// SIGHUP does. It polls (every `every`): that also catches editors that
// replace the file, and costs a read of a small file. A content that failed
// to load is not retried until it changes again.
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
			if !d.configChanged(&last) {
				continue
			}
			d.log.Info("configuration file changed; reloading", "file", d.opts.ConfigPath)
			if err := d.Reload(ctx); err != nil && ctx.Err() == nil {
				d.log.Error("reload after a change of the file failed; the previous configuration keeps serving", "error", err)
			}
		}
	}()
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
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// Cleanup detaches and unpins everything l4lbd left under the configured
// bpffs directory and removes its admin socket.
func Cleanup(cfg *config.Config) error {
	err := datapath.Cleanup(cfg.Daemon.BPFFS)
	if rerr := os.Remove(cfg.Daemon.AdminSocket); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// seedFingerprint identifies a seed without revealing it.
func seedFingerprint(s maglev.Seed) string {
	h := maglev.SipHash24(s, []byte("l4lb seed fingerprint"))
	return fmt.Sprintf("%016x", h)[:12]
}
