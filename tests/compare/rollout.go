// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// RolloutRow is one system through the rolling update.
type RolloutRow struct {
	System string `json:"system"`
	// Procedure says how the update was driven (see rollout).
	Procedure string `json:"procedure"`
	Outcome
	// L4LBReasons are l4lb's datapath reason counters that moved during
	// the run (see unusual).
	L4LBReasons map[string]uint64 `json:"l4lb_datapath_reasons,omitempty"`
	// Lag is how long a published change took to be in force in the
	// kernel (median and maximum over the changes); Unapplied counts the
	// changes still not in force when the load stopped.
	LagMedian time.Duration `json:"lag_median_ns"`
	LagMax    time.Duration `json:"lag_max_ns"`
	Changes   int           `json:"changes"`
	Unapplied int           `json:"unapplied_changes"`
	// RolledOver is true when, in the last second of the load, every
	// connection succeeded and reached a new backend.
	RolledOver bool `json:"rolled_over"`
	// ToDraining counts, for the drain procedure, new connections that
	// reached a backend after its draining state was in force, and
	// ToDrainingReused those of them from a client port that an earlier
	// connection to the same backend had used.
	ToDraining       int `json:"to_draining,omitempty"`
	ToDrainingReused int `json:"to_draining_reused_port,omitempty"`
}

// RolloutResult is the rolling-update scenario.
type RolloutResult struct {
	Services int           `json:"services"`
	Backends int           `json:"backends"`
	Rate     int           `json:"connections_per_second"`
	Duration time.Duration `json:"duration_ns"`
	// Step is the time between two replaced backends.
	Step time.Duration `json:"step_ns"`
	Rows []RolloutRow  `json:"rows"`
}

// The procedures.
const (
	procKubernetes = "as Kubernetes does it: the old backend stops the moment its removal is published; the proxy catches up on its own"
	procDrain      = "docs/operations.md's drain: the new backend in and the old one draining, the old one removed once it holds no connection, then stopped; each change (config file rewritten, SIGHUP) awaited until l4lbctl service get shows it in force"
)

