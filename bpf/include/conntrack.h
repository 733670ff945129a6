/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Backend selection: the connection table first, then the client's
 * remembered backend for services with affinity (affinity.h), then the
 * Maglev table.
 *
 * An entry keeps an established flow on its backend when the backend set
 * changes. It is trusted only while its backend is still programmed for the
 * same service; otherwise the flow is balanced again and the entry rewritten.
 *
 * SYN-flood resistance: a TCP SYN never creates an entry. The flow is balanced
 * (Maglev gives the same answer for the same 5-tuple) and the entry is
 * created by the first packet without SYN, which a spoofed source never
 * sends, so a flood of spoofed SYNs cannot evict established flows from the
 * LRU. What a DSR SYN chose is kept in the handshakes buckets (maps.h),
 * which such a flood can overwrite but which hold no established flow: the
 * first ACK follows its SYN even when the Maglev table changed in between. A flood of packets without SYN (an ACK or UDP flood)
 * would: above datapath.flow_insert_rate new entries per second per CPU, a
 * new flow is forwarded by Maglev alone and not recorded, while a flow whose
 * entry was evicted may be recorded again (ct_readmit).
 *
 * The established fast path (lb.c) finds a flow's entry before any service
 * lookup and forwards by it when ct_established accepts it; everything else
 * goes through select_backend, which also re-validates an entry whose
 * service changed since.
 */
#ifndef L4LB_CONNTRACK_H
#define L4LB_CONNTRACK_H

#include "affinity.h"
#include "clock.h"
#include "ctfilter.h"
#include "maglev.h"
#include "parse.h"
#include "ratelimit.h"
#include "snatovf.h"
#include "stats.h"

/* last_seen is refreshed at most this often, to keep the entry's cache line
 * from bouncing between CPUs on every packet. */
#define CT_REFRESH_NS 1000000000ULL

struct selection {
	const struct backend *be;
	__u32 backend_id;
	__u32 hash;     /* entropy for outer headers */
	int new_flow;   /* an entry was created or re-balanced */
	int has_entry;  /* the flow has a connection entry (hit, made or re-balanced) */
	/* The flow-cache slot of an established flow (flowcache.h): its
	 * route is read from there, or written there once resolved. */
	struct flow_cache_entry *fc;
};

static __always_inline const struct backend *backend_of(__u32 id, __u32 svc_id)
{
	const struct backend *be = bpf_map_lookup_elem(&backends, &id);

	if (!be || !(be->flags & L4LB_BACKEND_ACTIVE) || be->svc_id != svc_id)
		return NULL;
	return be;
}

/* The word svc_gen holds for svc_id; 0 when none. */
static __always_inline __u32 svc_word_of(__u32 svc_id)
{
	__u32 *w = bpf_map_lookup_elem(&svc_gen, &svc_id);

	return w ? *w : 0;
}

/*
 * The established fast path's check of a connection-table entry: the
 * service id still holds what the flow was balanced under (its svc_gen word
 * equals the entry's, see types.h) and the backend is still one of it. Then
 * the flow is forwarded without the service lookup, in the word's mode and
 * dispatch (*word). NULL sends the packet through the full path, which
 * looks the service up and checks the entry again (select_backend).
 */
static __always_inline const struct backend *ct_established(const struct ct_value *ct, __u32 *word)
{
	__u32 w = svc_word_of(ct->svc_id);

	if (w != ct->svc_word || !L4LB_WORD_MODE(w))
		return NULL;
	*word = w;
	return backend_of(L4LB_CT_ID(ct->backend_id), ct->svc_id);
}

/* L4LB_CT_CLOSING as packet p leaves it: set by a client's FIN or RST,
 * cleared by a SYN (the tuple reused for a new connection). */
static __always_inline __u32 ct_closing_after(__u32 backend_id, const struct packet *p)
{
	if (p->key.proto != IPPROTO_TCP)
		return 0;
	if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
		return L4LB_CT_CLOSING;
	if (p->tcp_flags & TCP_FLAG_SYN)
		return 0;
	return backend_id & L4LB_CT_CLOSING;
}

/* Keep an entry's L4LB_CT_CLOSING current: one write when it changes,
 * none on the packets between. */
static __always_inline void ct_track_close(struct ct_value *ct, const struct packet *p)
{
	__u32 id = ct->backend_id;
	__u32 closing = ct_closing_after(id, p);

	if ((id & L4LB_CT_CLOSING) != closing)
		ct->backend_id = L4LB_CT_ID(id) | closing;
}

/* Refresh an entry's last_seen (at most once a second, see CT_REFRESH_NS).
 * Another CPU's clock may be a tick ahead of this one's (clock.h). */
static __always_inline void ct_touch(struct ct_value *ct, __u64 now)
{
	if (now > ct->last_seen && now - ct->last_seen > CT_REFRESH_NS)
		ct->last_seen = now;
}

