/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * SNAT: full NAT on the LB.
 *
 * Forward (client -> VIP): the backend is chosen as for every mode
 * (select_backend); the flow then gets a binding, one (SNAT address, SNAT
 * port), and the packet leaves as SNAT:port -> backend:port. Replies come
 * back to the LB as backend:port -> SNAT:port and leave as VIP:port ->
 * client:port. Both directions decrement the TTL / hop limit (the LB is a
 * router hop here) and update the IPv4 header checksum and the TCP/UDP
 * checksum incrementally (RFC 1624); an IPv4 UDP checksum of 0 (none) stays
 * 0, an IPv6 one is always updated.
 *
 * Tables (maps.h): snat_fwd (client flow_key -> binding, backend) and
 * snat_rev (backend addr:port, SNAT addr:port, proto -> client, VIP). A
 * binding is unique per (backend addr:port, SNAT addr:port, proto), the
 * tuple the backend sees, so the port space is per backend and SNAT address.
 *
 * Allocation: the SNAT address is the family's configured address picked by
 * the flow hash; the port starts at a point of the configured range picked by
 * the flow hash and probes the next SNAT_PROBES ports. A candidate is claimed
 * by inserting its snat_rev entry with BPF_NOEXIST, which the kernel makes
 * atomic across CPUs, so two flows can never hold one tuple; the snat_fwd
 * entry is written after. No free candidate: the stalest unproven binding
 * probed gives its port up, or with none drop_snat_exhausted. Probing
 * looks each candidate up before trying to insert it, because a failed
 * insert into an LRU map still takes (and may evict for) a free node. It runs
 * in a bpf_loop callback, and keys and values live in the per-CPU
 * snat_scratch map: unrolled, or on the stack, they cost the verifier most
 * of a second and the program most of its 512 bytes of stack.
 *
 * Liveness: snat_rev is the authority. Both directions refresh its last_seen
 * and state; a binding idle past its state's timeout (config.h) is dead, and
 * found on lookup it is replaced, both halves, as if absent. A FIN or RST
 * either way moves a TCP binding to the closing timeout. A new binding is
 * unproven (snat_new_state) and keeps the short timeout until its client
 * shows it is real (snat_next_state): spoofed packets hold ports briefly,
 * and a new flow that finds no free port takes the port of the stalest
 * unproven binding it probed (snat_preempt), so they never hold the port
 * space against one.
 *
 * Eviction (both maps are LRU): losing one half of a live binding is
 * repaired from the other. A lost snat_rev entry is claimed back by the next
 * client packet, unless another flow took the port meanwhile (then the flow
 * gets a new port); a lost snat_fwd entry is found again by the probe, which
 * starts at the same hashed port and recognises the flow's own entry.
 */
#ifndef L4LB_SNAT_H
#define L4LB_SNAT_H

#include "clock.h"
#include "config.h"
#include "conntrack.h"
#include "csum.h"
#include "forward.h"
#include "hook.h"
#include "maps.h"
#include "nexthop.h"
#include "parse.h"
#include "snatovf.h"
#include "stats.h"

/* Ports tried per new binding before giving up: the whole range when it has
 * at most this many ports, otherwise this many from the flow's hashed start
 * (each try is two hash lookups; a range this full is exhausted in
 * practice, and a packet must not buy an unbounded search). */
#define SNAT_PROBES 256

/* last_seen is refreshed when older than a sixteenth of the timeout, but at
 * least this often: accurate expiry without a write per packet to a cache
 * line both directions of the flow read. */
#define SNAT_REFRESH_MAX_NS 1000000000ULL

#ifndef TCP_FLAG_FIN
#define TCP_FLAG_FIN 0x01
#endif
#ifndef TCP_FLAG_RST
#define TCP_FLAG_RST 0x04
#endif

/* Compare two 16-byte addresses held in 8-byte aligned storage. */
static __always_inline int snat_addr_eq(const __u8 a[16], const __u8 b[16])
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline __u64 snat_timeout(__u8 proto, __u32 state)
{
	if (proto != IPPROTO_TCP)
		return cfg_snat_udp_ns;
	if (state == L4LB_SNAT_OPEN)
		return cfg_snat_tcp_ns;
	return cfg_snat_tcp_closing_ns;
}

/* A last_seen written by another CPU may be a tick ahead of now. */
static __always_inline int snat_expired(__u64 now, __u64 last_seen, __u8 proto, __u32 state)
{
	return now > last_seen && now - last_seen > snat_timeout(proto, state);
}

static __always_inline void snat_touch(__u64 *last_seen, __u64 now, __u8 proto, __u32 state)
{
	__u64 step = snat_timeout(proto, state) >> 4;

	if (step > SNAT_REFRESH_MAX_NS)
		step = SNAT_REFRESH_MAX_NS;
	if (now > *last_seen && now - *last_seen > step)
		*last_seen = now;
}

/* State of a binding a client packet (protocol, TCP flags) creates: none
 * is open, since only the backend's answer shows the client is real. */
static __always_inline __u32 snat_new_state(__u8 proto, __u8 flags)
{
	if (proto == IPPROTO_TCP && (flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_FIN | TCP_FLAG_RST)) == TCP_FLAG_SYN)
		return L4LB_SNAT_SYN;
	return L4LB_SNAT_UNANSWERED;
}

