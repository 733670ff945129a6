// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"crypto/sha256"
	"errors"
	"os"
	"reflect"

	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// Names of the snapshots of the sources that can own adopted services.
const (
	consulSource     = consul.SourceName
	kubernetesSource = kubernetes.SourceName
)

// consulRun is one running Consul source and what it was started with.
type consulRun struct {
	src   *consul.Source
	cfg   config.Consul
	defs  lb.Defaults
	token [32]byte // hash of the token file, to notice a rotated token
	*runner
}

// reloadConsul prepares what a reload does to the Consul source: start a
// new one when its settings, the service defaults it validates against,
// or its token changed; stop it when [discovery.consul] is gone. Nothing
// changes until commit is called. The old source's services keep serving
// until the new source's first snapshot replaces them. An error (an
// unreadable token file) leaves the running source alone.
func (d *Daemon) reloadConsul(cfg *config.Config) (commit func(), err error) {
	cur := d.consulRun.Load()
	if cfg.Consul == nil {
		if cur == nil {
			return func() {}, nil
		}
		return d.turnOff(consul.SourceName, "Consul", func() {
			cur.stop()
			d.consulRun.Store(nil)
		}), nil
	}
	if cur != nil && reflect.DeepEqual(cur.cfg, *cfg.Consul) && cur.defs == cfg.Defaults() && cur.token == tokenHash(cfg.Consul.TokenFile) {
		return func() {}, nil
	}
	r, err := d.newConsul(cfg)
	if err != nil {
		return nil, err
	}
	var old *runner
	if cur != nil {
		old = cur.runner
	}
	return d.swapIn("Consul", old, r.runner, r.src, func() { d.consulRun.Store(r) }), nil
}

func (d *Daemon) newConsul(cfg *config.Config) (*consulRun, error) {
	src, err := consul.New(cfg.Consul, consul.Options{Defaults: cfg.Defaults(), Log: d.log, Healthy: d.healthy})
	if err != nil {
		return nil, err
	}
	return &consulRun{
		src:    src,
		cfg:    *cfg.Consul,
		defs:   cfg.Defaults(),
		token:  tokenHash(cfg.Consul.TokenFile),
		runner: newRunner(d.sourceCtx),
	}, nil
}

func tokenHash(path string) [32]byte {
	if path == "" {
		return [32]byte{}
	}
	data, _ := os.ReadFile(path)
	return sha256.Sum256(data)
}

// healthy feeds the TTL check of the box's own Consul registration: the box
// is healthy while its datapath holds what discovery asks for.
func (d *Daemon) healthy() error {
	if v := d.view.Load(); v != nil && v.RecErr != "" {
		return errors.New("reconcile failed: " + v.RecErr)
	}
	return nil
}
