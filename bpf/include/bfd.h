/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * BFD sessions held up across a planned restart (RFC 5880, 5881).
 *
 * l4lbd runs BFD with its routers from user space (lb/bfd). Between the
 * old process stopping and the new one taking over, nobody would answer
 * the router, which declares the session down after one detection time
 * (under a second) and, with its BGP session tied to BFD, withdraws the
 * box although the datapath forwards throughout. So a stopping l4lbd
 * leaves each Up session's state in bfd_hold with a deadline, and until
 * then the XDP program answers each of the router's control packets of
 * that session with the packet l4lbd would send: Up, the same
 * discriminators and timers. The router's detection timer is fed at the
 * router's own transmit rate, which the negotiation keeps within its
 * detection time. The next l4lbd resumes the sessions from these entries
 * and deletes them once it transmits itself.
 *
 * Only a packet that matches all of it is answered: TTL 255, UDP to the
 * control port, 24 bytes without authentication, version 1, state Up, and
 * both discriminators. Anything else (a router that restarted its session,
 * a Down, a deadline passed) goes on to the stack, where nothing listens
 * during the gap, and the session goes down as it would without the hold.
 * XDP only: at tc an skb may carry a partial checksum the rewrite cannot
 * keep.
 */
#ifndef L4LB_BFD_H
#define L4LB_BFD_H

#include "common.h"
#include "csum.h"
#include "parse.h"

#define BFD_CONTROL_PORT 3784
#define BFD_CONTROL_LEN  24
#define BFD_VERSION      1
#define BFD_STATE_UP     3
#define BFD_FLAG_POLL    0x20
#define BFD_FLAG_FINAL   0x10
#define BFD_FLAG_AUTH    0x04
#define BFD_FLAG_MULTI   0x01

/* Key of bfd_hold: the router's address. */
struct bfd_hold_key {
	__u8 peer[16]; /* network order, IPv4-mapped for IPv4 */
};

/* A session the datapath answers for until a deadline (lb/datapath writes
 * it from lb/bfd's saved state). */
