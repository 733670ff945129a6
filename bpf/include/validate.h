/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What the LB forwards is well-formed by the kernel's own rules: a packet
 * the kernel of the box (or of the backend) would refuse is handed to the
 * stack untouched instead, which refuses it as it would without l4lb, and
 * counted by what is wrong with it.
 *
 * The parser (parse.h) already checks every length and bound it reads.
 * This adds, for packets to a frontend and SNAT replies:
 *  - the IPv4 header checksum;
 *  - IPv4 options, as ip_options_compile reads a received packet's: the
 *    type/length walk within the header, the pointer fields of record
 *    route and timestamp (and a full timestamp's overflow count), router
 *    alert's length, no option twice; source routes (LSRR, SSRR: refused
 *    by default, accept_source_route) and CIPSO (needs the box's
 *    labelling policy) are not forwarded;
 *  - IPv6 extension headers (RFC 8200): hop-by-hop only first, a routing
 *    header only with no segments left (else the VIP is not the packet's
 *    destination yet) and not of the segment-routing or RPL types (which
 *    the kernel drops unless configured for them), options of hop-by-hop
 *    and destination-options headers as ip6_parse_tlv reads them: each
 *    fits its header, padding runs at most 7 bytes and PadN holds zeros,
 *    at most 8 options besides padding per header, every type says "skip
 *    if unknown" (the action bits 00: every other option makes a node
 *    discard the packet, none of them is one a client sends to a VIP), a
 *    hop-by-hop router alert of length 2, and no CALIPSO or IOAM option
 *    (they need the box's policy, as CIPSO); headers longer than
 *    VALIDATE_EXT_MAX are not checked but passed;
 *  - a UDP length equal to the IP payload's;
 *  - a source address a host accepts and a router forwards: not 0/8,
 *    127/8, multicast or the limited broadcast; not ::, ::1, fe80::/10,
 *    ::ffff:0:0/96 or ff00::/8 (pass_martian_source);
 *  - a routing header not of type 2 (Mobile IPv6; see check_ipv6_ext);
 *  - a frame addressed to the box (l2.h; checked in lb.c's validate);
 *  - a TTL / hop limit above 0: the opt dispatch keeps the client's, and
 *    a packet that arrived with 0 must not leave so (RFC 791, RFC 8200).
 * Trailing bytes after the IP packet (Ethernet padding) are allowed; every
 * forwarding path trims them. TCP options are left to the endpoints, as
 * the kernel leaves them: it stops reading options at the first that does
 * not fit and ignores one of a wrong length, but does not drop the segment.
 *
 * The checks every packet needs (UDP length, the IPv4 checksum of a header
 * without options) are inline; the walks, for the few packets whose parse
 * flagged them (packet.checks), are in global functions of lb.c, verified
 * once on their own.
 */
#ifndef L4LB_VALIDATE_H
#define L4LB_VALIDATE_H

#include "csum.h"
#include "hook.h"
#include "parse.h"

/* Offsets the verifier is given as bounds (parse_packet never makes larger ones). */
#define VALIDATE_OFF_MAX 0x3ff
/* Longest IPv6 hop-by-hop / destination-options header whose options are
 * checked; longer ones are passed. */
#define VALIDATE_EXT_MAX 64

/* The IPv4 header checksum of a 20-byte header at the frame's offset off. */
static __always_inline int ipv4_csum_ok(const struct hook *h, __u32 off)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 *w;
	__u64 sum;

	off &= VALIDATE_OFF_MAX;
	w = data + off;
	if ((void *)(w + 5) > data_end)
		return 0;
	sum = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];
	return csum_fold64(sum) == 0xffff;
}

/*
 * The inline part: -1 when p passes it, else the reason. *slow is set when
 * the packet needs the walks of validate_slow as well.
 */