/* May this CPU record one more new flow now (datapath.flow_insert_rate)? */
static __always_inline int ct_insert_allowed(__u64 now)
{
	if (!cfg_insert_interval_ns)
		return 1;
	return gcra_allow(&insert_buckets, now, cfg_insert_interval_ns, cfg_insert_burst_ns);
}

/*
 * Re-admission: over the insert rate, may a flow without an entry have one
 * all the same? Yes when the connection-table filter has its bit set (the
 * flow most likely had an entry, which a flood's inserts pushed out of the
 * LRU) and the CPU's re-admission budget, as large as the insert budget
 * and never spent by a flow the filter has not seen, allows. So an active
 * flow whose entry was evicted gets it back ahead of new flows while a
 * flood holds the insert budget; a spoofed flow reaches this budget only
 * through the filter's false positives, the share of its bits set (kept
 * low by lb/datapath's rebuilds).
 */
static __always_inline int ct_readmit(const struct packet *p, __u64 now)
{
	if (!cfg_insert_interval_ns || !ct_filter_seen(flow_key_mix(&p->key)))
		return 0;
	if (!gcra_allow(&readmit_buckets, now, cfg_insert_interval_ns, cfg_insert_burst_ns))
		return 0;
	count_event(L4LB_E_CT_READMITTED);
	return 1;
}

/* The handshakes bucket of a flow hash. */
static __always_inline struct handshake_bucket *handshake_bucket_of(__u64 hash)
{
	__u32 b = (__u32)hash & cfg_handshake_mask;

	return bpf_map_lookup_elem(&handshakes, &b);
}

/*
 * Read the handshakes bucket of a flow hash, and nothing more: a SYN does
 * this right after its connection-table lookup, so that the bucket's miss
 * (a random line of a 1 MB array, its page not in the TLB) overlaps the
 * table's instead of following it; select_backend then finds it in cache.
 */
static __always_inline void handshake_prefetch(__u64 hash)
{
	struct handshake_bucket *hb = handshake_bucket_of(hash);

	if (hb) {
		__u64 w = *(volatile __u64 *)&hb->way[0].hash;

		barrier_var(w);
	}
}

/*
 * Must a TCP packet without a connection entry follow its SYN's choice in
 * the handshakes map? Only if the SYN may have gone by another table than
 * the service has now: while its table was replaced less than
 * cfg_handshake_hold_ns ago (a backend added, removed, drained or
 * reweighted), or always for a service whose choice is not the table's
 * alone (random, or affinity, whose entry may be evicted between the SYN
 * and the ACK). Otherwise the table picks what the SYN picked, and a
 * packet without SYN does not read its bucket, a random line of a 1 MB
 * array: about a tenth of a new flow's first packet without SYN
 * (docs/datapath.md).
 */
static __always_inline int handshakes_matter(const struct svc_value *svc, __u64 now)
{
	__u32 id = svc->id;
	__u64 *t, at;

	if (svc->flags & (L4LB_SVC_RANDOM | L4LB_SVC_AFFINITY))
		return 1;
	t = bpf_map_lookup_elem(&maglev_swapped, &id);
	if (!t)
		return 1;
	at = *t;
	/* Another CPU's (or l4lbd's) clock may be a tick ahead. */
	return at && (now <= at || now - at < cfg_handshake_hold_ns);
}

/*
 * Fills sel and returns -1, or returns L4LB_R_DROP_NO_BACKEND. ct is the
 * flow's connection-table entry, or NULL when it has none (the caller
 * looked it up). On a miss, a service with affinity tries the client's
 * remembered backend before Maglev (affinity.h). update 0 looks without
 * leaving a trace, for an ICMP error about the flow: no entry is created or
 * refreshed, here or for affinity. now is coarse_now(), which the caller
 * has already read; hash is the flow hash when has_hash says the caller
 * has computed it.
 */
