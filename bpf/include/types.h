/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Structures shared between the datapath and the Go control plane.
 *
 * These are the only declarations of these layouts: bpf2go generates the Go
 * types from the BTF of the compiled object (-type flags in bpf/gen.go), and
 * a Go test checks every map's key and value size against them. A pinned map
 * keeps its layout forever: a change here needs a new map name and a
 * migration in lb/datapath, never an in-place edit.
 *
 * Addresses are always 16 bytes in network byte order. IPv4 addresses are
 * stored IPv4-mapped (::ffff:a.b.c.d) so that one key layout serves both
 * families and the 40-byte flow key is the exact input of the flow hash that
 * lb/maglev computes in Go.
 */
#ifndef L4LB_TYPES_H
#define L4LB_TYPES_H

#include <linux/types.h>

/* Forwarding mode of a frontend. Hybrid is resolved by the control plane:
 * a frontend has one protocol, so it is programmed as DSR (TCP) or SNAT (UDP). */
enum l4lb_mode {
	L4LB_MODE_SNAT = 1,
	L4LB_MODE_DSR = 2,
};

/* How a DSR packet reaches its backend. */
enum l4lb_dispatch {
	L4LB_DISPATCH_IPIP = 1,
	L4LB_DISPATCH_GENEVE = 2,
	L4LB_DISPATCH_OPT = 3,
};

/* svc_value.flags */
enum l4lb_svc_flags {
	/* Pick a random slot instead of the flow hash's slot. */
	L4LB_SVC_RANDOM = 1 << 0,
};

/* backend.flags; 0 marks an unused slot of the backend array. */
enum l4lb_backend_flags {
	/* Takes part in its service: conntrack hits are honoured. */
	L4LB_BACKEND_ACTIVE = 1 << 0,
	/* Draining: established flows stay, the Maglev table no longer has it. */
	L4LB_BACKEND_DRAINING = 1 << 1,
};

/* Key of the service map: one frontend. */
struct svc_key {
	__u8 addr[16]; /* VIP, network order, IPv4-mapped for IPv4 */
	__be16 port;   /* network order */
	__u8 proto;    /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;      /* always 0 */
};

/* Value of the service map. Host byte order throughout. */
struct svc_value {
	__u32 id;                      /* service id: index of the Maglev and stats arrays */
	enum l4lb_mode mode;
	enum l4lb_dispatch dispatch;
	enum l4lb_svc_flags flags;
	/* Maglev table size the control plane built for; the datapath uses the
	 * size stored in the table itself, this copy lets a restarted l4lbd
	 * read the configuration back. */
	__u32 table_size;
};

/* Value of the backend array, indexed by backend id (host order, 0 = none). */
struct backend {
	__u8 addr[16];                   /* network order, IPv4-mapped for IPv4 */
	__be16 port;                     /* network order */
	__u8 family;                     /* 4 or 6 */
	__u8 pad;                        /* always 0 */
	__u32 svc_id;                    /* owning service id; host order */
	enum l4lb_backend_flags flags;   /* 0 = unused slot */
};

/*
 * A Maglev table is a flat array of M+1 u32 backend ids (host order): index 0
 * holds M itself, indexes 1..M the slots. It is stored in chunks of 16 ids
 * (one cache line) because array maps round every element up to 8 bytes: a
 * u32 per element would double the memory of every table.
 */
#define MAGLEV_CHUNK 16

/*
 * A flow as seen from the client: the conntrack key, and byte for byte the
 * input of the flow hash (SipHash-2-4 keyed with the shared seed over the 40
 * bytes read as five little-endian 64-bit words; see lb/maglev).
 */
struct flow_key {
	__u8 src[16];  /* client address, network order, IPv4-mapped for IPv4 */
	__u8 dst[16];  /* VIP, same encoding */
	__be16 sport;  /* network order */
	__be16 dport;  /* network order */
	__u8 proto;
	__u8 pad[3];   /* always 0 */
} __attribute__((aligned(8)));

/* Value of the conntrack table. */
struct ct_value {
	__u32 backend_id; /* host order */
	__u32 svc_id;     /* service the flow was balanced in; host order */
	__u64 last_seen;  /* bpf_ktime_get_coarse_ns() of the latest packet, refreshed at most once a second */
	__u32 hash;       /* the flow hash's low 32 bits: outer-header entropy for encapsulation */
	__u32 pad;
};

/* Per-CPU counters of one service or one backend. */
struct lb_stats {
	__u64 packets;
	__u64 bytes;     /* L3 bytes as received from the client */
	__u64 new_flows; /* flows balanced by a table lookup (conntrack miss) */
};

/*
 * What happened to a packet that was not forwarded to a backend, or forwarded
 * with help from the stack. Index of the per-CPU reason counters; the Go side
 * names them in lb/datapath (a test checks that every value has a name).
 */
enum l4lb_reason {
	L4LB_R_PASS_NOT_IP = 0,      /* not IPv4/IPv6: passed */
	L4LB_R_PASS_NOT_SERVICE,     /* no frontend matches: passed */
	L4LB_R_PASS_MALFORMED_L3,    /* truncated or invalid IP header: passed for the stack to drop */
	L4LB_R_PASS_MALFORMED_L4,    /* truncated TCP/UDP header: passed for the stack to drop */
	L4LB_R_PASS_FRAGMENT,        /* IP fragment: passed (ports unknown) */
	L4LB_R_PASS_EXT_CHAIN,       /* IPv6 extension chain too long to walk: passed */
	L4LB_R_PASS_VLAN,            /* 802.1Q frame to a frontend: XDP cannot forward it, passed */
	L4LB_R_PASS_NO_NEIGH,        /* next hop not resolved: passed, the kernel resolves and forwards */
	L4LB_R_DROP_NO_BACKEND,      /* frontend without an eligible backend */
	L4LB_R_DROP_NO_ROUTE,        /* no route to the backend */
	L4LB_R_DROP_FRAG_NEEDED,     /* encapsulated packet exceeds the egress MTU */
	L4LB_R_DROP_ENCAP,           /* headroom could not be grown */
	L4LB_R_PASS_NO_TX_PORT,      /* egress interface is not in tx_ports: passed, the kernel forwards */
	L4LB_R_MAX,
};

/* Per-CPU counters of one reason. */
struct reason_stats {
	__u64 packets;
	__u64 bytes;
};

/* What the backend companion did with a packet; index of its counters. */
enum l4lb_backend_reason {
	L4LB_B_DECAP_IPIP = 0,    /* IPIP / IPv6-in-IPv6 to a local VIP: decapsulated */
	L4LB_B_PASS_OTHER,        /* not DSR traffic: left alone */
	L4LB_B_PASS_NOT_VIP,      /* encapsulated, but the inner destination is not a VIP here */
	L4LB_B_PASS_MALFORMED,    /* truncated or inconsistent headers: left for the stack */
	L4LB_B_DROP_DECAP,        /* the outer header could not be removed */
	L4LB_B_MAX,
};

#endif
