// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"reflect"

	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/plan"
)

// kubeRun is one running Kubernetes source and what it was started with.
type kubeRun struct {
	src  *kubernetes.Source
	cfg  config.Kubernetes
	defs lb.Defaults
	kc   [32]byte // hash of the kubeconfig, to notice new credentials
	*runner
}

// reloadKubernetes prepares what a reload does to the Kubernetes source:
// start a new one when its settings, the service defaults it validates
// against, or the kubeconfig's content changed; stop it when
// [discovery.kubernetes] is gone. Nothing changes until commit is called.
// The old source's services keep serving until the new source's first
// snapshot replaces them. An error (a missing or broken kubeconfig) leaves
// the running source alone.
func (d *Daemon) reloadKubernetes(cfg *config.Config) (commit func(), err error) {
	cur := d.kubeRun.Load()
	if cfg.Kubernetes == nil {
		if cur == nil {
			return func() {}, nil
		}
		return d.turnOff(kubernetes.SourceName, "Kubernetes", func() {
			cur.stop()
			d.kubeRun.Store(nil)
		}), nil
	}
	if cur != nil && reflect.DeepEqual(cur.cfg, *cfg.Kubernetes) && cur.defs == cfg.Defaults() && cur.kc == tokenHash(cfg.Kubernetes.Kubeconfig) {
		return func() {}, nil
	}
	r, err := d.newKubernetes(cfg)
	if err != nil {
		return nil, err
	}
	var old *runner
	if cur != nil {
		old = cur.runner
	}
	return d.swapIn("Kubernetes", old, r.runner, r.src, func() { d.kubeRun.Store(r) }), nil
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
		runner: newRunner(d.sourceCtx),
	}, nil
}

// reportProgrammed tells the Kubernetes source which frontends the
// datapath holds after a pass: it writes Service status from that, and
// releases deleted Services once their VIPs are gone.
func (d *Daemon) reportProgrammed(idx plan.Index) {
	r := d.kubeRun.Load()
	if r == nil {
		return
	}
	r.src.SetProgrammed(idx.Frontends())
}
