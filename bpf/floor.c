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

/*
 * Primitives: each program is the empty program plus one operation, so
 * that `make bench` can say what the operations a path is made of cost on
 * the machine it runs on. What they show there (docs/datapath.md): a call
 * that is not inlined, into a helper or a BPF function, costs tens of ns
 * when the CPU's return-stack mitigations are on, and a hash lookup is
 * mostly such a call.
 */

/* Keys of the lookup primitives, read from the frame at offset 14. */
struct prim_key16 {
	__u8 b[16];
};

struct prim_key40 {
	__u8 b[40];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct prim_key16);
	__type(value, struct ct_value);
	__uint(max_entries, 1024);
} prim_hash16 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct prim_key40);
	__type(value, struct ct_value);
	__uint(max_entries, 1024);
} prim_hash40 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct prim_key40);
	__type(value, struct ct_value);
	__uint(max_entries, 1024);
} prim_lru40 SEC(".maps");

/* Count one hit, as the floor does: the result cannot be optimised away. */
static __always_inline int prim_done(__u64 v)
{
	__u32 zero = 0;
	__u64 *hits = bpf_map_lookup_elem(&floor_hits, &zero);

	if (hits && v)
		(*hits)++;
	return XDP_PASS;
}

SEC("xdp")
int l4lb_prim_count(struct xdp_md *ctx)
{
	return prim_done(1);
}

SEC("xdp")
int l4lb_prim_helper(struct xdp_md *ctx)
{
	return prim_done(bpf_ktime_get_coarse_ns());
}

SEC("xdp")
int l4lb_prim_jiffies(struct xdp_md *ctx)
{
	return prim_done(bpf_jiffies64());
}

static __noinline int prim_callee(struct xdp_md *ctx)
{
	return ctx->ingress_ifindex != 0;
}

SEC("xdp")
int l4lb_prim_call(struct xdp_md *ctx)
{
	return prim_done(prim_callee(ctx));
}

SEC("xdp")
int l4lb_prim_adjust_head(struct xdp_md *ctx)
{
	return prim_done(bpf_xdp_adjust_head(ctx, -20) == 0);
}

#define PRIM_LOOKUP(name, map, type)                                              \
	SEC("xdp")                                                                 \
	int name(struct xdp_md *ctx)                                               \
	{                                                                          \
		void *data = (void *)(long)ctx->data;                              \
		void *data_end = (void *)(long)ctx->data_end;                      \
		type k;                                                            \
                                                                                   \
		if (data + 14 + sizeof(k) > data_end)                              \
			return XDP_PASS;                                           \
		__builtin_memcpy(&k, data + 14, sizeof(k));                        \
		return prim_done(bpf_map_lookup_elem(&map, &k) != NULL);           \
	}

PRIM_LOOKUP(l4lb_prim_hash16, prim_hash16, struct prim_key16)
PRIM_LOOKUP(l4lb_prim_hash40, prim_hash40, struct prim_key40)
PRIM_LOOKUP(l4lb_prim_lru40, prim_lru40, struct prim_key40)
