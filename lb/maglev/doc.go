// SPDX-License-Identifier: Apache-2.0

// Package maglev owns the step between a service's backend list and the
// datapath's per-service lookup table: it turns (seed, table size M, backends)
// into the M-slot Maglev table the reconciler writes into the BPF map, and it
// defines the keyed 5-tuple flow hash that the eBPF datapath computes to index
// that table. l4lbctl uses the same two functions to answer "which backend
// gets this flow" without asking the kernel.
//
// The package is pure: it imports only the standard library and package lb,
// touches no kernel object and keeps no global state.
//
// # Wire contract — MUST NOT CHANGE
//
// Everything in this section is shared by every l4lb box of a deployment and
// by the C datapath (bpf/include). Every LB box that shares a hash seed must
// compute the same table and the same flow hash, otherwise a flow that moves
// between boxes (ECMP rehash, box failure) lands on another backend and its
// connection breaks. Changing any byte, order, constant or formula below
// moves every flow on every box at once; it can only be done as a new,
// separately named algorithm that operators opt into.
//
// Hash function. SipHash-2-4 with a 64-bit output (Aumasson and Bernstein,
// 2012). The 16-byte seed is the key: k0 is the little-endian uint64 of
// seed[0:8] and k1 the little-endian uint64 of seed[8:16]. The seed is written
// in configs as 32 hex digits, seed byte 0 first.
//
// Backend key (18 bytes), the hash input that places a backend:
//
//	offset  size  field
//	0       16    backend address; IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d),
//	              network byte order; IPv6 zones are ignored
//	16      2     backend port, big endian
//
// Because IPv4 is stored mapped, 10.0.0.1:80 and [::ffff:10.0.0.1]:80 are the
// same backend.
//
// Canonical order: backends are ordered by their key bytes (memcmp order).
// Every step below walks backends in that order, whatever order the caller
// listed them in, so the table depends only on the set of backends, never on
// how a discovery source happened to list them.
//
// Permutation of a backend, for a table of prime size M:
//
//	h      = SipHash24(seed, backendKey)
//	offset = (h >> 32) % M
//	skip   = (h & 0xffffffff) % (M-1) + 1
//	pref_j = (offset + j*skip) % M          for j = 0, 1, ..., M-1
//
// Since M is prime and 1 <= skip < M, pref visits every slot exactly once.
//
// Quotas. Only backends with Weight > 0 take part. With W the sum of their
// weights, backend i gets quota_i = floor(M*w_i/W) slots (64-bit arithmetic).
// The R = M - sum(quota_i) slots left over go, one each, to the R backends
// with the largest remainder (M*w_i) mod W; equal remainders are broken by
// canonical order. A backend whose weight is tiny next to the others may end
// up with a quota of 0 and then gets no slot.
//
// Fill. With w_max the largest weight and every credit_i starting at 0, repeat
// rounds until all M slots are taken; in each round, for each backend i in
// canonical order:
//
//	credit_i += w_i
//	while credit_i >= w_max && filled_i < quota_i:
//	    claim the first slot of i's preference list not yet taken
//	    credit_i -= w_max
//
// A backend therefore claims at most once per round and its k-th claim falls
// in round ceil(k*w_max/w_i), so heavy and light backends interleave through
// the table the way equal ones do in classic Maglev. With equal weights this
// is exactly the algorithm of Eisenbud et al., "Maglev: A Fast and Reliable
// Software Network Load Balancer" (NSDI 2016): one claim per backend per
// round, and the first R backends in canonical order get one extra slot.
//
// Table. Slot s holds the backend that claimed it. The Go API returns indexes
// into the caller's backend slice; the datapath stores backend ids, which the
// reconciler maps from those indexes.
//
// Flow key (40 bytes), the hash input that picks a slot for a packet:
//
//	offset  size  field
//	0       16    source address, IPv4 as IPv4-mapped IPv6, network byte order
//	16      16    destination address, same encoding
//	32      2     source port, big endian (network order, as on the wire)
//	34      2     destination port, big endian
//	36      1     IP protocol number (6 TCP, 17 UDP)
//	37      3     zero
//
// For ICMP and other port-less protocols the ports are 0. The C datapath
// builds this buffer by copying the packet's network-order bytes into place
// (for IPv4: ten zero bytes, 0xff 0xff, then the four address bytes) and runs
// SipHash-2-4 over it, reading it as five little-endian uint64 words — which
// is how SipHash consumes any message, so no byte swapping is needed on the
// packet side. The 40 bytes are a multiple of 8, so the final SipHash block
// carries only the length byte (40 << 56).
//
//	hash    = SipHash24(seed, flowKey)
//	slot    = hash % M                      (64-bit modulo)
//	backend = table[slot]
package maglev
