// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
)

// Per-flow packet and byte counts for IPFIX records (bpf/include/flowcounts.h):
// the datapath counts, when Config.FlowCounts is set, the client packets it
// forwards per flow in flow_counts; Flows reports them with each entry;
// ForgetFlowCounts deletes a flow's counter once its last record is sent.

// flowCountVars is the load-time constant that turns the counting on or
// off. An object built before the counters (Config.Object in a bench of
// an older build) lacks it, which only matters when they are asked for.
func flowCountVars(spec *ebpf.CollectionSpec, on bool) (map[string]any, error) {
	if _, ok := spec.Variables[bpf.LbVarCfgFlowCounts]; !ok {
		if on {
			return nil, fmt.Errorf("datapath: the LB object has no per-flow counters (variable %s): it predates them; load the embedded object or rebuild it with make generate", bpf.LbVarCfgFlowCounts)
		}
		return nil, nil
	}
	v := uint8(0)
	if on {
		v = 1
	}
	return map[string]any{bpf.LbVarCfgFlowCounts: v}, nil
}

// flowCountsSize is the capacity of flow_counts: the connection table's,
// so that every flow with an entry can have a counter, when counting; one
// entry (about 100 bytes) when not, as no program touches it then.
func flowCountsSize(cfg Config) uint32 {
	if cfg.FlowCounts {
		return cfg.ConntrackMax
	}
	return 1
}

// FlowID names one flow: its client and the frontend it was sent to.
type FlowID struct {
	Client   netip.AddrPort
	Frontend lb.Frontend
}

// flowKey is id as the datapath's maps key it (IPv4 addresses mapped).
func flowKey(id FlowID) bpf.LbFlowKey {
	return bpf.LbFlowKey{
		Src:   id.Client.Addr().As16(),
		Dst:   id.Frontend.Addr.As16(),
		Sport: htons(id.Client.Port()),
		Dport: htons(id.Frontend.Port),
		Proto: uint8(id.Frontend.Proto),
	}
}

// readFlowCounts reads the whole counter table, or returns nil when the
// datapath does not count.
func (d *LB) readFlowCounts() (map[bpf.LbFlowKey]bpf.LbFlowCount, error) {
	if !d.cfg.FlowCounts || d.flowCountMap == nil {
		return nil, nil
	}
	out := map[bpf.LbFlowKey]bpf.LbFlowCount{}
	err := walk(d.flowCountMap, func(k *bpf.LbFlowKey, v *bpf.LbFlowCount) bool {
		out[*k] = *v
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("read per-flow counts: %w", err)
	}
	return out, nil
}

// ForgetFlowCounts deletes the counters of flows whose last record has
// been sent, so that the table holds the flows still reported. A flow
// without a counter is skipped; a packet of the flow that arrives later
// makes a new one, counted from zero. Does nothing when the datapath does
// not count.
func (d *LB) ForgetFlowCounts(ids []FlowID) error {
	if !d.cfg.FlowCounts || d.flowCountMap == nil || len(ids) == 0 {
		return nil
	}
	var errs []error
	for start := 0; start < len(ids); start += countBatch {
		batch := ids[start:min(start+countBatch, len(ids))]
		keys := make([]bpf.LbFlowKey, len(batch))
		for i, id := range batch {
			keys[i] = flowKey(id)
		}
		// A batch delete stops at the first key it lacks: those left
		// go one by one.
		n, err := d.flowCountMap.BatchDelete(keys, nil)
		if err == nil {
			continue
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("delete per-flow counts: %w", err))
			continue
		}
		for i := n; i < len(keys); i++ {
			if err := d.flowCountMap.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete per-flow count of %s: %w", batch[i].Client, err))
			}
		}
	}
	return errors.Join(errs...)
}
