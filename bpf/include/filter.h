/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The frontend filter: a Bloom filter over (VIP, port, protocol) in the
 * vip_filter array, kept by lb/datapath (filter.go computes the same hash).
 * A frontend sets two bits of one 64-bit word. A packet whose destination
 * finds either bit clear is to no frontend: it skips the connection and
 * service lookups, so traffic to the box itself, and through it, pays one
 * array read instead of a hash lookup. A packet that finds both set may
 * still be to no frontend (about 1% at the sizes lb/datapath picks); the
 * service lookup then says so.
 */
#ifndef L4LB_FILTER_H
#define L4LB_FILTER_H

#include "config.h"
#include "maps.h"

static __always_inline int vip_maybe(const struct flow_key *k)
{
	const __u32 *a = (const __u32 *)k->dst;
	__u64 x = ((__u64)(a[0] ^ a[2]) << 32) | (a[1] ^ a[3]);
	__u64 *w, bits;
	__u32 idx;

	x ^= ((__u64)k->dport << 8) | k->proto;
	x *= L4LB_FILTER_MUL;
	idx = (__u32)(x >> 32) & cfg_vip_filter_mask;
	w = bpf_map_lookup_elem(&vip_filter, &idx);
	if (!w)
		return 1;
	bits = (1ULL << ((x >> 20) & 63)) | (1ULL << ((x >> 26) & 63));
	return (*w & bits) == bits;
}

#endif
