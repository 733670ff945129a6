/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The datapath's clock: CLOCK_MONOTONIC at tick resolution, what
 * bpf_ktime_get_coarse_ns returns and what every last_seen and rate-limit
 * time in the maps is kept in (lb/datapath reads them against the same
 * clock).
 *
 * Why not call the helper per packet: a helper that is not inlined is a
 * call and a return in the kernel, and with return-stack mitigations (SRSO
 * safe RET on AMD, retbleed on Intel) that costs as much as a hash lookup:
 * about 50 ns of an established packet's 300 here (docs/datapath.md). The
 * coarse clock only moves when jiffies does (both advance in the same tick),
 * and bpf_jiffies64 is inlined by the verifier into one load. So each CPU
 * keeps the value with the jiffies it was read at, and asks the helper only
 * when jiffies has moved: once a tick, not once a packet.
 */
#ifndef L4LB_CLOCK_H
#define L4LB_CLOCK_H

#include "maps.h"

static __always_inline __u64 coarse_now(void)
{
	struct clock_copy *c;
	__u32 zero = 0;
	__u64 j = bpf_jiffies64();

	c = bpf_map_lookup_elem(&clock_cache, &zero);
	if (!c)
		return bpf_ktime_get_coarse_ns();
	/* ns is 0 only before this CPU's first read. */
	if (c->jiffies != j || !c->ns) {
		c->ns = bpf_ktime_get_coarse_ns();
		c->jiffies = j;
	}
	return c->ns;
}

#endif
