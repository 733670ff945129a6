/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Frames not addressed to the box are never forwarded. The kernel forwards
 * only what arrived as PACKET_HOST: a frame to another host's MAC is
 * PACKET_OTHERHOST and dropped on receive (ip_rcv_core, ip6_rcv_core), a
 * broadcast or multicast one is delivered at most, never routed
 * (ip_forward, ip6_forward). Without this check any host on the segment
 * could make every LB on it forward a copy of one broadcast frame.
 *
 * tc reads skb->pkt_type, which eth_type_trans set from the ingress
 * device's address. XDP runs before that: it refuses a group address (the
 * I/G bit: broadcast and multicast) and compares a unicast destination with
 * the ingress interface's MAC, which l4lbd writes to ingress_macs when it
 * attaches (the MAC that l4lb's L2 announcer answers ARP and NDP with as
 * well). An interface without an entry forwards nothing. The map is read
 * through a per-CPU copy of the last interface's entry, renewed when the
 * ingress interface or flow_cache_gen (which l4lbd bumps after writing the
 * map) changes: one inlined per-CPU array read per packet instead of a hash
 * lookup.
 */
#ifndef L4LB_L2_H
#define L4LB_L2_H

#include "hook.h"
#include "maps.h"

#ifndef PACKET_HOST
#define PACKET_HOST 0
#endif

/* A CPU's copy of one ingress_macs entry. */
struct ingress_copy {
	__u32 ifindex; /* the interface it is of; 0: none yet */
	__u32 gen;     /* flow_cache_gen when copied */
	__u8 mac[6];   /* the interface's MAC */
	__u8 known;    /* the interface had an entry */
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ingress_copy);
	__uint(max_entries, 1);
} ingress_cache SEC(".maps");

/* Was the frame addressed to the box (the ingress interface's own MAC)?
 * gen is flow_cache_gen as read for this packet. */
static __always_inline int l2_to_host(const struct hook *h, __u32 gen)
{
	struct ingress_copy *c;
	struct ethhdr *eth;
	__u32 zero = 0, ifindex;

	if (!h->xdp)
		return hook_skb(h)->pkt_type == PACKET_HOST;
	eth = hook_data(h);
	if ((void *)(eth + 1) > hook_data_end(h))
		return 0;
	/* The I/G bit: broadcast and every multicast group. */
	if (eth->h_dest[0] & 1)
		return 0;
	c = bpf_map_lookup_elem(&ingress_cache, &zero);
	if (!c)
		return 0;
	ifindex = hook_ifindex(h);
	if (unlikely(c->ifindex != ifindex || c->gen != gen)) {
		struct ingress_mac *m = bpf_map_lookup_elem(&ingress_macs, &ifindex);

		c->ifindex = ifindex;
		c->gen = gen;
		c->known = m != NULL;
		if (m)
			__builtin_memcpy(c->mac, m->mac, 6);
	}
	return c->known && *(__u32 *)eth->h_dest == *(__u32 *)c->mac &&
	       *(__u16 *)(eth->h_dest + 4) == *(__u16 *)(c->mac + 4);
}

#endif
