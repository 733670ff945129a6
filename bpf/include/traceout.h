/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The traced packet's event (trace.h): l4lb_trace, run by an entry point
 * after its verdict, only while a trace runs. It reads what the counters
 * noted and looks the rest up after the fact (the service entry, the
 * backend, the connection-table entry, the SNAT binding): none of it runs
 * without a trace, so the forwarding paths carry none of its work.
 */
#ifndef L4LB_TRACEOUT_H
#define L4LB_TRACEOUT_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "snat.h"
#include "trace.h"

/* (a & mask) == want over 16 bytes; all three 8-byte aligned. */
static __always_inline int trace_addr_match(const __u8 *a, const __u8 *want, const __u8 *mask)
{
	const __u64 *x = (const __u64 *)a, *w = (const __u64 *)want, *m = (const __u64 *)mask;

	return ((x[0] & m[0]) == w[0]) && ((x[1] & m[1]) == w[1]);
}

/* Does the flow in ev (client side) match f? The backend part is separate:
 * it is known only once the backend is. */
static __always_inline int trace_flow_match(const struct trace_filter *f, const struct trace_event *ev)
{
	if (f->proto && f->proto != ev->key.proto)
		return 0;
	if (f->port && f->port != ev->key.dport)
		return 0;
	return trace_addr_match(ev->key.src, f->client, f->client_mask) &&
	       trace_addr_match(ev->key.dst, f->vip, f->vip_mask);
}

/*
 * A packet to no frontend may be a backend's reply to a SNAT flow: ev
 * becomes the flow it belongs to (client -> VIP:port), with the backend and
 * binding from the reply. 0 when it is none.
 */
static __always_inline int trace_reply(const struct packet *p, struct trace_event *ev)
{
	struct snat_rev_key rk;
	struct snat_rev_value *rv;

	if (!snat_is_ours(p))
		return 0;
	snat_reply_key(&rk, p);
	rv = bpf_map_lookup_elem(&snat_rev, &rk);
	if (!rv)
		rv = bpf_map_lookup_elem(&snat_rev_ovf, &rk);
	if (!rv)
		return 0;
	copy16(ev->key.src, rv->client_addr);
	copy16(ev->key.dst, rv->vip);
	ev->key.sport = rv->client_port;
	ev->key.dport = rv->vip_port;
	copy16(ev->backend, p->key.src);
	ev->backend_port = p->key.sport;
	copy16(ev->snat_addr, p->key.dst);
	ev->snat_port = p->key.dport;
	ev->svc_id = rv->svc_id;
	ev->mode = L4LB_MODE_SNAT;
	ev->flags |= L4LB_TRACE_F_REPLY | L4LB_TRACE_F_SNAT;
	return 1;
}

/* May one more event go out on this CPU now (trace_filter.rate)? */
static __always_inline int trace_admit(const struct trace_filter *f, struct trace_note *n, __u64 now)
{
	__u64 second = now / 1000000000ULL;

	n->matched++;
	if (!f->rate)
		return 1;
	if (n->second != second) {
		n->second = second;
		n->in_second = 0;
	}
	if (n->in_second >= f->rate) {
		n->sampled++;
		return 0;
	}
	n->in_second++;
	return 1;
}

/*
 * Send the event of the packet p (as parse_packet and the paths after it
 * left it), which got verdict on ifindex at hook. kind is the ICMP path
 * the entry point ran (enum icmp_todo_kind of lb.c; 0 none). A global
 * function: the verifier checks it once, and the entry points' frames do
 * not carry its stack.
 */
__noinline int l4lb_trace(const struct packet *p, __u32 ifindex, int verdict, __u32 hook, __u32 kind)
{
	struct trace_event *ev;
	struct trace_filter *f;
	struct trace_note *n;
	struct svc_key sk = {};
	struct svc_value *svc;
	const struct backend *be;
	struct snat_fwd_value *fwd;
	__u32 zero = 0;

	f = bpf_map_lookup_elem(&trace_ctl, &zero);
	n = bpf_map_lookup_elem(&trace_notes, &zero);
	/* key.proto is set once the parser reached L4: nothing before has
	 * a flow to match. */
	if (!p || !f || !n || !f->session || !p->key.proto)
		return 0;
	/* Built in the CPU's note rather than on the stack. */
	ev = &n->ev;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->key = p->key;
	ev->session = f->session;
	ev->ifindex = ifindex;
	ev->verdict = verdict;
	ev->reason = n->reason;
	ev->l3_len = p->l3_len;
	ev->hook = hook;
	ev->family = p->family;
	ev->tcp_flags = p->tcp_flags;
	if (kind == 1)
		ev->flags |= L4LB_TRACE_F_ICMP_ERROR;
	else if (kind == 2)
		ev->flags |= L4LB_TRACE_F_TOO_BIG;

	svc_key_of(&sk, &p->key);
	svc = bpf_map_lookup_elem(&services, &sk);
	if (svc) {
		ev->svc_id = svc->id;
		ev->mode = svc->mode;
		ev->dispatch = svc->dispatch;
	} else {
		/* Neither a frontend's nor a SNAT reply: the filter decides
		 * on the packet's own tuple (only an empty one selects it). */
		trace_reply(p, ev);
	}
	if (!trace_flow_match(f, ev))
		return 0;

	if (n->forwarded) {
		ev->flags |= L4LB_TRACE_F_FORWARDED;
		ev->svc_id = n->svc_id;
		ev->backend_id = n->backend_id;
		be = bpf_map_lookup_elem(&backends, &ev->backend_id);
		if (be) {
			copy16(ev->backend, be->addr);
			ev->backend_port = be->port;
		}
		if (bpf_map_lookup_elem(&conntrack, &p->key))
			ev->ct = n->new_flow ? L4LB_TRACE_CT_CREATED : L4LB_TRACE_CT_HIT;
		else
			ev->ct = n->insert_failed ? L4LB_TRACE_CT_INSERT_FAILED : L4LB_TRACE_CT_MISS;
		if (ev->mode == L4LB_MODE_SNAT) {
			fwd = bpf_map_lookup_elem(&snat_fwd, &p->key);
			if (!fwd)
				fwd = bpf_map_lookup_elem(&snat_fwd_ovf, &p->key);
			if (fwd) {
				copy16(ev->snat_addr, fwd->snat_addr);
				ev->snat_port = fwd->snat_port;
				ev->flags |= L4LB_TRACE_F_SNAT;
			}
		}
	}
	if (!trace_addr_match(ev->backend, f->backend, f->backend_mask))
		return 0;
	if (f->backend_port && f->backend_port != ev->backend_port)
		return 0;

	ev->time_ns = bpf_ktime_get_ns();
	if (!trace_admit(f, n, ev->time_ns))
		return 0;
	if (bpf_ringbuf_output(&trace_events, ev, sizeof(*ev), 0))
		n->lost++;
	else
		n->sent++;
	return 0;
}

#endif
