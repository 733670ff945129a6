/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP: the answers the LB itself sends, and the errors it passes on.
 *
 * Too big. A client packet that the dispatch would make larger than the
 * egress MTU is answered with ICMP fragmentation-needed (IPv4 with DF, RFC
 * 792 / 1191) or packet-too-big (IPv6, RFC 4443) announcing the MTU left to
 * the client: the egress MTU minus what the dispatch adds. The message is
 * built in place from the packet (icmp_too_big): from the VIP, which the
 * client talked to, to the client, quoting the client's packet as far as
 * RFC 1812 (576 bytes in all) and RFC 4443 (1280) allow, routed back with
 * bpf_fib_lookup. No answer, and the packet is dropped as drop_frag_needed:
 * IPv4 without DF (XDP cannot fragment, and the backend's companion could
 * not decapsulate an outer fragment before reassembly), an MTU below the
 * family's minimum (68 / 1280) once the overhead is taken off, a packet
 * shorter than the quote (IPv4 paths narrower than about 570 bytes), an
 * icmp_rate_limit of 0, or no route back. Answers are rate-limited per CPU
 * (icmp_allow); over the limit the packet is dropped as icmp_rate_limited.
 *
 * Checksum completion. An skb that reaches tc (or generic XDP) after GRO,
 * or from a local sender, may be CHECKSUM_PARTIAL: the L4 checksum field
 * holds only the pseudo-header sum, and the device (or the stack) will
 * write the real one at that offset on transmit, over whatever bytes follow.
 * In the answer those bytes are the quote, so the field is set to the value
 * such a completion writes back unchanged: v with 2v + x = 0 in one's-
 * complement arithmetic, x being the sum of the quoted L4 bytes around it
 * (v = ~x rotated right by one bit). The ICMP checksum is computed over
 * that value, and holds whether or not anything completes the quote. The
 * client ignores a quoted checksum it cannot verify on a truncated quote.
 *
 * Errors passed on. An ICMP or ICMPv6 error (IPv4 types 3, 11, 12; IPv6
 * 1-4) quotes the packet it is about; icmp_parse reads the quoted addresses
 * and ports, and icmp_rewrite translates outer and quoted headers for the
 * paths that need it, with every checksum updated incrementally. lb.c
 * decides where each goes.
 */
#ifndef L4LB_ICMP_H
#define L4LB_ICMP_H

#include "clock.h"
#include "config.h"
#include "csum.h"
#include "forward.h"
#include "hook.h"
#include "maps.h"
#include "parse.h"
#include "ratelimit.h"

#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif

#define ICMP_HLEN 8

/* ICMP error types about a packet. */
#define ICMP4_DEST_UNREACH 3
#define ICMP4_FRAG_NEEDED 4 /* code of ICMP4_DEST_UNREACH */
#define ICMP4_TIME_EXCEEDED 11
#define ICMP4_PARAMETERPROB 12
#define ICMP6_DST_UNREACH 1
#define ICMP6_PACKET_TOO_BIG 2
#define ICMP6_PARAMPROB 4

/* Largest error message (IP header included): RFC 1812 4.3.2.3, RFC 4443 2.4(c). */
#define ICMP4_MAX_LEN 576
#define ICMP6_MAX_LEN 1280
/* Smallest MTU a link of the family may have: RFC 791, RFC 8200. */
#define IPV4_MIN_MTU 68
#define IPV6_MIN_MTU 1280

/* IPv4 precedence 6 (internetwork control), RFC 1812 4.3.2.5. */
#define ICMP4_TOS 0xc0
#define IP_DF 0x4000

/* Offsets the verifier is given as bounds (parse_packet never makes larger ones). */
#define ICMP_OFF_MAX 0x3fff

/* A token for one ICMP message from this CPU's bucket; 0 when over the limit. */
static __always_inline int icmp_allow(void)
{
	return gcra_allow(&icmp_buckets, coarse_now(), cfg_icmp_interval_ns, cfg_icmp_burst_ns);
}

/*
 * The one's-complement sum (unfolded) of the len bytes at frame offset off:
 * 16-bit words as loaded, so the folded complement is stored as is. off and
 * len must be compile-time constants (len a multiple of 4): bpf_csum_diff
 * takes at most 512 bytes a call, and with constant pieces the verifier
 * walks one path. Sets *bad when the bytes are not all in the frame.
 */
