// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/time/rate"
)

// requestGrace is how much longer than its wait time a blocking query may
// take before the source gives up on it: Consul adds up to wait/16, and a
// partitioned agent would otherwise hold the request open forever.
const requestGrace = 15 * time.Second

// fetchFunc runs one query. It returns the query's index and a function
// that applies the answer; the loop calls it only when the index says the
// answer may differ from the previous one.
type fetchFunc func(q *api.QueryOptions) (index uint64, apply func(), err error)

// maxWait is the longest wait Consul accepts for a blocking query.
const maxWait = 10 * time.Minute

// serviceAnswersPerSecond bounds how often the services' own watches come
// back with nothing new, all together: each blocking query that times out
// is an answer the agent encodes and l4lbd decodes for nothing. With
// 10,000 services at a one-minute wait that was 167 a second, 60–230 ms of
// l4lbd's CPU every second; the wait of those watches grows with their
// number instead (serviceWait). Changes are answered at once whatever the
// wait.
const serviceAnswersPerSecond = 20

// serviceWait is the wait of one service's blocking query: Options.Wait,
// or longer when the services watched one by one are many, up to Consul's
// maximum. The catalog and KV watches keep Options.Wait: they are what
// notices an agent that stopped answering.
func (s *Source) serviceWait() time.Duration {
	d := time.Duration(s.serviceWatches.Load()) * time.Second / serviceAnswersPerSecond
	return min(max(s.opts.Wait, d), max(s.opts.Wait, maxWait))
}

// loop runs fetch as a blocking-query loop, following Consul's rules for
// the index: block on the last index seen, restart from 0 when it goes
// backwards (a restored or replaced server), and never block on 0, which
// Consul answers at once. Every query waits for a token of the loop's
// bucket, so a service that changes constantly cannot make the loop spin.
// waitFor gives each query's longest wait (serviceWait, or optsWait).
func (s *Source) loop(ctx context.Context, watch string, waitFor func() time.Duration, fetch fetchFunc) {
	lim := rate.NewLimiter(rate.Every(s.opts.MinInterval), s.opts.Burst)
	var index uint64
	retry := s.opts.RetryMin
	for {
		if lim.Wait(ctx) != nil {
			return
		}
		longest := waitFor()
		wait := longest - rand.N(longest/16+1)
		q := &api.QueryOptions{AllowStale: s.cfg.Stale, Datacenter: s.cfg.Datacenter, WaitIndex: index, WaitTime: wait}
		rctx, cancel := context.WithTimeout(ctx, wait+wait/16+requestGrace)
		got, apply, err := fetch(q.WithContext(rctx))
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.failed(ctx, watch, err)
			// The agent that answers next may not be the one that gave
			// the index (a restart, another server): re-read at once
			// rather than block on an index it may never reach.
			index = 0
			if !sleep(ctx, jitter(retry)) {
				return
			}
			retry = min(retry*2, s.opts.RetryMax)
			continue
		}
		retry = s.opts.RetryMin
		if index == 0 || got != index {
			apply()
		}
		index = nextIndex(index, got)
		s.succeeded(ctx, watch)
	}
}

// nextIndex is the index of the next blocking query after one made with
// prev was answered with got.
func nextIndex(prev, got uint64) uint64 {
	switch {
	case got < prev:
		return 0
	case got == 0:
		return 1
	}
	return got
}

// jitter spreads d over [0.75d, 1.25d) so that retries of many watches do
// not arrive together.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Health bookkeeping. state is what was last logged, so that an outage is
// logged once when it starts and once when it ends, however many queries
// fail in between.
const (
	stateStarting = iota
	stateOK
	stateFailing
)

func (s *Source) failed(ctx context.Context, watch string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		// The watch was stopped (its service went away); its error is
		// the cancellation, not Consul's.
		return
	}
	s.failing[watch] = err
	// A first snapshot may have been waiting for this watch.
	s.notify()
	if s.state != stateFailing {
		s.state = stateFailing
		args := []any{"address", s.cfg.Address, "watch", watch, "error", err, "last_sync", s.synced}
		if strings.Contains(err.Error(), "429") {
			args = append(args, "hint", fmt.Sprintf("the agent refuses more connections from this box: keep discovery.consul.max_watches (%d) well below the agent's limits.http_max_conns_per_client", s.maxWatches()))
		}
		s.log.Warn("Consul is not answering; the last known services keep serving", args...)
	}
}

func (s *Source) succeeded(ctx context.Context, watch string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	delete(s.failing, watch)
	if len(s.failing) > 0 {
		return
	}
	prev := s.synced
	s.synced = time.Now()
	// Every watch's answer lands here: only a source not yet OK pays
	// healthyLocked's walk of every service.
	if s.state != stateOK && s.healthyLocked() {
		if s.state == stateFailing && !prev.IsZero() {
			s.log.Info("Consul answers again; services follow it", "address", s.cfg.Address, "stale_for", s.synced.Sub(prev).Round(time.Millisecond))
		} else {
			s.log.Info("Consul view complete", "address", s.cfg.Address)
		}
		s.state = stateOK
	}
}

// stopWatchLocked removes a stopped watch from the health bookkeeping.
func (s *Source) stopWatchLocked(watch string) {
	delete(s.failing, watch)
}

// healthyLocked: every watch answered its last query and the first full
// view is in.
func (s *Source) healthyLocked() bool {
	if len(s.failing) > 0 || s.catalog == nil || (s.cfg.KVPrefix != "" && s.kv == nil) {
		return false
	}
	for _, name := range s.catalog.names {
		if w := s.services[name]; w == nil || !w.have {
			return false
		}
	}
	return true
}

