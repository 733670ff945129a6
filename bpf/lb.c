// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * The l4lb load-balancer datapath.
 *
 * Per packet: parse; look the frontend up in `services`; choose a backend
 * (connection table, then the service's Maglev table); forward it the way
 * the service's mode says; count. Everything that is not a well-formed
 * packet to a frontend goes to the stack untouched, and is counted by reason.
 *
 * Two entry points share all of it: l4lb_xdp (XDP) and l4lb_tc (tc ingress
 * through tcx, for interfaces where XDP cannot attach); see hook.h.
 */
#include "include/common.h"
#include "include/config.h"
#include "include/conntrack.h"
#include "include/encap.h"
#include "include/forward.h"
#include "include/hook.h"
#include "include/ipopt.h"
#include "include/maps.h"
#include "include/parse.h"
#include "include/snat.h"
#include "include/stats.h"

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

/*
 * The one place a packet that the dispatch would make bigger than the egress
 * MTU (mtu) ends up, before anything in it has changed; overhead is what the
 * dispatch adds. The client is to learn the MTU left to it (mtu - overhead)
 * from ICMP fragmentation-needed / packet-too-big generated here; until
 * then the packet is dropped and counted.
 */
static __always_inline int frag_needed(const struct hook *h, const struct packet *p,
				       __u32 mtu, __u32 overhead, int *reason)
{
	*reason = L4LB_R_DROP_FRAG_NEEDED;
	return hook_drop(h);
}

/* DSR over IPIP: encapsulate to the backend, which replies from the VIP. */
static __always_inline int dsr_ipip(const struct hook *h, const struct packet *p,
				    const struct selection *sel, int *reason)
{
	struct route rt;
	__u8 src[16];
	__u32 hdr = ipip_overhead(p->family);
	int r;

	encap_source(p->family, sel->hash, src);
	r = route_lookup(h, p->family, src, sel->be->addr, p->l3_len + hdr, segment_len(h, p, hdr), &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED)
		return frag_needed(h, p, rt.mtu, hdr, reason);
	if (r >= 0)
		goto drop;
	r = encap_ipip(h, p, src, sel->be->addr, sel->hash);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/* DSR over Geneve: IPIP's path with UDP and the frontend-naming Geneve header
 * between; the backend's companion decapsulates. */
static __always_inline int dsr_geneve(const struct hook *h, const struct packet *p,
				      const struct selection *sel, int *reason)
{
	struct route rt;
	__u8 src[16];
	__u32 hdr = geneve_overhead(p->family);
	int r;

	encap_source(p->family, sel->hash, src);
	r = route_lookup(h, p->family, src, sel->be->addr, p->l3_len + hdr, segment_len(h, p, hdr), &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED)
		return frag_needed(h, p, rt.mtu, hdr, reason);
	if (r >= 0)
		goto drop;
	r = encap_geneve(h, p, src, sel->be->addr, sel->hash);
	if (r >= 0)
		goto drop;
	return transmit(h, &rt, reason);
drop:
	*reason = r;
	return hook_drop(h);
}

/* DSR with an IP option: the destination becomes the backend (address and
 * port); the SYN or datagram names the frontend in an option (ipopt.h). */
static __always_inline int dsr_opt(const struct hook *h, const struct packet *p,
				   const struct selection *sel, int *reason)
{
	struct route rt;
	__u32 len = opt_len(p);
	int r;

	r = opt_room(h, p, len);
	if (r >= 0)
		goto drop;
	r = route_lookup(h, p->family, p->key.src, sel->be->addr, p->l3_len + len, segment_len(h, p, len), &rt);
	if (r == L4LB_R_DROP_FRAG_NEEDED)
		return frag_needed(h, p, rt.mtu, len, reason);
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

/* Dispatch a DSR packet to sel's backend the way the service says. */
static __always_inline int dsr_dispatch(const struct hook *h, const struct svc_value *svc,
					const struct packet *p, const struct selection *sel, int *reason)
{
	if (svc->dispatch == L4LB_DISPATCH_GENEVE)
		return dsr_geneve(h, p, sel, reason);
	if (svc->dispatch == L4LB_DISPATCH_OPT)
		return dsr_opt(h, p, sel, reason);
	return dsr_ipip(h, p, sel, reason);
}

static __always_inline int lb_process(const struct hook *h)
{
	struct svc_key sk = {};
	struct selection sel;
	struct svc_value *svc;
	struct packet p;
	void *data, *data_end;
	int reason = -1, verdict, r;

	hook_pull(h, PARSE_PULL);
	data = hook_data(h);
	data_end = hook_data_end(h);
	r = parse_packet(data, data_end, &p);
	if (r >= 0) {
		count_reason(r, data_end - data);
		return hook_pass(h);
	}

	copy16(sk.addr, p.key.dst);
	sk.port = p.key.dport;
	sk.proto = p.key.proto;
	svc = bpf_map_lookup_elem(&services, &sk);
	if (!svc) {
		/* Maybe a backend's reply to a SNAT flow. */
		if (snat_is_ours(&p))
			return snat_reply(h, &p, segment_len(h, &p, 0));
		count_reason(L4LB_R_PASS_NOT_SERVICE, p.l3_len);
		return hook_pass(h);
	}
	/* XDP cannot re-tag a frame for another VLAN; at tc on the VLAN
	 * device the tag is already gone. */
	if (p.vlan) {
		count_reason(L4LB_R_PASS_VLAN, p.l3_len);
		return hook_pass(h);
	}

	/* SNAT makes the LB a router hop: the stack answers time-exceeded. */
	if (svc->mode == L4LB_MODE_SNAT && snat_ttl_expired(h, &p)) {
		count_reason(L4LB_R_PASS_TTL_EXCEEDED, p.l3_len);
		return hook_pass(h);
	}

	r = select_backend(&p, svc, &sel);
	if (r >= 0) {
		count_reason(r, p.l3_len);
		return hook_drop(h);
	}

	switch (svc->mode) {
	case L4LB_MODE_DSR:
		verdict = dsr_dispatch(h, svc, &p, &sel, &reason);
		break;
	case L4LB_MODE_SNAT:
		verdict = snat_forward(h, &p, &sel, svc->id, segment_len(h, &p, 0), &reason);
		break;
	default:
		/* The control plane never programs a mode this object lacks. */
		reason = L4LB_R_DROP_NO_BACKEND;
		verdict = hook_drop(h);
	}

	if (reason >= 0)
		count_reason(reason, p.l3_len);
	if (verdict != hook_drop(h))
		count_forward(svc->id, sel.backend_id, p.l3_len, sel.new_flow);
	return verdict;
}

SEC("xdp")
int l4lb_xdp(struct xdp_md *ctx)
{
	struct hook h = {.ctx = ctx, .xdp = 1};

	return lb_process(&h);
}

SEC("tcx/ingress")
int l4lb_tc(struct __sk_buff *skb)
{
	struct hook h = {.ctx = skb, .xdp = 0};

	return lb_process(&h);
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
	copy16(sk.addr, p.key.dst);
	sk.port = p.key.dport;
	sk.proto = p.key.proto;
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
	verdict = dsr_dispatch(&h, svc, &p, &sel, &reason);
	if (reason >= 0)
		count_reason(reason, p.l3_len);
	return verdict;
}
