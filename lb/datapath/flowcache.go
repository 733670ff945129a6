// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
)

// cacheGen is the generation of what the CPUs' flow caches copy
// (flow_cache_gen, bpf/include/flowcache.h): conntrack entries, svc_gen
// words, backends and their routes; and of what their service caches copy
// (bpf/include/svccache.h): service entries. Whatever writes one of those
// maps bumps it afterwards, and every slot filled before is then a miss,
// so a change reaches the next packet as it would without the caches. A
// bump that fails leaves stale slots for at most the second a slot lives.
// Only l4lbd writes the map, one l4lbd at a time (the state lock), so the
// value read at load and counted up here is the map's.
type cacheGen struct {
	mu  sync.Mutex
	m   *ebpf.Map
	cur uint32
}

// newCacheGen reads the generation from m. A nil m (an object built from
// C before the flow cache, which only Config.Object can load, for
// measurements) has nothing to bump.
func newCacheGen(m *ebpf.Map) (*cacheGen, error) {
	g := &cacheGen{m: m}
	if m == nil {
		return g, nil
	}
	var zero uint32
	if err := m.Lookup(&zero, &g.cur); err != nil {
		return nil, fmt.Errorf("datapath: read flow_cache_gen: %w", err)
	}
	return g, nil
}

// bump moves the generation on: called after a write the flow caches
// must not outlive.
func (g *cacheGen) bump() error {
	if g.m == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var zero uint32
	next := g.cur + 1
	if err := g.m.Put(&zero, &next); err != nil {
		return fmt.Errorf("write flow_cache_gen (flow caches may keep a stale copy for up to a second): %w", err)
	}
	g.cur = next
	return nil
}
