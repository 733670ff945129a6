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
	/* Client-IP affinity: a new flow goes to the backend its client used
	 * within svc_value.affinity_ns (map affinity), when still eligible. */
	L4LB_SVC_AFFINITY = 1 << 1,
	/* Only clients inside the service's prefixes of src_ranges are served;
	 * others are dropped. */
	L4LB_SVC_SOURCE_RANGES = 1 << 2,
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
	/* The service's svc_gen word (see svc_gen in maps.h), the same
	 * value, so that a new flow stamps its entry without reading
	 * svc_gen: l4lbd writes it here with the entry, then to svc_gen. */
	__u32 svc_word;
	/* How long a client's backend is remembered after its latest new flow
	 * (L4LB_SVC_AFFINITY), in nanoseconds; stored whatever the flag says,
	 * so the control plane reads back exactly what it wrote. */
	__u64 affinity_ns;
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
/*
 * A flag in the top bit of ct_value.backend_id (backend ids stay below
 * 2^24; lb/datapath's ctClosing mirrors it). L4LB_CT_CLOSING: the client
 * sent a FIN or RST on this TCP flow and no SYN since. It changes no
 * forwarding; it is what lets the control plane count a DSR connection
 * inactive once it ends (the LB never sees the backend's half). Entries of
 * an earlier l4lb have it clear.
 */
#define L4LB_CT_CLOSING 0x80000000u
#define L4LB_CT_ID(v) ((v) & ~L4LB_CT_CLOSING)

struct ct_value {
	__u32 backend_id; /* host order; L4LB_CT_CLOSING in its top bit */
	__u32 svc_id;     /* service the flow was balanced in; host order */
	__u64 last_seen;  /* coarse clock (clock.h) of the latest packet, refreshed at most once a second */
	__u32 hash;       /* the flow hash's low 32 bits: outer-header entropy for encapsulation */
	/* The svc_gen word of svc_id when the flow was last balanced or
	 * checked against the service entry; 0 (entries of l4lb versions
	 * before svc_gen) never matches. See svc_gen below. */
	__u32 svc_word;
};

/*
 * A slot of the flow cache (flowcache.h): what the established fast path
 * needs to forward a flow, copied from its conntrack entry, its backend and
 * its route, with the key it belongs to. backend_id 0: an empty slot.
 */
struct flow_cache_entry {
	/* What a lookup checks first, in the slot's first 64 bytes. */
	struct flow_key key;
	__u64 filled;          /* coarse clock (clock.h) when copied from the conntrack entry */
	__u32 backend_id;      /* without L4LB_CT_CLOSING */
	__u32 gen;             /* flow_cache_gen when filled */
	struct backend be;     /* the backends entry */
	__u32 svc_id;
	__u32 svc_word;        /* the svc_gen word (mode, dispatch) */
	__u32 hash;            /* as ct_value.hash */
	__u32 ifindex;         /* route_ok: the next hop's egress interface, */
	__u32 mtu;             /* the route's MTU */
	__u8 smac[6];          /* and MACs */
	__u8 dmac[6];
	__u8 route_ok;         /* the route fields hold the backend's route from the next-hop cache */
	__u8 snat_ok;          /* snat_port is the port of the flow's SNAT binding, at its hashed address */
	__be16 snat_port;      /* network order */
	__u8 pad[4];
};

/* Slots of each CPU's flow cache: a power of two. */
#define L4LB_FLOW_CACHE_SLOTS 4096

/*
 * A slot of a CPU's service cache (bpf/include/svccache.h): a copy of one
 * service entry, with its frontend, and the flow_cache_gen it was copied
 * under.
 */
struct svc_cache_entry {
	__u8 addr[16];         /* the frontend, as struct svc_key */
	__be16 port;
	__u8 proto;
	__u8 used;             /* 1 once filled */
	__u32 gen;             /* flow_cache_gen when filled */
	struct svc_value val;  /* the services entry */
	__u64 filled;          /* coarse clock (clock.h) when filled */
} __attribute__((aligned(8)));

/* Slots of each CPU's service cache: a power of two. */
#define L4LB_SVC_CACHE_SLOTS 1024
#define L4LB_SVC_CACHE_SHIFT 10