/*
 * State of a live binding after a packet from the client or the backend.
 * A binding opens only on what a spoofed client cannot do: a binding made
 * by a SYN when the client ACKs after the backend answered (the ACK of a
 * client that never saw the SYN+ACK carries the wrong number, and the
 * backend's RST closes the binding); one made by anything else (a TCP
 * packet without SYN, a datagram) when the backend answers.
 */
static __always_inline __u32 snat_next_state(__u8 proto, __u8 flags, __u32 state, int from_client)
{
	if (proto != IPPROTO_TCP)
		return from_client ? state : L4LB_SNAT_OPEN;
	if (flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
		return L4LB_SNAT_CLOSING;
	if (!from_client) {
		if (state == L4LB_SNAT_UNANSWERED)
			return L4LB_SNAT_OPEN;
		return state == L4LB_SNAT_SYN ? L4LB_SNAT_SYN_ANSWERED : state;
	}
	/* A new SYN on a closing binding: the client reuses its port for a
	 * new connection, which starts half-open again. */
	if ((flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return state == L4LB_SNAT_OPEN ? L4LB_SNAT_OPEN : L4LB_SNAT_SYN;
	if (state == L4LB_SNAT_SYN_ANSWERED && (flags & TCP_FLAG_ACK))
		return L4LB_SNAT_OPEN;
	return state;
}

/* May a new flow take this live binding's port when no port is free? Only
 * an open binding proved its client real; every other state is one a
 * spoofed flood can make (or a closed connection's). */
static __always_inline int snat_preemptible(__u32 state)
{
	return state != L4LB_SNAT_OPEN;
}

/* Does the reverse entry belong to the client flow of p? */
static __always_inline int snat_owns(const struct snat_rev_value *rv, const struct packet *p)
{
	return snat_addr_eq(rv->client_addr, p->key.src) && snat_addr_eq(rv->vip, p->key.dst) &&
	       rv->client_port == p->key.sport && rv->vip_port == p->key.dport;
}

/* Do two reverse entries describe the same client flow (client and VIP)? */
static __always_inline int snat_same_flow(const struct snat_rev_value *a, const struct snat_rev_value *b)
{
	return snat_addr_eq(a->client_addr, b->client_addr) && snat_addr_eq(a->vip, b->vip) &&
	       a->client_port == b->client_port && a->vip_port == b->vip_port;
}

_Static_assert((SNAT_ADDRS_MAX & (SNAT_ADDRS_MAX - 1)) == 0, "snat_pick_addr masks with SNAT_ADDRS_MAX - 1");

/* The index of the family's SNAT address for a flow hash, below
 * SNAT_ADDRS_MAX; -1 when the family has none. */
static __always_inline int snat_addr_index(__u8 family, __u32 hash)
{
	__u32 n = family == 4 ? cfg_snat_addr4_count : cfg_snat_addr6_count;
	__u32 i;

	if (n == 0 || n > SNAT_ADDRS_MAX)
		return -1;
	i = (hash >> 16) % n;
	/* Clang knows i < n <= 16 and drops a bounds check; the verifier
	 * must be told, and a mask (SNAT_ADDRS_MAX is a power of two) on the
	 * register clang uses is what it sees. */
	barrier_var(i);
	return i & (SNAT_ADDRS_MAX - 1);
}

/* The family's SNAT address for a flow hash; -1 when it has none. */
static __always_inline int snat_pick_addr(__u8 family, __u32 hash, __u8 out[16])
{
	int i = snat_addr_index(family, hash);

	if (i < 0)
		return -1;
	if (family == 4) {
		addr_from_v4(out, cfg_snat_addr4[i]);
	} else {
		const volatile __u32 *w = (const volatile __u32 *)cfg_snat_addr6 + i * 4;
		__u32 *o = (__u32 *)out;

		o[0] = w[0];
		o[1] = w[1];
		o[2] = w[2];
		o[3] = w[3];
	}
	return 0;
}

/* Is addr the family's SNAT address for a flow hash (snat_pick_addr)? */
static __always_inline int snat_picked(__u8 family, __u32 hash, const __u8 addr[16])
{
	const __u32 *a = (const __u32 *)addr;
	const volatile __u32 *w;
	int i = snat_addr_index(family, hash);

	if (i < 0)
		return 0;
	if (family == 4)
		return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff) && a[3] == cfg_snat_addr4[i];
	w = (const volatile __u32 *)cfg_snat_addr6 + i * 4;
	return a[0] == w[0] && a[1] == w[1] && a[2] == w[2] && a[3] == w[3];
}

/*
 * Cheap gate of the reply path, which every packet to no frontend takes:
 * is the destination one of our SNAT addresses, on a port of the range?
 */
/* The reverse-table key of a backend's reply p (backend -> SNAT address). */
static __always_inline void snat_reply_key(struct snat_rev_key *rk, const struct packet *p)
{
	rk->pad[0] = rk->pad[1] = rk->pad[2] = 0;
	copy16(rk->backend_addr, p->key.src);
	copy16(rk->snat_addr, p->key.dst);
	rk->backend_port = p->key.sport;
	rk->snat_port = p->key.dport;
	rk->proto = p->key.proto;
}

/* Is addr (of the given family) one of the SNAT addresses? */
static __always_inline int snat_addr_is(__u8 family, const __u8 addr[16])
{
	if (family == 4) {
		__be32 a = addr_to_v4(addr);

		for (__u32 i = 0; i < SNAT_ADDRS_MAX; i++) {
			if (i >= cfg_snat_addr4_count)
				break;
			if (cfg_snat_addr4[i] == a)
				return 1;
		}
		return 0;
	}
	const __u32 *d = (const __u32 *)addr;
	const volatile __u32 *w = (const volatile __u32 *)cfg_snat_addr6;

	for (__u32 i = 0; i < SNAT_ADDRS_MAX; i++) {
		if (i >= cfg_snat_addr6_count)
			break;
		if (w[i * 4] == d[0] && w[i * 4 + 1] == d[1] && w[i * 4 + 2] == d[2] && w[i * 4 + 3] == d[3])
			return 1;
	}
	return 0;
}

/* Is p addressed to a SNAT address and port: maybe a backend's reply? */
static __always_inline int snat_is_ours(const struct packet *p)
{
	__u16 port = bpf_ntohs(p->key.dport);

	if (port < cfg_snat_port_min || port > cfg_snat_port_max)
		return 0;
	return snat_addr_is(p->family, p->key.dst);
}

/*
 * Header offsets read back from struct packet are only known to the
 * verifier as 16-bit values, too wide for it to accept a bounds check on
 * the pointer they make; parse_packet never produces offsets this large.
 */
#define SNAT_OFF_MAX 0x3fff

/* TTL / hop limit of p's packet would reach 0 here. */
static __always_inline int snat_ttl_expired(const struct hook *h, const struct packet *p)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	__u32 off = p->l3_off;
	__u8 *ttl;

	if (off > SNAT_OFF_MAX)
		return 1;
	ttl = data + off + (p->family == 4 ? 8 : 7);
	barrier_var(ttl);
	if ((void *)(ttl + 1) > data_end)
		return 1;
	return *ttl <= 1;
}

/*
 * Rewrite p's packet to src:sport -> dst:dport, decrement the TTL / hop
 * limit and update the checksums. At XDP the checksum fields are updated
 * directly. At tc the kernel's helper does the TCP/UDP one: it knows
 * whether the skb carries a complete checksum or only the pseudo-header
 * part for the NIC to finish (CHECKSUM_PARTIAL, where ports must not be
 * folded in). Returns -1, or the reason for failing: parse_packet checked
 * every bound again here, so that takes a kernel helper refusing.
 */
static __always_inline int nat_rewrite(const struct hook *h, const struct packet *p, const __u8 src[16],
				       __be16 sport, const __u8 dst[16], __be16 dport)
{
	void *data = hook_data(h);
	void *data_end = hook_data_end(h);
	int udp = p->key.proto == IPPROTO_UDP;
	__u32 l3_off = p->l3_off, l4_off = p->l4_off;
	__u32 csum_off = l4_off + (udp ? __builtin_offsetof(struct udphdr, check) : __builtin_offsetof(struct tcphdr, check));
	__u64 addrs = 0, ports;
	__be16 *l4;

	if (l3_off > SNAT_OFF_MAX || l4_off > SNAT_OFF_MAX)
		return L4LB_R_DROP_SNAT_REWRITE;
	if (p->family == 4) {
		struct iphdr *iph = data + l3_off;
		__be32 s = addr_to_v4(src), d = addr_to_v4(dst);
		__u16 ttl_old, ttl_new;

		barrier_var(iph);
		if ((void *)(iph + 1) > data_end)
			return L4LB_R_DROP_SNAT_REWRITE;
		addrs = csum_delta32(iph->saddr, s) + csum_delta32(iph->daddr, d);
		/* TTL and protocol share one 16-bit word of the header sum. */
		ttl_old = *(__u16 *)&iph->ttl;
		iph->ttl--;
		ttl_new = *(__u16 *)&iph->ttl;
		iph->check = csum_apply_delta(iph->check, addrs + csum_delta16(ttl_old, ttl_new));
		iph->saddr = s;
		iph->daddr = d;
	} else {
		struct ipv6hdr *ip6h = data + l3_off;
		const __u32 *s = (const __u32 *)src, *d = (const __u32 *)dst;
		__u32 *os, *od;

		barrier_var(ip6h);
		if ((void *)(ip6h + 1) > data_end)
			return L4LB_R_DROP_SNAT_REWRITE;
		os = (__u32 *)&ip6h->saddr;
		od = (__u32 *)&ip6h->daddr;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			addrs += csum_delta32(os[i], s[i]) + csum_delta32(od[i], d[i]);
			os[i] = s[i];
			od[i] = d[i];
		}
		ip6h->hop_limit--;
	}

	l4 = data + l4_off;
	barrier_var(l4);
	if ((void *)(l4 + (udp ? 4 : 10)) > data_end)
		return L4LB_R_DROP_SNAT_REWRITE;
	ports = csum_delta16(l4[0], sport) + csum_delta16(l4[1], dport);
	l4[0] = sport;
	l4[1] = dport;

	if (h->xdp) {
		__sum16 *check = (__sum16 *)&l4[udp ? 3 : 8];
		__sum16 c;

		if (udp && p->family == 4 && *check == 0)
			return -1;
		c = csum_apply_delta(*check, addrs + ports);
		/* 0 means "no checksum" in UDP; RFC 768 sends all ones. */
		if (udp && c == 0)
			c = 0xffff;
		*check = c;
	} else {
		__u64 flags = 0;

		if (udp)
			flags = BPF_F_MARK_MANGLED_0 | (p->family == 6 ? BPF_F_MARK_ENFORCE : 0);
		if (bpf_l4_csum_replace(hook_skb(h), csum_off, 0, csum_fold64(addrs), flags | BPF_F_PSEUDO_HDR) ||
		    bpf_l4_csum_replace(hook_skb(h), csum_off, 0, csum_fold64(ports), flags))
			return L4LB_R_DROP_SNAT_REWRITE;
	}
	return -1;
}