static __always_inline __u64 csum_fixed(const struct hook *h, const __u32 off, const __u32 len, int *bad)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 left = len;
	__u64 sum = 0;
	void *at = data + off;

#define CSUM_PIECE(n)                                                  \
	do {                                                           \
		if (at + (n) > data_end) {                             \
			*bad = 1;                                      \
			return 0;                                      \
		}                                                      \
		sum += (__u32)bpf_csum_diff(NULL, 0, at, (n), 0);      \
		at += (n);                                             \
		left -= (n);                                           \
	} while (0)
	if (left >= 512)
		CSUM_PIECE(512);
	if (left >= 512)
		CSUM_PIECE(512);
	if (left >= 256)
		CSUM_PIECE(256);
	if (left >= 128)
		CSUM_PIECE(128);
	if (left >= 64)
		CSUM_PIECE(64);
	if (left >= 32)
		CSUM_PIECE(32);
	if (left >= 16)
		CSUM_PIECE(16);
	if (left >= 8)
		CSUM_PIECE(8);
	if (left >= 4)
		CSUM_PIECE(4);
#undef CSUM_PIECE
	return sum;
}

/* Largest quoted IP header chain whose sum icmp_too_big takes (in 4-byte
 * words): every IPv4 header, IPv6 with up to 88 bytes of extension headers. */
#define ICMP_HDR_WORDS 32

/*
 * The one's-complement sum (unfolded) of the first len bytes (a multiple of
 * 4, at most 4 * ICMP_HDR_WORDS) at the constant frame offset off.
 */
static __always_inline __u64 csum_words(const struct hook *h, const __u32 off, __u32 len, int *bad)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 *w = data + off;
	__u64 sum = 0;

	if ((void *)(w + 1) > data_end || len > 4 * ICMP_HDR_WORDS) {
		*bad = 1;
		return 0;
	}
	/* A bounded loop: the verifier walks it once per word. */
	for (__u32 i = 0; i < ICMP_HDR_WORDS && i * 4 < len; i++) {
		if ((void *)(w + i + 1) > data_end) {
			*bad = 1;
			return 0;
		}
		sum += w[i];
	}
	return sum;
}

/* The one's-complement sum of a 16-byte address as loaded. */
static __always_inline __u64 csum_addr(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;

	return (__u64)w[0] + w[1] + w[2] + w[3];
}

/* Longest ICMP error whose checksum icmp_csum_ok verifies; longer ones are
 * passed (an error quotes at most 576 bytes in all for IPv4, 1280 for
 * IPv6: RFC 1812, RFC 4443). */
#define ICMP_CSUM_MAX 2047

/*
 * Is the ICMP / ICMPv6 checksum of p (parse_packet stopped at its ICMP
 * header) right? The message must lie in the linear part of the frame (tc:
 * pulled by the caller). ICMPv6 sums the pseudo-header too.
 */
static __always_inline int icmp_csum_ok(const struct hook *h, const struct packet *p)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 off = p->l4_off, len = (__u32)p->l3_off + p->l3_len - p->l4_off;
	__u64 sum = 0;
	void *at;

	if (off > ICMP_OFF_MAX || len < ICMP_HLEN || len > ICMP_CSUM_MAX)
		return 0;
	at = data + off;
#define CSUM_BIT(n)                                                    \
	do {                                                           \
		if (len & (n)) {                                       \
			if (at + (n) > data_end)                       \
				return 0;                              \
			sum += (__u32)bpf_csum_diff(NULL, 0, at, (n), 0); \
			at += (n);                                     \
		}                                                      \
	} while (0)
	CSUM_BIT(1024);
	CSUM_BIT(512);
	CSUM_BIT(256);
	CSUM_BIT(128);
	CSUM_BIT(64);
	CSUM_BIT(32);
	CSUM_BIT(16);
	CSUM_BIT(8);
	CSUM_BIT(4);
#undef CSUM_BIT
	if (len & 2) {
		if (at + 2 > data_end)
			return 0;
		sum += *(__u16 *)at;
		at += 2;
	}
	if (len & 1) {
		if (at + 1 > data_end)
			return 0;
		/* The odd last byte is the high byte of a word whose low byte is 0. */
		sum += *(__u8 *)at;
	}
	if (p->family == 6)
		sum += csum_addr(p->key.src) + csum_addr(p->key.dst) + bpf_htonl(len) + bpf_htonl(IPPROTO_ICMPV6);
	return csum_fold64(sum) == 0xffff;
}

