// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * The l4lb load-balancer datapath.
 *
 * Per packet: parse; look the frontend up in `services`; check the
 * client against the service's source ranges; choose a backend (connection
 * table, then the client's affinity, then the service's Maglev table);
 * forward it the way the service's mode says, or answer a packet too big
 * for the path with ICMP; count. ICMP errors about a frontend's flow follow
 * that flow (icmp_error). Everything that is not a well-formed packet to a
 * frontend goes to the stack untouched, and is counted by reason.
 *
 * Two entry points share all of it: l4lb_xdp (XDP) and l4lb_tc (tc ingress
 * through tcx, for interfaces where XDP cannot attach); see hook.h.
 */
#include "include/bfd.h"
#include "include/clock.h"
#include "include/common.h"
#include "include/config.h"
#include "include/conntrack.h"
#include "include/ctfilter.h"
#include "include/encap.h"
#include "include/filter.h"
#include "include/flowcache.h"
#include "include/flowcounts.h"
#include "include/forward.h"
#include "include/hook.h"
#include "include/icmp.h"
#include "include/ipopt.h"
#include "include/l2.h"
#include "include/localaddr.h"
#include "include/maps.h"
#include "include/nexthop.h"
#include "include/parse.h"
#include "include/snat.h"
#include "include/srcrange.h"
#include "include/stats.h"
#include "include/svccache.h"
#include "include/traceout.h"
#include "include/validate.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Headers parsed in place at most: Ethernet, two VLAN tags, IPv6 with the
 * extension headers walked, TCP with options. */
#define PARSE_PULL 256

/*
 * The L3 length one segment will have after adding `overhead` bytes: the
 * packet itself, or for a GSO packet its headers plus one segment.
 */
static __always_inline __u32 segment_len(const struct hook *h, const struct packet *p, __u32 overhead)
{
	__u32 gso = hook_gso_size(h);

	if (gso)
		return (__u32)(p->l4_off - p->l3_off) + p->l4_hlen + gso + overhead;
	return (__u32)p->l3_len + overhead;
}

/* What a dispatch found when the packet was too big for the egress MTU. */
struct too_big {
	__u32 mtu;      /* the egress MTU */
	__u32 overhead; /* what the dispatch adds to the packet */
};

/*
 * The one place a packet that the dispatch would make bigger than the egress
 * MTU (mtu) ends up, before anything in it has changed; overhead is what the
 * dispatch adds. It is dropped as drop_frag_needed with tb filled; a client
 * packet is then answered with ICMP (icmp_too_big, run by the entry point
 * through struct icmp_todo), in one place rather than once per dispatch.
 */
static __always_inline int frag_needed(const struct hook *h, __u32 mtu, __u32 overhead,
				       struct too_big *tb, int *reason)
{
	tb->mtu = mtu;
	tb->overhead = overhead;
	*reason = L4LB_R_DROP_FRAG_NEEDED;
	return hook_drop(h);
}

/*
 * DSR over a tunnel: encapsulate to the backend, which replies from the VIP.
 * geneve (a literal at each call site) picks UDP/Geneve with the
 * frontend-naming option over plain IPIP; both decapsulate in the backend's
 * companion.
 */
