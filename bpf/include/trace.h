/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Tracing one flow's decisions (`l4lbctl trace`): what the datapath keeps
 * while a trace runs, and what it costs while none does.
 *
 * l4lbd writes a filter into trace_ctl with a nonzero session to start a
 * trace and zeroes the session to stop it. With no session, a packet pays
 * one inlined array load at its entry point and one in the counter it
 * bumps (stats.h): nothing else of this file runs. With a session, the
 * entry point clears this CPU's trace_note, the counters write the
 * reason, service, backend and new-flow mark they count into it, and
 * after the verdict the entry point calls l4lb_trace (traceout.h), which
 * matches the packet against the filter and sends an event to l4lbd
 * through trace_events.
 *
 * None of these maps is pinned: a trace belongs to the l4lbd that runs
 * it, and a restarted daemon starts with none.
 *
 * Addresses are 16 bytes in network order, IPv4-mapped for IPv4, as in
 * types.h; bpf2go generates the Go types from these declarations.
 */
#ifndef L4LB_TRACE_H
#define L4LB_TRACE_H

#include "common.h"
#include "types.h"

/*
 * What a trace selects (trace_ctl[0]). An address matches when
 * (addr & mask) == want, so an all-zero mask matches anything, a partial
 * one a prefix; a zero port or protocol matches any. A backend filter
 * matches only packets that reached a backend.
 */
