/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-CPU rate limits as a generic cell rate algorithm: a bucket holds the
 * theoretical arrival time (tat) of the next event. An event may happen
 * when tat - now <= burst; it moves tat on by interval. So the rate is one
 * event per interval with bursts of burst / interval + 1 events. Used for
 * the ICMP answers (icmp.h) and for connection-table inserts (conntrack.h).
 */
#ifndef L4LB_RATELIMIT_H
#define L4LB_RATELIMIT_H

#include "maps.h"

/* Take a token from the CPU's bucket in map (a per-CPU array of one struct
 * icmp_bucket) at time now; 0 when over the limit. */
static __always_inline int gcra_allow(void *map, __u64 now, __u64 interval, __u64 burst)
{
	struct icmp_bucket *b;
	__u32 zero = 0;
	__u64 tat;

	b = bpf_map_lookup_elem(map, &zero);
	if (!b)
		return 0;
	tat = b->tat;
	if (tat < now)
		tat = now;
	if (tat - now > burst)
		return 0;
	b->tat = tat + interval;
	return 1;
}

#endif