static __always_inline int dsr_encap(const struct hook *h, const struct packet *p, struct too_big *tb,
				     const struct selection *sel, int *reason, int geneve)
{
	struct route rt;
	__u8 src[16];
	__u32 hdr = geneve ? geneve_overhead(p->family) : ipip_overhead(p->family);
	int r;

	encap_source(p->family, sel->hash, src);
	r = route_to_backend(h, p->family, src, sel, p->l3_len + hdr, segment_len(h, p, hdr), &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED)
		return frag_needed(h, rt.mtu, hdr, tb, reason);
	if (r >= 0)
		goto drop;
	if (geneve)
		r = encap_geneve(h, p, src, sel->be->addr, sel->hash);
	else
		r = encap_ipip(h, p, src, sel->be->addr, sel->hash);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/* DSR with an IP option: the destination becomes the backend (address and
 * port); the SYN or datagram names the frontend in an option (ipopt.h). */
static __always_inline int dsr_opt(const struct hook *h, const struct packet *p, struct too_big *tb,
				   const struct selection *sel, int *reason)
{
	struct route rt;
	__u32 len = opt_len(p);
	int r;

	r = opt_room(h, p, len);
	if (r >= 0)
		goto drop;
	r = trim_to_l3(h, p);
	if (r >= 0)
		goto drop;
	r = route_to_backend(h, p->family, p->key.src, sel, p->l3_len + len, segment_len(h, p, len), &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED)
		return frag_needed(h, rt.mtu, len, tb, reason);
	if (r >= 0)
		goto drop;
	r = opt_rewrite(h, p, sel->be, len);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/* Dispatch a DSR packet to sel's backend the way the service says
 * (enum l4lb_dispatch); tb is filled when the packet is too big (reason
 * drop_frag_needed). */
static __always_inline int dsr_dispatch(const struct hook *h, __u32 dispatch,
					const struct packet *p, const struct selection *sel,
					struct too_big *tb, int *reason)
{
	if (dispatch == L4LB_DISPATCH_GENEVE)
		return dsr_encap(h, p, tb, sel, reason, 1);
	if (dispatch == L4LB_DISPATCH_OPT)
		return dsr_opt(h, p, tb, sel, reason);
	return dsr_encap(h, p, tb, sel, reason, 0);
}

/*
 * An ICMP error about a DSR flow (p->key: the flow as its client sends it)
 * goes to the flow's backend, chosen as the flow's own packets are but
 * without creating or refreshing any entry. ipip and geneve carry the ICMP
 * packet as it is: the backend's companion decapsulates it to the VIP, and
 * its stack matches the quote to the socket. opt rewrites the outer
 * destination to the backend and the quoted source (VIP:port, as the
 * companion made the reply leave) back to what the backend's socket sent.
 */
static __always_inline int icmp_to_dsr_backend(const struct hook *h, const struct svc_value *svc,
					       struct packet *p, const struct icmp_quote *q, int *reason)
{
	struct selection sel;
	struct too_big tb;
	struct route rt;
	int r;

	r = select_backend(p, svc, &sel, 0, bpf_map_lookup_elem(&conntrack, &p->key), coarse_now(), 0, 0);
	if (r >= 0)
		goto drop;
	if (svc->dispatch != L4LB_DISPATCH_OPT)
		return dsr_dispatch(h, svc->dispatch, p, &sel, &tb, reason);
	r = route_to_backend(h, p->family, p->key.dst, &sel, p->l3_len, p->l3_len, &rt);
	if (r >= 0)
		goto drop;
	r = trim_to_l3(h, p);
	if (r >= 0)
		goto drop;
	r = icmp_rewrite(h, p, q, NULL, sel.be->addr, sel.be->addr, sel.be->port, NULL, q->key.dport, 0);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/*
 * Send an ICMP error on the way a SNAT binding's packets go, the LB being a
 * router hop: from src to dst, the quoted packet becoming dst:dport ->
 * src:sport (what the recipient sent).
 */
static __always_inline int icmp_snat_send(const struct hook *h, const struct packet *p, const struct icmp_quote *q,
					  const __u8 *src, __be16 sport, const __u8 *dst, __be16 dport, int *reason)
{
	struct route rt;
	int r;

	if (snat_ttl_expired(h, p)) {
		r = L4LB_R_DROP_TTL_EXCEEDED;
		goto drop;
	}
	r = route_lookup(h, p->family, src, dst, p->l3_len, p->l3_len, &rt);
	if (r >= 0)
		goto drop;
	r = trim_to_l3(h, p);
	if (r >= 0)
		goto drop;
	r = icmp_rewrite(h, p, q, src, dst, dst, dport, src, sport, 1);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/*
 * An ICMP error about a SNAT flow's reply (p->key: the flow as its client
 * sends it) goes to the backend through the flow's binding, translated as
 * the flow's packets are: outer SNAT address -> backend, quoted backend:port
 * -> SNAT address:port.
 */
static __always_inline int icmp_to_snat_backend(const struct hook *h, const struct packet *p,
						const struct icmp_quote *q, int *reason)
{
	struct snat_fwd_value *fwd;
	struct snat_work *s;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&snat_scratch, &zero);
	fwd = bpf_map_lookup_elem(&snat_fwd, &p->key);
	if (!fwd)
		fwd = bpf_map_lookup_elem(&snat_fwd_ovf, &p->key);
	if (!s || !fwd) {
		*reason = L4LB_R_PASS_NOT_SERVICE;
		return hook_pass(h);
	}
	/* A copy: another CPU may reuse the entry while this one works. */
	s->fv = *fwd;
	return icmp_snat_send(h, p, q, s->fv.snat_addr, s->fv.snat_port, s->fv.backend_addr, s->fv.backend_port, reason);
}

/*
 * An ICMP error from the backend side about a packet the LB sent a SNAT
 * backend (p->key: the backend's reply tuple, backend:port -> SNAT
 * address:port) goes back to the client as the binding's replies do: from
 * the VIP, quoting client:port -> VIP:port, the packet the client sent.
 */
static __always_inline int icmp_to_snat_client(const struct hook *h, const struct packet *p,
					       const struct icmp_quote *q, int *reason)
{
	struct snat_rev_value *rv;
	struct snat_work *s;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&snat_scratch, &zero);
	if (!s || !snat_is_ours(p))
		goto pass;
	snat_reply_key(&s->rk, p);
	rv = bpf_map_lookup_elem(&snat_rev, &s->rk);
	if (!rv)
		rv = bpf_map_lookup_elem(&snat_rev_ovf, &s->rk);
	if (!rv)
		goto pass;
	s->rv = *rv;
	return icmp_snat_send(h, p, q, s->rv.vip, s->rv.vip_port, s->rv.client_addr, s->rv.client_port, reason);
pass:
	*reason = L4LB_R_PASS_NOT_SERVICE;
	return hook_pass(h);
}

/*
 * An ICMP error (parse_packet stopped at its header; p describes the outer
 * packet). An error goes to the source of the packet it quotes, so one
 * about a frontend's flow quotes the reply VIP:port -> client:port and is
 * addressed to the VIP; one about a packet sent to a SNAT backend quotes
 * SNAT address:port -> backend:port and is addressed to the SNAT address.
 * Either way, p->key becomes the quote seen from its destination (the
 * client's flow, or the backend's reply tuple), which is what the service
 * and binding tables are keyed by. Counts its own reasons: every error sent
 * on is icmp_error_forwarded.
 */
static __always_inline int icmp_error(const struct hook *h, struct packet *p)
{
	struct svc_key sk = {};
	struct icmp_quote q;
	struct svc_value *svc;
	int reason = -1, verdict, r;

	r = icmp_parse(h, p, &q);
	if (r >= 0)
		goto pass;
	/* Only well-formed errors go on: lb_process checked the outer
	 * headers (validate.h); the ICMP checksum covers the message. */
	if (!h->xdp) {
		struct __sk_buff *skb = hook_skb(h);

		bpf_skb_pull_data(skb, skb->len);
	}
	if (!icmp_csum_ok(h, p)) {
		r = L4LB_R_PASS_ICMP_CSUM;
		goto pass;
	}
	if (p->vlan) {
		r = L4LB_R_PASS_VLAN;
		goto pass;
	}
	if (local_source(p->family, p->key.src)) {
		r = L4LB_R_PASS_LOCAL_SOURCE;
		goto pass;
	}
	if (!snat_addr_eq(p->key.dst, q.key.src)) {
		r = L4LB_R_PASS_NOT_SERVICE;
		goto pass;
	}
	copy16(p->key.src, q.key.dst);
	copy16(p->key.dst, q.key.src);
	p->key.sport = q.key.dport;
	p->key.dport = q.key.sport;
	p->key.proto = q.key.proto;
	p->l4_hlen = ICMP_HLEN;

	svc_key_of(&sk, &p->key);
	svc = bpf_map_lookup_elem(&services, &sk);
	if (!svc) {
		verdict = icmp_to_snat_client(h, p, &q, &reason);
	} else if ((svc->flags & L4LB_SVC_SOURCE_RANGES) && !source_allowed(svc->id, p->key.src)) {
		/* No flow of that client can exist. */
		reason = L4LB_R_DROP_SOURCE_RANGE;
		verdict = hook_drop(h);
	} else if (svc->mode == L4LB_MODE_SNAT) {
		verdict = icmp_to_snat_backend(h, p, &q, &reason);
	} else {
		verdict = icmp_to_dsr_backend(h, svc, p, &q, &reason);
	}
	if (verdict != hook_drop(h) && reason != L4LB_R_PASS_NOT_SERVICE)
		reason = L4LB_R_ICMP_ERROR_FORWARDED;
	if (reason >= 0)
		count_reason(reason, p->l3_len);
	return verdict;
pass:
	count_reason(r, p->l3_len);
	return hook_pass(h);
}

/*
 * What lb_process leaves to its entry point: an ICMP path to run. Those
 * paths are global functions (below), and are called from the entry point
 * rather than from lb_process: the verifier adds a callee's stack to its
 * caller's, and lb_process's frame leaves no room for theirs.
 */
enum icmp_todo_kind {
	ICMP_TODO_NONE = 0,
	ICMP_TODO_ERROR,   /* an ICMP error to read and maybe pass on (icmp_error) */
	ICMP_TODO_TOO_BIG, /* a packet too big for the dispatch to answer (icmp_too_big) */
	ICMP_TODO_BFD,     /* XDP: a BFD control packet the datapath may answer for a restarting l4lbd (bfd.h) */
};
/* l4lb_trace (traceout.h) reads the kind by these values. */
_Static_assert(ICMP_TODO_ERROR == 1 && ICMP_TODO_TOO_BIG == 2, "icmp_todo_kind as traceout.h reads it");

struct icmp_todo {
	struct packet p;   /* the packet as parse_packet read it */
	__u32 mtu;         /* TOO_BIG: the egress MTU */
	__u32 overhead;    /* TOO_BIG: what the dispatch adds */
	__u32 kind;        /* enum icmp_todo_kind */
	__u32 pad;
};

__noinline int l4lb_validate_xdp(struct xdp_md *ctx, const struct packet *p, __u32 slow);
__noinline int l4lb_validate_tc(struct __sk_buff *ctx, const struct packet *p, __u32 slow);

/* May p be forwarded (validate.h)? -1, or the reason it may not. gen is
 * flow_cache_gen as read for this packet (l2.h). */
static __always_inline int validate(const struct hook *h, const struct packet *p, __u32 gen)
{
#ifdef L4LB_BENCH_NO_VALIDATE
	/* Only for measuring what validation costs (docs/datapath.md): never
	 * in a committed object. */
	return -1;
#endif
	int slow, r;

	if (!l2_to_host(h, gen))
		return L4LB_R_PASS_NOT_FOR_HOST;
	r = validate_fast(h, p, &slow);

	if (r >= 0 || !slow)
		return r;
	if (h->xdp)
		return l4lb_validate_xdp(h->ctx, p, slow);
	return l4lb_validate_tc(h->ctx, p, slow);
}

/*
 * A TCP/UDP packet to no frontend: maybe a backend's reply to a SNAT flow.
 * A reply too big for the path to its client is left to the ICMP path
 * (todo), which answers the backend from the SNAT address, as the router
 * hop the LB is for it.
 */
static __always_inline int not_frontend(const struct hook *h, struct icmp_todo *todo)
{
	const struct packet *p = &todo->p;
	__u32 mtu = 0;
	int r, verdict;

	if (snat_is_ours(p)) {
		r = validate(h, p, flow_cache_gen_now());
		if (r >= 0) {
			count_reason(r, p->l3_len);
			return hook_pass(h);
		}
		verdict = snat_reply(h, p, segment_len(h, p, 0), &mtu);
		if (unlikely(mtu)) {
			todo->mtu = mtu;
			todo->overhead = 0;
			todo->kind = ICMP_TODO_TOO_BIG;
		}
		return verdict;
	}
	if (unlikely(h->xdp && bfd_maybe(p))) {
		/* Counted there: an answered packet is not passed. */
		todo->kind = ICMP_TODO_BFD;
		return hook_pass(h);
	}
	count_reason(L4LB_R_PASS_NOT_SERVICE, p->l3_len);
	return hook_pass(h);
}

static __always_inline int lb_process(const struct hook *h, struct icmp_todo *todo)
{
	struct packet *p = &todo->p;
	struct selection sel;
	struct svc_value *svc;
	struct flow_cache_entry *fc;
	struct ct_value *ct;
	struct too_big tb = {};
	void *data, *data_end;
	int reason = -1, verdict, r, syn, has_hash;
	__u32 svc_id, mode, dispatch, word, gen;
	__u64 now, mix, hash = 0;

	hook_pull(h, PARSE_PULL);
	data = hook_data(h);
	data_end = hook_data_end(h);
	/* Set by parse_packet only once it reaches L4. */
	p->key.proto = 0;
	r = parse_packet(data, data_end, p);
	if (r >= 0) {
		if (unlikely(r == L4LB_R_PASS_NOT_SERVICE &&
			     (p->key.proto == IPPROTO_ICMP || p->key.proto == IPPROTO_ICMPV6))) {
			/* An error is only passed on with well-formed outer
			 * headers; icmp_error checks the rest. */
			r = validate(h, p, flow_cache_gen_now());
			if (r >= 0) {
				count_reason(r, p->l3_len);
				return hook_pass(h);
			}
			todo->kind = ICMP_TODO_ERROR;
			return hook_pass(h);
		}
		count_reason(r, data_end - data);
		return hook_pass(h);
	}
	if (!vip_maybe(&p->key))
		return not_frontend(h, todo);
	gen = flow_cache_gen_now();
	r = validate(h, p, gen);
	if (r >= 0) {
		count_reason(r, p->l3_len);
		return hook_pass(h);
	}

	/*
	 * The established fast path: a flow the connection table knows,
	 * whose service has not changed since (ct_established), is forwarded
	 * by its entry alone, read from this CPU's flow cache while the copy
	 * there is usable (flowcache.h). Anything else takes the full path
	 * below.
	 */
	now = coarse_now();
	mix = flow_key_mix(&p->key);
	fc = NULL;
	if (flow_cache_may(p) && !p->vlan) {
		fc = flow_cache_slot(mix);
		if (fc && flow_cache_hit(fc, p, now, gen)) {
			word = fc->svc_word;
			if (L4LB_WORD_MODE(word) == L4LB_MODE_SNAT && snat_ttl_expired(h, p)) {
				count_reason(L4LB_R_PASS_TTL_EXCEEDED, p->l3_len);
				return hook_pass(h);
			}
			svc_id = fc->svc_id;
			sel.be = &fc->be;
			sel.backend_id = fc->backend_id;
			sel.hash = fc->hash;
			sel.fc = fc;
			goto established;
		}
	}
	/*
	 * A SYN of a frontend is most likely a new flow: it will need the
	 * flow hash and then (DSR) the handshakes bucket the hash picks.
	 * With the hash computed first and the bucket read right after the
	 * connection-table lookup, the two misses (each a random bucket of a
	 * table not in cache) overlap rather than add up: about 15% of a
	 * SYN (docs/datapath.md). Only for a frontend, so that SYNs to no
	 * service do not buy the hash; any other packet is most likely
	 * established and never needs it.
	 */
	svc = NULL;
	has_hash = 0;
	syn = p->key.proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	if (syn) {
		svc = svc_lookup(p, now, gen);
		if (svc) {
			hash = flow_hash(&p->key);
			/* Computed here, not sunk past the lookup below. */
			barrier_var(hash);
			has_hash = 1;
		}
	}
	/* A SYN whose key the filter has never seen has no entry to
	 * follow: it skips the table's cold bucket (ctfilter.h). */
	ct = NULL;
	if (!syn)
		ct_filter_prefetch(mix);
	if (!syn || ct_filter_maybe(mix))
		ct = bpf_map_lookup_elem(&conntrack, &p->key);
	/* A SNAT SYN makes its binding instead (snat.h). */
	if (has_hash && svc->mode != L4LB_MODE_SNAT)
		handshake_prefetch(hash);
	if (ct && !p->vlan) {
		sel.be = ct_established(ct, &word);
		if (sel.be) {
			svc_id = ct->svc_id;
			if (L4LB_WORD_MODE(word) == L4LB_MODE_SNAT && snat_ttl_expired(h, p)) {
				count_reason(L4LB_R_PASS_TTL_EXCEEDED, p->l3_len);
				return hook_pass(h);
			}
			ct_touch(ct, now);
			ct_track_close(ct, p);
			sel.backend_id = L4LB_CT_ID(ct->backend_id);
			sel.hash = ct->hash;
			sel.fc = fc;
			if (fc)
				flow_cache_fill(fc, p, ct, sel.be, word, now, gen);
			goto established;
		}
	}

	if (!syn)
		svc = svc_lookup(p, now, gen);
	if (!svc)
		return not_frontend(h, todo);
	if ((svc->flags & L4LB_SVC_SOURCE_RANGES) && !source_allowed(svc->id, p->key.src)) {
		count_reason(L4LB_R_DROP_SOURCE_RANGE, p->l3_len);
		return hook_drop(h);
	}
	/* Only here, where a flow is balanced: no entry is ever made for a
	 * local source, so the established paths above need no check. */
	if (local_source(p->family, p->key.src)) {
		count_reason(L4LB_R_PASS_LOCAL_SOURCE, p->l3_len);
		return hook_pass(h);
	}
	if (unlikely(ah_refused(p, svc->mode, svc->dispatch))) {
		count_reason(L4LB_R_PASS_IPV6_AH, p->l3_len);
		return hook_pass(h);
	}
	/* XDP cannot re-tag a frame for another VLAN; at tc on the VLAN
	 * device the tag is already gone. */
	if (p->vlan) {
		count_reason(L4LB_R_PASS_VLAN, p->l3_len);
		return hook_pass(h);
	}

	/* SNAT makes the LB a router hop: the stack answers time-exceeded. */
	if (svc->mode == L4LB_MODE_SNAT && snat_ttl_expired(h, p)) {
		count_reason(L4LB_R_PASS_TTL_EXCEEDED, p->l3_len);
		return hook_pass(h);
	}

	r = select_backend(p, svc, &sel, 1, ct, now, hash, has_hash);
	if (r >= 0) {
		count_reason(r, p->l3_len);
		return hook_drop(h);
	}
	mode = svc->mode;
	dispatch = svc->dispatch;
	svc_id = svc->id;
	goto forward;

established:
	mode = L4LB_WORD_MODE(word);
	dispatch = L4LB_WORD_DISPATCH(word);
	sel.new_flow = 0;
	sel.has_entry = 1;
	if (unlikely(ah_refused(p, mode, dispatch))) {
		count_reason(L4LB_R_PASS_IPV6_AH, p->l3_len);
		return hook_pass(h);
	}
forward:
	switch (mode) {
	case L4LB_MODE_DSR:
		verdict = dsr_dispatch(h, dispatch, p, &sel, &tb, &reason);
		if (unlikely(reason == L4LB_R_DROP_FRAG_NEEDED)) {
			/* Not forwarded; counted by the ICMP path. */
			todo->mtu = tb.mtu;
			todo->overhead = tb.overhead;
			todo->kind = ICMP_TODO_TOO_BIG;
			return verdict;
		}
		break;
	case L4LB_MODE_SNAT:
		verdict = snat_forward(h, p, &sel, svc_id, segment_len(h, p, 0), now, &tb.mtu, &reason);
		if (unlikely(reason == L4LB_R_DROP_FRAG_NEEDED)) {
			/* Answered as a router hop would (ip_forward); SNAT
			 * adds nothing to the packet. */
			todo->mtu = tb.mtu;
			todo->overhead = 0;
			todo->kind = ICMP_TODO_TOO_BIG;
			return verdict;
		}
		break;
	default:
		/* The control plane never programs a mode this object lacks. */
		reason = L4LB_R_DROP_NO_BACKEND;
		verdict = hook_drop(h);
	}

	if (reason >= 0)
		count_reason(reason, p->l3_len);
	if (verdict != hook_drop(h)) {
		count_forward(svc_id, sel.backend_id, p->l3_len, sel.new_flow);
		flow_count(&p->key, p->l3_len, sel.has_entry);
	}
	return verdict;
}

/* lb_process for each hook, in a frame of its own (see struct icmp_todo). */
static __noinline int lb_process_xdp(struct xdp_md *ctx, struct icmp_todo *todo)
{
	struct hook h = {.ctx = ctx, .xdp = 1};

	return lb_process(&h, todo);
}

static __noinline int lb_process_tc(struct __sk_buff *skb, struct icmp_todo *todo)
{
	struct hook h = {.ctx = skb, .xdp = 0};

	return lb_process(&h, todo);
}

/*
 * The ICMP paths, one global function per hook and path. The verifier
 * checks a global function once, from its arguments' types alone, rather
 * than once for every state its caller may arrive in: inlined, these rarely
 * taken paths more than doubled its work on the whole program. Each wraps
 * the always-inline code with a literal hook, as the entry points do, and
 * counts what happened. The entry points touch no packet pointer after.
 */
__noinline int l4lb_icmp_too_big_xdp(struct xdp_md *ctx, const struct packet *p, __u32 mtu, __u32 overhead)
{
	struct hook h = {.ctx = ctx, .xdp = 1};
	int reason, verdict;

	if (!p)
		return XDP_DROP;
	/* A literal family: each family's code on its own path. */
	if (p->family == 4)
		verdict = icmp_too_big(&h, p, 4, mtu, overhead, &reason);
	else
		verdict = icmp_too_big(&h, p, 6, mtu, overhead, &reason);
	count_reason(reason, p->l3_len);
	return verdict;
}

__noinline int l4lb_icmp_too_big_tc(struct __sk_buff *ctx, const struct packet *p, __u32 mtu, __u32 overhead)
{
	struct hook h = {.ctx = ctx, .xdp = 0};
	int reason, verdict;

	if (!p)
		return TCX_DROP;
	/* A literal family: each family's code on its own path. */
	if (p->family == 4)
		verdict = icmp_too_big(&h, p, 4, mtu, overhead, &reason);
	else
		verdict = icmp_too_big(&h, p, 6, mtu, overhead, &reason);
	count_reason(reason, p->l3_len);
	return verdict;
}

/* The walks of validate.h, one global function per hook (see above). */
__noinline int l4lb_validate_xdp(struct xdp_md *ctx, const struct packet *p, __u32 slow)
{
	struct hook h = {.ctx = ctx, .xdp = 1};

	if (!p)
		return L4LB_R_PASS_MALFORMED_L3;
	return validate_slow(&h, p, slow);
}

__noinline int l4lb_validate_tc(struct __sk_buff *ctx, const struct packet *p, __u32 slow)
{
	struct hook h = {.ctx = ctx, .xdp = 0};

	if (!p)
		return L4LB_R_PASS_MALFORMED_L3;
	return validate_slow(&h, p, slow);
}

/* BFD answers for a restarting l4lbd (bfd.h); XDP only. */
__noinline int l4lb_bfd_answer_xdp(struct xdp_md *ctx, const struct packet *p)
{
	int verdict;

	if (!p)
		return XDP_PASS;
	verdict = bfd_answer(ctx, p);
	if (verdict == XDP_PASS)
		count_reason(L4LB_R_PASS_NOT_SERVICE, p->l3_len);
	return verdict;
}

__noinline int l4lb_icmp_error_xdp(struct xdp_md *ctx, struct packet *p)
{
	struct hook h = {.ctx = ctx, .xdp = 1};

	if (!p)
		return XDP_PASS;
	return icmp_error(&h, p);
}

__noinline int l4lb_icmp_error_tc(struct __sk_buff *ctx, struct packet *p)
{
	struct hook h = {.ctx = ctx, .xdp = 0};

	if (!p)
		return TCX_NEXT;
	return icmp_error(&h, p);
}

SEC("xdp")
int l4lb_xdp(struct xdp_md *ctx)
{
	struct icmp_todo todo;
	int verdict;
	__u32 tracing = trace_begin();

	todo.kind = ICMP_TODO_NONE;
	verdict = lb_process_xdp(ctx, &todo);
	if (unlikely(todo.kind == ICMP_TODO_ERROR))
		verdict = l4lb_icmp_error_xdp(ctx, &todo.p);
	else if (unlikely(todo.kind == ICMP_TODO_TOO_BIG))
		verdict = l4lb_icmp_too_big_xdp(ctx, &todo.p, todo.mtu, todo.overhead);
	else if (unlikely(todo.kind == ICMP_TODO_BFD))
		verdict = l4lb_bfd_answer_xdp(ctx, &todo.p);
	if (unlikely(tracing))
		l4lb_trace(&todo.p, ctx->ingress_ifindex, verdict, L4LB_TRACE_XDP, todo.kind);
	return verdict;
}

SEC("tcx/ingress")
int l4lb_tc(struct __sk_buff *skb)
{
	struct icmp_todo todo;
	int verdict;
	__u32 tracing = trace_begin();

	todo.kind = ICMP_TODO_NONE;
	verdict = lb_process_tc(skb, &todo);
	if (unlikely(todo.kind == ICMP_TODO_ERROR))
		verdict = l4lb_icmp_error_tc(skb, &todo.p);
	else if (unlikely(todo.kind == ICMP_TODO_TOO_BIG))
		verdict = l4lb_icmp_too_big_tc(skb, &todo.p, todo.mtu, todo.overhead);
	if (unlikely(tracing))
		l4lb_trace(&todo.p, skb->ifindex, verdict, L4LB_TRACE_TC, todo.kind);
	return verdict;
}

/*
 * Health probes through the VIP path (tcx egress of the datapath
 * interfaces). l4lbd checks a DSR backend the way clients reach it: its
 * probe connects to the VIP with skb->mark naming the backend (config.h),
 * and this program dispatches the probe to that backend exactly as
 * lb_process dispatches a client's packet. The backend answers the LB's
 * address from the VIP, like any client. Unmarked traffic is untouched.
 */
SEC("tcx/egress")
int l4lb_hc(struct __sk_buff *skb)
{
	struct hook h = {.ctx = skb, .xdp = 0};
	struct svc_key sk = {};
	struct selection sel = {};
	struct svc_value *svc;
	struct too_big tb;
	struct packet p;
	void *data, *data_end;
	__u32 mark = skb->mark, id;
	int reason = -1, verdict;

	if ((mark & cfg_hc_mark_mask) != cfg_hc_mark)
		return TCX_NEXT;
	id = mark & ~cfg_hc_mark_mask;
	/* Whatever happens next, the mark has done its job. */
	skb->mark = 0;

	hook_pull(&h, PARSE_PULL);
	data = hook_data(&h);
	data_end = hook_data_end(&h);
	if (parse_packet(data, data_end, &p) >= 0 || p.vlan)
		return TCX_NEXT;
	svc_key_of(&sk, &p.key);
	svc = bpf_map_lookup_elem(&services, &sk);
	/* SNAT backends are probed on their own address, unmarked. */
	if (!svc || svc->mode != L4LB_MODE_DSR)
		return TCX_NEXT;
	sel.be = backend_of(id, svc->id);
	if (!sel.be) {
		count_reason(L4LB_R_DROP_HC_NO_BACKEND, p.l3_len);
		return TCX_DROP;
	}
	sel.backend_id = id;
	sel.hash = (__u32)flow_hash(&p.key);
	/* A probe too big for the path is dropped: the probe is the LB's own. */
	verdict = dsr_dispatch(&h, svc->dispatch, &p, &sel, &tb, &reason);
	if (reason >= 0)
		count_reason(reason, p.l3_len);
	return verdict;
}