static __always_inline int select_backend(struct packet *p, const struct svc_value *svc,
					  struct selection *sel, int update, struct ct_value *ct, __u64 now,
					  __u64 hash, int has_hash)
{
	__u32 word = svc->svc_word;
	struct handshake_bucket *hb = NULL;
	__u32 id;

	sel->new_flow = 0;
	/* An entry it hits, or rewrites when re-balanced. */
	sel->has_entry = ct != NULL;
	sel->fc = NULL;
	if (ct && ct->svc_id == svc->id) {
		id = L4LB_CT_ID(ct->backend_id);
		sel->be = backend_of(id, svc->id);
		if (sel->be) {
			if (update) {
				ct_touch(ct, now);
				ct_track_close(ct, p);
				/* Checked against the entry: fast again. */
				if (ct->svc_word != word)
					ct->svc_word = word;
			}
			sel->backend_id = id;
			sel->hash = ct->hash;
			return -1;
		}
	}

	if (!has_hash)
		hash = flow_hash(&p->key);
	id = 0;
	/* A SNAT flow's binding is state too: a flow the connection table
	 * does not hold (it began over datapath.flow_insert_rate, or its entry
	 * was evicted) keeps the backend its binding was made for while that
	 * backend is still the service's. */
	if (svc->mode == L4LB_MODE_SNAT && !ct) {
		struct snat_fwd_value *fwd = bpf_map_lookup_elem(&snat_fwd, &p->key);

		if (!fwd && snat_ovf_maybe(now))
			fwd = bpf_map_lookup_elem(&snat_fwd_ovf, &p->key);
		if (fwd) {
			const __u64 *a = (const __u64 *)fwd->backend_addr;

			id = fwd->backend_id;
			sel->be = backend_of(id, svc->id);
			if (sel->be && a[0] == ((const __u64 *)sel->be->addr)[0] &&
			    a[1] == ((const __u64 *)sel->be->addr)[1] && fwd->backend_port == sel->be->port)
				goto chosen;
			id = 0;
		}
	}
	/*
	 * A DSR handshake in flight: the SYN's choice, for its retransmits and
	 * for the first packet without SYN (which records it below), while
	 * the SYN may have gone by another table than the service's now
	 * (handshakes_matter). SYN and ACK decide alike, or a client reusing
	 * an old tuple would have its SYN follow a stale bucket and its ACK
	 * the table. A SYN reads its bucket either way, to write its choice,
	 * and asks only when the bucket holds its hash: most SYNs are new.
	 */
	if (!ct && p->key.proto == IPPROTO_TCP && svc->mode != L4LB_MODE_SNAT) {
		int syn = (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
		int follow = syn ? -1 : handshakes_matter(svc, now);
		const struct handshake *hs;

		if (follow)
			hb = handshake_bucket_of(hash);
		if (hb) {
			hs = hb->way[0].hash == hash ? &hb->way[0] : hb->way[1].hash == hash ? &hb->way[1] : NULL;
			if (hs && hs->svc_id == svc->id) {
				if (follow < 0)
					follow = handshakes_matter(svc, now);
				if (follow > 0) {
					id = hs->backend_id;
					sel->be = backend_of(id, svc->id);
					if (sel->be) {
						hb = NULL; /* known: nothing to write */
						goto chosen;
					}
					id = 0;
				}
			}
		}
	}
	if (svc->flags & L4LB_SVC_AFFINITY) {
		id = affinity_lookup(svc, p->key.src, now, update);
		sel->be = backend_of(id, svc->id);
		/* A draining backend keeps its flows, not its clients. */
		if (!sel->be || (sel->be->flags & L4LB_BACKEND_DRAINING))
			id = 0;
	}
	if (!id) {
		id = maglev_pick(svc->id, hash, svc->flags & L4LB_SVC_RANDOM);
		sel->be = backend_of(id, svc->id);
		if (!sel->be)
			return L4LB_R_DROP_NO_BACKEND;
		if (update && (svc->flags & L4LB_SVC_AFFINITY))
			affinity_store(svc->id, p->key.src, id, now);
	}
chosen:
	sel->backend_id = id;
	sel->hash = (__u32)hash;
	if (!update)
		return -1;

	struct ct_value v = {
		.backend_id = id | ct_closing_after(0, p),
		.svc_id = svc->id,
		.last_seen = now,
		.hash = (__u32)hash,
		.svc_word = word,
	};

	if (ct) {
		/* Re-balanced (its backend left, or the service id changed
		 * hands): the entry is rewritten in place, no insert. */
		*ct = v;
		sel->new_flow = 1;
	} else if (p->key.proto != IPPROTO_TCP || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN) {
		/* Either way the flow is forwarded: Maglev (or its SYN's
		 * handshakes entry) gives its later packets the same backend
		 * while the table holds. A failure is what `l4lbctl conntrack
		 * stats` reports; a limited insert is counted as event
		 * ct_insert_limited. */
		if (!ct_insert_allowed(now) && !ct_readmit(p, now)) {
			count_event(L4LB_E_CT_INSERT_LIMITED);
		} else {
			/* Its bit first: a SYN must never find it clear
			 * with the entry in the table (ctfilter.h). */
			ct_filter_add(&p->key);
			if (bpf_map_update_elem(&conntrack, &p->key, &v, BPF_ANY))
				count_reason(L4LB_R_EVENT_CT_INSERT_FAILED, p->l3_len);
			else
				sel->has_entry = 1;
		}
		sel->new_flow = 1;
	} else if (hb) {
		/* A DSR SYN (a SNAT one makes its binding instead, snat.h).
		 * Not rate-limited: the buckets hold no established flow. Its
		 * own way if it has one (re-balanced), else the newer way,
		 * the older one being forgotten. */
		struct handshake *w = &hb->way[0];

		if (hb->way[1].hash == hash)
			w = &hb->way[1];
		else if (hb->way[0].hash != hash)
			hb->way[1] = hb->way[0];
		w->hash = hash;
		w->backend_id = id;
		w->svc_id = svc->id;
	}
	return -1;
}

#endif
