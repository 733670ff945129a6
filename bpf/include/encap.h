/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * DSR encapsulation: IPv4-in-IPv4 and IPv6-in-IPv6 (RFC 2003, RFC 2473).
 *
 * The inner packet is left exactly as the client sent it (TTL included: the
 * LB is not a router hop for the client). The outer header copies the inner
 * TOS / traffic class (so DSCP and ECN survive, RFC 6040 normal mode) and,
 * for IPv4, the DF bit and the identification. Its source is picked from the
 * flow hash inside a configured prefix (see config.h) so that backends can
 * spread flows over receive queues; its destination is the backend.
 */
#ifndef L4LB_ENCAP_H
#define L4LB_ENCAP_H

#include "config.h"
#include "csum.h"
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

/* Drop Ethernet padding after the IP packet so it is not carried inside the tunnel. */
static __always_inline int trim_to_l3(struct xdp_md *ctx, const struct packet *p)
{
	__u32 frame = ctx->data_end - ctx->data;
	__u32 want = (__u32)p->l3_off + p->l3_len;

	if (frame > want && bpf_xdp_adjust_tail(ctx, -(int)(frame - want)))
		return L4LB_R_DROP_ENCAP;
	return -1;
}

/*
 * Prepend an Ethernet header and an outer IP header in front of the IP
 * packet of p (which must start right after an untagged Ethernet header).
 * Returns -1 on success or the reason for failing.
 */
static __always_inline int encap_ipip(struct xdp_md *ctx, const struct packet *p,
				      const __u8 src[16], const __u8 dst[16], __u32 hash)
{
	int hdr = p->family == 4 ? (int)sizeof(struct iphdr) : (int)sizeof(struct ipv6hdr);
	__u8 macs[2 * ETH_ALEN];
	void *data, *data_end;
	struct ethhdr *eth;

	if (trim_to_l3(ctx, p) >= 0)
		return L4LB_R_DROP_ENCAP;
	/*
	 * The new Ethernet header starts in uninitialised headroom. Give it
	 * the client frame's MACs: transmit() overwrites them, but a frame
	 * handed to the stack (next hop unresolved) must still be addressed
	 * to this interface, or the stack drops it as PACKET_OTHERHOST.
	 */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + sizeof(macs) > data_end)
		return L4LB_R_DROP_ENCAP;
	__builtin_memcpy(macs, data, sizeof(macs));
	if (bpf_xdp_adjust_head(ctx, -hdr))
		return L4LB_R_DROP_ENCAP;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;

	if (p->family == 4) {
		struct iphdr *outer = data + sizeof(*eth);
		struct iphdr *inner = (void *)(outer + 1);

		if ((void *)(inner + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
		__builtin_memcpy(eth, macs, sizeof(macs));
		eth->h_proto = bpf_htons(ETH_P_IP);
		outer->version = 4;
		outer->ihl = 5;
		outer->tos = p->tos;
		outer->tot_len = bpf_htons(p->l3_len + sizeof(*outer));
		outer->id = inner->id;
		outer->frag_off = p->frag_df;
		outer->ttl = cfg_encap_ttl;
		outer->protocol = IPPROTO_IPIP;
		outer->check = 0;
		outer->saddr = addr_to_v4(src);
		outer->daddr = addr_to_v4(dst);
		outer->check = ipv4_hdr_csum(outer);
	} else {
		struct ipv6hdr *outer = data + sizeof(*eth);

		if ((void *)(outer + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
		__builtin_memcpy(eth, macs, sizeof(macs));
		eth->h_proto = bpf_htons(ETH_P_IPV6);
		outer->version = 6;
		outer->priority = p->tos >> 4;
		outer->flow_lbl[0] = ((p->tos & 0x0f) << 4) | ((hash >> 16) & 0x0f);
		outer->flow_lbl[1] = hash >> 8;
		outer->flow_lbl[2] = hash;
		outer->payload_len = bpf_htons(p->l3_len);
		outer->nexthdr = IPPROTO_IPV6;
		outer->hop_limit = cfg_encap_ttl;
		copy16(&outer->saddr, src);
		copy16(&outer->daddr, dst);
	}
	return -1;
}

#endif
