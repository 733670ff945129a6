/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet parsing: Ethernet (+ up to two 802.1Q/802.1ad tags), IPv4 with
 * options, IPv6 with a bounded walk over extension headers, TCP and UDP.
 *
 * Every length is checked against the packet and against the IP header's own
 * length fields before it is used. The parser never decides a packet's fate;
 * it returns a reason, and the caller passes or drops and counts it.
 */
#ifndef L4LB_PARSE_H
#define L4LB_PARSE_H

#include "common.h"
#include "types.h"

#ifndef ETH_P_8021Q
#define ETH_P_8021Q 0x8100
#endif
#ifndef ETH_P_8021AD
#define ETH_P_8021AD 0x88A8
#endif

/* IPv6 extension headers walked before giving up on a packet. */
#define MAX_IPV6_EXT 6

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

/* A parsed packet; offsets count from the start of the frame. */
struct packet {
	struct flow_key key; /* client 5-tuple, in the flow hash's layout */
	__u16 l3_off;        /* start of the IP header */
	__u16 l4_off;        /* start of the TCP/UDP header */
	__u16 l3_len;        /* IP total length (IPv4 tot_len, IPv6 40 + payload_len) */
	__u8 family;         /* 4 or 6 */
	__u8 tcp_flags;      /* byte 13 of the TCP header; 0 for UDP */
	__u8 vlan;           /* the frame carried an 802.1Q/802.1ad tag */
	__u8 tos;            /* IPv4 TOS / IPv6 traffic class */
	__be16 frag_df;      /* IPv4 DF bit as found (network order), 0 for IPv6 */
	__u8 l4_hlen;        /* TCP header length with options; 8 for UDP */
	__u8 checks;         /* PKT_*: what validate.h must look at before forwarding */
};

/* packet.checks: parts of a packet the parser did not check to the
 * standard of what the LB forwards (validate.h does, when it matters). */
#define PKT_IP_OPTS 0x1  /* IPv4 options: their syntax */
#define PKT_IP6_EXT 0x2  /* IPv6 extension headers: order, TLVs, routing */
#define PKT_UDP_LEN 0x4  /* UDP length shorter than the IP payload */
#define PKT_TTL0    0x8  /* TTL / hop limit 0: no hop may forward it */
#define PKT_MARTIAN 0x10 /* a source no host or router accepts (ip_route_input, ipv6_rcv, ip6_forward) */
#define PKT_IP6_AH  0x20 /* an IPv6 authentication header: a rewrite would break its ICV */

/* The service-map key of the frontend a flow is addressed to. */
static __always_inline void svc_key_of(struct svc_key *sk, const struct flow_key *k)
{
	copy16(sk->addr, k->dst);
	sk->port = k->dport;
	sk->proto = k->proto;
	sk->pad = 0;
}

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/*
 * Parse the frame up to the L4 ports. Returns -1 when the packet is a
 * well-formed TCP or UDP packet (p filled), otherwise the enum l4lb_reason
 * explaining why it is not one we could forward.
 */
