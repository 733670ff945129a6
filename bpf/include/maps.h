/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Maps of the LB program. Sizes here are placeholders: lb/datapath sets
 * max_entries from the config (datapath.max_services, max_backends,
 * conntrack_max, snat_max) before loading. Every map is pinned by name under
 * daemon.bpffs so a restarted l4lbd adopts the live state.
 */
#ifndef L4LB_MAPS_H
#define L4LB_MAPS_H

#include "common.h"
#include "types.h"

/* Frontend -> service. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} services SEC(".maps");

/*
 * Service id -> the word naming what the id holds (see L4LB_WORD_* in
 * types.h): what lets an established flow skip the service lookup.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 4097);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_gen SEC(".maps");

/*
 * A Bloom filter over the frontends (filter.h): 64-bit words, a power of
 * two of them (cfg_vip_filter_mask + 1). A packet whose (VIP, port,
 * protocol) sets no complete pair of bits is to no frontend, and skips
 * the connection and service lookups.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vip_filter SEC(".maps");

/* Backend id -> backend. An array: ids are small and the lookup is inlined. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(max_entries, 65537);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backends SEC(".maps");

/* Backend id -> its route: next-hop ids and MTU (struct backend_route). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct backend_route);
	__uint(max_entries, 65537);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backend_routes SEC(".maps");

/* Next-hop id -> MACs and egress interface (struct nexthop). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct nexthop);
	__uint(max_entries, 65537);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nexthops SEC(".maps");

#include "maglevmap.h"

/*
 * Flow -> backend. An LRU shared by all CPUs, so that its capacity is what
 * datapath.conntrack_max says whichever CPUs the flows arrive on (per-CPU
 * lists would give each CPU a 1/ncpus share). The kernel keeps per-CPU
 * free lists in front of the shared one; make bench measured inserts
 * cheaper than with per-CPU lists, whose every pop rotates the CPU's lists
 * (docs/datapath.md). Pinned as conntrack_v2 (lb/datapath/migrate.go
 * moves the entries of the per-CPU map an earlier l4lbd pinned as
 * conntrack).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow_key);
	__type(value, struct ct_value);
	__uint(max_entries, 1048576);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conntrack SEC(".maps");

/*
 * The connection table's presence filter (ctfilter.h): one bit per mix
 * of a flow key, set before the datapath inserts the key's entry. Slot CT_FILTER_LIVE is
 * the filter SYNs read; slot CT_FILTER_NEXT, present only while
 * lb/datapath rebuilds the filter, is written as well. Inner maps are
 * sized by lb/datapath (ctFilterWords); an empty slot CT_FILTER_LIVE means
 * no filter, and every SYN looks its entry up.
 */
struct ct_filter_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 64);
	/* l4lbd sets bits through a shared mapping, with the datapath's
	 * atomic OR (ctfilter.go). */
	__uint(map_flags, BPF_F_MMAPABLE);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct ct_filter_inner);
} ct_filter SEC(".maps");

