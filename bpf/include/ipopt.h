/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * DSR dispatch opt: the LB rewrites the destination to the backend's address
 * and port, and names the frontend the client addressed in an IP option: the
 * IPv4 option L4LB_IPV4_OPT_TYPE right after the base header, or an IPv6
 * destination-options header right after the IPv6 header (layouts in
 * types.h). The backend's companion remembers the flow from the option and
 * gives the replies the VIP:port as their source.
 *
 * A TCP flow carries the option on its SYN only: the companion keeps the
 * flow from there, and segments stay free of per-packet growth (no MSS or
 * MTU cost after the handshake). UDP has no handshake, so every datagram
 * carries it: any one of them may be the first the companion sees.
 * Checksums are updated incrementally, never recomputed.
 */
#ifndef L4LB_IPOPT_H
#define L4LB_IPOPT_H

#include "csum.h"
#include "hook.h"
#include "parse.h"

/* IPv4 header length limit (IHL 15). */
#define IPV4_HLEN_MAX 60

/* Bytes the opt dispatch inserts into p: the option on a UDP datagram or a
 * TCP SYN, otherwise none. */
static __always_inline __u32 opt_len(const struct packet *p)
{
	if (p->key.proto == IPPROTO_TCP &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
		return 0;
	return p->family == 4 ? sizeof(struct l4lb_ipv4_opt) : sizeof(struct l4lb_ipv6_dstopt);
}

/*
 * L4LB_R_DROP_OPT_NO_ROOM when len bytes of option have no place in p: an
 * IPv4 header whose options leave less room than that (IHL would exceed 15),
 * or an IPv6 packet that starts with a hop-by-hop header, which must stay
 * first. Otherwise -1. p's frame starts with an untagged Ethernet header.
 */
static __always_inline int opt_room(const struct hook *h, const struct packet *p, __u32 len)
{
	struct ipv6hdr *ip6h;

	if (!len)
		return -1;
	if (p->family == 4)
		return (__u32)(p->l4_off - p->l3_off) + len > IPV4_HLEN_MAX ? L4LB_R_DROP_OPT_NO_ROOM : -1;
	if (p->l4_off == p->l3_off + sizeof(struct ipv6hdr))
		return -1;
	ip6h = hook_data(h) + ETH_HLEN;
	if ((void *)(ip6h + 1) > hook_data_end(h))
		return L4LB_R_DROP_ENCAP;
	return ip6h->nexthdr == IPPROTO_HOPOPTS ? L4LB_R_DROP_OPT_NO_ROOM : -1;
}

/*
 * Rewrite p for backend be: destination address and port, and with len not
 * 0 the option (opt_len) inserted after the base IP header. p's frame starts
 * with an untagged Ethernet header and opt_room has accepted it. Returns -1,
 * or the reason for failing.
 */
static __always_inline int opt_rewrite(const struct hook *h, const struct packet *p,
				       const struct backend *be, __u32 len)
{
	__u32 l4_off = (__u32)p->l4_off + len;
	__u32 check_off = l4_off + (p->key.proto == IPPROTO_TCP ? 16 : 6);
	__u64 mangled = p->key.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u64 addr_delta = 0, port_delta;
	void *data, *data_end;
	__be16 *dport;

	if (len && hook_grow(h, ETH_HLEN + (p->family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)),
			     len, BPF_F_ADJ_ROOM_FIXED_GSO))
		return L4LB_R_DROP_ENCAP;
	data = hook_data(h);
	data_end = hook_data_end(h);

	if (p->family == 4) {
		struct iphdr *iph = data + ETH_HLEN;
		__be32 daddr = addr_to_v4(be->addr);
		__u64 ip_delta = 0;

		if ((void *)(iph + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
		if (len) {
			struct l4lb_ipv4_opt *o = (void *)(iph + 1);
			__u16 first = *(__u16 *)iph; /* version, IHL, TOS */
			__be16 tot_len = bpf_htons(p->l3_len + sizeof(*o));

			if ((void *)(o + 1) > data_end)
				return L4LB_R_DROP_ENCAP;
			o->type = L4LB_IPV4_OPT_TYPE;
			o->len = sizeof(*o);
			o->port = p->key.dport;
			o->vip = addr_to_v4(p->key.dst);
			iph->ihl += sizeof(*o) / 4;
			ip_delta += csum_delta16(first, *(__u16 *)iph);
			ip_delta += csum_delta16(iph->tot_len, tot_len);
			iph->tot_len = tot_len;
			/* New words: only their sum counts. */
			ip_delta += (__u64)((__u32 *)o)[0] + ((__u32 *)o)[1];
		}
		addr_delta = csum_delta32(iph->daddr, daddr);
		iph->daddr = daddr;
		iph->check = csum_apply_delta(iph->check, ip_delta + addr_delta);
	} else {
		struct ipv6hdr *ip6h = data + ETH_HLEN;
		const __u32 *to = (const __u32 *)be->addr;
		__u32 *from;

		if ((void *)(ip6h + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
		if (len) {
			struct l4lb_ipv6_dstopt *o = (void *)(ip6h + 1);

			if ((void *)(o + 1) > data_end)
				return L4LB_R_DROP_ENCAP;
			o->nexthdr = ip6h->nexthdr;
			o->hdrlen = sizeof(*o) / 8 - 1;
			o->pad_type = 1; /* PadN */
			o->pad_len = 0;
			o->opt_type = L4LB_IPV6_OPT_TYPE;
			o->opt_len = sizeof(*o) - 6;
			o->port = p->key.dport;
			copy16(o->vip, p->key.dst);
			ip6h->nexthdr = IPPROTO_DSTOPTS;
			ip6h->payload_len = bpf_htons(p->l3_len - sizeof(*ip6h) + sizeof(*o));
		}
		/* The upper-layer length and next header of the pseudo-header
		 * do not change: only the destination does. */
		from = (__u32 *)&ip6h->daddr;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			addr_delta += csum_delta32(from[i], to[i]);
			from[i] = to[i];
		}
	}

	if (l4_off > HOOK_CSUM_OFF_MAX)
		return L4LB_R_DROP_ENCAP;
	dport = data + l4_off + 2;
	barrier_var(dport);
	if ((void *)(dport + 1) > data_end)
		return L4LB_R_DROP_ENCAP;
	port_delta = csum_delta16(*dport, be->port);
	*dport = be->port;
	if (hook_l4_csum_update(h, check_off, addr_delta, BPF_F_PSEUDO_HDR | mangled) ||
	    hook_l4_csum_update(h, check_off, port_delta, mangled))
		return L4LB_R_DROP_ENCAP;
	return -1;
}

#endif
