/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The flow hash and the Maglev table lookup.
 *
 * The flow hash is SipHash-2-4 keyed with the shared seed over the 40-byte
 * struct flow_key read as five little-endian 64-bit words. lb/maglev computes
 * the same function in Go (a test compares them), so every LB box, and
 * l4lbctl, picks the same backend for the same flow. Changing this function
 * moves every flow on every box: it must not change.
 */
#ifndef L4LB_MAGLEV_H
#define L4LB_MAGLEV_H

#include "config.h"
#include "maps.h"

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIP_ROUND(v0, v1, v2, v3)                                             \
	do {                                                                  \
		v0 += v1; v1 = SIP_ROTL(v1, 13); v1 ^= v0; v0 = SIP_ROTL(v0, 32); \
		v2 += v3; v3 = SIP_ROTL(v3, 16); v3 ^= v2;                    \
		v0 += v3; v3 = SIP_ROTL(v3, 21); v3 ^= v0;                    \
		v2 += v1; v1 = SIP_ROTL(v1, 17); v1 ^= v2; v2 = SIP_ROTL(v2, 32); \
	} while (0)

static __always_inline __u64 flow_hash(const struct flow_key *k)
{
	const __u64 *m = (const __u64 *)k;
	__u64 k0 = cfg_seed_k0, k1 = cfg_seed_k1;
	__u64 v0 = k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k1 ^ 0x7465646279746573ULL;
	/* Final block: message length (40) in the top byte, no tail bytes. */
	__u64 b = (__u64)sizeof(*k) << 56;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*k) / 8); i++) {
		__u64 mi = m[i];

		v3 ^= mi;
		SIP_ROUND(v0, v1, v2, v3);
		SIP_ROUND(v0, v1, v2, v3);
		v0 ^= mi;
	}
	v3 ^= b;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

/*
 * The backend id in svc_id's table for a flow hashing to hash, or 0 when the
 * service has no table or an empty one. random picks a uniformly random slot
 * instead (algorithm = "random").
 */
static __always_inline __u32 maglev_pick(__u32 svc_id, __u64 hash, int random)
{
	__u32 *chunk;
	__u32 zero = 0, slot, idx, size;
	void *table = bpf_map_lookup_elem(&maglev, &svc_id);

	if (!table)
		return 0;
	chunk = bpf_map_lookup_elem(table, &zero);
	if (!chunk)
		return 0;
	size = chunk[0];
	if (size == 0)
		return 0;
	if (random)
		slot = 1 + bpf_get_prandom_u32() % size;
	else
		slot = 1 + (__u32)(hash % size);
	idx = slot / MAGLEV_CHUNK;
	chunk = bpf_map_lookup_elem(table, &idx);
	if (!chunk)
		return 0;
	return chunk[slot & (MAGLEV_CHUNK - 1)];
}

#endif