/*
 * One DSR SYN's choice in the handshakes map: its full 64-bit flow hash
 * (SipHash keyed with the secret seed, so a spoofer cannot aim at another
 * flow's slot), the backend it went to and its service. Written without a
 * lock: a reader racing a writer may see a mix, which names a backend of
 * the same service at worst (both are checked).
 */
struct handshake {
	__u64 hash;
	__u32 backend_id; /* host order */
	__u32 svc_id;     /* host order */
};

/* A bucket of the handshakes map: the two latest SYNs whose hashes fall in
 * it, the newer first. Two ways make a collision cost a handshake only when
 * two more SYNs fall in its bucket within its round trip. */
struct handshake_bucket {
	struct handshake way[2];
};

/*
 * What a service id holds, as one word (map svc_gen, indexed by service
 * id): generation << 8 | dispatch << 4 | mode. lb/datapath writes a new
 * generation whenever it writes the service's entry, and on delete keeps
 * the generation with mode 0, so that a word is never used twice for an id.
 * A connection-table entry records the word it was balanced under; while
 * the service's word still equals it, the entry's flow is forwarded without
 * the service lookup (the established fast path), with the mode and
 * dispatch the word carries. Any change to the service (mode, dispatch,
 * source ranges, ...) thus sends each of its flows once through the full
 * path, which checks them against the new entry.
 */
#define L4LB_WORD_MODE(w) ((w) & 0xf)
#define L4LB_WORD_DISPATCH(w) (((w) >> 4) & 0xf)
#define L4LB_WORD_GEN_SHIFT 8

/* Multiplier of the frontend filter's hash (filter.h; lb/datapath). */
#define L4LB_FILTER_MUL 0x9E3779B97F4A7C15ULL

/*
 * Next hops, resolved by the control plane from the kernel's routes,
 * neighbours and links (lb/datapath/nexthop.go) and kept current from
 * netlink events, so that forwarding to a backend reads two array entries
 * instead of asking bpf_fib_lookup. The datapath asks bpf_fib_lookup only
 * when a backend has no usable entry (counted as event fib_fallback).
 */
/* nexthop.flags: the neighbour's MAC is known, frames go out directly.
 * Without it the packet takes bpf_fib_lookup, which hands it to the stack
 * to resolve the neighbour. (lb/datapath: nhValid.) */
#define L4LB_NH_VALID 0x1

/* Value of the nexthops array, indexed by next-hop id (0 = none). */
struct nexthop {
	__u8 dmac[6];     /* the neighbour's MAC */
	__u8 smac[6];     /* the egress interface's MAC */
	__u32 ifindex;    /* egress interface; host order */
	__u8 flags;       /* L4LB_NH_VALID */
	__u8 family;      /* 4 or 6: of addr */
	__u8 pad[2];      /* always 0 */
	__u8 addr[16];    /* the neighbour (gateway or the backend itself), IPv4-mapped; for the control plane only */
};

/* Paths a backend's route may spread over (ECMP). */
#define L4LB_NH_PATHS 8

/* Value of the backend_routes array, indexed by backend id: the backend's route. */
struct backend_route {
	__u32 count;               /* next hops in ids; 0: not resolved, ask bpf_fib_lookup */
	__u32 mtu;                 /* the route's MTU (its own, or the egress interface's) */
	__u32 ids[L4LB_NH_PATHS];  /* next-hop ids; a flow takes ids[hash * count >> 32] */
};

/* Counters of what happened besides a packet's verdict (map events); the
 * Go side names them in lb/datapath. */
enum l4lb_event {
	L4LB_E_FIB_FALLBACK = 0,    /* a backend had no usable cached next hop: bpf_fib_lookup asked */
	L4LB_E_CT_INSERT_LIMITED,   /* a new flow was not recorded in the connection table: over datapath.flow_insert_rate; forwarded by Maglev alone */
	L4LB_E_SNAT_OVERFLOW,       /* a new SNAT binding went to the overflow tables: over datapath.flow_insert_rate */
	L4LB_E_SNAT_PROMOTED,       /* an overflow SNAT binding that proved itself moved into the main tables */
	L4LB_E_SNAT_PROMOTE_LIMITED, /* an overflow SNAT binding ready to move stayed: over datapath.flow_insert_rate */
	L4LB_E_SNAT_PREEMPTED,      /* a new SNAT binding took the port of the stalest unproven binding: no port was free */
	L4LB_E_CT_READMITTED,       /* over datapath.flow_insert_rate, a flow the filter had seen (an evicted entry's) was recorded again */
	L4LB_E_MAX,
};

