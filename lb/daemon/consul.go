// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"reflect"
	"time"

	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/discovery/kubernetes"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
)

// Names of the snapshots of the sources that can own adopted services.
const (
	consulSource     = consul.SourceName
	kubernetesSource = kubernetes.SourceName
)

// consulStartWait is how long a start waits for Consul's first snapshot
// before programming the datapath. After a restart the pinned maps still
// hold Consul's services; programming without them would withdraw them
// until Consul answers.
var consulStartWait = 10 * time.Second

// consulRun is one running Consul source and what it was started with.
type consulRun struct {
	src   *consul.Source
	cfg   config.Consul
	defs  lb.Defaults
	token [32]byte // hash of the token file, to notice a rotated token
	*runner
}

// startConsul starts the Consul source when [discovery.consul] is set and
// waits up to consulStartWait for its first snapshot, which it hands to the
// merger. It runs on the control goroutine before the first apply. stop
// ends whichever source is running when the daemon stops.
func (d *Daemon) startConsul(ctx context.Context) (stop func(), err error) {
	d.consulCtx = ctx
	stop = func() {
		if r := d.consulRun.Load(); r != nil {
			r.stop()
		}
	}
	if d.cfg.Consul == nil {
		return stop, nil
	}
	r, err := d.newConsul(d.cfg)
	if err != nil {
		return nil, err
	}
	r.run(r.src)
	if snap, ok := r.first(ctx, consulStartWait); ok {
		d.merger.Update(snap)
		d.sourceAnswered(snap.Source)
		d.log.Info("Consul services read", "services", len(snap.Services))
	} else if ctx.Err() == nil {
		d.log.Warn("Consul has not answered yet; starting without its services, they follow as soon as it does", "address", d.cfg.Consul.Address, "waited", consulStartWait)
	}
	r.forward(d.snaps)
	d.consulRun.Store(r)
	return stop, nil
}

// reloadConsul restarts the source when its settings, the service
// defaults it validates against, or its token changed, and stops it when
// [discovery.consul] is gone. The old source's services keep serving until
// the new source's first snapshot replaces them. An error (an unreadable
// token file) leaves the running source alone.
func (d *Daemon) reloadConsul(cfg *config.Config) error {
	cur := d.consulRun.Load()
	if cfg.Consul == nil {
		if cur == nil {
			return nil
		}
		cur.stop()
		d.consulRun.Store(nil)
		d.dropSnapshots(consul.SourceName)
		d.merger.Remove(consul.SourceName)
		d.log.Info("Consul source turned off")
		return nil
	}
	if cur != nil && reflect.DeepEqual(cur.cfg, *cfg.Consul) && cur.defs == cfg.Defaults() && cur.token == tokenHash(cfg.Consul.TokenFile) {
		return nil
	}
	r, err := d.newConsul(cfg)
	if err != nil {
		return err
	}
	if cur != nil {
		cur.stop()
		d.log.Info("Consul settings changed; watching again")
	}
	r.run(r.src)
	r.forward(d.snaps)
	d.consulRun.Store(r)
	return nil
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
		runner: newRunner(d.consulCtx),
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
	if v := d.view.Load(); v != nil && v.recErr != "" {
		return errors.New("reconcile failed: " + v.recErr)
	}
	return nil
}

// consulStatus is the Consul source's entry of discoveryStatus.
func (d *Daemon) consulStatus(now time.Time) []api.SourceStatus {
	r := d.consulRun.Load()
	if r == nil {
		return nil
	}
	st := r.src.Status()
	return []api.SourceStatus{{
		Name:         consul.SourceName,
		LastSync:     st.LastSync,
		Stale:        !st.Healthy,
		StaleSeconds: st.Staleness(now).Seconds(),
		Error:        st.Error,
		Errors:       st.Errors,
	}}
}
