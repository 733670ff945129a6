/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: per service, per backend, per reason. */
#ifndef L4LB_STATS_H
#define L4LB_STATS_H

#include "maps.h"
#include "trace.h"

static __always_inline void count_reason(__u32 reason, __u64 bytes)
{
	struct reason_stats *s = bpf_map_lookup_elem(&reasons, &reason);

	if (s) {
		s->packets++;
		s->bytes += bytes;
	}
	trace_note_reason(reason);
}

/* Count one event (enum l4lb_event). */
static __always_inline void count_event(__u32 event)
{
	__u64 *n = bpf_map_lookup_elem(&events, &event);

	if (n)
		(*n)++;
}

/* Count one forwarded packet of len bytes; new_flow when it created an entry. */
static __always_inline void count_forward(__u32 svc_id, __u32 backend_id, __u64 len, int new_flow)
{
	struct lb_stats *s = bpf_map_lookup_elem(&svc_stats, &svc_id);

	if (s) {
		s->packets++;
		s->bytes += len;
		s->new_flows += new_flow;
	}
	s = bpf_map_lookup_elem(&backend_stats, &backend_id);
	if (s) {
		s->packets++;
		s->bytes += len;
		s->new_flows += new_flow;
	}
	trace_note_forward(svc_id, backend_id, new_flow);
}

/* Count one SNAT reply of len bytes sent back to a client of service svc_id. */
static __always_inline void count_reply(__u32 svc_id, __u64 len)
{
	struct reply_stats *s = bpf_map_lookup_elem(&svc_reply_stats, &svc_id);

	if (s) {
		s->packets++;
		s->bytes += len;
	}
}

#endif
