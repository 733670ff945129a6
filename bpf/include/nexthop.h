/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The route to a backend from the control plane's next-hop cache: the
 * backend's backend_routes entry names up to L4LB_NH_PATHS next hops (ECMP;
 * a flow keeps one, picked by its hash) and the route's MTU; each next hop
 * has the MACs and the egress interface. lb/datapath resolves them from
 * the kernel's routes, neighbours and links and rewrites them on every
 * netlink change. A backend without a usable entry (not resolved yet, no
 * neighbour MAC) takes bpf_fib_lookup, counted as event fib_fallback,
 * which also hands the packet to the stack when the neighbour is unknown.
 */
#ifndef L4LB_NEXTHOP_H
#define L4LB_NEXTHOP_H

#include "conntrack.h"
#include "forward.h"
#include "stats.h"

_Static_assert((L4LB_NH_PATHS & (L4LB_NH_PATHS - 1)) == 0, "route_to_backend masks with L4LB_NH_PATHS - 1");

/*
 * As route_lookup (forward.h), for a packet from src to sel's backend,
 * its ECMP path picked by sel's flow hash. An established flow's route
 * comes from its flow-cache slot (sel->fc) when the slot holds one, and is
 * written there when the next-hop cache resolves it (flowcache.h); one
 * that took bpf_fib_lookup is not cached, so it is asked again.
 */
static __always_inline int route_to_backend(const struct hook *h, __u8 family, const __u8 src[16],
					 const struct selection *sel, __u16 tot_len, __u32 seg_len, struct route *rt)
{
	struct flow_cache_entry *fc = sel->fc;
	__u32 backend_id = sel->backend_id, n, i, mtu;
	struct backend_route *bn;
	struct nexthop *nh;

	if (fc && fc->route_ok) {
		mtu = fc->mtu;
		rt->ifindex = fc->ifindex;
		__builtin_memcpy(rt->smac, fc->smac, ETH_ALEN);
		__builtin_memcpy(rt->dmac, fc->dmac, ETH_ALEN);
		goto mtu;
	}
	bn = bpf_map_lookup_elem(&backend_routes, &backend_id);
	if (!bn)
		goto fib;
	n = bn->count;
	if (!n)
		goto fib;
	i = n == 1 ? 0 : (__u32)(((__u64)sel->hash * n) >> 32);
	i &= L4LB_NH_PATHS - 1;
	nh = bpf_map_lookup_elem(&nexthops, &bn->ids[i]);
	if (!nh || !(nh->flags & L4LB_NH_VALID))
		goto fib;
	mtu = bn->mtu;
	rt->ifindex = nh->ifindex;
	__builtin_memcpy(rt->smac, nh->smac, ETH_ALEN);
	__builtin_memcpy(rt->dmac, nh->dmac, ETH_ALEN);
	if (fc) {
		fc->ifindex = nh->ifindex;
		fc->mtu = mtu;
		__builtin_memcpy(fc->smac, nh->smac, ETH_ALEN);
		__builtin_memcpy(fc->dmac, nh->dmac, ETH_ALEN);
		fc->route_ok = 1;
	}
mtu:
	rt->no_neigh = 0;
	if (seg_len > mtu) {
		rt->mtu = mtu;
		return L4LB_R_DROP_FRAG_NEEDED;
	}
	rt->mtu = 0;
	return -1;
fib:
	count_event(L4LB_E_FIB_FALLBACK);
	return route_lookup(h, family, src, sel->be->addr, tot_len, seg_len, rt);
}

#endif
