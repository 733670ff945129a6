// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"reflect"
	"time"

	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// kubernetesStartWait is how long a start waits for the cluster's first
// snapshot before programming the datapath (see runner.first).
var kubernetesStartWait = 10 * time.Second

// kubeRun is one running Kubernetes source and what it was started with.
type kubeRun struct {
	src  *kubernetes.Source
	cfg  config.Kubernetes
	defs lb.Defaults
	kc   [32]byte // hash of the kubeconfig, to notice new credentials
	*runner
}

// startKubernetes starts the Kubernetes source when [discovery.kubernetes]
// is set and waits up to kubernetesStartWait for its first snapshot, which
// it hands to the merger. It runs on the control goroutine before the
// first apply.
func (d *Daemon) startKubernetes(ctx context.Context) (stop func(), err error) {
	d.kubeCtx = ctx
	stop = func() {
		if r := d.kubeRun.Load(); r != nil {
			r.stop()
		}
	}
	if d.cfg.Kubernetes == nil {
		return stop, nil
	}
	r, err := d.newKubernetes(d.cfg)
	if err != nil {
		return nil, err
	}
	r.run(r.src)
	if snap, ok := r.first(ctx, kubernetesStartWait); ok {
		d.merger.Update(snap)
		d.sourceAnswered(snap.Source)
		d.log.Info("Kubernetes services read", "services", len(snap.Services))
	} else if ctx.Err() == nil {
		d.log.Warn("the Kubernetes apiserver has not answered yet; starting without its services, they follow as soon as it does", "waited", kubernetesStartWait)
	}
	r.forward(d.snaps)
	d.kubeRun.Store(r)
	return stop, nil
}

// reloadKubernetes restarts the source when its settings, the service
// defaults it validates against, or the kubeconfig changed, and stops it
// when [discovery.kubernetes] is gone. The old source's services keep
// serving until the new source's first snapshot replaces them.
func (d *Daemon) reloadKubernetes(cfg *config.Config) error {
	cur := d.kubeRun.Load()
	if cfg.Kubernetes == nil {
		if cur == nil {
			return nil
		}
		cur.stop()
		d.kubeRun.Store(nil)
		d.dropSnapshots(kubernetes.SourceName)
		d.merger.Remove(kubernetes.SourceName)
		d.log.Info("Kubernetes source turned off")
		return nil
	}
	if cur != nil && reflect.DeepEqual(cur.cfg, *cfg.Kubernetes) && cur.defs == cfg.Defaults() && cur.kc == tokenHash(cfg.Kubernetes.Kubeconfig) {
		return nil
	}
	r, err := d.newKubernetes(cfg)
	if err != nil {
		return err
	}
	if cur != nil {
		cur.stop()
		d.log.Info("Kubernetes settings changed; watching again")
	}
	r.run(r.src)
	r.forward(d.snaps)
	d.kubeRun.Store(r)
	return nil
}

func (d *Daemon) newKubernetes(cfg *config.Config) (*kubeRun, error) {
	src, err := kubernetes.New(cfg.Kubernetes, kubernetes.Options{Defaults: cfg.Defaults(), Log: d.log})
	if err != nil {
		return nil, err
	}
	return &kubeRun{
		src:    src,
		cfg:    *cfg.Kubernetes,
		defs:   cfg.Defaults(),
		kc:     tokenHash(cfg.Kubernetes.Kubeconfig),
		runner: newRunner(d.kubeCtx),
	}, nil
}

// reportProgrammed tells the Kubernetes source which frontends the
// datapath holds after a pass: it writes Service status from that, and
// releases deleted Services once their VIPs are gone.
func (d *Daemon) reportProgrammed(st reconciler.State) {
	r := d.kubeRun.Load()
	if r == nil {
		return
	}
	var fes []lb.Frontend
	for _, s := range st.Services {
		if s.HasEntry && s.HasTable {
			fes = append(fes, s.Service.Frontend)
		}
	}
	r.src.SetProgrammed(fes)
}

// kubernetesStatus is the Kubernetes source's entry of discoveryStatus.
func (d *Daemon) kubernetesStatus(now time.Time) []api.SourceStatus {
	r := d.kubeRun.Load()
	if r == nil {
		return nil
	}
	st := r.src.Status()
	return []api.SourceStatus{{
		Name:         kubernetes.SourceName,
		LastSync:     st.LastSync,
		Stale:        !st.Healthy,
		StaleSeconds: st.Staleness(now).Seconds(),
		Error:        st.Error,
		Errors:       st.Errors,
	}}
}