static __always_inline int parse_packet(void *data, void *data_end, struct packet *p)
{
	struct ethhdr *eth = data;
	__u64 len = data_end - data;
	__u16 off = sizeof(*eth);
	__be16 proto;
	__u8 l4proto;

	if ((void *)(eth + 1) > data_end)
		return L4LB_R_PASS_NOT_IP;
	proto = eth->h_proto;
	p->vlan = 0;
	p->checks = 0;

#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		struct vlan_hdr *vh = data + off;

		if ((void *)(vh + 1) > data_end)
			return L4LB_R_PASS_NOT_IP;
		proto = vh->proto;
		off += sizeof(*vh);
		p->vlan = 1;
	}
	p->l3_off = off;

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = data + off;
		__u16 hlen, tot;

		if ((void *)(iph + 1) > data_end)
			return L4LB_R_PASS_MALFORMED_L3;
		if (iph->version != 4 || iph->ihl < 5)
			return L4LB_R_PASS_MALFORMED_L3;
		hlen = iph->ihl * 4;
		tot = bpf_ntohs(iph->tot_len);
		if (tot < hlen || (__u64)off + tot > len)
			return L4LB_R_PASS_MALFORMED_L3;
		if (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return L4LB_R_PASS_FRAGMENT;
		if (hlen > sizeof(*iph))
			p->checks |= PKT_IP_OPTS;
		if (iph->ttl == 0)
			p->checks |= PKT_TTL0;
		{
			/* 0/8, 127/8, multicast, limited broadcast. */
			__u8 a0 = ((__u8 *)&iph->saddr)[0];

			if (a0 == 0 || a0 == 127 || (a0 & 0xf0) == 0xe0 || iph->saddr == 0xffffffff)
				p->checks |= PKT_MARTIAN;
		}
		p->family = 4;
		p->l3_len = tot;
		p->tos = iph->tos;
		p->frag_df = iph->frag_off & bpf_htons(0x4000);
		addr_from_v4(p->key.src, iph->saddr);
		addr_from_v4(p->key.dst, iph->daddr);
		l4proto = iph->protocol;
		off += hlen;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = data + off;
		/* 32 bits: 40 + payload_len does not fit 16, and a wrapped end
		 * would pass the length check below. */
		__u32 end;

		if ((void *)(ip6h + 1) > data_end)
			return L4LB_R_PASS_MALFORMED_L3;
		if (ip6h->version != 6)
			return L4LB_R_PASS_MALFORMED_L3;
		/* payload_len 0 is a jumbogram, which we do not serve. */
		end = (__u32)off + sizeof(*ip6h) + bpf_ntohs(ip6h->payload_len);
		if (ip6h->payload_len == 0 || end > len)
			return L4LB_R_PASS_MALFORMED_L3;
		p->family = 6;
		p->l3_len = sizeof(*ip6h) + bpf_ntohs(ip6h->payload_len);
		if (ip6h->hop_limit == 0)
			p->checks |= PKT_TTL0;
		{
			/* Multicast (ff00::/8), link-local (fe80::/10: ip6_forward
			 * never forwards it), and in ::/96 and ::ffff:0:0/96 the
			 * unspecified ::, loopback ::1 and v4-mapped addresses
			 * (never on the wire: tcp_v6_conn_request drops v4-mapped
			 * SYNs, RFC 4291 2.5.5.2). */
			const __u32 *w = ip6h->saddr.in6_u.u6_addr32;
			__u8 a0 = ip6h->saddr.in6_u.u6_addr8[0];

			if (a0 == 0xff || (a0 == 0xfe && (ip6h->saddr.in6_u.u6_addr8[1] & 0xc0) == 0x80) ||
			    (!(w[0] | w[1]) && (w[2] == bpf_htonl(0x0000ffff) ||
						 (!w[2] && (w[3] == 0 || w[3] == bpf_htonl(1))))))
				p->checks |= PKT_MARTIAN;
		}
		p->tos = (ip6h->priority << 4) | (ip6h->flow_lbl[0] >> 4);
		p->frag_df = 0;
		copy16(p->key.src, &ip6h->saddr);
		copy16(p->key.dst, &ip6h->daddr);
		if (addr_is_v4mapped(p->key.dst))
			return L4LB_R_PASS_NOT_SERVICE;
		l4proto = ip6h->nexthdr;
		off += sizeof(*ip6h);

#pragma unroll
		for (int i = 0; i < MAX_IPV6_EXT; i++) {
			struct ipv6_opt_hdr *oh;
			__u16 hl;

			switch (l4proto) {
			case IPPROTO_HOPOPTS:
			case IPPROTO_ROUTING:
			case IPPROTO_DSTOPTS:
			case IPPROTO_AH:
				break;
			case IPPROTO_FRAGMENT:
				return L4LB_R_PASS_FRAGMENT;
			default:
				goto l4;
			}
			oh = data + off;
			p->checks |= PKT_IP6_EXT;
			if ((void *)(oh + 1) > data_end)
				return L4LB_R_PASS_MALFORMED_L3;
			if (l4proto == IPPROTO_AH) {
				/* Shorter than AH's 12 fixed bytes (RFC 4302 2.2):
				 * no room for its sequence number. */
				if (oh->hdrlen < 1)
					return L4LB_R_PASS_MALFORMED_L3;
				hl = (oh->hdrlen + 2) * 4;
				p->checks |= PKT_IP6_AH;
			} else
				hl = (oh->hdrlen + 1) * 8;
			if (off + hl > end)
				return L4LB_R_PASS_MALFORMED_L3;
			l4proto = oh->nexthdr;
			off += hl;
		}
		switch (l4proto) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
		case IPPROTO_AH:
		case IPPROTO_FRAGMENT:
			return L4LB_R_PASS_EXT_CHAIN;
		}
	} else {
		return L4LB_R_PASS_NOT_IP;
	}

l4:
	p->l4_off = off;
	p->key.proto = l4proto;
	p->key.pad[0] = 0;
	p->key.pad[1] = 0;
	p->key.pad[2] = 0;
	p->tcp_flags = 0;

	if (l4proto == IPPROTO_TCP) {
		struct tcphdr *th = data + off;

		/* Keep the checked pointer in one register: clang may otherwise
		 * recompute data + off for the loads below, and the verifier
		 * would not know the recomputed pointer was bounds-checked. */
		barrier_var(th);
		if ((void *)(th + 1) > data_end)
			return L4LB_R_PASS_MALFORMED_L4;
		if (th->doff < 5 || (__u32)off + th->doff * 4 > (__u32)p->l3_off + p->l3_len)
			return L4LB_R_PASS_MALFORMED_L4;
		p->key.sport = th->source;
		p->key.dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
		p->l4_hlen = th->doff * 4;
	} else if (l4proto == IPPROTO_UDP) {
		struct udphdr *uh = data + off;

		barrier_var(uh);
		if ((void *)(uh + 1) > data_end)
			return L4LB_R_PASS_MALFORMED_L4;
		if (bpf_ntohs(uh->len) < sizeof(*uh) ||
		    (__u32)off + bpf_ntohs(uh->len) > (__u32)p->l3_off + p->l3_len)
			return L4LB_R_PASS_MALFORMED_L4;
		p->key.sport = uh->source;
		p->key.dport = uh->dest;
		p->l4_hlen = sizeof(*uh);
		if ((__u32)off + bpf_ntohs(uh->len) != (__u32)p->l3_off + p->l3_len)
			p->checks |= PKT_UDP_LEN;
	} else {
		return L4LB_R_PASS_NOT_SERVICE;
	}
	return -1;
}

#endif
