/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Next hop and transmit: bpf_fib_lookup for the egress interface, MACs and
 * MTU; out of the egress interface (XDP_TX, devmap redirect or tc redirect,
 * see hook.h). An unresolved neighbour sends the (already rewritten) packet
 * to the stack, which resolves it and forwards; l4lbd keeps the neighbours
 * of all backends resolved so steady-state traffic never takes that path.
 */
#ifndef L4LB_FORWARD_H
#define L4LB_FORWARD_H

#include "hook.h"
#include "maps.h"
#include "parse.h"

struct route {
	__u32 ifindex;
	__u16 mtu; /* of the egress interface, when the lookup says the packet is too big */
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	int no_neigh;
};

/*
 * Look up the route for a packet from src to dst (16-byte form) whose L3
 * length will be tot_len once rewritten. Returns -1 and fills rt when the
 * packet can go out, or the enum l4lb_reason for why not; for
 * L4LB_R_DROP_FRAG_NEEDED rt->mtu holds the egress MTU.
 *
 * The kernel checks the length it is given against the route's MTU: at XDP
 * tot_len; at tc seg_len (what one segment's L3 length will be), since the
 * packet may be a GSO super-packet whose segments fit although its length
 * does not. A length of 0 would make the kernel check the skb as it is now
 * instead, which is not what leaves: too big for a packet about to be
 * encapsulated, and for an ICMP answer about to replace it (a jumbo frame
 * in, 1500 out, would get no answer at tc).
 */
static __always_inline int route_lookup(const struct hook *h, __u8 family, const __u8 src[16],
					const __u8 dst[16], __u16 tot_len, __u32 seg_len, struct route *rt)
{
	struct bpf_fib_lookup fib = {};
	long rc;

	fib.ifindex = hook_ifindex(h);
	fib.tot_len = h->xdp ? tot_len : (seg_len > 0xffff ? 0xffff : seg_len);
	if (family == 4) {
		fib.family = AF_INET;
		fib.ipv4_src = addr_to_v4(src);
		fib.ipv4_dst = addr_to_v4(dst);
	} else {
		fib.family = AF_INET6;
		copy16(fib.ipv6_src, src);
		copy16(fib.ipv6_dst, dst);
	}
	rc = bpf_fib_lookup(h->ctx, &fib, sizeof(fib), 0);
	rt->no_neigh = 0;
	rt->mtu = 0;
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		break;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		rt->no_neigh = 1;
		return -1;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		rt->mtu = fib.mtu_result;
		return L4LB_R_DROP_FRAG_NEEDED;
	default:
		return L4LB_R_DROP_NO_ROUTE;
	}
	rt->ifindex = fib.ifindex;
	__builtin_memcpy(rt->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(rt->dmac, fib.dmac, ETH_ALEN);
	return -1;
}

/* Drop Ethernet padding (or any bytes) after the IP packet, so that a
 * forwarded packet is exactly what its IP header says: inside a tunnel,
 * and out of a rewrite alike. */
static __always_inline int trim_to_l3(const struct hook *h, const struct packet *p)
{
	if (hook_trim(h, (__u32)p->l3_off + p->l3_len))
		return L4LB_R_DROP_ENCAP;
	return -1;
}

/*
 * Send the frame along rt. Its Ethernet header must be in place; only the
 * MACs are written here, and only when the frame leaves directly: a frame
 * handed to the stack keeps the MACs it arrived with, because the stack
 * drops a frame not addressed to the interface. *reason is set when the
 * packet took the stack's slow path.
 */
static __always_inline int transmit(const struct hook *h, const struct route *rt, int *reason)
{
	void *data, *data_end;
	struct ethhdr *eth;
	int ret, not_sent;

	if (rt->no_neigh) {
		*reason = L4LB_R_PASS_NO_NEIGH;
		return hook_pass(h);
	}
	/* The redirect happens after the program returns, so the MACs can
	 * still be written below. */
	ret = hook_redirect(h, rt->ifindex, &not_sent);
	if (not_sent) {
		*reason = L4LB_R_PASS_NO_TX_PORT;
		return hook_pass(h);
	}
	data = hook_data(h);
	data_end = hook_data_end(h);
	eth = data;
	if ((void *)(eth + 1) > data_end) {
		*reason = L4LB_R_DROP_ENCAP;
		return hook_drop(h);
	}
	__builtin_memcpy(eth->h_dest, rt->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, rt->smac, ETH_ALEN);
	return ret;
}

#endif