/* Value of the ingress_macs map (key: ifindex, host order): the MAC of an
 * interface the LB program is attached to at XDP, which frames must be
 * addressed to (see l2.h). */
struct ingress_mac {
	__u8 mac[6]; /* the interface's address */
	__u8 pad[2]; /* always 0 */
};

/* Key of the local_addrs map: one of the box's own addresses (a VIP, an
 * address of an attached interface), which no packet the LB forwards may
 * carry as its source (see localaddr.h). The value (a __u8, 1) is not read. */
struct local_addr {
	__u8 addr[16]; /* network order, IPv4-mapped for IPv4 */
};

/* Per-CPU counters of one service or one backend. */
struct lb_stats {
	__u64 packets;
	__u64 bytes;     /* L3 bytes as received from the client */
	__u64 new_flows; /* flows balanced by a table lookup (conntrack miss) */
};

/* Per-CPU counters of a service's SNAT replies: backends' packets the
 * reply path rewrote and sent back to their clients. Kept apart from
 * lb_stats so the pinned svc_stats keeps its layout. */
struct reply_stats {
	__u64 packets;
	__u64 bytes; /* L3 bytes as received from the backend */
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
	L4LB_R_DROP_SNAT_EXHAUSTED,  /* SNAT: no free port for the backend: the whole range probed, or 256 ports of a larger one (snat.h) */
	L4LB_R_PASS_TTL_EXCEEDED,    /* TTL / hop limit 0, or under SNAT would reach 0: passed, the stack answers time-exceeded */
	L4LB_R_DROP_TTL_EXCEEDED,    /* SNAT reply whose TTL / hop limit would reach 0: dropped */
	L4LB_R_DROP_SNAT_REWRITE,    /* SNAT: the packet could not be rewritten (a kernel helper refused) */
	L4LB_R_DROP_OPT_NO_ROOM,     /* DSR opt: no room for the VIP option (IPv4 options full, or an IPv6 hop-by-hop header that must stay first) */
	L4LB_R_DROP_HC_NO_BACKEND,   /* health probe marked for a backend that is not (or no longer) the service's */
	L4LB_R_ICMP_FRAG_NEEDED_SENT, /* too big for the egress MTU: ICMP fragmentation-needed / packet-too-big sent to the client instead */
	L4LB_R_ICMP_RATE_LIMITED,    /* too big, and the ICMP answer was over datapath.icmp_rate_limit: dropped */
	L4LB_R_DROP_SOURCE_RANGE,    /* client outside the service's source_ranges */
	L4LB_R_ICMP_ERROR_FORWARDED, /* ICMP error about a frontend's flow or a SNAT binding: sent where that flow goes */
	L4LB_R_PASS_ICMP_QUOTE,      /* ICMP error whose quoted packet is cut short or not a TCP/UDP first fragment: passed */
	L4LB_R_EVENT_CT_INSERT_FAILED, /* not a verdict: a flow could not be recorded in the connection table (still forwarded) */
	L4LB_R_PASS_IP_CSUM,         /* IPv4 header checksum wrong: passed, for the stack to drop */
	L4LB_R_PASS_IP_OPTIONS,      /* IPv4 options the kernel refuses (syntax, pointers, a repeat) or the LB does not forward (source route, CIPSO): passed */
	L4LB_R_PASS_IPV6_EXT,        /* IPv6 extension headers the kernel refuses (hop-by-hop not first, an option past its header or one to discard, a routing header with segments left) or too long to check: passed */
	L4LB_R_PASS_UDP_LENGTH,      /* UDP length shorter than the IP payload: passed */
	L4LB_R_PASS_ICMP_CSUM,       /* ICMP error with a wrong checksum (or too long to check): passed */
	L4LB_R_PASS_NOT_FOR_HOST,    /* Ethernet destination not this box (broadcast, multicast, another host's MAC): passed, the stack does not forward it */
	L4LB_R_PASS_MARTIAN_SOURCE,  /* source no host or router accepts (0/8, 127/8, multicast, broadcast; ::, ::1, fe80::/10, ::ffff:0:0/96, ff00::/8): passed */
	L4LB_R_PASS_LOCAL_SOURCE,    /* source is one of the box's own addresses (a VIP, a SNAT or interface address): passed */
	L4LB_R_PASS_IPV6_AH,         /* IPv6 AH on a packet the service rewrites (SNAT, DSR opt), whose ICV the rewrite would break: passed */
	L4LB_R_MAX,
};


