/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Source ranges: a service with L4LB_SVC_SOURCE_RANGES serves only clients
 * inside one of its prefixes, held in the LPM trie src_ranges under the
 * service's id (struct src_range_key). lb/datapath writes a service's
 * prefixes before the flag that makes them count and removes stale ones
 * after, so a packet never meets a half-written list.
 */
#ifndef L4LB_SRCRANGE_H
#define L4LB_SRCRANGE_H

#include "maps.h"

/* Bits of struct src_range_key after prefixlen: the id and the address. */
#define SRC_RANGE_BITS (32 + 128)

static __always_inline int source_allowed(__u32 svc_id, const __u8 addr[16])
{
	struct src_range_key k = {.prefixlen = SRC_RANGE_BITS, .svc_id = svc_id};

	copy16(k.addr, addr);
	return bpf_map_lookup_elem(&src_ranges, &k) != NULL;
}

#endif
