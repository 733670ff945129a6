// SPDX-License-Identifier: Apache-2.0

// Package file is the discovery source for the services of the TOML
// configuration file. The daemon owns the file (it also holds daemon and
// datapath settings): on start, SIGHUP or a change of the file it parses and
// validates the whole file with lb/config and, only when it is valid, hands
// the services here. This source then publishes them as one snapshot, so an
// invalid edit never reaches the reconciler and the last good state keeps
// serving.
package file

import (
	"context"
	"sync"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
)

// Source publishes the services of one configuration file.
type Source struct {
	name string

	mu      sync.Mutex
	current []lb.Service
	have    bool
	notify  chan struct{}
}

// New returns the source for the file at path.
func New(path string) *Source {
	return &Source{name: "file:" + path, notify: make(chan struct{}, 1)}
}

// Name implements discovery.Source.
func (s *Source) Name() string { return s.name }

// Set replaces the file's services (already validated) and publishes them.
func (s *Source) Set(services []lb.Service) {
	cp := make([]lb.Service, len(services))
	for i, svc := range services {
		cp[i] = svc.Clone()
		cp[i].Source = s.name
	}
	s.mu.Lock()
	s.current, s.have = cp, true
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Run implements discovery.Source: it sends the latest services after every
// Set, coalescing sets that arrive faster than they are consumed.
func (s *Source) Run(ctx context.Context, out chan<- discovery.Snapshot) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.notify:
		}
		s.mu.Lock()
		snap := discovery.Snapshot{Source: s.name, Services: s.current}
		have := s.have
		s.mu.Unlock()
		if !have {
			continue
		}
		select {
		case out <- snap:
		case <-ctx.Done():
			return nil
		}
	}
}
