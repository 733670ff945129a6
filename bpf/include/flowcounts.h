/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packets and bytes per flow, for the packetDeltaCount / octetDeltaCount of
 * IPFIX records (lb/ipfix, docs/observability.md).
 *
 * Only when l4lbd sets cfg_flow_counts (config.h: [ipfix] configured and
 * ipfix.counts not false). Otherwise the verifier sees a constant 0 and
 * drops all of this: the programs run as if it were not there, and Load
 * gives flow_counts a single entry.
 *
 * What is counted: each client packet forwarded to a backend (sent by the
 * datapath, or passed to the stack to resolve the neighbour: as
 * count_forward), its IP packet's octets (header and payload, as IPFIX
 * defines octets). A counter is made only for a flow that has a
 * connection-table entry (the packet hit it, or made it): a TCP flow's
 * SYN, which makes none, and the packets of flows over
 * datapath.flow_insert_rate update a counter that exists but never make
 * one, so a flood cannot push counters out faster than it can push out
 * connection entries. SNAT replies are not counted per flow (DSR never
 * sees them, and a record describes the client's direction); they are
 * counted per service (svc_reply_stats).
 *
 * One table shared by all CPUs with atomic adds, rather than per-CPU
 * values: a flow's packets arrive on one CPU (RSS), so the adds do not
 * contend, and a per-CPU table would take conntrack_max x CPUs x 16 bytes
 * (0.5 GiB at a million entries and 32 CPUs) where this one takes 16 bytes
 * an entry. Sized like the connection table (Load), so that every flow
 * with an entry can have its counter; LRU, so that counters l4lbd never
 * deleted (its export stopped) go once room is needed.
 *
 * Not pinned: the counts belong to the l4lbd that reports them. A
 * restarted l4lbd starts from an empty table (and a tracker that has
 * reported nothing), so no packet is reported twice; the packets between
 * the old l4lbd's last records and the new program are not reported.
 */
#ifndef L4LB_FLOWCOUNTS_H
#define L4LB_FLOWCOUNTS_H

#include "common.h"
#include "config.h"
#include "types.h"

/* The counts of one flow since its counter was made. Host order. */
struct flow_count {
	__u64 packets;
	__u64 bytes; /* IP octets: header and payload */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow_key);
	__type(value, struct flow_count);
	__uint(max_entries, 1);
} flow_counts SEC(".maps");

/*
 * Count one forwarded packet of len IP octets of the flow key. may_create:
 * the flow has a connection entry, so a missing counter is made.
 */
static __always_inline void flow_count(const struct flow_key *key, __u64 len, int may_create)
{
	struct flow_count *c, v = {.packets = 1, .bytes = len};

	if (!cfg_flow_counts)
		return;
	c = bpf_map_lookup_elem(&flow_counts, key);
	if (!c) {
		if (!may_create)
			return;
		/* NOEXIST: another CPU may have made it meanwhile; add to
		 * that one rather than overwrite its counts. */
		if (!bpf_map_update_elem(&flow_counts, key, &v, BPF_NOEXIST))
			return;
		c = bpf_map_lookup_elem(&flow_counts, key);
		if (!c)
			return;
	}
	__sync_fetch_and_add(&c->packets, 1);
	__sync_fetch_and_add(&c->bytes, len);
}

#endif
