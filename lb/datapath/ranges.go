// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// DefaultMaxSourceRanges is the capacity of the source-range trie when
// Config.MaxSourceRanges is 0. The trie allocates per entry, so an unused
// capacity costs nothing.
const DefaultMaxSourceRanges = 65536

// minAffinityMax is the smallest affinity table DefaultAffinityMax gives.
const minAffinityMax = 1024

// DefaultAffinityMax is the capacity of the affinity table when
// Config.AffinityMax is 0: a quarter of the connection table's, at least
// 1024. LRU tables are allocated whole at load (104 bytes an entry, measured),
// and a client usually holds several connections.
func DefaultAffinityMax(conntrackMax uint32) uint32 {
	return max(conntrackMax/4, minAffinityMax)
}

// withPolicyDefaults fills the affinity and source-range capacities a
// caller left at zero.
func withPolicyDefaults(cfg Config) Config {
	if cfg.AffinityMax == 0 {
		cfg.AffinityMax = DefaultAffinityMax(cfg.ConntrackMax)
	}
	if cfg.MaxSourceRanges == 0 {
		cfg.MaxSourceRanges = DefaultMaxSourceRanges
	}
	return cfg
}

// rangeKey is the src_ranges key of prefix p of service id: the prefix
// length counts the id's 32 bits and the address's, IPv4 being IPv4-mapped.
func rangeKey(id uint32, p netip.Prefix) bpf.LbSrcRangeKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return bpf.LbSrcRangeKey{Prefixlen: uint32(32 + bits), SvcId: id, Addr: p.Addr().As16()}
}

// rangePrefix is the prefix of key k as the service with a VIP of family
// v4 (true: IPv4) had it configured.
func rangePrefix(k bpf.LbSrcRangeKey, v4 bool) netip.Prefix {
	addr := netip.AddrFrom16(k.Addr)
	bits := int(k.Prefixlen) - 32
	if v4 && addr.Is4In6() && bits >= 96 {
		addr, bits = addr.Unmap(), bits-96
	}
	return netip.PrefixFrom(addr, bits)
}

// rangePrefixes are the prefixes of keys, in the canonical order of
// reconciler.Entry (masked, sorted, without duplicates).
func rangePrefixes(keys []bpf.LbSrcRangeKey, v4 bool) []netip.Prefix {
	if len(keys) == 0 {
		return nil
	}
	out := make([]netip.Prefix, len(keys))
	for i, k := range keys {
		out[i] = rangePrefix(k, v4)
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

// checkSourceRanges refuses prefixes the trie cannot hold as configured: a
// prefix of the other family than the VIP would never match a client.
func checkSourceRanges(svc lb.Service) error {
	for _, p := range svc.SourceRanges {
		if !p.IsValid() {
			return fmt.Errorf("source range %s is not a valid prefix", p)
		}
		if p.Addr().Is4() != svc.Frontend.Addr.Is4() {
			return fmt.Errorf("source range %s and VIP %s are of different families: it could never match; remove it", p, svc.Frontend.Addr)
		}
	}
	return nil
}

// rangeCache mirrors what src_ranges holds, by service id, so that a
// service's update touches only its own prefixes without walking the trie.
// It is read from the map at load (pinned prefixes survive a restart) and
// follows every write.
type rangeCache struct {
	mu    sync.Mutex
	bySvc map[uint32]map[bpf.LbSrcRangeKey]bool
}

// readRanges reads every key of the src_ranges trie m, by service id.
func readRanges(m *ebpf.Map) (*rangeCache, error) {
	c := &rangeCache{bySvc: map[uint32]map[bpf.LbSrcRangeKey]bool{}}
	var (
		k bpf.LbSrcRangeKey
		v uint8
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		c.add(k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read source ranges map: %w", err)
	}
	return c, nil
}

func (c *rangeCache) add(k bpf.LbSrcRangeKey) {
	set := c.bySvc[k.SvcId]
	if set == nil {
		set = map[bpf.LbSrcRangeKey]bool{}
		c.bySvc[k.SvcId] = set
	}
	set[k] = true
}

func (c *rangeCache) remove(k bpf.LbSrcRangeKey) {
	delete(c.bySvc[k.SvcId], k)
	if len(c.bySvc[k.SvcId]) == 0 {
		delete(c.bySvc, k.SvcId)
	}
}

// rangeKeys are the src_ranges keys of svc's allow-list under id.
func rangeKeys(id reconciler.ServiceID, svc lb.Service) map[bpf.LbSrcRangeKey]bool {
	out := make(map[bpf.LbSrcRangeKey]bool, len(svc.SourceRanges))
	for _, p := range svc.SourceRanges {
		out[rangeKey(uint32(id), p)] = true
	}
	return out
}

// addRanges writes the keys of want that id does not hold yet, the first
// step of make-before-break, and returns them. On failure it removes what
// it added, so the trie is as it was. The caller holds d.ranges.mu.
func (d *LB) addRanges(id reconciler.ServiceID, want map[bpf.LbSrcRangeKey]bool) ([]bpf.LbSrcRangeKey, error) {
	have := d.ranges.bySvc[uint32(id)]
	var added []bpf.LbSrcRangeKey
	for k := range want {
		if have[k] {
			continue
		}
		if err := d.srcRanges.Update(&k, uint8(1), ebpf.UpdateAny); err != nil {
			d.undoRanges(added)
			p := rangePrefix(k, false)
			if errors.Is(err, unix.ENOSPC) || isFull(err) {
				return nil, fmt.Errorf("source range map full (%d prefixes across all services) writing %s: shorten source_ranges lists: %w", d.cfg.MaxSourceRanges, p, err)
			}
			return nil, fmt.Errorf("write source range %s of service id %d: %w", p, id, err)
		}
		d.ranges.add(k)
		added = append(added, k)
	}
	return added, nil
}

// undoRanges deletes keys addRanges added, best effort: what cannot be
// deleted stays in the cache, so the next update of the service retries.
func (d *LB) undoRanges(keys []bpf.LbSrcRangeKey) {
	for _, k := range keys {
		if err := d.srcRanges.Delete(&k); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
			d.ranges.remove(k)
		}
	}
}

// pruneRanges deletes the keys id holds beyond keep: the last step of
// make-before-break, after the service entry stopped needing them. The
// caller holds d.ranges.mu.
func (d *LB) pruneRanges(id reconciler.ServiceID, keep map[bpf.LbSrcRangeKey]bool) error {
	c := d.ranges
	var errs []error
	for k := range c.bySvc[uint32(id)] {
		if keep[k] {
			continue
		}
		if err := d.srcRanges.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete source range %s of service id %d: %w", rangePrefix(k, false), id, err))
			continue
		}
		c.remove(k)
	}
	return errors.Join(errs...)
}

// readRangesByID reads the src_ranges trie for State: every key, by
// service id.
func (d *LB) readRangesByID() (map[uint32][]bpf.LbSrcRangeKey, error) {
	out := map[uint32][]bpf.LbSrcRangeKey{}
	var (
		k bpf.LbSrcRangeKey
		v uint8
	)
	it := d.srcRanges.Iterate()
	for it.Next(&k, &v) {
		out[k.SvcId] = append(out[k.SvcId], k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read source ranges map: %w", err)
	}
	return out, nil
}
