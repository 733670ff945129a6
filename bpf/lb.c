// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * The l4lb load-balancer datapath.
 *
 * Per packet: parse; look the frontend up in `services`; choose a backend
 * (connection table, then the service's Maglev table); forward it the way
 * the service's mode says; count. Everything that is not a well-formed
 * packet to a frontend goes to the stack untouched, and is counted by reason.
 */
#include "include/common.h"
#include "include/config.h"
#include "include/conntrack.h"
#include "include/encap.h"
#include "include/forward.h"
#include "include/maps.h"
#include "include/parse.h"
#include "include/stats.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* DSR over IPIP: encapsulate to the backend, which replies from the VIP. */
static __always_inline int dsr_ipip(struct xdp_md *ctx, const struct packet *p,
				    const struct selection *sel, int *reason)
{
	struct route rt;
	__u8 src[16];
	int hdr = p->family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	int r;

	encap_source(p->family, sel->hash, src);
	r = route_lookup(ctx, p->family, src, sel->be->addr, p->l3_len + hdr, &rt);
	if (r >= 0)
		goto drop;
	r = encap_ipip(ctx, p, src, sel->be->addr, sel->hash);
	if (r >= 0)
		goto drop;
	return transmit(ctx, &rt, reason);
drop:
	*reason = r;
	return XDP_DROP;
}

SEC("xdp")
int l4lb_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct svc_key sk = {};
	struct selection sel;
	struct svc_value *svc;
	struct packet p;
	int reason = -1, verdict, r;

	r = parse_packet(data, data_end, &p);
	if (r >= 0) {
		count_reason(r, data_end - data);
		return XDP_PASS;
	}

	copy16(sk.addr, p.key.dst);
	sk.port = p.key.dport;
	sk.proto = p.key.proto;
	svc = bpf_map_lookup_elem(&services, &sk);
	if (!svc) {
		count_reason(L4LB_R_PASS_NOT_SERVICE, p.l3_len);
		return XDP_PASS;
	}
	if (p.vlan) {
		count_reason(L4LB_R_PASS_VLAN, p.l3_len);
		return XDP_PASS;
	}

	r = select_backend(&p, svc, &sel);
	if (r >= 0) {
		count_reason(r, p.l3_len);
		return XDP_DROP;
	}

	switch (svc->mode) {
	case L4LB_MODE_DSR:
		verdict = dsr_ipip(ctx, &p, &sel, &reason);
		break;
	default:
		/* The control plane never programs a mode this object lacks. */
		reason = L4LB_R_DROP_NO_BACKEND;
		verdict = XDP_DROP;
	}

	if (reason >= 0)
		count_reason(reason, p.l3_len);
	if (verdict != XDP_DROP)
		count_forward(svc->id, sel.backend_id, p.l3_len, sel.new_flow);
	return verdict;
}