/*
 * The flow cache (flowcache.h): per CPU, direct-mapped, holding what an
 * established flow is forwarded by (copies from conntrack, backends and
 * the next-hop cache). Not pinned: a new program starts with an empty cache.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_cache_entry);
	__uint(max_entries, L4LB_FLOW_CACHE_SLOTS);
} flow_cache SEC(".maps");

/*
 * The service cache (svccache.h): per CPU, direct-mapped, copies of the
 * service entries new flows look up. Not pinned, like flow_cache.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct svc_cache_entry);
	__uint(max_entries, L4LB_SVC_CACHE_SLOTS);
} svc_cache SEC(".maps");

/*
 * The generation of what a flow-cache slot (flowcache.h) and a
 * service-cache slot (svccache.h) copy: bumped by the control plane after
 * it deletes or rewrites connection entries and after every write to
 * services, svc_gen, backends, backend_routes and nexthops, which empties
 * every CPU's caches at once. Pinned, so that the program an
 * earlier l4lbd attached and the maps a later one writes agree on it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flow_cache_gen SEC(".maps");

/*
 * TCP handshakes in flight: what a DSR flow's SYN was sent to, in the
 * bucket of its flow hash (struct handshake_bucket; cfg_handshake_mask + 1
 * buckets, a power of two). A SYN makes no connection entry (conntrack.h), so without this a
 * backend change between a client's SYN and its first ACK would send the
 * ACK, by the new Maglev table, to a backend that never saw the SYN, which
 * answers with a reset. Two-way set-associative, not an LRU: a SYN writes
 * its bucket in place (no allocation, no lock, no eviction walk), a SYN
 * flood overwrites buckets without touching established flows, and a way
 * whose hash is not the packet's is simply not its flow's. Sized by
 * lb/datapath (handshakeBuckets).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct handshake_bucket);
	__uint(max_entries, 32768);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} handshakes SEC(".maps");

/*
 * Service id -> when its Maglev table last replaced another (coarse clock,
 * ns; 0: never since this datapath was made). Written by lb/datapath
 * before it swaps a table in or out, read by a packet without SYN and
 * without a connection entry to know whether its SYN can have gone by
 * another table (conntrack.h, handshakes_matter). Not pinned: a restarted
 * l4lbd does not know what the earlier one swapped, and writes the time it
 * loads for every service instead.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4097);
} maglev_swapped SEC(".maps");

/*
 * SNAT bindings, one entry per direction (see snat.h). LRU because a NAT
 * table that refuses new flows when full fails the new flows of every
 * service at once; an LRU instead forgets the binding idle the longest.
 * Evicting a live binding breaks that one flow: its next packet gets a new
 * port (or, when only one half was evicted, the binding is rebuilt from the
 * other half). New bindings above datapath.flow_insert_rate go to the
 * overflow tables below instead, so that a flood cannot evict these. Shared
 * by all CPUs, as conntrack; pinned as snat_fwd_v2 / snat_rev_v2. Sized by
 * datapath.snat_max.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow_key);
	__type(value, struct snat_fwd_value);
	__uint(max_entries, 1048576);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_fwd SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct snat_rev_key);
	__type(value, struct snat_rev_value);
	__uint(max_entries, 1048576);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_rev SEC(".maps");

/*
 * The SNAT overflow tables: bindings made while the CPU was over
 * datapath.flow_insert_rate (snat.h), in a set of their own so that a
 * flood of new flows churns only them. Sized by lb/datapath.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow_key);
	__type(value, struct snat_fwd_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_fwd_ovf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct snat_rev_key);
	__type(value, struct snat_rev_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_rev_ovf SEC(".maps");

/*
 * When an overflow binding was last made or used (coarse clock, ns; a
 * second late at most, and never early), so that while the overflow
 * tables can hold no live binding, which is all the time a box is not
 * flooded, a new SNAT flow does not look in them (snat.h,
 * snat_ovf_maybe). ~0: unknown, look always (lb/datapath writes it when an
 * earlier l4lbd's program, which does not keep it, may still be making
 * overflow bindings, until Retire). Pinned: every program that runs keeps
 * it, so no restart forgets a binding.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_ovf_seen SEC(".maps");

/*
 * Per-CPU scratch space of the SNAT paths (see struct snat_work).
 * A program run never nests with another on the same CPU, so one slot per
 * CPU is enough. It holds no state between packets, so it is not pinned.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct snat_work);
	__uint(max_entries, 1);
} snat_scratch SEC(".maps");

/*
 * Client-IP affinity: (service, client) -> the backend of the client's
 * latest new flow (affinity.h). LRU: a forgotten client only loses its
 * stickiness for its next new flow, never an established one (those keep
 * their conntrack entry). Sized by lb/datapath (Config.AffinityMax).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} affinity SEC(".maps");

/*
 * Source ranges: (service id, client prefix) -> allowed, for services with
 * L4LB_SVC_SOURCE_RANGES (struct src_range_key). LPM tries allocate per
 * entry, so max_entries costs nothing until used.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_range_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} src_ranges SEC(".maps");

/* The ICMP rate limiter's bucket, one per CPU (struct icmp_bucket). Not
 * pinned: a restart refilling the buckets is harmless. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct icmp_bucket);
	__uint(max_entries, 1);
} icmp_buckets SEC(".maps");

/* The connection-table insert limiter's bucket, one per CPU (GCRA, as
 * icmp_buckets; datapath.flow_insert_rate). Not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct icmp_bucket);
	__uint(max_entries, 1);
} insert_buckets SEC(".maps");

/* The re-admission budget's bucket, one per CPU (conntrack.h, ct_readmit;
 * the rate of datapath.flow_insert_rate, spent only by flows the
 * connection-table filter has seen). Not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct icmp_bucket);
	__uint(max_entries, 1);
} readmit_buckets SEC(".maps");

/* Each CPU's copy of the coarse clock and the jiffies it was read at
 * (clock.h). Not pinned. */
struct clock_copy {
	__u64 jiffies;
	__u64 ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct clock_copy);
	__uint(max_entries, 1);
} clock_cache SEC(".maps");

/* Per-CPU counters by enum l4lb_event. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, enum l4lb_event);
	__type(value, __u64);
	__uint(max_entries, L4LB_E_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events SEC(".maps");

/* Per-CPU counters by service id and by backend id. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_stats);
	__uint(max_entries, 4097);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_stats);
	__uint(max_entries, 65537);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backend_stats SEC(".maps");

/* Per-CPU counters of SNAT replies by service id: the reply path knows its
 * binding's service (snat_rev_value.svc_id), not its backend's id. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct reply_stats);
	__uint(max_entries, 4097);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_reply_stats SEC(".maps");

/* Per-CPU counters by enum l4lb_reason. A new reason changes its size, so
 * the map is pinned under a new name then (lb/datapath/migrate.go). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, enum l4lb_reason);
	__type(value, struct reason_stats);
	__uint(max_entries, L4LB_R_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} reasons SEC(".maps");

/* The MAC of each interface the XDP program is attached to, by ifindex
 * (host order): written by l4lbd when it attaches (l2.h). Not pinned: each
 * datapath fills its own before its programs run (lb/datapath/local.go). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct ingress_mac);
	__uint(max_entries, 64);
} ingress_macs SEC(".maps");

/* The box's own addresses besides the SNAT addresses (config.h): VIPs and
 * the attached interfaces' addresses, written by l4lbd (localaddr.h).
 * Sized by lb/datapath from max_services; not pinned, as ingress_macs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct local_addr);
	__type(value, __u8);
	__uint(max_entries, 4352);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} local_addrs SEC(".maps");

/* Interfaces the LB may redirect to (ifindex -> ifindex). */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tx_ports SEC(".maps");

#endif