// rollout replaces every backend of the target service one by one (a new
// one added, then an old one removed, as a Deployment with maxSurge 1 and
// maxUnavailable 0 does) while the client opens new connections to it at a
// steady rate, on each system in turn:
//
//   - iptables with kube-proxy 1.28+'s partial syncs, and with full syncs
//     (kube-proxy before 1.28), the old backend stopping when its removal
//     is published, as kubelet stops a pod while kube-proxy on every node
//     is still to learn of it;
//   - l4lb driven the same way (config file rewritten and SIGHUP, the old
//     backend stopped at once);
//   - l4lb driven the way its operator can (docs/operations.md): the old
//     backend drained, removed once idle and only then stopped, each change
//     confirmed in force before the next step. l4lbd says when a change is
//     in force; kube-proxy tells no one.
func rollout(ctx context.Context, r *rig, o options, p *progress) *RolloutResult {
	b := o.roBackends
	var olds, news []netip.AddrPort
	for j := range b {
		olds = append(olds, r.backendAddr(j, uint16(8001+j)))
		news = append(news, r.backendAddr(j, uint16(9001+j)))
	}
	w := r.fillerWorkload(o.roServices, b, olds)
	target := len(w.svcs) - 1
	lead := o.roDuration / 15
	step := (o.roDuration - lead - o.roDuration/6) / time.Duration(b)
	res := &RolloutResult{Services: o.roServices, Backends: b, Rate: o.roRate, Duration: o.roDuration, Step: step}
	spec := loadSpec{Target: targetVIP.String(), Rate: o.roRate, Count: o.roRate * int(o.roDuration/time.Second), Timeout: time.Second, Abort: true}

	// drive runs the update with proc against publish, the system's way
	// of taking a new endpoint set (with the draining ones, where it has
	// them), starting at t0. publish returns once the set is in force
	// for the procedures that wait for that.
	drive := func(t0 time.Time, proc string, publish func(eps, draining []netip.AddrPort)) {
		cur := slices.Clone(olds)
		for k := range b {
			old := olds[k]
			sleepUntil(ctx, t0.Add(lead+time.Duration(k)*step))
			r.serve(news[k])
			cur = append(cur, news[k])
			without := func() { cur = slices.DeleteFunc(cur, func(a netip.AddrPort) bool { return a == old }) }
			switch proc {
			case procDrain:
				publish(cur, []netip.AddrPort{old})
				r.waitIdle(old, time.Second)
				without()
				publish(cur, nil)
				r.stop(old)
			default:
				publish(cur, nil)
				sleepUntil(ctx, t0.Add(lead+time.Duration(k)*step+step/2))
				without()
				publish(cur, nil)
				r.stop(old)
			}
		}
	}

	for _, mode := range []kpMode{kpPartial, kpFull} {
		name := "iptables, kube-proxy partial syncs (1.28+)"
		if mode == kpFull {
			name = "iptables, kube-proxy full syncs (before 1.28)"
		}
		p.step("rolling update: %s, %d services, %d/s for %s", name, o.roServices, o.roRate, o.roDuration)
		r.stopAll()
		for _, a := range olds {
			r.serve(a)
		}
		r.iptLoad(ctx, w)
		r.via(r.ipt)
		kp := newKPProxy(r.ipt.NS, mode, w.svcs)
		pctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); kp.run(pctx) }()
		load := r.startLoad(ctx, spec)
		drive(time.Now(), procKubernetes, func(eps, _ []netip.AddrPort) { kp.publish(target, eps) })
		lr := load.wait(r)
		cancel()
		wg.Wait()
		lags, unapplied := kp.lags()
		row := rolloutRow(name, procKubernetes, lr, news, lags, unapplied)
		if kp.err != nil {
			r.t.Fatalf("rolling update: %v", kp.err)
		}
		res.Rows = append(res.Rows, row)
		p.done("%s", row.summary())
	}

	cfg := func(eps, draining []netip.AddrPort) topo.LBConfig {
		svc := w.svcs[target]
		svc.Endpoints = slices.Clone(eps)
		ww := &workload{svcs: append(slices.Clone(w.svcs[:target]), svc)}
		c := r.l4Config(ww, l4Conntrack)
		t := &c.Services[target]
		// One table size through the update, as an operator would
		// configure it: a size change would move every flow.
		t.TableSize = maglevSize(b)
		for i := range t.Backends {
			if slices.Contains(draining, t.Backends[i].Addr) {
				t.Backends[i].State = lb.Draining
			}
		}
		return c
	}
	for _, x := range []struct{ name, proc string }{
		{"l4lb, same procedure", procKubernetes},
		{"l4lb, drain, remove, stop", procDrain},
	} {
		p.step("rolling update: %s, %d services, %d/s for %s", x.name, o.roServices, o.roRate, o.roDuration)
		r.stopAll()
		for _, a := range olds {
			r.serve(a)
		}
		// A fresh daemon and connection table for each row, as the
		// iptables rows start from a flushed netfilter table.
		r.startL4LBD(cfg(olds, nil))
		r.via(r.l4)
		watch := r.watchService(fmt.Sprintf("svc-%d", target))
		publish := func(eps, draining []netip.AddrPort) {
			r.d.WriteConfig(cfg(eps, draining).TOML())
			g := watch.publish(eps, draining)
			if err := r.d.Signal(syscall.SIGHUP); err != nil {
				r.t.Fatalf("lb2: SIGHUP: %v", err)
			}
			if x.proc != procKubernetes {
				watch.wait(g, 30*time.Second)
			}
		}
		reasons := r.l4Reasons()
		load := r.startLoad(ctx, spec)
		drive(time.Now(), x.proc, publish)
		lr := load.wait(r)
		lags, unapplied := watch.close()
		row := rolloutRow(x.name, x.proc, lr, news, lags, unapplied)
		row.L4LBReasons = unusual(reasons, r.l4Reasons())
		if x.proc == procDrain {
			row.ToDraining, row.ToDrainingReused = watch.toDraining(lr)
		}
		res.Rows = append(res.Rows, row)
		p.done("%s", row.summary())
		if x.proc == procDrain {
			p.done("%d new connections reached a backend after its drain was in force, %d of them from a client port an earlier connection to that backend had used",
				row.ToDraining, row.ToDrainingReused)
		}
	}
	r.stopAll()
	return res
}

// l4Conntrack is l4lbd's conntrack_max and snat_max outside the
// exhaustion scenario: the default order of magnitude, kept in memory.
const l4Conntrack = 1 << 18

// waitIdle waits until the backend instance at addr holds no connection,
// at most limit.
func (r *rig) waitIdle(addr netip.AddrPort, limit time.Duration) {
	s := r.servers[addr]
	deadline := time.Now().Add(limit)
	for s != nil && s.active() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// load is a load generator running on the client.
type load struct {
	done chan struct{}
	res  loadResult
	err  error
}

func (r *rig) startLoad(ctx context.Context, s loadSpec) *load {
	l := &load{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.res, l.err = runLoad(ctx, r.tp.Client, s)
	}()
	return l
}

func (l *load) wait(r *rig) loadResult {
	<-l.done
	if l.err != nil {
		r.t.Fatalf("%v", l.err)
	}
	return l.res
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-time.After(time.Until(t)):
	case <-ctx.Done():
	}
}

func (x RolloutRow) summary() string {
	s := fmt.Sprintf("%d of %d connections failed", x.Failed, x.Connections)
	if x.Failed > 0 {
		s += ", longest failure window " + secs(x.LongestWindow)
	}
	return s + fmt.Sprintf("; changes in force after %s median, %s at most", secs(x.LagMedian), secs(x.LagMax))
}