/*
 * May an ICMP answer go to addr? Never to an unspecified, multicast or
 * broadcast address (RFC 1812 4.3.2.7, RFC 4443 2.4(e); icmp_send and
 * icmp6_send refuse them): such a "client" is a spoofer or a
 * misconfiguration, and an answer would go to nobody or to everybody.
 * parse.h's martian check refuses these sources before, so this is the
 * answer's own guarantee, whatever path led to it.
 */
static __always_inline int icmp_unicast_dest(__u8 family, const __u8 addr[16])
{
	const __u32 *w = (const __u32 *)addr;

	if (family == 4) {
		__u8 a0 = addr[12];

		return a0 != 0 && a0 < 224;
	}
	return addr[0] != 0xff && (w[0] | w[1] | w[2] | w[3]) != 0;
}

/*
 * Answer p, of the given family (a literal, so each family's code is its
 * own), too big by the egress MTU mtu once the dispatch adds overhead
 * bytes, with ICMP fragmentation-needed / packet-too-big to the client (see
 * the top of this file). p's frame starts with an untagged Ethernet header.
 * Returns the verdict; *reason says what happened: icmp_frag_needed_sent,
 * icmp_rate_limited, drop_frag_needed (no answer due) or drop_encap (the
 * frame could not be reshaped).
 */