/*
 * Client-IP affinity (map affinity): the backend a client of a service got
 * for its latest new flow, and when.
 */
struct affinity_key {
	__u32 svc_id;     /* host order */
	__u8 client[16];  /* network order, IPv4-mapped for IPv4 */
};

struct affinity_value {
	__u32 backend_id; /* host order */
	__u32 pad;        /* always 0 */
	__u64 last_seen;  /* coarse clock (clock.h) of the client's latest new flow (refreshed at most once a second) */
};

/*
 * Key of the src_ranges LPM trie: one allowed client prefix of one service.
 * prefixlen counts bits over svc_id and addr together: 32 + 96 + the IPv4
 * prefix length (addresses are IPv4-mapped), or 32 + the IPv6 one. svc_id is
 * always matched whole, so its byte order only has to agree between the
 * writer (lb/datapath: host order) and the lookup. Bits of addr past the
 * prefix are 0. The value (a __u8, 1) is not read: presence allows.
 */
struct src_range_key {
	__u32 prefixlen;
	__u32 svc_id;     /* host order */
	__u8 addr[16];    /* network order, IPv4-mapped for IPv4 */
};

/*
 * Per-CPU state of the ICMP rate limiter (map icmp_buckets): a token bucket
 * kept as the theoretical arrival time of the next message (GCRA). A message
 * may go when tat - now <= cfg_icmp_burst_ns; it moves tat on by
 * cfg_icmp_interval_ns.
 */
struct icmp_bucket {
	__u64 tat;        /* coarse clock (clock.h) */
};

/* Per-CPU counters of one reason. */
struct reason_stats {
	__u64 packets;
	__u64 bytes;
};

/*
 * SNAT bindings. A SNAT flow owns one (SNAT address, SNAT port) towards its
 * backend. Two LRU maps hold it, one per direction: snat_fwd keyed by the
 * client's flow_key, snat_rev keyed by the reply as the backend sends it.
 * The reverse entry is the claim on the port (inserted with BPF_NOEXIST), so
 * it is the authority on liveness: both directions refresh its last_seen and
 * state. See snat.h.
 */
enum l4lb_snat_state {
	L4LB_SNAT_OPEN = 0,    /* UDP the backend answered, or TCP past the handshake: tcp / udp timeout */
	L4LB_SNAT_SYN = 1,     /* TCP binding made by a SYN, until the backend answers: tcp_closing timeout */
	L4LB_SNAT_CLOSING = 2, /* TCP after a FIN or RST in either direction: tcp_closing timeout */
	/* TCP binding made by a client packet other than a SYN, until the
	 * backend answers: tcp_closing timeout; UDP until the backend
	 * answers: udp timeout. Spoofed ACKs then hold ports for seconds,
	 * not for the open timeout. */
	L4LB_SNAT_UNANSWERED = 3,
	/* TCP binding made by a SYN that the backend answered (SYN+ACK),
	 * until the client's ACK: tcp_closing timeout. Only a client that
	 * saw the answer goes on, so a SYN then a spoofed ACK stays here. */
	L4LB_SNAT_SYN_ANSWERED = 4,
};

