// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb/api"
)

// sourceStartWait is how long a start waits, for all sources together, for
// the first snapshot of each source that watches something outside l4lbd,
// before programming the datapath: after a restart the pinned maps still
// hold their services, and programming without them would withdraw them
// until the source answers.
var sourceStartWait = 10 * time.Second

// startSources starts the Consul and Kubernetes sources that are
// configured, waits up to sourceStartWait for their first snapshots, which
// it hands to the merger, and then forwards the rest to the control loop.
// It runs on the control goroutine before the first apply. stop ends
// whichever sources are running when the daemon stops.
func (d *Daemon) startSources(ctx context.Context) (stop func(), err error) {
	d.sourceCtx = ctx
	stop = func() {
		if r := d.consulRun.Load(); r != nil {
			r.stop()
		}
		if r := d.kubeRun.Load(); r != nil {
			r.stop()
		}
	}
	type started struct {
		r      *runner
		name   string
		source string
		attrs  []any
	}
	var wait []started
	// A source turned off while l4lbd was down must not bring its
	// services back with a later restart.
	if d.cfg.Consul == nil {
		d.forgetLastGood(consulSource)
	}
	if d.cfg.Kubernetes == nil {
		d.forgetLastGood(kubernetesSource)
	}
	if d.cfg.Consul != nil {
		r, err := d.newConsul(d.cfg)
		if err != nil {
			return nil, err
		}
		r.run(r.src)
		d.consulRun.Store(r)
		wait = append(wait, started{r.runner, "Consul", consulSource, []any{"address", d.cfg.Consul.Address}})
	}
	if d.cfg.Kubernetes != nil {
		r, err := d.newKubernetes(d.cfg)
		if err != nil {
			stop()
			return nil, err
		}
		r.run(r.src)
		d.kubeRun.Store(r)
		wait = append(wait, started{r.runner, "Kubernetes", kubernetesSource, []any{"kubeconfig", d.cfg.Kubernetes.Kubeconfig}})
	}
	deadline := time.Now().Add(sourceStartWait)
	for _, w := range wait {
		if snap, ok := w.r.first(ctx, time.Until(deadline)); ok {
			d.update(snap)
			d.sourceAnswered(snap.Source)
			d.log.Info(w.name+" services read", "services", len(snap.Services))
		} else if ctx.Err() == nil {
			d.log.Warn(w.name+" has not answered yet; starting without its services, they follow as soon as it does", append(w.attrs, "waited", sourceStartWait)...)
			if d.waitingFor[w.source] {
				d.restoreLastGood(w.source)
			}
		}
		w.r.forward(d.snaps)
	}
	return stop, nil
}

// runner runs one discovery source that watches something outside l4lbd
// (Consul, Kubernetes) and forwards its snapshots to the control loop.
type runner struct {
	out    chan discovery.Snapshot
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // Run and the forwarder
}

func newRunner(parent context.Context) *runner {
	ctx, cancel := context.WithCancel(parent)
	return &runner{out: make(chan discovery.Snapshot), ctx: ctx, cancel: cancel}
}

func (r *runner) run(src discovery.Source) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = src.Run(r.ctx, r.out)
	}()
}

// first waits up to wait for the source's first snapshot. A start waits
// for it before programming the datapath: after a restart the pinned maps
// still hold the source's services, and programming without them would
// withdraw them until the source answers.
func (r *runner) first(ctx context.Context, wait time.Duration) (discovery.Snapshot, bool) {
	select {
	case snap := <-r.out:
		return snap, true
	case <-time.After(wait):
	case <-ctx.Done():
	}
	return discovery.Snapshot{}, false
}

// forward passes the source's snapshots to the control loop until stopped.
func (r *runner) forward(to chan<- discovery.Snapshot) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case snap := <-r.out:
				select {
				case to <- snap:
				case <-r.ctx.Done():
					return
				}
			case <-r.ctx.Done():
				return
			}
		}
	}()
}

// stop ends the source and the forwarder, and waits for both.
func (r *runner) stop() {
	r.cancel()
	r.wg.Wait()
}

// dropSnapshots takes what is queued for the control loop and applies all
// but the stopped source's snapshots, which must not bring its services
// back after the merger forgot them.
func (d *Daemon) dropSnapshots(source string) {
	for {
		select {
		case snap := <-d.snaps:
			if snap.Source != source {
				d.update(snap)
			}
		default:
			return
		}
	}
}

// discoveryStatus reports the sources that can go stale.
func (d *Daemon) discoveryStatus() []api.SourceStatus {
	now := time.Now()
	entry := func(name string, st discovery.Status) api.SourceStatus {
		return api.SourceStatus{
			Name:         name,
			LastSync:     st.LastSync,
			Stale:        !st.Healthy,
			StaleSeconds: st.Staleness(now).Seconds(),
			Error:        st.Error,
			Errors:       st.Errors,
		}
	}
	var out []api.SourceStatus
	if r := d.consulRun.Load(); r != nil {
		out = append(out, entry(consulSource, r.src.Status()))
	}
	if r := d.kubeRun.Load(); r != nil {
		st := r.src.Status()
		e := entry(kubernetesSource, st.Status)
		e.StatusWriter = st.Leader
		out = append(out, e)
	}
	return out
}

// swapIn is the commit of a reload that starts discovery source src anew
// (title in the log) on runner r: stop the one running (old, nil when
// none), run the new one, forward its snapshots and store it. The old
// source's services stay in the merger until the new one's first snapshot
// replaces them.
func (d *Daemon) swapIn(title string, old, r *runner, src discovery.Source, store func()) func() {
	return func() {
		if old != nil {
			old.stop()
			d.log.Info(title + " settings changed; watching again")
		}
		r.run(src)
		r.forward(d.snaps)
		store()
	}
}

// turnOff is the commit of a reload that removes discovery source name
// (title in the log): stop it, then forget its services, its snapshots
// and its last-good copy, so that nothing it served outlives it.
func (d *Daemon) turnOff(name, title string, stop func()) func() {
	return func() {
		stop()
		d.dropSnapshots(name)
		d.merger.Remove(name)
		d.forgetLastGood(name)
		d.log.Info(title + " source turned off")
	}
}
