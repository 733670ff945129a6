/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Internet checksum helpers (RFC 1071, incremental updates per RFC 1624). */
#ifndef L4LB_CSUM_H
#define L4LB_CSUM_H

#include "common.h"

/* Fold a 64-bit one's-complement accumulator into 16 bits. */
static __always_inline __u16 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* Header checksum of a 20-byte IPv4 header whose check field is zero. */
static __always_inline __sum16 ipv4_hdr_csum(const struct iphdr *iph)
{
	const __u16 *w = (const __u16 *)iph;
	__u64 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*iph) / 2); i++)
		sum += w[i];
	return (__sum16)~csum_fold64(sum);
}

/*
 * Incremental updates (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')). Accumulate
 * the delta of every changed field with csum_delta16/32 (network-order
 * values as loaded), then apply the sum once with csum_apply_delta. The
 * delta is order- and word-size-independent, so 16- and 32-bit fields mix.
 */
static __always_inline __u64 csum_delta16(__u16 old, __u16 new)
{
	return (__u64)(__u16)~old + new;
}

static __always_inline __u64 csum_delta32(__u32 old, __u32 new)
{
	return (__u64)(__u32)~old + new;
}

static __always_inline __sum16 csum_apply_delta(__sum16 check, __u64 delta)
{
	return (__sum16)~csum_fold64((__u64)(__u16)~check + delta);
}

#endif
