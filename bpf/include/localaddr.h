/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The box's own addresses as a source. The kernel refuses to route a
 * received packet whose source is one of its own addresses (a martian:
 * fib_validate_source's IP_LOCAL_SOURCE, and likewise for IPv6 once the
 * reply would loop back); under SNAT such a client would make the LB bind a
 * flow to itself. The LB refuses them too (pass_local_source): the SNAT
 * addresses are load-time constants (config.h), the VIPs and the attached
 * interfaces' addresses are in local_addrs, kept by l4lbd.
 *
 * Checked where a flow is balanced (a connection-table miss) and on ICMP
 * errors, not on the established path: a flow gets its entry only after
 * this check, so no entry has a local source, and established packets pay
 * nothing for it.
 */
#ifndef L4LB_LOCALADDR_H
#define L4LB_LOCALADDR_H

#include "maps.h"
#include "snat.h"

static __always_inline int local_source(__u8 family, const __u8 src[16])
{
	if (snat_addr_is(family, src))
		return 1;
	return bpf_map_lookup_elem(&local_addrs, src) != NULL;
}

#endif
