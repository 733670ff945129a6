/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Next hop and transmit: bpf_fib_lookup for the egress interface, MACs and
 * MTU; XDP_TX when the egress is the ingress interface, a devmap redirect
 * otherwise. An unresolved neighbour sends the (already rewritten) packet to
 * the stack, which resolves it and forwards; l4lbd keeps the neighbours of
 * all backends resolved so steady-state traffic never takes that path.
 */
#ifndef L4LB_FORWARD_H
#define L4LB_FORWARD_H

#include "maps.h"

struct route {
	__u32 ifindex;
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	int no_neigh;
};

/*
 * Look up the route for a packet of tot_len bytes (L3) from src to dst (both
 * in the family's network-order form). Returns -1 and fills rt when the
 * packet can go out, or the enum l4lb_reason for why not.
 */
static __always_inline int route_lookup(struct xdp_md *ctx, __u8 family, const __u8 src[16],
					const __u8 dst[16], __u16 tot_len, struct route *rt)
{
	struct bpf_fib_lookup fib = {};
	long rc;

	fib.ifindex = ctx->ingress_ifindex;
	fib.tot_len = tot_len;
	if (family == 4) {
		fib.family = AF_INET;
		fib.ipv4_src = addr_to_v4(src);
		fib.ipv4_dst = addr_to_v4(dst);
	} else {
		fib.family = AF_INET6;
		copy16(fib.ipv6_src, src);
		copy16(fib.ipv6_dst, dst);
	}
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	rt->no_neigh = 0;
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		break;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		rt->no_neigh = 1;
		return -1;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		return L4LB_R_DROP_FRAG_NEEDED;
	default:
		return L4LB_R_DROP_NO_ROUTE;
	}
	rt->ifindex = fib.ifindex;
	__builtin_memcpy(rt->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(rt->dmac, fib.dmac, ETH_ALEN);
	return -1;
}

/*
 * Send the frame at ctx along rt. Its Ethernet header must be in place;
 * only the MACs are written here, and only when the frame leaves by XDP: a
 * frame handed to the stack keeps the MACs it arrived with, because the
 * stack drops a frame not addressed to the interface. *reason is set when
 * the packet took the stack's slow path.
 */
static __always_inline int transmit(struct xdp_md *ctx, const struct route *rt, int *reason)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	long ret = XDP_TX;

	if (rt->no_neigh) {
		*reason = L4LB_R_PASS_NO_NEIGH;
		return XDP_PASS;
	}
	if ((void *)(eth + 1) > data_end) {
		*reason = L4LB_R_DROP_ENCAP;
		return XDP_DROP;
	}
	if (rt->ifindex != ctx->ingress_ifindex) {
		/* The redirect happens after the program returns, so the
		 * MACs can still be written below. */
		ret = bpf_redirect_map(&tx_ports, rt->ifindex, XDP_PASS);
		if (ret == XDP_PASS) {
			*reason = L4LB_R_PASS_NO_TX_PORT;
			return XDP_PASS;
		}
	}
	__builtin_memcpy(eth->h_dest, rt->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, rt->smac, ETH_ALEN);
	return ret;
}

#endif