static __always_inline int icmp_too_big(const struct hook *h, const struct packet *p, const __u8 family,
					__u32 mtu, __u32 overhead, int *reason)
{
	/* New headers, and the quote: as much as the message may hold, in
	 * whole 4-byte words (the IP headers are made of them). */
	const __u32 hdr = (family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)) + ICMP_HLEN;
	const __u32 quote = ((family == 4 ? ICMP4_MAX_LEN : ICMP6_MAX_LEN) - hdr) & ~3U;
	const __u32 icmp_off = ETH_HLEN + hdr - ICMP_HLEN;
	const __u32 qoff = ETH_HLEN + hdr;
	__u32 announce, l4rel, field;
	void *data, *data_end;
	__u64 sum, sum_quote;
	struct route rt;
	int bad = 0, t = -1, verdict;
	__u16 *fp;

	*reason = L4LB_R_DROP_FRAG_NEEDED;
	if (!cfg_icmp_interval_ns || mtu <= overhead || !icmp_unicast_dest(family, p->key.src))
		return hook_drop(h);
	announce = mtu - overhead;
	if (family == 4 ? (!p->frag_df || announce < IPV4_MIN_MTU) : announce < IPV6_MIN_MTU)
		return hook_drop(h);
	/* Shorter packets only miss paths narrower than 576 bytes (IPv4;
	 * IPv6 packets this big are always longer than the quote). */
	l4rel = (__u32)p->l4_off - p->l3_off;
	if (p->l3_len < quote || l4rel > ICMP_OFF_MAX || quote < l4rel + 8)
		return hook_drop(h);
	if (route_lookup(h, family, p->key.dst, p->key.src, hdr + quote, hdr + quote, &rt) >= 0)
		return hook_drop(h);
	if (!icmp_allow()) {
		*reason = L4LB_R_ICMP_RATE_LIMITED;
		return hook_drop(h);
	}

	/* The quote first (less to move), then room for the new headers. */
	if (hook_trim(h, ETH_HLEN + quote) || hook_grow(h, ETH_HLEN, hdr, 0))
		goto fail;
	data = hook_data(h);
	data_end = hook_data_end(h);
	if (family == 4) {
		struct iphdr *ip = data + ETH_HLEN;
		__u8 *ic = (void *)(ip + 1);

		if ((void *)(ic + ICMP_HLEN) > data_end)
			goto fail;
		ip->version = 4;
		ip->ihl = 5;
		ip->tos = ICMP4_TOS;
		ip->tot_len = bpf_htons(hdr + quote);
		/* An atomic datagram (DF, 576 bytes at most): the id is free (RFC 6864). */
		ip->id = 0;
		ip->frag_off = bpf_htons(IP_DF);
		ip->ttl = cfg_encap_ttl;
		ip->protocol = IPPROTO_ICMP;
		ip->check = 0;
		ip->saddr = addr_to_v4(p->key.dst);
		ip->daddr = addr_to_v4(p->key.src);
		ip->check = ipv4_hdr_csum(ip);
		ic[0] = ICMP4_DEST_UNREACH;
		ic[1] = ICMP4_FRAG_NEEDED;
		*(__u16 *)(ic + 2) = 0;
		*(__u16 *)(ic + 4) = 0;
		*(__be16 *)(ic + 6) = bpf_htons(announce);
		sum = ((ICMP4_DEST_UNREACH << 8) | ICMP4_FRAG_NEEDED) + announce;
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		__u8 *ic = (void *)(ip6 + 1);

		if ((void *)(ic + ICMP_HLEN) > data_end)
			goto fail;
		/* Version 6, traffic class and flow label 0. */
		*(__be32 *)ip6 = bpf_htonl(0x60000000);
		ip6->payload_len = bpf_htons(ICMP_HLEN + quote);
		ip6->nexthdr = IPPROTO_ICMPV6;
		ip6->hop_limit = cfg_encap_ttl;
		copy16(&ip6->saddr, p->key.dst);
		copy16(&ip6->daddr, p->key.src);
		ic[0] = ICMP6_PACKET_TOO_BIG;
		ic[1] = 0;
		*(__u16 *)(ic + 2) = 0;
		*(__be32 *)(ic + 4) = bpf_htonl(announce);
		sum = (ICMP6_PACKET_TOO_BIG << 8) + (announce >> 16) + (announce & 0xffff) + ICMP_HLEN + quote +
		      IPPROTO_ICMPV6;
	}
	/* So far in host order (header words, IPv6 pseudo-header lengths);
	 * the packet's words below are as loaded: swap once to match. */
	sum = csum_fold64(sum);
	sum = bpf_htons((__u16)sum);
	if (family == 6)
		sum += csum_addr(p->key.src) + csum_addr(p->key.dst);

	sum_quote = csum_fixed(h, qoff, quote, &bad);
	sum += sum_quote;
	field = l4rel + (p->key.proto == IPPROTO_TCP ? 16 : 6);
	if (l4rel <= 4 * ICMP_HDR_WORDS && field + 2 <= quote) {
		__u64 hdrs = csum_words(h, qoff, l4rel, &bad);
		__u16 x, nx, v, old;

		data = hook_data(h);
		data_end = hook_data_end(h);
		fp = data + qoff + (field & ICMP_OFF_MAX);
		barrier_var(fp);
		if (bad || (void *)(fp + 1) > data_end)
			goto fail;
		old = *fp;
		/* The quoted L4 bytes but the field: the quote, less its IP
		 * headers and the field (adding a complement subtracts). */
		x = csum_fold64(csum_fold64(sum_quote) + (__u16)~csum_fold64(hdrs) + (__u16)~old);
		nx = ~x;
		v = (__u16)((nx >> 1) | (nx << 15));
		*fp = v;
		sum += (__u16)~old + v;
	}
	if (bad)
		goto fail;
	data = hook_data(h);
	data_end = hook_data_end(h);
	fp = data + icmp_off + 2;
	if ((void *)(fp + 1) > data_end)
		goto fail;
	*fp = (__u16)~csum_fold64(sum);

	verdict = transmit(h, &rt, &t);
	*reason = t == L4LB_R_DROP_ENCAP ? t : L4LB_R_ICMP_FRAG_NEEDED_SENT;
	return verdict;
fail:
	*reason = L4LB_R_DROP_ENCAP;
	return hook_drop(h);
}

/* An ICMP error's quoted packet. Offsets count from the frame start. */
struct icmp_quote {
	struct flow_key key; /* the quoted packet's addresses, ports and protocol, as it was sent */
	__u16 ip_off;        /* the quoted IP header */
	__u16 l4_off;        /* the quoted TCP/UDP header */
	__u16 end;           /* end of the ICMP message (and of the outer IP packet) */
	__u8 pad[2];
};

/*
 * Read the ICMP error of p (parse_packet stopped at its header: p->l4_off)
 * and the packet it quotes. Returns -1 with q filled when p is an ICMP
 * error quoting the first fragment of a TCP or UDP packet of p's family,
 * with its ports; otherwise the reason: pass_not_service (not an error we
 * act on), pass_malformed_l4 (cut short before the quote), or
 * pass_icmp_quote (the quote is cut short or not such a packet).
 */