static __always_inline int validate_fast(const struct hook *h, const struct packet *p, int *slow)
{
	__u8 checks = p->checks;

	*slow = 0;
	if (checks & PKT_UDP_LEN)
		return L4LB_R_PASS_UDP_LENGTH;
	if (checks & PKT_TTL0)
		return L4LB_R_PASS_TTL_EXCEEDED;
	if (checks & PKT_MARTIAN)
		return L4LB_R_PASS_MARTIAN_SOURCE;
	if (p->family == 4 && !(checks & PKT_IP_OPTS) && !ipv4_csum_ok(h, p->l3_off))
		return L4LB_R_PASS_IP_CSUM;
	*slow = checks & (PKT_IP_OPTS | PKT_IP6_EXT);
	return -1;
}

/* Bytes the walks copy from the packet at most. */
#define VALIDATE_BUF 64

struct validate_buf {
	__u8 b[VALIDATE_BUF];
};

/* Copy len (at most VALIDATE_BUF) bytes at the frame's offset off. */
static __always_inline int validate_load(const struct hook *h, __u32 off, struct validate_buf *buf, __u32 n)
{
	/* 64 bits and checked after the barrier: otherwise clang checks a
	 * 32-bit copy and hands the helper a zero-extended one the verifier
	 * has no bound for. */
	__u64 len = n;

	barrier_var(len);
	if (len == 0 || len > VALIDATE_BUF)
		return -1;
	if (h->xdp)
		return bpf_xdp_load_bytes(hook_xdp(h), off, buf->b, len);
	return bpf_skb_load_bytes(hook_skb(h), off, buf->b, len);
}

/*
 * The walks step one option per bpf_loop iteration: the verifier checks
 * the body once, where an unrolled or bounded loop over up to 40 options
 * of any kinds makes it walk every combination. A step gets a pointer to
 * the CPU's struct walk pointer (bpf_loop's context must be on the stack),
 * returns 1 to stop, and leaves the verdict in w->r (-1: fine so far).
 */
struct walk {
	struct validate_buf buf;
	__u32 len;  /* bytes of buf that are the header */
	__u32 i;    /* the current option's offset in buf */
	__u32 seen; /* IPv4: options met so far (each at most once) */
	int r;      /* -1, or the reason */
};

#define WB(w, x) ((w)->buf.b[(x) & (VALIDATE_BUF - 1)])

/* IPOPT_* are linux/ip.h's option types. */
static long ipv4_opt_step(__u32 n, void *ctx)
{
	struct walk *w = *(struct walk **)ctx;
	__u32 i = w->i, hlen = w->len;
	__u8 type, len, ptr, step, bit = 0;

	if (i >= hlen)
		return 1;
	type = WB(w, i);
	if (type == IPOPT_END)
		return 1;
	if (type == IPOPT_NOOP) {
		w->i = i + 1;
		return 0;
	}
	w->r = L4LB_R_PASS_IP_OPTIONS;
	if (i + 2 > hlen)
		return 1;
	len = WB(w, i + 1);
	if (len < 2 || i + len > hlen)
		return 1;
	ptr = len > 2 ? WB(w, i + 2) : 0;
	switch (type) {
	case IPOPT_LSRR:
	case IPOPT_SSRR:
	case IPOPT_CIPSO:
		return 1;
	case IPOPT_RR:
		if (len < 3 || ptr < 4 || (ptr <= len && ptr + 3 > len))
			return 1;
		bit = 1;
		break;
	case IPOPT_TIMESTAMP:
		if (len < 4 || ptr < 5)
			return 1;
		switch (WB(w, i + 3) & 0xf) {
		case 0:
			step = 4;
			break;
		case 1:
		case 3:
			step = 8;
			break;
		default:
			return 1;
		}
		if (ptr <= len && ptr + step - 1 > len)
			return 1;
		/* Full (no room left): its overflow count goes up by one,
		 * and one at 15 cannot. */
		if (ptr > len && (WB(w, i + 3) & 0xf) != 3 && (WB(w, i + 3) >> 4) == 15)
			return 1;
		bit = 2;
		break;
	case IPOPT_RA:
		if (len != 4)
			return 1;
		bit = 4;
		break;
	}
	if (w->seen & bit)
		return 1;
	w->seen |= bit;
	w->r = -1;
	w->i = i + len;
	return 0;
}