struct bfd_hold_value {
	__u64 until;         /* bpf_ktime_get_ns (CLOCK_MONOTONIC) deadline */
	__u64 answered;      /* control packets answered */
	__u32 local_discr;   /* ours, host order */
	__u32 remote_discr;  /* the router's */
	__u32 min_tx_us;     /* our DesiredMinTxInterval */
	__u32 min_rx_us;     /* our RequiredMinRxInterval */
	__u32 remote_min_tx_us; /* the router's timers, for the next l4lbd */
	__u32 remote_min_rx_us;
	__u16 src_port;      /* our session's source port, host order */
	__u8 detect_mult;    /* ours */
	__u8 remote_detect_mult;
	__u8 pad[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct bfd_hold_key);
	__type(value, struct bfd_hold_value);
	__uint(max_entries, 64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bfd_hold SEC(".maps");

/* The control packet without authentication (RFC 5880 4.1). */
struct bfd_control {
	__u8 vers_diag;   /* version (3 bits), diagnostic (5) */
	__u8 state_flags; /* state (2 bits), P F C A D M */
	__u8 detect_mult;
	__u8 length;
	__be32 my_discr;
	__be32 your_discr;
	__be32 desired_min_tx;
	__be32 required_min_rx;
	__be32 required_min_echo_rx;
};
_Static_assert(sizeof(struct bfd_control) == BFD_CONTROL_LEN, "BFD control packet layout");

/* May p be a BFD control packet (to be looked at by bfd_answer)? */
static __always_inline int bfd_maybe(const struct packet *p)
{
	return p->key.dport == bpf_htons(BFD_CONTROL_PORT) && p->key.proto == IPPROTO_UDP;
}

/* Sum of n 16-bit words at w (n a constant). */
#define BFD_SUM_WORDS(sum, w, n)                   \
	do {                                       \
		_Pragma("unroll")                  \
		for (int _i = 0; _i < (n); _i++)   \
			(sum) += (w)[_i];          \
	} while (0)

/*
 * Answer the router's control packet p in place and send it back, if a
 * held session matches; XDP_PASS otherwise. The frame keeps its length:
 * Ethernet addresses and IP addresses swapped, TTL 255, UDP from the
 * session's source port to the control port, our packet as payload.
 */
static __always_inline int bfd_answer(struct xdp_md *ctx, const struct packet *p)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct bfd_hold_key key;
	struct bfd_hold_value *hold;
	struct ethhdr *eth = data;
	struct udphdr *udp;
	struct bfd_control *c;
	__u32 l3 = p->l3_off;
	__u8 mac[ETH_ALEN];
	__u64 sum = 0;
	void *ip;

	/* udp from ip by a constant, so that one bounds check covers both
	 * for the verifier. */
	if (l3 > 64)
		return XDP_PASS;
	ip = data + l3;
	if (p->family == 4) {
		if (p->l4_off != l3 + sizeof(struct iphdr))
			return XDP_PASS;
		udp = ip + sizeof(struct iphdr);
	} else {
		if (p->l4_off != l3 + sizeof(struct ipv6hdr))
			return XDP_PASS;
		udp = ip + sizeof(struct ipv6hdr);
	}
	c = (void *)(udp + 1);
	if ((void *)(eth + 1) > data_end || (void *)(c + 1) > data_end)
		return XDP_PASS;
	/* Exactly one unauthenticated control packet, Up, to this host. */
	if (udp->len != bpf_htons(sizeof(*udp) + BFD_CONTROL_LEN) || c->length != BFD_CONTROL_LEN ||
	    (c->vers_diag >> 5) != BFD_VERSION || (c->state_flags >> 6) != BFD_STATE_UP ||
	    (c->state_flags & (BFD_FLAG_AUTH | BFD_FLAG_MULTI)) || (eth->h_dest[0] & 1))
		return XDP_PASS;
	if (p->l3_len != sizeof(*udp) + BFD_CONTROL_LEN + (p->l4_off - l3))
		return XDP_PASS;

	copy16(key.peer, p->key.src);
	hold = bpf_map_lookup_elem(&bfd_hold, &key);
	if (!hold || bpf_ktime_get_ns() >= hold->until ||
	    c->my_discr != bpf_htonl(hold->remote_discr) || c->your_discr != bpf_htonl(hold->local_discr))
		return XDP_PASS;

	if (p->family == 4) {
		struct iphdr *ip4 = ip;
		__be32 a;

		if (ip4->ttl != 255)
			return XDP_PASS;
		a = ip4->saddr;
		ip4->saddr = ip4->daddr;
		ip4->daddr = a;
		ip4->check = 0;
		ip4->check = ipv4_hdr_csum(ip4);
		BFD_SUM_WORDS(sum, (const __u16 *)&ip4->saddr, 4);
	} else {
		struct ipv6hdr *ip6 = ip;
		struct in6_addr a;

		if (ip6->hop_limit != 255)
			return XDP_PASS;
		a = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = a;
		BFD_SUM_WORDS(sum, (const __u16 *)&ip6->saddr, 16);
	}
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);

	/* A poll is answered with the final bit (RFC 5880 6.5). */
	c->state_flags = (BFD_STATE_UP << 6) | ((c->state_flags & BFD_FLAG_POLL) ? BFD_FLAG_FINAL : 0);
	c->vers_diag = BFD_VERSION << 5;
	c->detect_mult = hold->detect_mult;
	c->my_discr = bpf_htonl(hold->local_discr);
	c->your_discr = bpf_htonl(hold->remote_discr);
	c->desired_min_tx = bpf_htonl(hold->min_tx_us);
	c->required_min_rx = bpf_htonl(hold->min_rx_us);
	c->required_min_echo_rx = 0;
	udp->source = bpf_htons(hold->src_port);
	udp->dest = bpf_htons(BFD_CONTROL_PORT);
	udp->check = 0;

	/* The whole checksum, not an update: a veth frame may arrive with
	 * the sender's partial one. Pseudo-header, then UDP and payload. */
	sum += bpf_htons(IPPROTO_UDP) + udp->len;
	BFD_SUM_WORDS(sum, (const __u16 *)udp, (sizeof(*udp) + BFD_CONTROL_LEN) / 2);
	udp->check = (__sum16)~csum_fold64(sum);
	if (!udp->check)
		udp->check = 0xffff;
	__sync_fetch_and_add(&hold->answered, 1);
	return XDP_TX;
}

#endif /* L4LB_BFD_H */
