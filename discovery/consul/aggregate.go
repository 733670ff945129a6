// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"context"
	"strconv"
	"sync"

	"github.com/hashicorp/consul/api"
	"golang.org/x/time/rate"

	"github.com/l4lb/l4lb/lb/config"
)

// Watching many services together.
//
// A blocking query holds an HTTP connection to the agent for as long as it
// waits, and the agent refuses a client more than
// limits.http_max_conns_per_client of them (200 by default): past that it
// answers 429, and the services whose watch it refused are never read.
// So with more tagged services than MaxWatches the source does not give
// each its own query. It blocks on two queries for all of them instead:
//
//   - the catalog's service list (already watched), whose index moves when
//     any instance is registered, changed or deregistered: every service is
//     read again (it does not say which one changed);
//   - the health state of every check of a tagged instance and of every
//     node check, whose answer carries each check's ModifyIndex: only the
//     services whose checks changed (or lost a check) are read again, and
//     all of them when a node check changed.
//
// Reads are plain (non-blocking) health queries, refreshConcurrency at a
// time, and a service whose index did not move is not translated again.
// A check flip therefore costs one read of its service; a registration
// costs a read of every tagged service.

// refreshConcurrency is how many services are read at once.
const refreshConcurrency = 8

// maxWatches is the configured MaxWatches, or its default.
func (s *Source) maxWatches() int {
	if s.cfg.MaxWatches > 0 {
		return s.cfg.MaxWatches
	}
	return config.DefaultConsulMaxWatches
}

// switchModeLocked moves between one blocking query per service and the
// services watched together. Every watched is replaced by a copy that
// keeps its last answer, so that a read or a watch of the other mode still
// in flight cannot store its answer over a newer one.
func (s *Source) switchModeLocked(aggregate bool, n int) {
	s.aggregate = aggregate
	for name, w := range s.services {
		if w.cancel != nil {
			w.cancel()
		}
		s.services[name] = &watched{have: w.have, index: w.index, tr: w.tr}
	}
	if aggregate {
		s.log.Info("watching Consul services together: more tagged services than discovery.consul.max_watches",
			"services", n, "max_watches", s.maxWatches())
		ctx, cancel := context.WithCancel(s.run)
		s.stopHealth = cancel
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.loop(ctx, "health state", s.optsWait, s.healthFetch())
		}()
		return
	}
	s.log.Info("watching each Consul service with its own query", "services", n, "max_watches", s.maxWatches())
	if s.stopHealth != nil {
		s.stopHealth()
		s.stopHealth = nil
	}
	s.stopWatchLocked("health state")
	clear(s.pending)
	s.pendingAll = false
}

// setService stores an answer for service name, if w still is its watch.
func (s *Source) setService(name string, w *watched, index uint64, entries []*api.ServiceEntry) {
	tr := fromCatalog(name, entries, s.cfg.WarningState, s.opts.Defaults)
	s.mu.Lock()
	if s.services[name] == w {
		w.tr, w.have, w.index = tr, true, index
		s.dirty[name] = true
	}
	s.mu.Unlock()
	s.notify()
}

// refreshLocked queues services to be read again: names, or all.
func (s *Source) refreshLocked(names []string, all bool) {
	if all {
		s.pendingAll = true
	}
	for _, n := range names {
		s.pending[n] = true
	}
	select {
	case s.refreshKick <- struct{}{}:
	default:
	}
}

// healthFetch is the blocking query on the health state of tagged
// instances and nodes. Its answer queues the services whose checks
// changed since the previous answer.
func (s *Source) healthFetch() fetchFunc {
	var last uint64
	counts := map[string]int{} // service -> checks in the previous answer
	filter := strconv.Quote(s.cfg.Tag) + ` in ServiceTags or ServiceID == ""`
	return func(q *api.QueryOptions) (uint64, func(), error) {
		q.Filter = filter
		checks, meta, err := s.client.Health().State(api.HealthAny, q)
		if err != nil {
			return 0, nil, err
		}
		return meta.LastIndex, func() {
			var names []string
			all := false
			now := make(map[string]int, len(counts))
			for _, c := range checks {
				now[c.ServiceName]++
				if last == 0 || c.ModifyIndex <= last {
					continue
				}
				if c.ServiceName == "" {
					all = true // a node's health counts for every service on it
				} else {
					names = append(names, c.ServiceName)
				}
			}
			if last != 0 {
				// A removed check is not in the answer at all.
				for name, n := range counts {
					if now[name] < n {
						if name == "" {
							all = true
						} else {
							names = append(names, name)
						}
					}
				}
			}
			counts, last = now, meta.LastIndex
			if len(names) == 0 && !all {
				return
			}
			s.mu.Lock()
			if s.aggregate {
				s.refreshLocked(names, all)
			}
			s.mu.Unlock()
		}, nil
	}
}

// refresher reads the queued services while they are watched together,
// coalescing a burst of changes into one round of reads. A service whose
// read fails is queued again and read after a back-off; its failure
// counts against the source's health like a failing watch.
func (s *Source) refresher(ctx context.Context) {
	lim := rate.NewLimiter(rate.Every(s.opts.MinInterval), s.opts.Burst)
	retry := s.opts.RetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.refreshKick:
		}
		if lim.Wait(ctx) != nil {
			return
		}
		s.mu.Lock()
		var todo []string
		if s.pendingAll && s.catalog != nil {
			todo = append(todo, s.catalog.names...)
		} else {
			for name := range s.pending {
				todo = append(todo, name)
			}
		}
		clear(s.pending)
		s.pendingAll = false
		s.mu.Unlock()
		if len(todo) == 0 {
			continue
		}
		if failed := s.readServices(ctx, todo); len(failed) > 0 {
			if !sleep(ctx, jitter(retry)) {
				return
			}
			retry = min(retry*2, s.opts.RetryMax)
			s.mu.Lock()
			if s.aggregate {
				s.refreshLocked(failed, false)
			}
			s.mu.Unlock()
			continue
		}
		retry = s.opts.RetryMin
	}
}

// readServices reads names with plain health queries, refreshConcurrency at
// a time, and stores each answer whose index moved. It returns the
// services it could not read.
func (s *Source) readServices(ctx context.Context, names []string) (failed []string) {
	var mu sync.Mutex
	sem := make(chan struct{}, refreshConcurrency)
	var wg sync.WaitGroup
	for _, name := range names {
		s.mu.Lock()
		w := s.services[name]
		stillAggregate := s.aggregate
		s.mu.Unlock()
		if w == nil || !stillAggregate {
			continue // gone, or watched on its own again
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			watch := serviceWatch(name)
			q := &api.QueryOptions{AllowStale: s.cfg.Stale, Datacenter: s.cfg.Datacenter}
			rctx, cancel := context.WithTimeout(ctx, requestGrace)
			entries, meta, err := s.client.Health().Service(name, s.cfg.Tag, false, q.WithContext(rctx))
			cancel()
			if err != nil {
				s.failed(ctx, watch, err)
				mu.Lock()
				failed = append(failed, name)
				mu.Unlock()
				return
			}
			s.mu.Lock()
			same := w.have && w.index == meta.LastIndex && meta.LastIndex != 0
			s.mu.Unlock()
			if !same {
				s.setService(name, w, meta.LastIndex, entries)
			}
			s.succeeded(ctx, watch)
		}()
	}
	wg.Wait()
	return failed
}
