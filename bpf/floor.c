// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * A benchmark floor, not part of the datapath: the LB program's parser plus
 * one hash-map lookup with the service map's key, then XDP_PASS. `make
 * bench` times it next to the LB program so that the LB's cost per packet
 * reads against the least a program doing its job could cost.
 */
#include "include/common.h"
#include "include/parse.h"
#include "include/types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
	__uint(max_entries, 1024);
} floor_services SEC(".maps");

/* Counts lookups that hit, so the lookup cannot be optimised away. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} floor_hits SEC(".maps");

SEC("xdp")
int l4lb_floor(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct svc_key sk = {};
	struct packet p;
	__u32 zero = 0;
	__u64 *hits;

	if (parse_packet(data, data_end, &p) >= 0)
		return XDP_PASS;
	svc_key_of(&sk, &p.key);
	if (bpf_map_lookup_elem(&floor_services, &sk)) {
		hits = bpf_map_lookup_elem(&floor_hits, &zero);
		if (hits)
			(*hits)++;
	}
	return XDP_PASS;
}

/* The same floor at tc (tcx ingress), for the tc paths' ratios. */
SEC("tcx/ingress")
int l4lb_floor_tc(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct svc_key sk = {};
	struct packet p;
	__u32 zero = 0;
	__u64 *hits;

	/* As the LB program at tc: make the headers directly readable. */
	bpf_skb_pull_data(skb, skb->len < 256 ? skb->len : 256);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (parse_packet(data, data_end, &p) >= 0)
		return TCX_NEXT;
	svc_key_of(&sk, &p.key);
	if (bpf_map_lookup_elem(&floor_services, &sk)) {
		hits = bpf_map_lookup_elem(&floor_hits, &zero);
		if (hits)
			(*hits)++;
	}
	return TCX_NEXT;
}