/* Value of snat_fwd (key: struct flow_key, the client's 5-tuple). */
struct snat_fwd_value {
	__u8 snat_addr[16];    /* new source, network order, IPv4-mapped for IPv4 */
	__u8 backend_addr[16]; /* new destination, same encoding */
	__be16 snat_port;      /* network order */
	__be16 backend_port;   /* network order */
	__u32 backend_id;      /* host order; the binding is redone when the flow changes backend */
	__u64 last_seen;       /* coarse clock (clock.h) of the latest client packet (throttled) */
	enum l4lb_snat_state state; /* as last seen by the forward path */
	__u32 pad;             /* always 0 */
};

/* Key of snat_rev: a reply as it arrives from the backend. */
struct snat_rev_key {
	__u8 backend_addr[16]; /* reply source, network order, IPv4-mapped for IPv4 */
	__u8 snat_addr[16];    /* reply destination, same encoding */
	__be16 backend_port;   /* network order */
	__be16 snat_port;      /* network order */
	__u8 proto;            /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];           /* always 0 */
};

/* Value of snat_rev: where the reply goes, and the binding's liveness. */
struct snat_rev_value {
	__u8 client_addr[16];  /* new destination, network order, IPv4-mapped for IPv4 */
	__u8 vip[16];          /* new source, same encoding */
	__be16 client_port;    /* network order */
	__be16 vip_port;       /* network order */
	__u32 svc_id;          /* host order */
	__u64 last_seen;       /* coarse clock (clock.h) of the latest packet either way (throttled) */
	enum l4lb_snat_state state;
	/* L4LB_SNAT_ANSWERED; only entries of the overflow tables carry
	 * flags (those of snat_rev are 0). */
	__u32 flags;
};

/* snat_rev_value.flags of an overflow binding: the backend has answered. */
#define L4LB_SNAT_ANSWERED 0x1

/*
 * Scratch space of the SNAT paths, one per CPU (map snat_scratch): these
 * keys and values do not fit the 512-byte stack next to the rest of the
 * program. Go only checks its size.
 */
struct snat_work {
	struct snat_rev_key rk;   /* backend, SNAT address and port, protocol */
	struct snat_rev_value rv; /* the flow's reverse entry */
	struct snat_fwd_value fv; /* the flow's forward entry */
	__u64 now;
	__u32 lo;                 /* probe: first port of the range, host order */
	__u32 range;              /* probe: ports in the range */
	__u32 start;              /* probe: first candidate, an offset into the range */
	__u8 flags;               /* the client packet's TCP flags */
	__u8 claimed;             /* probe: a port was claimed */
	__u8 table;               /* the binding's table set, 0 main, 1 overflow (snat_bind) */
	__u8 victim;              /* probe: an unproven binding of another flow was seen (victim_*) */
	__be16 victim_port;       /* probe: the stalest one's SNAT port, network order */
	__u8 victim_table;        /* probe: its table set */
	__u8 pad[5];
	__u64 victim_seen;        /* probe: its last_seen */
	struct flow_key vk;       /* preemption: the victim's client flow */
};

/* What the backend companion did with a packet; index of its counters. */
enum l4lb_backend_reason {
	L4LB_B_DECAP_IPIP = 0,    /* IPIP / IPv6-in-IPv6 to a local VIP: decapsulated */
	L4LB_B_PASS_OTHER,        /* not DSR traffic: left alone */
	L4LB_B_PASS_NOT_VIP,      /* encapsulated, but the inner destination is not a VIP here */
	L4LB_B_PASS_MALFORMED,    /* truncated or inconsistent headers: left for the stack */
	L4LB_B_DROP_DECAP,        /* the outer header could not be removed */
	L4LB_B_DECAP_GENEVE,      /* Geneve with the l4lb option, to a local VIP: decapsulated */
	L4LB_B_OPT_RECORD,        /* opt dispatch: the packet's VIP:port recorded for its replies */
	L4LB_B_OPT_REPLY,         /* egress: reply of a recorded flow, source rewritten to VIP:port */
	L4LB_B_EGRESS_OTHER,      /* egress: not a reply of a recorded flow, left alone */
	L4LB_B_DROP_REPLY,        /* egress: a reply's rewrite failed; dropped rather than sent from the backend's address */
	L4LB_B_MAX,
};

/*
 * Wire formats of DSR dispatch geneve and opt: what the LB writes and the
 * backend companion reads. All multi-byte fields are network order.
 */

