// SPDX-License-Identifier: Apache-2.0

// Package selfcheck runs the reconciler's self-check (reconciler.Check) in
// the background: a pass over every service, backend and table of the
// datapath every interval, taken in small steps with rests between them so
// that it costs a bounded share of one CPU, and a record of what each pass
// found for status, metrics and logs. What a step reads, compares and
// repairs is the reconciler's (lb/reconciler/check.go); this package only
// paces the steps and reports.
package selfcheck

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/l4lb/l4lb/lb/reconciler"
)

// DefaultInterval is how often a pass starts when Options.Interval is 0
// (daemon.self_check_interval).
const DefaultInterval = 10 * time.Second

// DefaultBudget is the share of one CPU a paced pass uses when
// Options.Budget is 0: after a step that took t the checker rests
// t*(1-budget)/budget, so at 5 % a step of 1 ms is followed by 19 ms of
// rest.
const DefaultBudget = 0.05

// Options configure a Checker.
type Options struct {
	// Interval is the time from the start of one pass to the start of
	// the next; a pass that takes longer is followed at once by the next.
	Interval time.Duration
	// Budget is the share of one CPU (0 < Budget <= 1) a paced pass may
	// use; 1 never rests.
	Budget float64
	// Drift is called for every difference a pass finds, repaired or not
	// (metrics). It runs on the checker's goroutine.
	Drift func(reconciler.Drift)
	// Passed is called at the end of every pass.
	Passed func(Pass)
	Log    *slog.Logger
}

// Pass is what one pass found.
type Pass struct {
	Started time.Time
	// Took is the pass's wall time, rests included; Busy is the time
	// spent in steps, which is about the CPU it used.
	Took, Busy time.Duration
	// Drifts counts the differences found, Unrepaired those whose repair
	// failed (the next pass tries again).
	Drifts, Unrepaired int
	// Err joins the reads that failed; their slices were not checked.
	Err error
}

// Status is the checker's record, for `l4lbctl status`.
type Status struct {
	Interval time.Duration
	// Passes counts the passes finished; Last is the last of them, valid
	// when Passes > 0.
	Passes int
	Last   Pass
	// Drifts counts every difference found since start, by map.
	Drifts map[string]uint64
	// LastDrift is the last difference found, when Drifts is not empty.
	LastDrift   reconciler.Drift
	LastDriftAt time.Time
	Unrepaired  uint64
}

// Checker runs self-check passes of one reconciler over its datapath.
type Checker struct {
	rec  *reconciler.Reconciler
	rd   reconciler.Reader
	opts Options

	mu sync.Mutex
	st Status
}

// New returns a checker of what rec programmed into rd, which must be the
// datapath rec writes.
func New(rec *reconciler.Reconciler, rd reconciler.Reader, opts Options) *Checker {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Budget <= 0 || opts.Budget > 1 {
		opts.Budget = DefaultBudget
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Checker{rec: rec, rd: rd, opts: opts, st: Status{Interval: opts.Interval, Drifts: map[string]uint64{}}}
}

// Run takes a paced pass every interval until ctx ends; the first starts
// after one interval (the daemon runs an unpaced one at start, see Pass).
func (c *Checker) Run(ctx context.Context) {
	next := time.Now().Add(c.opts.Interval)
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		next = time.Now().Add(c.opts.Interval)
		if _, ok := c.Pass(ctx, true); !ok {
			return
		}
	}
}

// Pass takes one whole pass, resting between steps when paced, and returns
// what it found; ok is false when ctx ended before the pass did.
func (c *Checker) Pass(ctx context.Context, paced bool) (p Pass, ok bool) {
	p.Started = time.Now()
	check := c.rec.NewCheck(c.rd)
	var errs []error
	for {
		t0 := time.Now()
		drifts, done, err := check.Step()
		busy := time.Since(t0)
		p.Busy += busy
		if err != nil {
			errs = append(errs, err)
			c.opts.Log.Error("datapath self-check could not read part of the datapath; that part is checked again next pass", "error", err)
		}
		for _, d := range drifts {
			p.Drifts++
			if d.Err != nil {
				p.Unrepaired++
			}
			c.report(d)
		}
		if done {
			break
		}
		if paced {
			rest := time.Duration(float64(busy) * (1 - c.opts.Budget) / c.opts.Budget)
			t := time.NewTimer(rest)
			select {
			case <-ctx.Done():
				t.Stop()
				return p, false
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return p, false
		}
	}
	p.Took = time.Since(p.Started)
	if len(errs) > 0 {
		p.Err = errs[0]
	}
	c.mu.Lock()
	c.st.Passes++
	c.st.Last = p
	c.mu.Unlock()
	log := c.opts.Log.Debug
	if p.Drifts > 0 || p.Err != nil {
		log = c.opts.Log.Info
	}
	log("datapath self-check pass done", "took", p.Took, "busy", p.Busy, "drifts", p.Drifts, "unrepaired", p.Unrepaired)
	if c.opts.Passed != nil {
		c.opts.Passed(p)
	}
	return p, true
}

// report counts and logs one difference.
func (c *Checker) report(d reconciler.Drift) {
	c.mu.Lock()
	c.st.Drifts[d.Map]++
	c.st.LastDrift, c.st.LastDriftAt = d, time.Now()
	if d.Err != nil {
		c.st.Unrepaired++
	}
	c.mu.Unlock()
	args := []any{"map", d.Map, "id", d.ID, "found", d.Found, "want", d.Want}
	if d.Frontend.Addr.IsValid() {
		args = append(args, "frontend", d.Frontend.String())
	}
	if d.Service != "" {
		args = append(args, "service", d.Service)
	}
	if d.Err != nil {
		c.opts.Log.Error("datapath drift: the maps differ from what l4lbd programmed and the repair failed; the next pass tries again", append(args, "error", d.Err)...)
	} else {
		c.opts.Log.Warn("datapath drift repaired: the maps differed from what l4lbd programmed and were written again", args...)
	}
	if c.opts.Drift != nil {
		c.opts.Drift(d)
	}
}

// Status returns a copy of the checker's record.
func (c *Checker) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.Drifts = make(map[string]uint64, len(c.st.Drifts))
	for k, v := range c.st.Drifts {
		st.Drifts[k] = v
	}
	return st
}
