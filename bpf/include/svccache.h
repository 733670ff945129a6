/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The service cache: a per-CPU, direct-mapped copy of the service entries
 * the packets a CPU balances look up, in front of the services hash map.
 *
 * Why: every packet the flow cache does not forward (a new flow, an
 * established one whose slot was taken or is a second old) looks its
 * service up, and a hash-map lookup is a bucket in one large allocation and
 * an element in another: two pages that, on a guest whose TLB is flushed
 * on every kernel entry, cost more than the lookup's instructions
 * (docs/datapath.md). A hit reads one slot of a small per-CPU array,
 * inline. Traffic goes to a few frontends far more often than to the rest,
 * so a small cache holds most of what is looked up.
 *
 * It never decides anything the map would not. A slot is used only while
 *   - flow_cache_gen is what it was when the slot was filled: the control
 *     plane bumps it after every write to the services map, so a changed,
 *     added or removed service reaches the next packet as it would without
 *     the cache. The generation is read before anything it guards (lb.c),
 *     so a slot filled from an entry the control plane was changing
 *     carries the generation before the change and is never used after it;
 *   - it was filled less than CT_REFRESH_NS ago, which bounds what a bump
 *     the control plane failed to make can leave behind to a second, as
 *     for the flow cache.
 * A frontend without an entry is not cached: the frontend filter turns
 * most such packets away before they get here.
 */
#ifndef L4LB_SVCCACHE_H
#define L4LB_SVCCACHE_H

#include "conntrack.h"
#include "maps.h"
#include "parse.h"

_Static_assert(L4LB_SVC_CACHE_SLOTS == 1 << L4LB_SVC_CACHE_SHIFT, "svc_cache_slot shifts");

/*
 * The service entry of p's frontend (destination, port, protocol), from
 * this CPU's cache when its slot holds it under generation gen (and was
 * filled less than CT_REFRESH_NS before now), else from the services map
 * (and the slot then holds it). NULL: no service.
 */
static __always_inline struct svc_value *svc_lookup(const struct packet *p, __u64 now, __u32 gen)
{
	const __u64 *d = (const __u64 *)p->key.dst;
	__u64 x = (d[0] ^ d[1] ^ ((__u64)p->key.dport << 8 | p->key.proto)) * 0x9e3779b97f4a7c15ULL;
	__u32 idx = (__u32)(x >> (64 - L4LB_SVC_CACHE_SHIFT));
	struct svc_cache_entry *e = bpf_map_lookup_elem(&svc_cache, &idx);
	struct svc_value *v;

	if (e && e->used && e->gen == gen && now - e->filled < CT_REFRESH_NS && e->port == p->key.dport &&
	    e->proto == p->key.proto && ((const __u64 *)e->addr)[0] == d[0] && ((const __u64 *)e->addr)[1] == d[1])
		return &e->val;
	{
		/* Only a miss builds the map's key. */
		struct svc_key sk = {};

		svc_key_of(&sk, &p->key);
		v = bpf_map_lookup_elem(&services, &sk);
	}
	if (v && e) {
		copy16(e->addr, p->key.dst);
		e->port = p->key.dport;
		e->proto = p->key.proto;
		e->gen = gen;
		e->filled = now;
		e->val = *v;
		e->used = 1;
	}
	return v;
}

#endif
