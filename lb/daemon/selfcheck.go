// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/selfcheck"
)

// startSelfCheck starts the background self-check of the datapath
// (lb/selfcheck) every daemon.self_check_interval. After a restart that
// adopted pinned maps it first takes one whole pass, unpaced, before Run
// reports ready: the adopted state is what an earlier l4lbd (or anything
// since) left, and the box should not say it serves before it has checked
// that the maps hold what it recorded.
func (d *Daemon) startSelfCheck(ctx context.Context, wg *sync.WaitGroup, cfg *config.Config, adopted bool) {
	c := selfcheck.New(d.rec, d.dp, selfcheck.Options{
		Interval: cfg.Daemon.SelfCheckInterval,
		Log:      d.log,
		Drift:    func(dr reconciler.Drift) { d.metrics.ObserveDrift(dr.Map, dr.Err != nil) },
		Passed:   func(p selfcheck.Pass) { d.metrics.ObserveCheckPass(p.Started.Add(p.Took), p.Took) },
		// The fingerprints of services whose maps could not be
		// written back change at once (fleet.go).
		Unverified: func(map[lb.Frontend]string) {
			if v := d.view.Load(); v != nil {
				d.publishFleet(v, nil, nil)
			}
		},
	})
	d.selfCheck.Store(c)
	if adopted {
		p, ok := c.Pass(ctx, false)
		if ok {
			d.log.Info("checked the adopted datapath against what l4lbd recorded", "took", p.Took, "drifts", p.Drifts, "unrepaired", p.Unrepaired)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.Run(ctx)
	}()
}

// unverified are the frontends whose maps the self-check found different
// from what l4lbd programmed and could not write back.
func (d *Daemon) unverified() map[lb.Frontend]string {
	if c := d.selfCheck.Load(); c != nil {
		return c.Unverified()
	}
	return nil
}

// driftFingerprint is the fingerprint a box publishes for a service whose
// maps hold something else than it programmed (found, as the self-check
// read it): the fingerprint of the programmed state would claim what the
// kernel does not do, so the box publishes one that no other box has, and
// the fleet check names the service.
func driftFingerprint(fp, found string) string {
	sum := sha256.Sum256([]byte(fp + "\x00" + found))
	return "drift-" + hex.EncodeToString(sum[:6])
}

// selfCheckStatus is the self-check's record for `l4lbctl status`.
func (d *Daemon) selfCheckStatus() *api.SelfCheckStatus {
	c := d.selfCheck.Load()
	if c == nil {
		return nil
	}
	st := c.Status()
	out := &api.SelfCheckStatus{
		IntervalSeconds: st.Interval.Seconds(),
		Passes:          st.Passes,
		Drifts:          st.Drifts,
	}
	if st.Passes > 0 {
		out.LastPass = st.Last.Started.Add(st.Last.Took).UTC().Truncate(time.Millisecond)
		out.LastPassSeconds = st.Last.Took.Seconds()
		out.LastPassDrifts, out.LastPassUnrepaired = st.Last.Drifts, st.Last.Unrepaired
		if st.Last.Err != nil {
			out.LastPassError = st.Last.Err.Error()
		}
	}
	if len(st.Drifts) > 0 {
		out.LastDrift, out.LastDriftAt = st.LastDrift.String(), st.LastDriftAt.UTC().Truncate(time.Millisecond)
	}
	return out
}