/* An IPv4 header with options: its checksum, then the options' syntax. */
static __always_inline int check_ipv4_header(const struct hook *h, const struct packet *p, struct walk *w)
{
	__u32 hlen = (__u32)(p->l4_off - p->l3_off);
	__u64 sum = 0;

	if (hlen < 24 || hlen > 60)
		return L4LB_R_PASS_IP_OPTIONS;
	if (validate_load(h, p->l3_off, &w->buf, hlen))
		return L4LB_R_PASS_MALFORMED_L3;
	for (__u32 k = 0; k < 15; k++) {
		if (k * 4 >= hlen)
			break;
		sum += *(__u32 *)&w->buf.b[(k * 4) & (VALIDATE_BUF - 4)];
	}
	if (csum_fold64(sum) != 0xffff)
		return L4LB_R_PASS_IP_CSUM;
	w->len = hlen;
	w->i = 20;
	w->seen = 0;
	w->r = -1;
	bpf_loop(40, ipv4_opt_step, &w, 0);
	return w->r;
}

/* IPv6 option types (linux/in6.h, ipv6.h) the walk treats apart. */
#define TLV_PAD1 0
#define TLV_PADN 1
#define TLV_ROUTERALERT 5
#define TLV_CALIPSO 7
#define TLV_IOAM 0x31
/* ip6_parse_tlv's limits: padding in a row, and options besides padding
 * (net.ipv6 max_hbh_opts_number / max_dst_opts_number defaults). */
#define TLV_PAD_MAX 7
#define TLV_COUNT_MAX 8

/* walk.seen while walking TLVs: options so far, padding bytes in a row,
 * and whether the header is hop-by-hop. */
#define TLV_COUNT(s) ((s) & 0xff)
#define TLV_PAD(s) (((s) >> 8) & 0xff)
#define TLV_HBH 0x10000

/* One option of a hop-by-hop or destination-options header, as
 * ip6_parse_tlv reads it. */
static long ext_tlv_step(__u32 n, void *ctx)
{
	struct walk *w = *(struct walk **)ctx;
	__u32 j = w->i, hl = w->len, seen = w->seen, pad = TLV_PAD(seen);
	__u8 type, len;

	if (j >= hl) {
		if (j != hl)
			w->r = L4LB_R_PASS_IPV6_EXT;
		return 1;
	}
	w->r = L4LB_R_PASS_IPV6_EXT;
	type = WB(w, j);
	if (type == TLV_PAD1) {
		if (pad + 1 > TLV_PAD_MAX)
			return 1;
		w->seen = (seen & ~0xff00) | ((pad + 1) << 8);
		w->r = -1;
		w->i = j + 1;
		return 0;
	}
	if (j + 2 > hl)
		return 1;
	len = WB(w, j + 1);
	if (j + 2 + len > hl || (type & 0xc0))
		return 1;
	if (type == TLV_PADN) {
		if (pad + 2 + len > TLV_PAD_MAX)
			return 1;
		/* len <= 5 here. */
		for (__u32 k = 0; k < TLV_PAD_MAX - 2; k++)
			if (k < len && WB(w, j + 2 + k))
				return 1;
		w->seen = (seen & ~0xff00) | ((pad + 2 + len) << 8);
	} else {
		if (TLV_COUNT(seen) + 1 > TLV_COUNT_MAX)
			return 1;
		if ((seen & TLV_HBH) &&
		    ((type == TLV_ROUTERALERT && len != 2) || type == TLV_CALIPSO || type == TLV_IOAM))
			return 1;
		w->seen = (seen & TLV_HBH) | (TLV_COUNT(seen) + 1);
	}
	w->r = -1;
	w->i = j + 2 + len;
	return 0;
}

