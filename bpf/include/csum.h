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

#endif