static __always_inline int icmp_parse(const struct hook *h, const struct packet *p, struct icmp_quote *q)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 off = p->l4_off, end = (__u32)p->l3_off + p->l3_len;
	__u8 *ic, type, proto;
	__be16 *ports;

	if (off > ICMP_OFF_MAX || end > ICMP_OFF_MAX)
		return L4LB_R_PASS_NOT_SERVICE;
	ic = data + off;
	barrier_var(ic);
	if ((void *)(ic + ICMP_HLEN) > data_end || off + ICMP_HLEN > end)
		return L4LB_R_PASS_MALFORMED_L4;
	type = ic[0];
	if (p->family == 4) {
		if (p->key.proto != IPPROTO_ICMP ||
		    (type != ICMP4_DEST_UNREACH && type != ICMP4_TIME_EXCEEDED && type != ICMP4_PARAMETERPROB))
			return L4LB_R_PASS_NOT_SERVICE;
	} else if (p->key.proto != IPPROTO_ICMPV6 || type < ICMP6_DST_UNREACH || type > ICMP6_PARAMPROB) {
		return L4LB_R_PASS_NOT_SERVICE;
	}

	off += ICMP_HLEN;
	q->ip_off = off;
	if (p->family == 4) {
		struct iphdr *iph = data + off;

		barrier_var(iph);
		if ((void *)(iph + 1) > data_end || off + sizeof(*iph) > end)
			return L4LB_R_PASS_ICMP_QUOTE;
		/* Only a first fragment carries the ports. */
		if (iph->version != 4 || iph->ihl < 5 || (iph->frag_off & bpf_htons(IP_OFFSET)))
			return L4LB_R_PASS_ICMP_QUOTE;
		proto = iph->protocol;
		addr_from_v4(q->key.src, iph->saddr);
		addr_from_v4(q->key.dst, iph->daddr);
		off += iph->ihl * 4;
	} else {
		struct ipv6hdr *ip6h = data + off;

		barrier_var(ip6h);
		if ((void *)(ip6h + 1) > data_end || off + sizeof(*ip6h) > end)
			return L4LB_R_PASS_ICMP_QUOTE;
		/* Replies carry no extension headers; a quote with some is not ours to read. */
		if (ip6h->version != 6)
			return L4LB_R_PASS_ICMP_QUOTE;
		proto = ip6h->nexthdr;
		copy16(q->key.src, &ip6h->saddr);
		copy16(q->key.dst, &ip6h->daddr);
		off += sizeof(*ip6h);
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return L4LB_R_PASS_ICMP_QUOTE;
	/* RFC 792 quotes at least 8 bytes past the IP header: the ports. */
	if (off > ICMP_OFF_MAX)
		return L4LB_R_PASS_ICMP_QUOTE;
	ports = data + off;
	barrier_var(ports);
	if ((void *)(ports + 4) > data_end || off + 8 > end)
		return L4LB_R_PASS_ICMP_QUOTE;
	q->key.sport = ports[0];
	q->key.dport = ports[1];
	q->key.proto = proto;
	q->key.pad[0] = 0;
	q->key.pad[1] = 0;
	q->key.pad[2] = 0;
	q->l4_off = off;
	q->end = end;
	return -1;
}

/* Replace the 16-byte address at field (IPv4: only its last 4 bytes are
 * the field) and return the checksum delta; NULL to keep it. */
static __always_inline __u64 icmp_set_addr4(__be32 *field, const __u8 *to)
{
	__u64 d;

	if (!to)
		return 0;
	d = csum_delta32(*field, addr_to_v4(to));
	*field = addr_to_v4(to);
	return d;
}

static __always_inline __u64 icmp_set_addr6(struct in6_addr *field, const __u8 *to)
{
	__u32 *w = (__u32 *)field;
	const __u32 *n = (const __u32 *)to;
	__u64 d = 0;

	if (!to)
		return 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		d += csum_delta32(w[i], n[i]);
		w[i] = n[i];
	}
	return d;
}