/* The forward and reverse tables of the main (ovf 0) or overflow (1) set;
 * ovf is a literal at every call site. */
#define SNAT_FWD(ovf) ((ovf) ? (void *)&snat_fwd_ovf : (void *)&snat_fwd)
#define SNAT_REV(ovf) ((ovf) ? (void *)&snat_rev_ovf : (void *)&snat_rev)

/*
 * Remove the binding of another flow held at s->rk in table set ovf (cur:
 * its reverse entry), both halves: the forward one only while it still
 * names this tuple, so that snat_fwd keeps no entry for a port its flow no
 * longer holds, and a flood's dead bindings do not push live ones out of
 * the LRU.
 */
static __always_inline void snat_forget(struct snat_work *s, const struct snat_rev_value *cur, const int ovf)
{
	struct snat_fwd_value *fwd;

	copy16(s->vk.src, cur->client_addr);
	copy16(s->vk.dst, cur->vip);
	s->vk.sport = cur->client_port;
	s->vk.dport = cur->vip_port;
	s->vk.proto = s->rk.proto;
	s->vk.pad[0] = s->vk.pad[1] = s->vk.pad[2] = 0;
	bpf_map_delete_elem(SNAT_REV(ovf), &s->rk);
	fwd = bpf_map_lookup_elem(SNAT_FWD(ovf), &s->vk);
	if (fwd && fwd->snat_port == s->rk.snat_port && fwd->backend_port == s->rk.backend_port &&
	    snat_addr_eq(fwd->snat_addr, s->rk.snat_addr) && snat_addr_eq(fwd->backend_addr, s->rk.backend_addr))
		bpf_map_delete_elem(SNAT_FWD(ovf), &s->vk);
}