// rolloutRow sums up one system's run.
func rolloutRow(system, proc string, lr loadResult, news []netip.AddrPort, lags []time.Duration, unapplied int) RolloutRow {
	return RolloutRow{
		System: system, Procedure: proc, Outcome: outcomeOf(lr), Changes: len(lags), Unapplied: unapplied,
		LagMedian: median(lags), LagMax: slices.Max(append([]time.Duration{0}, lags...)),
		RolledOver: rolledOver(lr, news),
	}
}

// rolledOver reports whether the last second of the run went to new
// backends only, without a failure.
func rolledOver(lr loadResult, news []netip.AddrPort) bool {
	var end time.Duration
	for _, c := range lr.Conns {
		end = max(end, c.At)
	}
	seen := false
	for _, c := range lr.Conns {
		if c.At < end-time.Second {
			continue
		}
		if c.Result != resOK || !slices.ContainsFunc(news, func(a netip.AddrPort) bool { return a.String() == c.Backend }) {
			return false
		}
		seen = true
	}
	return seen
}

// svcWatch follows, through l4lbd's admin API (what `l4lbctl service get`
// shows), when each published backend set of one service is in force: the
// backends and their states as published, every active one holding Maglev
// slots and every draining one none. That, not the reload counter, is the
// confirmation: l4lbd also reloads on its own when it sees the file change,
// and such a reload may have read an earlier version of the file.
type svcWatch struct {
	r    *rig
	name string
	stop chan struct{}
	done chan struct{}

	mu        sync.Mutex
	want      []map[string]string // by generation - 1: address -> state
	published []time.Time
	applied   []time.Time
}

func (r *rig) watchService(name string) *svcWatch {
	w := &svcWatch{r: r, name: name, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// publish records the backend set just written and returns its generation.
func (w *svcWatch) publish(eps, draining []netip.AddrPort) int {
	want := map[string]string{}
	for _, a := range eps {
		want[a.String()] = lb.Active.String()
	}
	for _, a := range draining {
		want[a.String()] = lb.Draining.String()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want = append(w.want, want)
	w.published = append(w.published, time.Now())
	w.applied = append(w.applied, time.Time{})
	return len(w.want)
}

func (w *svcWatch) run() {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		// A query costs l4lbd a walk of its connection table (the
		// backends' connection counts), so the watch asks only while a
		// published set is not yet seen in force. It asks every 2 ms
		// then: the lag measured includes up to one interval, and the
		// iptables side's is exact (the end of iptables-restore).
		if !w.pending() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		svc, err := w.r.d.API().Service(ctx, w.name)
		cancel()
		if err != nil {
			continue
		}
		now := time.Now()
		w.mu.Lock()
		// The newest generation in force covers every older one.
		for g := len(w.want) - 1; g >= 0; g-- {
			if !inForce(svc.Backends, w.want[g]) {
				continue
			}
			for h := g; h >= 0 && w.applied[h].IsZero(); h-- {
				w.applied[h] = now
			}
			break
		}
		w.mu.Unlock()
	}
}

func (w *svcWatch) pending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.applied) > 0 && w.applied[len(w.applied)-1].IsZero()
}

func inForce(got []api.Backend, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, b := range got {
		st, ok := want[b.Address]
		if !ok || b.State != st || (st == lb.Active.String()) != (b.Slots > 0) {
			return false
		}
	}
	return true
}

// wait blocks until generation g is in force, at most limit.
func (w *svcWatch) wait(g int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.applied[g-1].IsZero() {
		if time.Now().After(deadline) {
			w.r.t.Fatalf("lb2: backend set %d of %s not in force after %s", g, w.name, limit)
		}
		w.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		w.mu.Lock()
	}
}

// close stops the watch and returns each generation's lag; generations
// not in force by now count until now and as unapplied, as for iptables.
func (w *svcWatch) close() (lags []time.Duration, unapplied int) {
	close(w.stop)
	<-w.done
	now := time.Now()
	for g := range w.want {
		at := w.applied[g]
		if at.IsZero() {
			at = now
			unapplied++
		}
		lags = append(lags, at.Sub(w.published[g]))
	}
	return lags, unapplied
}

// toDraining counts the connections of lr that a backend accepted while
// the newest backend set in force had it draining, and those of them from
// a client port that an earlier connection to that backend had used.
func (w *svcWatch) toDraining(lr loadResult) (n, reused int) {
	seen := map[string]map[int]bool{}
	conns := slices.Clone(lr.Conns)
	slices.SortFunc(conns, func(a, b connStat) int { return int(a.At - b.At) })
	for _, c := range conns {
		if c.Result != resOK {
			continue
		}
		at := lr.Start.Add(c.At)
		state := ""
		for g := range w.want {
			if !w.applied[g].IsZero() && w.applied[g].Before(at) {
				state = w.want[g][c.Backend]
			}
		}
		if state == lb.Draining.String() {
			n++
			if seen[c.Backend][c.Port] {
				reused++
			}
		}
		if seen[c.Backend] == nil {
			seen[c.Backend] = map[int]bool{}
		}
		seen[c.Backend][c.Port] = true
	}
	return n, reused
}