// watchCatalog reads the catalog's service list. Its index moves with every
// registration of any instance, and the answer names every service: at
// 100,000 services, decoding it for each change would cost more than the
// change. So the answer is kept as it came, and one equal to the last
// (the same services with the same tags) is not decoded, unless the
// services are watched together, where a moved index is the news.
func (s *Source) watchCatalog(q *api.QueryOptions) (uint64, func(), error) {
	var raw json.RawMessage
	meta, err := s.client.Raw().Query("/v1/catalog/services", &raw, q)
	if err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	same := !s.aggregate && s.catalog != nil && bytes.Equal(raw, s.catalogRaw)
	s.mu.Unlock()
	if same {
		return meta.LastIndex, func() {}, nil
	}
	var all map[string][]string
	if err := json.Unmarshal(raw, &all); err != nil {
		return 0, nil, fmt.Errorf("read the catalog's service list: %w", err)
	}
	return meta.LastIndex, func() { s.setCatalog(all, raw) }, nil
}

// setCatalog follows the catalog's tagged services: it starts a watch for
// each new one and stops those of services that are gone or lost the tag.
// Up to MaxWatches services each get a blocking query of their own; past
// that, the services are watched together (aggregate.go), since every
// blocking query holds one of the few connections the agent allows a
// client.
func (s *Source) setCatalog(all map[string][]string, raw []byte) {
	var names []string
	for name, tags := range all {
		if slices.Contains(tags, s.cfg.Tag) {
			names = append(names, name)
		}
	}
	slices.Sort(names)

	s.mu.Lock()
	for name, w := range s.services {
		// names is sorted: a search, not a scan, keeps a catalog of
		// 10,000 services from costing 10,000² comparisons.
		if _, found := slices.BinarySearch(names, name); !found {
			if w.cancel != nil {
				w.cancel()
			}
			delete(s.services, name)
			s.stopWatchLocked(serviceWatch(name))
			s.log.Debug("stopped watching Consul service", "service", name)
		}
	}
	aggregate := len(names) > s.maxWatches()
	if aggregate != s.aggregate {
		s.switchModeLocked(aggregate, len(names))
	}
	for _, name := range names {
		w, ok := s.services[name]
		if !ok {
			w = &watched{}
			s.services[name] = w
		}
		if !aggregate && w.cancel == nil {
			s.watchServiceLocked(name, w)
		}
	}
	if s.catalog == nil || !slices.Equal(s.catalog.names, names) {
		s.reshaped = true
	}
	s.catalog = &catalogView{names: names}
	s.catalogRaw = raw
	if aggregate {
		// The catalog's index moved: some instance was registered,
		// changed or removed, and the answer does not say which.
		s.refreshLocked(nil, true)
	}
	s.mu.Unlock()
	s.notify()
}

// watchServiceLocked starts the blocking-query loop of one service.
func (s *Source) watchServiceLocked(name string, w *watched) {
	ctx, cancel := context.WithCancel(s.run)
	w.cancel = cancel
	s.wg.Add(1)
	s.serviceWatches.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.serviceWatches.Add(-1)
		s.loop(ctx, serviceWatch(name), s.serviceWait, s.serviceFetch(name, w))
	}()
	s.log.Debug("watching Consul service", "service", name)
}

func serviceWatch(name string) string { return "service " + name }

func (s *Source) serviceFetch(name string, w *watched) fetchFunc {
	return func(q *api.QueryOptions) (uint64, func(), error) {
		entries, meta, err := s.client.Health().Service(name, s.cfg.Tag, false, q)
		if err != nil {
			return 0, nil, err
		}
		return meta.LastIndex, func() { s.setService(name, w, meta.LastIndex, entries) }, nil
	}
}

func (s *Source) watchKV(q *api.QueryOptions) (uint64, func(), error) {
	pairs, meta, err := s.client.KV().List(s.cfg.KVPrefix, q)
	if err != nil {
		return 0, nil, err
	}
	return meta.LastIndex, func() { s.setKV(pairs) }, nil
}

// setKV re-parses only the keys whose ModifyIndex changed.
func (s *Source) setKV(pairs api.KVPairs) {
	s.mu.Lock()
	old := s.kv
	s.mu.Unlock()
	next := make(map[string]kvEntry, len(pairs))
	same := old != nil
	for _, p := range pairs {
		if p == nil || strings.HasSuffix(p.Key, "/") {
			continue // a folder, not a definition
		}
		if e, ok := old[p.Key]; ok && e.modify == p.ModifyIndex && p.ModifyIndex != 0 {
			next[p.Key] = e
			continue
		}
		same = false
		next[p.Key] = kvEntry{modify: p.ModifyIndex, tr: fromKV(p.Key, p.Value, s.opts.Defaults)}
	}
	if same && len(next) == len(old) {
		// Consul answers a prefix's list with an index that moves with
		// writes elsewhere in the KV store (with no key under the
		// prefix, the whole store's): the boxes' fleet records, written
		// every second under a stream of changes, would otherwise make
		// each answer a full rebuild of every service.
		return
	}
	s.mu.Lock()
	s.kv = next
	s.reshaped = true
	s.mu.Unlock()
	s.notify()
}

// optsWait is the wait of the catalog, KV and health-state watches.
func (s *Source) optsWait() time.Duration { return s.opts.Wait }