/*
 * Is the candidate s->rk free in table set ovf for the flow of s->rv?
 * 1: free (a dead entry of another flow was removed); 0: taken by a live
 * binding of another flow; 2: held by this very flow (its forward half was
 * lost), which then takes it again with its state moved on.
 */
static __always_inline int snat_port_state(struct snat_work *s, const int ovf)
{
	struct snat_rev_value *cur = bpf_map_lookup_elem(SNAT_REV(ovf), &s->rk);
	__u8 proto = s->rk.proto;

	if (!cur)
		return 1;
	if (snat_same_flow(cur, &s->rv)) {
		if (snat_expired(s->now, cur->last_seen, proto, cur->state))
			cur->state = s->rv.state;
		else
			cur->state = snat_next_state(proto, s->flags, cur->state, 1);
		cur->last_seen = s->now;
		s->rv.state = cur->state;
		s->rv.flags = cur->flags;
		return 2;
	}
	if (!snat_expired(s->now, cur->last_seen, proto, cur->state)) {
		/* Taken; remember the stalest unproven holder, whose port a
		 * new flow may take when none is free (snat_preempt). */
		if (snat_preemptible(cur->state) && (!s->victim || cur->last_seen < s->victim_seen)) {
			s->victim = 1;
			s->victim_port = s->rk.snat_port;
			s->victim_table = ovf;
			s->victim_seen = cur->last_seen;
		}
		return 0;
	}
	/* Dead binding of another flow: its port is free again, and its
	 * forward half goes with it. */
	snat_forget(s, cur, ovf);
	return 1;
}

/* Claim s->rk in table set ovf once both sets said it is free: inserted
 * with BPF_NOEXIST (atomic across CPUs), then the other set checked again,
 * since a binding may have moved there (promotion) between the checks. */
static __always_inline int snat_claim(struct snat_work *s, const int ovf)
{
	struct snat_rev_value *other;

	if (bpf_map_update_elem(SNAT_REV(ovf), &s->rk, &s->rv, BPF_NOEXIST))
		return 0;
	/* The main set's claim reads the mark after its insert. */
	if (!ovf && !snat_ovf_maybe(s->now))
		return 1;
	other = bpf_map_lookup_elem(SNAT_REV(!ovf), &s->rk);
	if (other && !snat_expired(s->now, other->last_seen, s->rk.proto, other->state)) {
		bpf_map_delete_elem(SNAT_REV(ovf), &s->rk);
		return 0;
	}
	return 1;
}

