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

/* Drop Ethernet padding after the IP packet so it is not carried inside the tunnel. */
static __always_inline int trim_to_l3(const struct hook *h, const struct packet *p)
{
	if (hook_trim(h, (__u32)p->l3_off + p->l3_len))
		return L4LB_R_DROP_ENCAP;
	return -1;
}

/*
 * Put an outer IP header in front of the IP packet of p (which must start
 * right after an untagged Ethernet header), keeping the Ethernet header: a
 * frame handed to the stack (next hop unresolved) must still be addressed to
 * this interface, or the stack drops it as PACKET_OTHERHOST. Returns -1 on
 * success or the reason for failing.
 */
static __always_inline int encap_ipip(const struct hook *h, const struct packet *p,
				      const __u8 src[16], const __u8 dst[16], __u32 hash)
{
	int hdr = p->family == 4 ? (int)sizeof(struct iphdr) : (int)sizeof(struct ipv6hdr);
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO |
		      (p->family == 4 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV6);
	void *data, *data_end;
	struct ethhdr *eth;

	if (trim_to_l3(h, p) >= 0)
		return L4LB_R_DROP_ENCAP;
	if (hook_grow(h, ETH_HLEN, hdr, flags))
		return L4LB_R_DROP_ENCAP;
	data = hook_data(h);
	data_end = hook_data_end(h);
	eth = data;

	if (p->family == 4) {
		struct iphdr *outer = data + sizeof(*eth);
		struct iphdr *inner = (void *)(outer + 1);

		if ((void *)(inner + 1) > data_end)
			return L4LB_R_DROP_ENCAP;
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