struct trace_filter {
	__u8 client[16];        /* the flow's client address ... */
	__u8 client_mask[16];   /* ... under this mask */
	__u8 vip[16];           /* the frontend's address */
	__u8 vip_mask[16];
	__u8 backend[16];       /* the backend's address */
	__u8 backend_mask[16];
	__u32 session;          /* 0: no trace runs; else the session's number, in each event */
	__u32 rate;             /* events per second and CPU before sampling; 0: no limit */
	__be16 port;            /* frontend port, network order */
	__be16 backend_port;    /* network order */
	__u8 proto;             /* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad[3];
} __attribute__((aligned(8)));


/* trace_event.hook. The trace enums are one byte (packed). */
enum __attribute__((packed)) l4lb_trace_hook {
	L4LB_TRACE_XDP = 0,
	L4LB_TRACE_TC = 1,
};

/* trace_event.ct: what the connection table did for the packet. */
enum __attribute__((packed)) l4lb_trace_ct {
	L4LB_TRACE_CT_NONE = 0,          /* not forwarded, or not a client packet */
	L4LB_TRACE_CT_HIT = 1,           /* forwarded by the flow's entry */
	L4LB_TRACE_CT_MISS = 2,          /* balanced without an entry (a SYN, or over flow_insert_rate) */
	L4LB_TRACE_CT_CREATED = 3,       /* balanced, and an entry created or re-balanced */
	L4LB_TRACE_CT_INSERT_FAILED = 4, /* balanced; the entry could not be inserted */
};

/* trace_event.flags */
enum __attribute__((packed)) l4lb_trace_flags {
	L4LB_TRACE_F_REPLY = 1 << 0,      /* a backend's reply to a SNAT flow; key is the client's flow */
	L4LB_TRACE_F_FORWARDED = 1 << 1,  /* counted as forwarded to a backend */
	L4LB_TRACE_F_ICMP_ERROR = 1 << 2, /* an ICMP error about the flow in key */
	L4LB_TRACE_F_TOO_BIG = 1 << 3,    /* too big for the path: the ICMP answer path ran */
	L4LB_TRACE_F_SNAT = 1 << 4,       /* snat_addr/snat_port hold the flow's binding */
};

/* One traced packet, as l4lb_trace sends it. */
struct trace_event {
	struct flow_key key;    /* the flow as its client sends it */
	__u64 time_ns;          /* bpf_ktime_get_ns() after the verdict */
	__u8 backend[16];       /* the backend (backend_id's entry, or a reply's source) */
	__u8 snat_addr[16];     /* L4LB_TRACE_F_SNAT: the binding's SNAT address */
	__be16 backend_port;    /* network order */
	__be16 snat_port;       /* network order */
	__u32 session;          /* trace_filter.session when sent */
	__u32 ifindex;          /* the interface it arrived on */
	__s32 verdict;          /* the program's return value (XDP action, tcx verdict) */
	__s32 reason;           /* enum l4lb_reason counted last; -1: none */
	__u32 svc_id;           /* 0: no service */
	__u32 backend_id;       /* 0: no backend */
	__u16 l3_len;           /* IP length as received */
	enum l4lb_trace_hook hook;
	__u8 family;            /* 4 or 6 */
	__u8 mode;              /* enum l4lb_mode of the service; 0 without one */
	__u8 dispatch;          /* enum l4lb_dispatch */
	enum l4lb_trace_ct ct;
	enum l4lb_trace_flags flags;
	__u8 tcp_flags;
	__u8 pad[3];
} __attribute__((aligned(8)));

/*
 * One CPU's notes about the packet it is processing, and the current
 * session's counts on that CPU. l4lbd zeroes the counts before a session.
 */
struct trace_note {
	__s32 reason;           /* the last reason counted for the packet; -1: none */
	__u32 svc_id;           /* count_forward's service; 0: not forwarded */
	__u32 backend_id;       /* count_forward's backend */
	__u8 forwarded;         /* count_forward ran */
	__u8 new_flow;          /* count_forward's new_flow */
	__u8 insert_failed;     /* the connection-table insert failed (reason event_ct_insert_failed) */
	__u8 pad;
	__u64 second;           /* the second (of bpf_ktime_get_ns) `in_second` counts */
	__u64 in_second;        /* events sent in that second */
	__u64 matched;          /* packets the filter selected */
	__u64 sent;             /* events written to trace_events */
	__u64 sampled;          /* selected but over the rate: not sent */
	__u64 lost;             /* selected but trace_events was full */
	struct trace_event ev;  /* the event being built (l4lb_trace) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct trace_filter);
	__uint(max_entries, 1);
} trace_ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct trace_note);
	__uint(max_entries, 1);
} trace_notes SEC(".maps");

/* 256 KiB: about 2,000 events of a burst before l4lbd reads them. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} trace_events SEC(".maps");

/* The running session, or 0: the one load a packet pays without a trace. */
static __always_inline __u32 trace_session(void)
{
	__u32 zero = 0;
	struct trace_filter *f = bpf_map_lookup_elem(&trace_ctl, &zero);

	return f ? f->session : 0;
}

/* This CPU's note while a trace runs, else NULL. */
static __always_inline struct trace_note *trace_note_on(void)
{
	__u32 zero = 0;

	if (likely(!trace_session()))
		return NULL;
	return bpf_map_lookup_elem(&trace_notes, &zero);
}

/* At an entry point: is a trace running? If so, clear the packet's note. */
static __always_inline __u32 trace_begin(void)
{
	struct trace_note *n = trace_note_on();

	if (likely(!n))
		return 0;
	n->reason = -1;
	n->svc_id = 0;
	n->backend_id = 0;
	n->forwarded = 0;
	n->new_flow = 0;
	n->insert_failed = 0;
	return 1;
}

/* count_reason's note. An insert failure is not the packet's verdict. */
static __always_inline void trace_note_reason(__u32 reason)
{
	struct trace_note *n = trace_note_on();

	if (likely(!n))
		return;
	if (reason == L4LB_R_EVENT_CT_INSERT_FAILED)
		n->insert_failed = 1;
	else
		n->reason = reason;
}

/* count_forward's note. */
static __always_inline void trace_note_forward(__u32 svc_id, __u32 backend_id, int new_flow)
{
	struct trace_note *n = trace_note_on();

	if (likely(!n))
		return;
	n->forwarded = 1;
	n->svc_id = svc_id;
	n->backend_id = backend_id;
	n->new_flow = !!new_flow;
}

#endif