/*
 * Port probing for a new binding, one candidate per bpf_loop iteration (the
 * verifier checks the body once instead of once per candidate). data points
 * to the CPU's struct snat_work pointer. A candidate is free when neither
 * table set holds a live binding on it; the binding goes to s->table.
 */
static long snat_probe_port(__u32 i, void *data)
{
	struct snat_work *s = *(struct snat_work **)data;
	__u32 port;
	int m, o;

	if (i >= s->range)
		return 1;
	port = s->start + i;
	if (port >= s->range)
		port -= s->range;
	s->rk.snat_port = bpf_htons((__u16)(s->lo + port));
	m = snat_port_state(s, 0);
	if (m == 2) {
		s->table = 0;
		s->claimed = 1;
		return 1;
	}
	if (!m)
		return 0;
	o = snat_ovf_maybe(s->now) ? snat_port_state(s, 1) : 1;
	if (o == 2) {
		snat_ovf_mark(s->now);
		s->table = 1;
		s->claimed = 1;
		return 1;
	}
	if (!o)
		return 0;
	if (s->table ? snat_claim(s, 1) : snat_claim(s, 0)) {
		s->claimed = 1;
		return 1;
	}
	return 0;
}

/*
 * No port was free: take the port of the stalest unproven binding the
 * probe saw (s->victim_*; snat_preemptible), if it is still as the probe
 * saw it, for s's flow in table set s->table. So unproven bindings, which
 * a spoofed flood makes, never hold the port space against a new flow;
 * only open ones can exhaust it. Returns 1 with the port claimed.
 */
static __always_inline int snat_preempt(struct snat_work *s)
{
	struct snat_rev_value *cur;

	s->rk.snat_port = s->victim_port;
	if (s->victim_table)
		cur = bpf_map_lookup_elem(&snat_rev_ovf, &s->rk);
	else
		cur = bpf_map_lookup_elem(&snat_rev, &s->rk);
	if (!cur || !snat_preemptible(cur->state) || cur->last_seen != s->victim_seen)
		return 0;
	if (s->victim_table)
		snat_forget(s, cur, 1);
	else
		snat_forget(s, cur, 0);
	if (!(s->table ? snat_claim(s, 1) : snat_claim(s, 0)))
		return 0;
	count_event(L4LB_E_SNAT_PREEMPTED);
	return 1;
}

/* The reverse entry of p's flow, to insert. */
static __always_inline void snat_fill_rev(struct snat_work *s, const struct packet *p, __u32 svc_id, __u32 state)
{
	copy16(s->rv.client_addr, p->key.src);
	copy16(s->rv.vip, p->key.dst);
	s->rv.client_port = p->key.sport;
	s->rv.vip_port = p->key.dport;
	s->rv.svc_id = svc_id;
	s->rv.last_seen = s->now;
	s->rv.state = state;
	s->rv.flags = 0;
}

/* The forward entry of the binding s->rk of p's flow to backend sel. */
static __always_inline void snat_fill_fwd(struct snat_work *s, const struct selection *sel)
{
	copy16(s->fv.snat_addr, s->rk.snat_addr);
	copy16(s->fv.backend_addr, sel->be->addr);
	s->fv.snat_port = s->rk.snat_port;
	s->fv.backend_port = sel->be->port;
	s->fv.backend_id = sel->backend_id;
	s->fv.last_seen = s->now;
	s->fv.state = s->rv.state;
	s->fv.pad = 0;
}

/* Return values of snat_find besides -1 (found) and reasons. */
#define SNAT_MISS (L4LB_R_MAX + 1)

/*
 * Look for p's binding to sel's backend in table set ovf: -1 with it in
 * s->rk (state and liveness moved on) when it is there and alive;
 * SNAT_MISS otherwise, after removing what is dead or stale of it (its
 * old tuple when the flow changed backend).
 */
static __always_inline int snat_find(const struct packet *p, const struct selection *sel, __u32 svc_id,
				     struct snat_work *s, const int ovf)
{
	const struct backend *be = sel->be;
	struct snat_fwd_value *fwd = bpf_map_lookup_elem(SNAT_FWD(ovf), &p->key);
	struct snat_rev_value *cur;
	__u8 proto = p->key.proto;

