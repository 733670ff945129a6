// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"sync"
	"time"

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