/* IPv6 extension headers, walked again as parse_packet did. */
static __always_inline int check_ipv6_ext(const struct hook *h, const struct packet *p, struct walk *w)
{
	__u32 off = (__u32)p->l3_off + sizeof(struct ipv6hdr);
	__u8 next;

	if (validate_load(h, p->l3_off + 6, &w->buf, 1))
		return L4LB_R_PASS_MALFORMED_L3;
	next = w->buf.b[0];
	for (int i = 0; i < MAX_IPV6_EXT; i++) {
		__u32 hl;
		__u8 cur = next;

		if (off >= p->l4_off)
			break;
		if (validate_load(h, off, &w->buf, 4))
			return L4LB_R_PASS_MALFORMED_L3;
		next = w->buf.b[0];
		hl = cur == IPPROTO_AH ? ((__u32)w->buf.b[1] + 2) * 4 : ((__u32)w->buf.b[1] + 1) * 8;
		/* Segments left, or segment routing (4) / RPL (3), which
		 * the kernel drops unless seg6 / RPL is enabled, or Mobile
		 * IPv6's type 2, which a host discards unless it processed
		 * the header itself (ipv6_rthdr_rcv): the backend would. */
		if (cur == IPPROTO_ROUTING &&
		    (w->buf.b[3] != 0 || w->buf.b[2] == 2 || w->buf.b[2] == 3 || w->buf.b[2] == 4))
			return L4LB_R_PASS_IPV6_EXT;
		if (cur == IPPROTO_HOPOPTS && i != 0)
			return L4LB_R_PASS_IPV6_EXT;
		if (cur == IPPROTO_HOPOPTS || cur == IPPROTO_DSTOPTS) {
			if (hl > VALIDATE_EXT_MAX)
				return L4LB_R_PASS_IPV6_EXT;
			if (validate_load(h, off, &w->buf, hl))
				return L4LB_R_PASS_MALFORMED_L3;
			w->len = hl;
			w->i = 2;
			w->r = -1;
			w->seen = cur == IPPROTO_HOPOPTS ? TLV_HBH : 0;
			bpf_loop(VALIDATE_EXT_MAX, ext_tlv_step, &w, 0);
			if (w->r >= 0)
				return w->r;
		}
		off += hl;
	}
	return -1;
}

/*
 * Must p, which carries an IPv6 authentication header, stay out of a
 * service in this mode and dispatch? AH's ICV covers the addresses and
 * every header before it that does not change en route (RFC 4302 3.3.3):
 * SNAT rewrites the addresses and ports, the opt dispatch the destination
 * and a destination-options header of its own, and the backend would find
 * the ICV broken. ipip and geneve carry the packet byte for byte, so it
 * reaches the backend as the client signed it.
 */
static __always_inline int ah_refused(const struct packet *p, __u32 mode, __u32 dispatch)
{
	return (p->checks & PKT_IP6_AH) && (mode == L4LB_MODE_SNAT || dispatch == L4LB_DISPATCH_OPT);
}

/* The walks' state, one per CPU: on the stack it would not fit beside
 * lb_process's frame. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct walk);
	__uint(max_entries, 1);
} validate_scratch SEC(".maps");

static __always_inline int validate_slow(const struct hook *h, const struct packet *p, __u32 slow)
{
	struct walk *w;
	__u32 zero = 0;
	int r;

	w = bpf_map_lookup_elem(&validate_scratch, &zero);
	if (!w)
		return L4LB_R_PASS_MALFORMED_L3;

	if (slow & PKT_IP_OPTS) {
		r = check_ipv4_header(h, p, w);
		if (r >= 0)
			return r;
	}
	if (slow & PKT_IP6_EXT) {
		r = check_ipv6_ext(h, p, w);
		if (r >= 0)
			return r;
	}
	return -1;
}

#endif