	if (!fwd)
		return SNAT_MISS;
	if (fwd->backend_id == sel->backend_id && snat_addr_eq(fwd->backend_addr, be->addr) &&
	    fwd->backend_port == be->port) {
		copy16(s->rk.snat_addr, fwd->snat_addr);
		s->rk.snat_port = fwd->snat_port;
		cur = bpf_map_lookup_elem(SNAT_REV(ovf), &s->rk);
		if (cur && snat_owns(cur, p)) {
			if (!snat_expired(s->now, cur->last_seen, proto, cur->state)) {
				__u32 st = snat_next_state(proto, s->flags, cur->state, 1);

				if (st != cur->state)
					cur->state = st;
				if (st != fwd->state)
					fwd->state = st;
				snat_touch(&cur->last_seen, s->now, proto, st);
				snat_touch(&fwd->last_seen, s->now, proto, st);
				if (ovf) {
					/* Copies for a promotion. */
					s->rv = *cur;
					s->fv = *fwd;
				}
				return -1;
			}
			/* Dead: replace it as if it were absent. */
			bpf_map_delete_elem(SNAT_REV(ovf), &s->rk);
		} else if (!cur && !snat_expired(s->now, fwd->last_seen, proto, fwd->state)) {
			/* The reverse half was evicted: claim the port back,
			 * unless the other set holds it now. */
			snat_fill_rev(s, p, svc_id, snat_next_state(proto, s->flags, fwd->state, 1));
			if (ovf)
				snat_ovf_mark(s->now); /* before the insert */
			if (snat_claim(s, ovf)) {
				fwd->state = s->rv.state;
				fwd->last_seen = s->now;
				if (ovf)
					s->fv = *fwd;
				return -1;
			}
		}
		return SNAT_MISS;
	}
	/* The flow changed backend: free its old tuple if still its own. */
	copy16(s->rk.snat_addr, fwd->snat_addr);
	copy16(s->rk.backend_addr, fwd->backend_addr);
	s->rk.snat_port = fwd->snat_port;
	s->rk.backend_port = fwd->backend_port;
	cur = bpf_map_lookup_elem(SNAT_REV(ovf), &s->rk);
	if (cur && snat_owns(cur, p))
		bpf_map_delete_elem(SNAT_REV(ovf), &s->rk);
	copy16(s->rk.backend_addr, be->addr);
	s->rk.backend_port = be->port;
	if (ovf)
		bpf_map_delete_elem(&snat_fwd_ovf, &p->key);
	return SNAT_MISS;
}

/*
 * An overflow binding that has proved itself (the backend answered, and
 * the client sent again on an open binding) moves into the main tables,
 * when the insert rate allows. s->rv and s->fv hold its entries.
 */
static __always_inline void snat_promote(const struct packet *p, struct snat_work *s)
{
	if (!(s->rv.flags & L4LB_SNAT_ANSWERED) || s->rv.state != L4LB_SNAT_OPEN)
		return;
	if (!ct_insert_allowed(s->now)) {
		count_event(L4LB_E_SNAT_PROMOTE_LIMITED);
		return;
	}
	s->rv.flags = 0;
	if (bpf_map_update_elem(&snat_rev, &s->rk, &s->rv, BPF_NOEXIST)) {
		struct snat_rev_value *cur = bpf_map_lookup_elem(&snat_rev, &s->rk);

		/* Only a dead entry may stand in the way. */
		if (!cur || !snat_expired(s->now, cur->last_seen, s->rk.proto, cur->state))
			return;
		bpf_map_delete_elem(&snat_rev, &s->rk);
		if (bpf_map_update_elem(&snat_rev, &s->rk, &s->rv, BPF_NOEXIST))
			return;
	}
	bpf_map_update_elem(&snat_fwd, &p->key, &s->fv, BPF_ANY);
	bpf_map_delete_elem(&snat_rev_ovf, &s->rk);
	bpf_map_delete_elem(&snat_fwd_ovf, &p->key);
	count_event(L4LB_E_SNAT_PROMOTED);
}

/*
 * Find or make the binding of p's flow to its backend in sel. Returns -1
 * with the binding in *out (s->rk holds its SNAT address and port), or the
 * reason for not having one.
 *
 * Bindings live in the main tables (snat_fwd, snat_rev). A new binding
 * goes there while the CPU is under datapath.flow_insert_rate; above it,
 * to the overflow tables (snat_fwd_ovf, snat_rev_ovf), a smaller LRU set
 * of their own, so that a flood of new flows (spoofed SYNs, ACKs, UDP)
 * churns only that set and never evicts an established binding. An
 * overflow binding works as any other and moves to the main tables once
 * the backend has answered and the client sent again (snat_promote).
 */
static __always_inline int snat_bind(const struct packet *p, const struct selection *sel, __u32 svc_id,
				     struct snat_work **out)
{
	const struct backend *be = sel->be;
	struct snat_work *s;
	__u8 proto = p->key.proto;
	__u32 lo = cfg_snat_port_min, hi = cfg_snat_port_max, zero = 0;
	int r;

	s = bpf_map_lookup_elem(&snat_scratch, &zero);
	if (!s)
		return L4LB_R_DROP_SNAT_REWRITE;
	/* Every field is written before it is read (rv and fv only off the
	 * fast path); keys and values go to maps whole, so their padding
	 * must be zero too. */
	s->rk.pad[0] = s->rk.pad[1] = s->rk.pad[2] = 0;
	s->now = coarse_now();
	s->flags = p->tcp_flags;
	copy16(s->rk.backend_addr, be->addr);
	s->rk.backend_port = be->port;
	s->rk.proto = proto;
	*out = s;

	s->table = 0;
	r = snat_find(p, sel, svc_id, s, 0);
	if (r != SNAT_MISS)
		return r;
	if (snat_ovf_maybe(s->now)) {
		s->table = 1;
		r = snat_find(p, sel, svc_id, s, 1);
		if (r == -1) {
			snat_ovf_mark(s->now);
			snat_promote(p, s);
			return -1;
		}
		if (r != SNAT_MISS)
			return r;
	}

