/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * DSR encapsulation: IPv4-in-IPv4 and IPv6-in-IPv6 (RFC 2003, RFC 2473), and
 * Geneve (RFC 8926) over UDP.
 *
 * The inner packet is left exactly as the client sent it (TTL included: the
 * LB is not a router hop for the client). The outer header copies the inner
 * TOS / traffic class (so DSCP and ECN survive, RFC 6040 normal mode) and,
 * for IPv4, the DF bit and the identification. Its source is picked from the
 * flow hash inside a configured prefix (see config.h) so that backends can
 * spread flows over receive queues; its destination is the backend.
 *
 * Geneve puts UDP and a Geneve header with the l4lb option (struct
 * l4lb_geneve: the frontend's VIP and port) between the outer IP header and
 * the client's packet, with no inner Ethernet header. The UDP source port
 * comes from the flow hash, for receivers that spread flows by ports. The
 * UDP checksum is 0: RFC 768 allows it for IPv4, and RFC 6935/6936 for IPv6
 * tunnels whose receiver is set up to accept it. Ours is: the only receiver
 * is the l4lb companion, which removes the outer headers at tc ingress
 * before the stack would validate them, and the client's packet keeps its
 * own checksums end to end.
 */
#ifndef L4LB_ENCAP_H
#define L4LB_ENCAP_H

#include "config.h"
#include "csum.h"
#include "forward.h"
#include "hook.h"
#include "parse.h"

/* Outer source address for a flow with this hash, in the 16-byte form. */
static __always_inline void encap_source(__u8 family, __u32 hash, __u8 out[16])
{
	if (family == 4) {
		__u32 host = hash & cfg_encap_src4_host_mask;

		addr_from_v4(out, cfg_encap_src4 | bpf_htonl(host));
	} else {
		const volatile __u32 *base = (const volatile __u32 *)cfg_encap_src6;
		__u32 *w = (__u32 *)out;
		__u32 host = hash & cfg_encap_src6_host_mask;

		w[0] = base[0];
		w[1] = base[1];
		w[2] = base[2];
		w[3] = base[3] | bpf_htonl(host);
	}
}

/* UDP and Geneve headers between the outer IP header and the client's packet. */
#define GENEVE_HLEN (sizeof(struct udphdr) + sizeof(struct l4lb_geneve))

/* Bytes each encapsulation adds to a packet of the family. */
static __always_inline __u32 ipip_overhead(__u8 family)
{
	return family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
}

static __always_inline __u32 geneve_overhead(__u8 family)
{
	return ipip_overhead(family) + GENEVE_HLEN;
}

/*
 * Put an outer IP header with protocol proto, followed by extra bytes of
 * room for the caller's headers, in front of the IP packet of p (which must
 * start right after an untagged Ethernet header). Returns -1 on success or the reason for failing.
 *
 * XDP grows the head by the new headers in one bpf_xdp_adjust_head and
 * writes the outer header in place from values computed in registers (its
 * IPv4 checksum summed from them, not read back). The MACs the frame came
 * with go in front again (three words kept in registers): transmit
 * overwrites them with rt's when the frame leaves directly, and a frame it
 * hands to the stack (neighbour unresolved, egress not in tx_ports) must
 * still be addressed to this interface or the stack drops it as
 * PACKET_OTHERHOST. tc asks bpf_skb_adjust_room, which keeps the
 * Ethernet header and marks the skb as encapsulated (tc_flags adds the L4
 * tunnel type) so that GSO packets are segmented right later.
 */
static __always_inline int encap_push(const struct hook *h, const struct packet *p,
				      const __u8 src[16], const __u8 dst[16], __u32 hash,
				      __u8 proto, int extra, __u64 tc_flags)
{
	int hdr = p->family == 4 ? (int)sizeof(struct iphdr) : (int)sizeof(struct ipv6hdr);
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | tc_flags |
		      (p->family == 4 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV6);
	void *data, *data_end;
	__u32 mac0 = 0, mac1 = 0, mac2 = 0;
	__be16 inner_id = 0;

	if (trim_to_l3(h, p) >= 0)
		return L4LB_R_DROP_ENCAP;
	data = hook_data(h);
	data_end = hook_data_end(h);
	if (data + ETH_HLEN + sizeof(struct iphdr) > data_end)
		return L4LB_R_DROP_ENCAP;
	if (p->family == 4)
		inner_id = ((struct iphdr *)(data + ETH_HLEN))->id;
	if (h->xdp) {
		mac0 = ((__u32 *)data)[0];
		mac1 = ((__u32 *)data)[1];
		mac2 = ((__u32 *)data)[2];
		if (bpf_xdp_adjust_head(hook_xdp(h), -(hdr + extra)))
			return L4LB_R_DROP_ENCAP;
	} else if (bpf_skb_adjust_room(hook_skb(h), hdr + extra, BPF_ADJ_ROOM_MAC, flags)) {
		return L4LB_R_DROP_ENCAP;
	}
	data = hook_data(h);
	data_end = hook_data_end(h);

	if (p->family == 4) {
		struct iphdr *outer = data + ETH_HLEN;
		__u32 *w = (__u32 *)outer;
		__u32 w0, w1, w2;
		__u64 sum;

		if ((void *)(outer + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
		if (h->xdp) {
			((__u32 *)data)[0] = mac0;
			((__u32 *)data)[1] = mac1;
			((__u32 *)data)[2] = mac2;
		}
		((struct ethhdr *)data)->h_proto = bpf_htons(ETH_P_IP);
		/* Words as stored (the bytes of each field in network
		 * order): version/IHL, TOS, total length; identification
		 * (the inner one), flags (DF copied); TTL, protocol, checksum. */
		w0 = 0x45 | (__u32)p->tos << 8 | (__u32)bpf_htons(p->l3_len + sizeof(*outer) + extra) << 16;
		w1 = (__u32)inner_id | (__u32)p->frag_df << 16;
		w2 = (__u32)cfg_encap_ttl | (__u32)proto << 8;
		sum = (__u64)w0 + w1 + w2 + addr_to_v4(src) + addr_to_v4(dst);
		w[0] = w0;
		w[1] = w1;
		w[2] = w2 | (__u32)(__u16)~csum_fold64(sum) << 16;
		w[3] = addr_to_v4(src);
		w[4] = addr_to_v4(dst);
	} else {
		struct ipv6hdr *outer = data + ETH_HLEN;
		__u32 *w = (__u32 *)outer;
		const __u32 *s = (const __u32 *)src, *d = (const __u32 *)dst;

		if ((void *)(outer + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
		if (h->xdp) {
			((__u32 *)data)[0] = mac0;
			((__u32 *)data)[1] = mac1;
			((__u32 *)data)[2] = mac2;
		}
		((struct ethhdr *)data)->h_proto = bpf_htons(ETH_P_IPV6);
		/* Version 6, the inner traffic class, the flow hash's low 20
		 * bits as the flow label; payload length, next header, hop
		 * limit. */
		w[0] = bpf_htonl(6U << 28 | (__u32)p->tos << 20 | (hash & 0xfffff));
		w[1] = (__u32)bpf_htons(p->l3_len + extra) | (__u32)proto << 16 | (__u32)cfg_encap_ttl << 24;
		w[2] = s[0];
		w[3] = s[1];
		w[4] = s[2];
		w[5] = s[3];
		w[6] = d[0];
		w[7] = d[1];
		w[8] = d[2];
		w[9] = d[3];
	}
	return -1;
}

/* IPIP: the outer IP header straight in front of the client's packet. */
static __always_inline int encap_ipip(const struct hook *h, const struct packet *p,
				      const __u8 src[16], const __u8 dst[16], __u32 hash)
{
	return encap_push(h, p, src, dst, hash, p->family == 4 ? IPPROTO_IPIP : IPPROTO_IPV6, 0, 0);
}

/* Geneve: outer IP / UDP / Geneve with the l4lb option naming p's frontend. */
static __always_inline int encap_geneve(const struct hook *h, const struct packet *p,
					const __u8 src[16], const __u8 dst[16], __u32 hash)
{
	struct l4lb_geneve *g;
	void *data, *data_end;
	struct udphdr *uh;
	int r;

	r = encap_push(h, p, src, dst, hash, IPPROTO_UDP, GENEVE_HLEN, BPF_F_ADJ_ROOM_ENCAP_L4_UDP);
	if (r >= 0)
		return r;
	data = hook_data(h);
	data_end = hook_data_end(h);
	if (p->family == 4)
		uh = data + ETH_HLEN + sizeof(struct iphdr);
	else
		uh = data + ETH_HLEN + sizeof(struct ipv6hdr);
	g = (void *)(uh + 1);
	if ((void *)(g + 1) > data_end)
		return L4LB_R_DROP_ENCAP;

	/* Bits 16-29 of the hash: the IPv4 outer source already shows the low ones. */
	uh->source = bpf_htons(L4LB_GENEVE_SPORT_MIN | ((hash >> 16) & 0x3fff));
	uh->dest = bpf_htons(L4LB_GENEVE_PORT);
	uh->len = bpf_htons(p->l3_len + GENEVE_HLEN);
	uh->check = 0;

	g->ver_optlen = (sizeof(*g) - 8) / 4;
	g->flags = 0;
	g->proto = p->family == 4 ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	g->vni[0] = 0;
	g->vni[1] = 0;
	g->vni[2] = 0;
	g->rsvd = 0;
	g->opt_class = bpf_htons(L4LB_GENEVE_CLASS);
	g->opt_type = L4LB_GENEVE_TYPE;
	g->opt_len = (sizeof(*g) - 12) / 4;
	copy16(g->vip, p->key.dst);
	g->port = p->key.dport;
	g->reserved[0] = 0;
	g->reserved[1] = 0;
	return -1;
}

#endif
