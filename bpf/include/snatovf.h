/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The SNAT overflow mark: whether the overflow binding tables (snat.h) may
 * hold a live binding, so that new SNAT flows look in them only then.
 */
#ifndef L4LB_SNATOVF_H
#define L4LB_SNATOVF_H

#include "config.h"
#include "maps.h"

/*
 * Are the overflow tables worth a look at now? Every packet that makes or
 * uses an overflow binding brings snat_ovf_seen to within
 * SNAT_OVF_MARK_NS of its now, and a binding is dead once its timeout has
 * passed since it was last used. So none can be alive at now unless the
 * mark is less than the longest timeout ago, plus the mark's lateness and
 * the clock skew between CPUs (a tick). 0: no overflow binding was ever
 * made (the coarse clock is never 0). Outside a flood this skips two
 * lookups on every new SNAT flow, each in a random bucket of a large
 * table (docs/datapath.md).
 *
 * The order keeps it exact across CPUs: a CPU marks before it inserts an
 * overflow binding, and one that inserted into the main table reads the
 * mark after its insert (snat_claim); the inserts are locked operations.
 * So of two CPUs claiming one port in different sets, at least one sees
 * the other's claim, as without the mark.
 */
#define SNAT_OVF_MARK_NS 1000000000ULL
#define SNAT_OVF_SLACK_NS 2000000000ULL

static __always_inline int snat_ovf_maybe(__u64 now)
{
	__u64 longest = cfg_snat_tcp_ns, seen, *m;
	__u32 zero = 0;

	if (cfg_snat_tcp_closing_ns > longest)
		longest = cfg_snat_tcp_closing_ns;
	if (cfg_snat_udp_ns > longest)
		longest = cfg_snat_udp_ns;
	m = bpf_map_lookup_elem(&snat_ovf_seen, &zero);
	if (!m)
		return 1;
	seen = *(volatile __u64 *)m;
	return seen && (now <= seen || now - seen <= longest + SNAT_OVF_SLACK_NS);
}

/* A packet makes or uses an overflow binding at now (see snat_ovf_maybe). */
static __always_inline void snat_ovf_mark(__u64 now)
{
	__u32 zero = 0;
	__u64 *m = bpf_map_lookup_elem(&snat_ovf_seen, &zero);
	__u64 seen;

	if (!m)
		return;
	/* Written once a second at most: every CPU reads it. A mark ahead
	 * of now (another CPU's tick, or lb/datapath's ~0) stays. */
	seen = *(volatile __u64 *)m;
	if (seen < now && now - seen > SNAT_OVF_MARK_NS)
		*(volatile __u64 *)m = now;
}

#endif