	/* A new binding. */
	if (hi < lo || snat_pick_addr(p->family, sel->hash, s->rk.snat_addr))
		return L4LB_R_DROP_SNAT_EXHAUSTED;
	s->lo = lo;
	s->range = hi - lo + 1;
	s->start = sel->hash % s->range;
	s->claimed = 0;
	s->table = !ct_insert_allowed(s->now);
	/* Before the claim (see snat_ovf_maybe). */
	if (s->table)
		snat_ovf_mark(s->now);
	snat_fill_rev(s, p, svc_id, snat_new_state(proto, s->flags));
	s->victim = 0;
	bpf_loop(s->range < SNAT_PROBES ? s->range : SNAT_PROBES, snat_probe_port, &s, 0);
	if (!s->claimed && !(s->victim && snat_preempt(s)))
		return L4LB_R_DROP_SNAT_EXHAUSTED;
	if (s->table)
		count_event(L4LB_E_SNAT_OVERFLOW);
	snat_fill_fwd(s, sel);
	/* Should this fail, the packet still goes out; the next one finds
	 * the reverse entry again through the probe. */
	if (s->table)
		bpf_map_update_elem(&snat_fwd_ovf, &p->key, &s->fv, BPF_ANY);
	else
		bpf_map_update_elem(&snat_fwd, &p->key, &s->fv, BPF_ANY);
	return -1;
}

/* Rewrite p to src:sport -> sel's backend and send it there. Too big for
 * the egress MTU: dropped as drop_frag_needed with *mtu set, untouched, for
 * the caller to answer as a router would. */
