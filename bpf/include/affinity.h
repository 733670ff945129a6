/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Client-IP session affinity (services with L4LB_SVC_AFFINITY).
 *
 * The map affinity remembers, per (service, client address), the backend
 * of the client's latest new flow. A new flow (conntrack miss) of the same
 * client within svc_value.affinity_ns goes there instead of to its Maglev
 * slot, provided the backend is still an active, non-draining member of the
 * service (conntrack.h checks); otherwise Maglev decides and the entry
 * follows. Every new flow refreshes the entry, SYNs included: a connection's
 * SYN and its first ACK are both conntrack misses, and the ACK must find
 * what the SYN used. Established flows never look here.
 *
 * Spoofed SYNs can fill the table with junk clients, which costs real
 * clients their stickiness (their next new flow may go elsewhere), never a
 * connection.
 */
#ifndef L4LB_AFFINITY_H
#define L4LB_AFFINITY_H

#include "maps.h"

/* last_seen is rewritten at most this often (and at least every sixteenth
 * of the timeout), so that a client opening many flows does not write the
 * entry's cache line on every one. */
#define AFFINITY_REFRESH_MAX_NS 1000000000ULL

static __always_inline __u64 affinity_step(__u64 timeout)
{
	__u64 step = timeout >> 4;

	return step < AFFINITY_REFRESH_MAX_NS ? step : AFFINITY_REFRESH_MAX_NS;
}

/*
 * The backend id the client at addr used for a new flow of svc within its
 * timeout, or 0. With update, a live entry's last_seen moves to now; the
 * caller still has to check that the backend is eligible.
 */
static __always_inline __u32 affinity_lookup(const struct svc_value *svc, const __u8 addr[16], __u64 now,
					     int update)
{
	struct affinity_key k = {.svc_id = svc->id};
	struct affinity_value *v;
	__u64 seen;

	copy16(k.client, addr);
	v = bpf_map_lookup_elem(&affinity, &k);
	if (!v)
		return 0;
	seen = v->last_seen;
	/* Another CPU may have written a tick ahead of now. */
	if (now > seen && now - seen > svc->affinity_ns)
		return 0;
	if (update && now > seen && now - seen > affinity_step(svc->affinity_ns))
		v->last_seen = now;
	return v->backend_id;
}

/* Remember backend id for the client at addr of service svc_id. */
static __always_inline void affinity_store(__u32 svc_id, const __u8 addr[16], __u32 id, __u64 now)
{
	struct affinity_key k = {.svc_id = svc_id};
	struct affinity_value v = {.backend_id = id, .last_seen = now};

	copy16(k.client, addr);
	bpf_map_update_elem(&affinity, &k, &v, BPF_ANY);
}

#endif
