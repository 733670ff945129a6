// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * The backend companion: tc ingress on a backend host, run by
 * `l4lbd backend`. It accepts DSR traffic without kernel tunnel modules.
 *
 * IPIP (IPv4-in-IPv4) and IPv6-in-IPv6 packets whose inner destination is a
 * VIP listed in `vips` lose their outer header here; the stack then delivers
 * the client's original packet to the VIP bound on the host (usually on lo),
 * and the socket's reply leaves with the VIP as its source, straight to the
 * client. Only VIPs in the map are decapsulated, so the host never becomes an
 * open relay for tunnelled packets to arbitrary addresses.
 */
#include "include/common.h"
#include "include/types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* VIPs served on this host (16-byte form, IPv4-mapped for IPv4) -> unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u8[16]);
	__type(value, __u8);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, enum l4lb_backend_reason);
	__type(value, struct reason_stats);
	__uint(max_entries, L4LB_B_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backend_reasons SEC(".maps");

static __always_inline int done(struct __sk_buff *skb, __u32 reason)
{
	struct reason_stats *s = bpf_map_lookup_elem(&backend_reasons, &reason);

	if (s) {
		s->packets++;
		s->bytes += skb->len;
	}
	/* Let any later tcx program see the packet, decapsulated or not. */
	return reason == L4LB_B_DROP_DECAP ? TCX_DROP : TCX_NEXT;
}

static __always_inline int is_vip(const __u8 addr[16])
{
	return bpf_map_lookup_elem(&vips, addr) != NULL;
}

SEC("tcx/ingress")
int l4lb_backend_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u8 inner_dst[16];
	__u32 outer_len;

	if ((void *)(eth + 1) > data_end)
		return done(skb, L4LB_B_PASS_OTHER);

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *outer = (void *)(eth + 1);
		struct iphdr *inner;

		if ((void *)(outer + 1) > data_end)
			return done(skb, L4LB_B_PASS_OTHER);
		if (outer->protocol != IPPROTO_IPIP)
			return done(skb, L4LB_B_PASS_OTHER);
		if (outer->version != 4 || outer->ihl < 5 ||
		    outer->frag_off & bpf_htons(0x3fff))
			return done(skb, L4LB_B_PASS_MALFORMED);
		outer_len = outer->ihl * 4;
		inner = (void *)outer + outer_len;
		if ((void *)(inner + 1) > data_end)
			return done(skb, L4LB_B_PASS_MALFORMED);
		if (inner->version != 4 ||
		    bpf_ntohs(outer->tot_len) != outer_len + bpf_ntohs(inner->tot_len))
			return done(skb, L4LB_B_PASS_MALFORMED);
		/* Lengths that agree with each other may still exceed a cut
		 * frame: leave that to the stack rather than count it as ours. */
		if (skb->len < sizeof(*eth) + bpf_ntohs(outer->tot_len))
			return done(skb, L4LB_B_PASS_MALFORMED);
		addr_from_v4(inner_dst, inner->daddr);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *outer = (void *)(eth + 1);
		struct ipv6hdr *inner = (void *)(outer + 1);

		if ((void *)(outer + 1) > data_end)
			return done(skb, L4LB_B_PASS_OTHER);
		if (outer->nexthdr != IPPROTO_IPV6)
			return done(skb, L4LB_B_PASS_OTHER);
		if (outer->version != 6)
			return done(skb, L4LB_B_PASS_MALFORMED);
		if ((void *)(inner + 1) > data_end)
			return done(skb, L4LB_B_PASS_MALFORMED);
		if (inner->version != 6 ||
		    bpf_ntohs(outer->payload_len) != sizeof(*inner) + bpf_ntohs(inner->payload_len))
			return done(skb, L4LB_B_PASS_MALFORMED);
		if (skb->len < sizeof(*eth) + sizeof(*outer) + bpf_ntohs(outer->payload_len))
			return done(skb, L4LB_B_PASS_MALFORMED);
		outer_len = sizeof(*outer);
		copy16(inner_dst, &inner->daddr);
	} else {
		return done(skb, L4LB_B_PASS_OTHER);
	}

	if (!is_vip(inner_dst))
		return done(skb, L4LB_B_PASS_NOT_VIP);
	if (bpf_skb_adjust_room(skb, -(__s32)outer_len, BPF_ADJ_ROOM_MAC, 0))
		return done(skb, L4LB_B_DROP_DECAP);
	return done(skb, L4LB_B_DECAP_IPIP);
}
