/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Load-time configuration of the LB program.
 *
 * lb/datapath sets these through CollectionSpec.Variables before loading, so
 * one committed object serves every box; the verifier sees them as constants
 * and prunes what a configuration does not use. Never replace one with an
 * #ifdef.
 */
#ifndef L4LB_CONFIG_H
#define L4LB_CONFIG_H

#include <linux/types.h>

/* The shared Maglev hash seed as SipHash keys: little-endian u64 of bytes
 * 0..7 and 8..15 of maglev.hash_seed. */
volatile const __u64 cfg_seed_k0 = 0;
volatile const __u64 cfg_seed_k1 = 0;

/*
 * Outer source of encapsulated IPv4 packets: cfg_encap_src4 (network order)
 * with the bits of cfg_encap_src4_host_mask (host order) taken from the flow
 * hash. Backends hash the outer addresses to pick a receive queue (an IPIP
 * packet shows a NIC no ports), so one source per flow spreads the load over
 * their queues. A mask of 0 gives every packet the same source.
 */
volatile const __be32 cfg_encap_src4 = 0;
volatile const __u32 cfg_encap_src4_host_mask = 0;

/* The same for IPv6: the low 32 bits of cfg_encap_src6 under the mask come
 * from the flow hash; the flow label also carries the hash. Read it only
 * through volatile loads (see encap_source): a plain copy lets the compiler
 * fold in the all-zero initializer. Aligned for word loads. */
volatile const __u8 cfg_encap_src6[16] __attribute__((aligned(4))) = {};
volatile const __u32 cfg_encap_src6_host_mask = 0;

/* TTL / hop limit of outer headers the LB builds. */
volatile const __u8 cfg_encap_ttl = 64;

/*
 * Health probes through the VIP path: l4lbd's probe sockets set
 * skb->mark = cfg_hc_mark | backend id (the id in the bits outside
 * cfg_hc_mark_mask). l4lb_hc, at tc egress, sends such a probe to exactly
 * that backend the way the service dispatches its clients' packets.
 */
volatile const __u32 cfg_hc_mark = 0x4c000000;
volatile const __u32 cfg_hc_mark_mask = 0xff000000;

/*
 * SNAT. Source addresses per family (at most SNAT_ADDRS_MAX each; IPv4 in
 * network order, IPv6 as 16 bytes each), the source port range (host order,
 * inclusive) and the idle timeouts of a binding in nanoseconds. Read the
 * arrays only through volatile loads (see encap_source).
 */
#define SNAT_ADDRS_MAX 16
volatile const __be32 cfg_snat_addr4[SNAT_ADDRS_MAX] = {};
volatile const __u32 cfg_snat_addr4_count = 0;
volatile const __u8 cfg_snat_addr6[SNAT_ADDRS_MAX * 16] __attribute__((aligned(4))) = {};
volatile const __u32 cfg_snat_addr6_count = 0;
volatile const __u16 cfg_snat_port_min = 32768;
volatile const __u16 cfg_snat_port_max = 60999;
volatile const __u64 cfg_snat_tcp_ns = 21600000000000ULL;      /* 6h */
volatile const __u64 cfg_snat_tcp_closing_ns = 10000000000ULL; /* 10s */
volatile const __u64 cfg_snat_udp_ns = 60000000000ULL;         /* 60s */

/*
 * ICMP fragmentation-needed / packet-too-big answers, rate-limited per CPU
 * (datapath.icmp_rate_limit messages per second): one message per
 * cfg_icmp_interval_ns, with bursts of up to rate messages
 * (cfg_icmp_burst_ns = (rate - 1) * interval). An interval of 0 sends none.
 */
volatile const __u64 cfg_icmp_interval_ns = 0;
volatile const __u64 cfg_icmp_burst_ns = 0;

/*
 * New connection-table entries per CPU (datapath.flow_insert_rate): one per
 * cfg_insert_interval_ns, in bursts of up to a second's worth
 * (cfg_insert_burst_ns). An interval of 0 means no limit. Above the rate a
 * new flow is forwarded by Maglev alone, unrecorded: a flood of packets of
 * unknown flows cannot push established flows out of the LRU table.
 */
volatile const __u64 cfg_insert_interval_ns = 0;
volatile const __u64 cfg_insert_burst_ns = 0;

/* Words of the vip_filter map minus one (a power of two minus one). */
volatile const __u32 cfg_vip_filter_mask = 0;

/* Buckets of the handshakes map minus one (a power of two minus one). */
volatile const __u32 cfg_handshake_mask = 0;

/* Words of each connection-table filter minus one (a power of two minus
 * one; ctfilter.h). */
volatile const __u32 cfg_ct_filter_mask = 0;

/* How long after a service's Maglev table is replaced its packets without
 * SYN still look for their SYN's choice in the handshakes map (ns;
 * conntrack.h, handshakes_matter): longer than a client retries a SYN and a
 * backend its SYN-ACK. */
volatile const __u64 cfg_handshake_hold_ns = 240000000000ULL; /* 4 min */

/* Count packets and bytes per flow for IPFIX records (flowcounts.h): set
 * when [ipfix] is configured with counts on. 0: none of it runs. */
volatile const __u8 cfg_flow_counts = 0;

#endif
