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
	"maps"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// DefaultInterval is how often a pass starts when Options.Interval is 0
// (daemon.self_check_interval).
const DefaultInterval = 10 * time.Second

// DefaultBudget is the share of one CPU a paced pass uses when
// Options.Budget is 0: after a step that used t of CPU the checker rests
// t*(1-budget)/budget, so at 5 % a step of 1 ms is followed by 19 ms of
// rest.
const DefaultBudget = 0.05

// Options configure a Checker.
type Options struct {
	// Interval is the time from the start of one pass to the start of
	// the next; a pass that takes longer is followed at once by the next.
	Interval time.Duration
	// Budget is the share of one CPU (0 < Budget <= 1) a paced pass may
	// use; 1 never rests. When the last pass's steps with their rests at
	// this share would not fit in 80 % of the interval (very many or
	// very large tables), the share is raised just enough that they do:
	// a pass should finish within its interval.
	Budget float64
	// Drift is called for every difference a pass finds, repaired or not
	// (metrics). It runs on the checker's goroutine.
	Drift func(reconciler.Drift)
	// Passed is called at the end of every pass.
	Passed func(Pass)
	// Unverified is called after a pass that changed the set of
	// frontends whose maps differ from the record for want of a repair
	// (see Checker.Unverified).
	Unverified func(map[lb.Frontend]string)
	Log        *slog.Logger
}

// Pass is what one pass found.
type Pass struct {
	Started time.Time
	// Took is the pass's wall time, rests included; Busy is the CPU its
	// steps used (their wall time where the kernel does not say).
	Took, Busy time.Duration
	// Share is the share of one CPU the pass was paced to, when paced.
	Share float64
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
	// steps is the wall time of the last pass's steps (its rests left
	// out), for the next one's share.
	steps time.Duration
	// unverified are the frontends whose maps the last pass found
	// different from the record and could not write back, with what it
	// found; pending collects them during a pass.
	unverified, pending map[lb.Frontend]string
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
	// The steps' system calls run on this thread, so its CPU time is
	// theirs (the reads of the kernel's maps are most of it).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	budget := c.budget()
	var steps time.Duration
	if paced {
		p.Share = budget
	}
	for {
		t0, c0 := time.Now(), threadCPU()
		drifts, done, err := check.Step()
		busy := time.Since(t0)
		steps += busy
		if c1 := threadCPU(); c0 > 0 && c1 > c0 {
			busy = c1 - c0
		}
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
			rest := time.Duration(float64(busy) * (1 - budget) / budget)
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
	c.steps = steps
	changed := !maps.Equal(c.unverified, c.pending)
	c.unverified, c.pending = c.pending, nil
	c.mu.Unlock()
	log := c.opts.Log.Debug
	if p.Drifts > 0 || p.Err != nil {
		log = c.opts.Log.Info
	}
	log("datapath self-check pass done", "took", p.Took, "busy", p.Busy, "drifts", p.Drifts, "unrepaired", p.Unrepaired)
	if c.opts.Passed != nil {
		c.opts.Passed(p)
	}
	if changed && c.opts.Unverified != nil {
		c.opts.Unverified(c.Unverified())
	}
	return p, true
}

// budget is the share of one CPU the next paced pass may use.
func (c *Checker) budget() float64 {
	c.mu.Lock()
	steps := c.steps
	c.mu.Unlock()
	// The steps' wall time, not their CPU: on a busy machine a step
	// waits for a CPU too, and the pass must fit all the same.
	need := float64(steps) / (0.8 * float64(c.opts.Interval))
	return min(1, max(c.opts.Budget, need))
}

// rusageThread is RUSAGE_THREAD of getrusage(2) on Linux.
const rusageThread = 1

// threadCPU is the CPU time the calling thread has used, user and system;
// 0 when the kernel does not say.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report counts and logs one difference.
func (c *Checker) report(d reconciler.Drift) {
	c.mu.Lock()
	c.st.Drifts[d.Map]++
	c.st.LastDrift, c.st.LastDriftAt = d, time.Now()
	if d.Err != nil {
		c.st.Unrepaired++
		if d.Frontend.Addr.IsValid() {
			if c.pending == nil {
				c.pending = map[lb.Frontend]string{}
			}
			c.pending[d.Frontend] = d.Map + ": " + d.Found
		}
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

// Unverified returns the frontends whose maps the last pass found
// different from what l4lbd programmed and could not write back, each with
// what the maps held. Their programmed state is not what the record says,
// so a fingerprint of the record would claim an agreement with the other
// boxes that the kernel does not keep.
func (c *Checker) Unverified() map[lb.Frontend]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.unverified)
}

// Status returns a copy of the checker's record.
func (c *Checker) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.Drifts = maps.Clone(c.st.Drifts)
	return st
}