/* UDP destination port of Geneve (IANA). */
#define L4LB_GENEVE_PORT 6081
/* Option class of the l4lb Geneve option: the experimental range
 * (0xFF00-0xFFFF) of RFC 8926's IANA registry. */
#define L4LB_GENEVE_CLASS 0xFF4C
#define L4LB_GENEVE_TYPE 0x01
/* First Geneve UDP source port; the flow hash picks one of the 16384 from here. */
#define L4LB_GENEVE_SPORT_MIN 49152

/*
 * Geneve (RFC 8926) as the LB sends it: the base header, then exactly one
 * option, the l4lb one. No inner Ethernet header: proto is the inner
 * ethertype.
 */
struct l4lb_geneve {
	__u8 ver_optlen;  /* version (top 2 bits) 0; options length in 4-byte words: 6 */
	__u8 flags;       /* O (0x80) and C (0x40): 0 */
	__be16 proto;     /* ETH_P_IP or ETH_P_IPV6: the inner packet's family */
	__u8 vni[3];      /* 0 */
	__u8 rsvd;        /* 0 */
	__be16 opt_class; /* L4LB_GENEVE_CLASS */
	__u8 opt_type;    /* L4LB_GENEVE_TYPE (critical bit clear) */
	__u8 opt_len;     /* 3 reserved bits 0; data length in 4-byte words: 5 */
	__u8 vip[16];     /* the frontend's VIP, IPv4-mapped for IPv4 */
	__be16 port;      /* the frontend's port */
	__u8 reserved[2]; /* 0 */
};

_Static_assert(sizeof(struct l4lb_geneve) == 32, "Geneve base header (8) and l4lb option (4 + 20)");

/* IPv4 option type of the opt dispatch: copied on fragmentation, class 0,
 * number 30 (RFC 4727 experimental). */
#define L4LB_IPV4_OPT_TYPE 0x9E

/* The IPv4 option the LB inserts right after the base header. */
struct l4lb_ipv4_opt {
	__u8 type;   /* L4LB_IPV4_OPT_TYPE */
	__u8 len;    /* 8 */
	__be16 port; /* the frontend's port */
	__be32 vip;  /* the frontend's VIP */
};

_Static_assert(sizeof(struct l4lb_ipv4_opt) == 8, "IPv4 option of the opt dispatch");

/* IPv6 destination option type of the opt dispatch: skip if unknown, not
 * changed en route, number 30 (RFC 4727 experimental). */
#define L4LB_IPV6_OPT_TYPE 0x1E

/*
 * The IPv6 destination-options header the LB inserts right after the IPv6
 * header: a 2-byte PadN first so that the VIP sits 8-byte aligned, then the
 * option (type, length 18, port, VIP). 24 bytes: hdrlen 2.
 */
struct l4lb_ipv6_dstopt {
	__u8 nexthdr;  /* the packet's original next header */
	__u8 hdrlen;   /* 2: (24 / 8) - 1 */
	__u8 pad_type; /* 1: PadN */
	__u8 pad_len;  /* 0 */
	__u8 opt_type; /* L4LB_IPV6_OPT_TYPE */
	__u8 opt_len;  /* 18 */
	__be16 port;   /* the frontend's port */
	__u8 vip[16];  /* the frontend's VIP */
};

_Static_assert(sizeof(struct l4lb_ipv6_dstopt) == 24, "IPv6 destination options of the opt dispatch");

/*
 * Key of the companion's opt_flows table: a client's flow as the backend
 * sees it arrive, and (swapped) as its replies leave.
 */
struct opt_flow_key {
	__u8 client[16];     /* client address, network order, IPv4-mapped for IPv4 */
	__be16 client_port;  /* network order */
	__be16 local_port;   /* the backend port the LB rewrote the destination to; network order */
	__u8 proto;          /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];         /* always 0 */
};

/* Value of opt_flows: the frontend the client addressed, the replies' source. */
struct opt_flow_value {
	__u8 vip[16];        /* network order, IPv4-mapped for IPv4 */
	__be16 vip_port;     /* network order */
	__u8 pad[2];         /* always 0 */
};

#endif