/*
 * Translate the ICMP error p (quote q, from icmp_parse) in place: outer
 * source and destination to osrc and odst, the quoted packet's to qsrc:qsport
 * -> qdst:qdport (a NULL address is kept; pass the quoted port to keep a
 * port). Updates the outer IPv4 header checksum, the quoted IPv4 header
 * checksum, the quoted TCP/UDP checksum when the quote holds it (an IPv4 UDP
 * checksum of 0 stays 0), and the ICMP checksum (ICMPv6: pseudo-header
 * included), all incrementally. ttl_dec takes one off the outer TTL / hop
 * limit; the caller has checked it is above 1. Every bound is checked
 * before anything is written: on failure (pass_icmp_quote) the frame is
 * unchanged. Returns -1 on success.
 */
static __always_inline int icmp_rewrite(const struct hook *h, const struct packet *p, const struct icmp_quote *q,
					const __u8 *osrc, const __u8 *odst, const __u8 *qsrc, __be16 qsport,
					const __u8 *qdst, __be16 qdport, int ttl_dec)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 l3 = p->l3_off, ic = p->l4_off, qip = q->ip_off, ql4 = q->l4_off;
	int udp = q->key.proto == IPPROTO_UDP;
	__u32 qcheck = ql4 + (udp ? 6 : 16);
	__u64 icmp = 0, quoted, ports;
	__sum16 *icheck, *qc = NULL;
	__be16 *l4;

	if (l3 > ICMP_OFF_MAX || ic > ICMP_OFF_MAX || qip > ICMP_OFF_MAX || ql4 > ICMP_OFF_MAX)
		return L4LB_R_PASS_ICMP_QUOTE;
	icheck = data + ic + 2;
	barrier_var(icheck);
	if ((void *)(icheck + 1) > data_end)
		return L4LB_R_PASS_ICMP_QUOTE;
	l4 = data + ql4;
	barrier_var(l4);
	if ((void *)(l4 + 2) > data_end)
		return L4LB_R_PASS_ICMP_QUOTE;
	if (qcheck + 2 <= q->end) {
		qc = data + qcheck;
		barrier_var(qc);
		if ((void *)(qc + 1) > data_end)
			return L4LB_R_PASS_ICMP_QUOTE;
	}

	if (p->family == 4) {
		struct iphdr *o = data + l3, *qi = data + qip;
		__u64 outer = 0;
		__sum16 old;

		barrier_var(o);
		barrier_var(qi);
		if ((void *)(o + 1) > data_end || (void *)(qi + 1) > data_end)
			return L4LB_R_PASS_ICMP_QUOTE;
		if (ttl_dec) {
			/* TTL and protocol share one 16-bit word of the header sum. */
			__u16 w = *(__u16 *)&o->ttl;

			o->ttl--;
			outer += csum_delta16(w, *(__u16 *)&o->ttl);
		}
		outer += icmp_set_addr4(&o->saddr, osrc);
		outer += icmp_set_addr4(&o->daddr, odst);
		o->check = csum_apply_delta(o->check, outer);
		quoted = icmp_set_addr4(&qi->saddr, qsrc);
		quoted += icmp_set_addr4(&qi->daddr, qdst);
		old = qi->check;
		qi->check = csum_apply_delta(old, quoted);
		icmp += quoted + csum_delta16(old, qi->check);
	} else {
		struct ipv6hdr *o = data + l3, *qi = data + qip;

		barrier_var(o);
		barrier_var(qi);
		if ((void *)(o + 1) > data_end || (void *)(qi + 1) > data_end)
			return L4LB_R_PASS_ICMP_QUOTE;
		if (ttl_dec)
			o->hop_limit--;
		/* The outer addresses are in the ICMPv6 pseudo-header. */
		icmp += icmp_set_addr6(&o->saddr, osrc);
		icmp += icmp_set_addr6(&o->daddr, odst);
		quoted = icmp_set_addr6(&qi->saddr, qsrc);
		quoted += icmp_set_addr6(&qi->daddr, qdst);
		icmp += quoted;
	}

	ports = csum_delta16(l4[0], qsport) + csum_delta16(l4[1], qdport);
	l4[0] = qsport;
	l4[1] = qdport;
	icmp += ports;
	if (qc && !(udp && p->family == 4 && *qc == 0)) {
		__sum16 old = *qc, n = csum_apply_delta(old, quoted + ports);

		/* 0 means "no checksum" in UDP; RFC 768 sends all ones. */
		if (udp && n == 0)
			n = 0xffff;
		*qc = n;
		icmp += csum_delta16(old, n);
	}
	*icheck = csum_apply_delta(*icheck, icmp);
	return -1;
}

#endif