static __always_inline int snat_send(const struct hook *h, const struct packet *p, const struct selection *sel,
				     const __u8 src[16], __be16 sport, __u32 seg_len, __u32 *mtu, int *reason)
{
	struct route rt;
	int r;

	r = route_to_backend(h, p->family, src, sel, p->l3_len, seg_len, &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED)
		*mtu = rt.mtu;
	if (r >= 0)
		goto drop;
	if (trim_to_l3(h, p) >= 0) {
		r = L4LB_R_DROP_SNAT_REWRITE;
		goto drop;
	}
	r = nat_rewrite(h, p, src, sport, sel->be->addr, sel->be->port);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/*
 * The binding of an established flow whose flow-cache slot knows its port
 * (fc->snat_ok): both halves are looked up one right after the other, the
 * reverse one by the key the slot and the flow hash give, not by what the
 * forward one says. The two lookups do not wait on each other, so the CPU
 * overlaps their cache and TLB misses, which are most of what a lookup
 * costs. Returns 1 with both halves checked and refreshed exactly as
 * snat_find does it and the key in *rk; 0, having changed neither table,
 * when anything is off (a half lost, another port, a state change), for
 * snat_bind to look again and sort out.
 */
static __always_inline int snat_cached(const struct packet *p, const struct selection *sel, __u64 now,
				       struct snat_rev_key *rk)
{
	const struct backend *be = sel->be;
	struct snat_fwd_value *fwd;
	struct snat_rev_value *rv;
	__u8 proto = p->key.proto;
	__u32 st;

	if (snat_pick_addr(p->family, sel->hash, rk->snat_addr))
		return 0;
	copy16(rk->backend_addr, be->addr);
	rk->backend_port = be->port;
	rk->snat_port = sel->fc->snat_port;
	rk->proto = proto;
	rk->pad[0] = rk->pad[1] = rk->pad[2] = 0;
	fwd = bpf_map_lookup_elem(&snat_fwd, &p->key);
	rv = bpf_map_lookup_elem(&snat_rev, rk);
	if (!fwd || !rv)
		return 0;
	if (fwd->backend_id != sel->backend_id || !snat_addr_eq(fwd->backend_addr, be->addr) ||
	    fwd->backend_port != be->port || fwd->snat_port != rk->snat_port ||
	    !snat_addr_eq(fwd->snat_addr, rk->snat_addr))
		return 0;
	if (!snat_owns(rv, p) || snat_expired(now, rv->last_seen, proto, rv->state))
		return 0;
	st = snat_next_state(proto, p->tcp_flags, rv->state, 1);
	if (st != rv->state || st != fwd->state)
		return 0;
	snat_touch(&rv->last_seen, now, proto, st);
	snat_touch(&fwd->last_seen, now, proto, st);
	return 1;
}

/*
 * SNAT a client packet to the backend in sel. seg_len is what one segment's
 * L3 length is (see route_lookup). Returns the verdict; *reason is set when
 * the packet was not forwarded, or forwarded with the stack's help; for
 * drop_frag_needed *mtu holds the egress MTU (see snat_send).
 *
 * Every packet looks up both halves of its binding: that is what notices a
 * half the LRU forgot, on the very next packet, and repairs it.
 */
static __always_inline int snat_forward(const struct hook *h, const struct packet *p, const struct selection *sel,
					__u32 svc_id, __u32 seg_len, __u64 now, __u32 *mtu, int *reason)
{
	struct flow_cache_entry *fc = sel->fc;
	struct snat_work *s;
	__u32 zero = 0;
	int r;

	if (fc && fc->snat_ok) {
		/* The key in the scratch space: on the stack it would deepen
		 * this frame, and with it every path's. */
		s = bpf_map_lookup_elem(&snat_scratch, &zero);
		if (s && snat_cached(p, sel, now, &s->rk))
			return snat_send(h, p, sel, s->rk.snat_addr, s->rk.snat_port, seg_len, mtu, reason);
	}
	r = snat_bind(p, sel, svc_id, &s);
	if (r >= 0) {
		*reason = r;
		return hook_drop(h);
	}
	/* The slot may skip snat_bind next time when the binding's address
	 * is the one the flow hash picks, as snat_cached rebuilds it. */
	if (fc && !s->table && snat_picked(p->family, sel->hash, s->rk.snat_addr)) {
		fc->snat_port = s->rk.snat_port;
		fc->snat_ok = 1;
	}
	return snat_send(h, p, sel, s->rk.snat_addr, s->rk.snat_port, seg_len, mtu, reason);
}

/* The live binding of a backend's reply p (s->rk its key): the main
 * table's, or the overflow table's (*ovf set, and marked answered). */
static __always_inline struct snat_rev_value *snat_reply_binding(const struct packet *p, struct snat_work *s,
								 __u64 now, int *ovf)
{
	struct snat_rev_value *rv = bpf_map_lookup_elem(&snat_rev, &s->rk);

	*ovf = 0;
	if (rv) {
		if (!snat_expired(now, rv->last_seen, p->key.proto, rv->state))
			return rv;
		/* A dead binding is forgotten; its port is free again. */
		bpf_map_delete_elem(&snat_rev, &s->rk);
	}
	if (!snat_ovf_maybe(now))
		return NULL;
	rv = bpf_map_lookup_elem(&snat_rev_ovf, &s->rk);
	if (!rv)
		return NULL;
	if (snat_expired(now, rv->last_seen, p->key.proto, rv->state)) {
		bpf_map_delete_elem(&snat_rev_ovf, &s->rk);
		return NULL;
	}
	*ovf = 1;
	return rv;
}

/*
 * The reply path: a TCP/UDP packet to no frontend whose destination passed
 * snat_is_ours. A live binding's reply is rewritten back to VIP:port ->
 * client:port and sent to the client; anything else goes to the stack
 * untouched (pass_not_service). Counts its own reasons, but one: a reply
 * too big for the path to the client is dropped uncounted with *mtu set to
 * the egress MTU, for the caller to answer the backend as a router would.
 */
static __always_inline int snat_reply(const struct hook *h, const struct packet *p, __u32 seg_len, __u32 *mtu)
{
	struct snat_rev_value *rv;
	struct snat_work *s;
	struct route rt;
	int reason = -1, verdict, r, ovf;
	__u32 st, zero = 0;
	__u64 now;

	s = bpf_map_lookup_elem(&snat_scratch, &zero);
	if (!s)
		goto pass;
	snat_reply_key(&s->rk, p);
	now = coarse_now();
	rv = snat_reply_binding(p, s, now, &ovf);
	if (!rv)
		goto pass;
	if (p->vlan) {
		count_reason(L4LB_R_PASS_VLAN, p->l3_len);
		return hook_pass(h);
	}
	if (snat_ttl_expired(h, p)) {
		/* The stack could only answer for the SNAT address, which
		 * the backend does not know as a hop of this path. */
		count_reason(L4LB_R_DROP_TTL_EXCEEDED, p->l3_len);
		return hook_drop(h);
	}
	st = snat_next_state(p->key.proto, p->tcp_flags, rv->state, 0);
	if (st != rv->state)
		rv->state = st;
	snat_touch(&rv->last_seen, now, p->key.proto, st);
	if (ovf) {
		snat_ovf_mark(now);
		if (!(rv->flags & L4LB_SNAT_ANSWERED))
			rv->flags |= L4LB_SNAT_ANSWERED;
	}
	/* A copy: another CPU may reuse the entry while this one works. */
	s->rv = *rv;

	r = route_lookup(h, p->family, s->rv.vip, s->rv.client_addr, p->l3_len, seg_len, &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED) {
		*mtu = rt.mtu;
		return hook_drop(h);
	}
	if (r >= 0)
		goto drop;
	if (trim_to_l3(h, p) >= 0) {
		r = L4LB_R_DROP_SNAT_REWRITE;
		goto drop;
	}
	r = nat_rewrite(h, p, s->rv.vip, s->rv.vip_port, s->rv.client_addr, s->rv.client_port);
	if (r >= 0)
		goto drop;
	verdict = transmit(h, &rt, &reason);
	if (reason >= 0)
		count_reason(reason, p->l3_len);
	/* As count_forward: sent by the datapath or, its neighbour unknown,
	 * through the stack. */
	if (verdict != hook_drop(h))
		count_reply(s->rv.svc_id, p->l3_len);
	return verdict;
drop:
	count_reason(r, p->l3_len);
	return hook_drop(h);
pass:
	count_reason(L4LB_R_PASS_NOT_SERVICE, p->l3_len);
	return hook_pass(h);
}

#endif
