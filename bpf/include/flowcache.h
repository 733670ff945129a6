/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The flow cache: a per-CPU, direct-mapped copy of what the established
 * fast path needs to forward the flows a CPU forwards: the conntrack
 * entry's backend, service word and hash, the backend's entry and its
 * route from the next-hop cache, and a SNAT flow's binding port (which
 * only says where to look: snat_cached in snat.h).
 *
 * Why: a hash-map lookup is a call into the kernel (the hash, the bucket
 * walk, a memcmp of the 40-byte key), and each map an established packet
 * reads is another cache line, and another page, that a busy CPU may have
 * lost since the flow's last packet; on a guest whose TLB is flushed on
 * every kernel entry, each page touched costs more than the instructions
 * that touch it (docs/datapath.md). A hit reads one slot, inline, in place
 * of the connection table, svc_gen, backends, backend_routes and nexthops.
 * The cache is the exact-match cache of a software switch: one slot per
 * hash of the 5-tuple, holding the key.
 *
 * It never decides anything those maps would not. A slot is used only
 * while
 *   - it was filled from the conntrack entry less than CT_REFRESH_NS ago
 *     on this CPU, so the entry's last_seen and its LRU reference are
 *     still refreshed through a real lookup as often as before;
 *   - flow_cache_gen is what it was at the fill: the control plane bumps it
 *     after it deletes conntrack entries (conntrack flush) and after every
 *     write to svc_gen, backends, backend_routes and nexthops, so a changed
 *     service, a drained, disabled or removed backend, a new next hop or
 *     MTU reaches the next packet exactly as it would without the cache;
 *   - the packet is no TCP SYN, FIN or RST, which take the real lookup to
 *     keep the entry's closing flag.
 * The generation is read before anything it guards, so a slot filled
 * from maps the control plane was changing carries the generation before
 * the change and is never used after it. Slots are per CPU, so no other
 * CPU writes them; a slot taken by another flow is a miss.
 */
#ifndef L4LB_FLOWCACHE_H
#define L4LB_FLOWCACHE_H

#include "conntrack.h"
#include "ctfilter.h"

_Static_assert((L4LB_FLOW_CACHE_SLOTS & (L4LB_FLOW_CACHE_SLOTS - 1)) == 0, "flow_cache_slot masks");

/* The slot of a key in this CPU's cache, by its flow_key_mix (ctfilter.h;
 * not the flow hash, which a miss would pay for). */
static __always_inline struct flow_cache_entry *flow_cache_slot(__u64 mix)
{
	__u32 idx = (__u32)(mix >> 40) & (L4LB_FLOW_CACHE_SLOTS - 1);

	return bpf_map_lookup_elem(&flow_cache, &idx);
}

/* The current generation (see above); read once per packet, first. */
static __always_inline __u32 flow_cache_gen_now(void)
{
	__u32 zero = 0;
	__u32 *g = bpf_map_lookup_elem(&flow_cache_gen, &zero);

	return g ? *(volatile __u32 *)g : 0;
}

static __always_inline int flow_key_eq(const struct flow_key *a, const struct flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4])) == 0;
}

/* May p's flow be forwarded from the cache at all? A SYN, FIN or RST
 * goes to the connection table (see above); asked before the slot is read,
 * so that new flows' SYNs do not pay for reading it. */
static __always_inline int flow_cache_may(const struct packet *p)
{
	return p->key.proto != IPPROTO_TCP || !(p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST));
}

/* Does fc hold p's flow, still usable at now under generation gen? */
static __always_inline int flow_cache_hit(const struct flow_cache_entry *fc, const struct packet *p, __u64 now,
					  __u32 gen)
{
	if (!fc->backend_id || fc->gen != gen || now - fc->filled >= CT_REFRESH_NS)
		return 0;
	return flow_key_eq(&fc->key, &p->key);
}

/* Fill fc from the conntrack entry ct of p's flow, which ct_established
 * accepted under word with backend be; the route follows once
 * route_to_backend resolves it (nexthop.h). */
static __always_inline void flow_cache_fill(struct flow_cache_entry *fc, const struct packet *p,
					    const struct ct_value *ct, const struct backend *be, __u32 word,
					    __u64 now, __u32 gen)
{
	fc->key = p->key;
	fc->filled = now;
	fc->be = *be;
	fc->backend_id = L4LB_CT_ID(ct->backend_id);
	fc->svc_id = ct->svc_id;
	fc->svc_word = word;
	fc->hash = ct->hash;
	fc->gen = gen;
	fc->route_ok = 0;
	fc->snat_ok = 0;
}

#endif
