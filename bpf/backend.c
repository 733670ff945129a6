// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * The backend companion, run by `l4lbd backend` on a backend host: it lets
 * a plain Linux host take DSR traffic without tunnel modules or devices.
 *
 * At tc ingress (l4lb_backend_ingress):
 *  - IPIP / IPv6-in-IPv6, and Geneve to UDP 6081 carrying the l4lb option,
 *    whose inner destination is a VIP listed in `vips` lose their outer
 *    headers. The stack then delivers the client's packet to the VIP bound
 *    on the host (usually on lo), and the socket's reply leaves from the VIP
 *    straight to the client. Only listed VIPs are decapsulated, so the host
 *    never becomes an open relay for tunnelled packets to other addresses.
 *  - opt: a packet that carries the l4lb IPv4 option or IPv6 destination
 *    option naming a listed VIP is left as it is (Linux ignores an unknown
 *    IPv4 option on a packet it receives, and skips the IPv6 one as its type
 *    says) and its flow is recorded in `opt_flows`.
 * At tc egress (l4lb_backend_egress), a reply of a recorded flow leaves with
 * the VIP and the frontend's port as its source, the address and port the
 * client's socket is connected to.
 *
 * Reads go through bpf_skb_load_bytes and writes through helpers: no direct
 * packet write, so the verifier adds no unclone prologue, which at egress
 * would copy the header of every cloned TCP segment the host sends.
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

/*
 * Flows that arrived by the opt dispatch -> the frontend their replies speak
 * for. Sized by `l4lbd backend --max-flows`. A TCP flow is recorded from its
 * SYN alone: an entry lost to eviction or a companion restart leaves the
 * rest of that connection's replies with the backend's address, which the
 * client rejects. One LRU shared by all CPUs: the reply is looked up on
 * whichever CPU the application sends from.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct opt_flow_key);
	__type(value, struct opt_flow_value);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} opt_flows SEC(".maps");

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

/* IPv6 extension headers the opt path walks to find the ports. */
#define OPT_MAX_EXT 4

static __always_inline int done(struct __sk_buff *skb, __u32 reason)
{
	struct reason_stats *s = bpf_map_lookup_elem(&backend_reasons, &reason);

	if (s) {
		s->packets++;
		s->bytes += skb->len;
	}
	if (reason == L4LB_B_DROP_DECAP || reason == L4LB_B_DROP_REPLY)
		return TCX_DROP;
	/* Let any later tcx program see the packet, changed or not. */
	return TCX_NEXT;
}

static __always_inline int is_vip(const __u8 addr[16])
{
	return bpf_map_lookup_elem(&vips, addr) != NULL;
}

static __always_inline int addr_eq(const __u8 a[16], const __u8 b[16])
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static __always_inline int load(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	return bpf_skb_load_bytes(skb, off, to, len);
}

/* Cut the hdr bytes after the Ethernet header. The kernel resets a checksum
 * the NIC validated (CHECKSUM_UNNECESSARY), so the stack checks the inner one. */
static __always_inline int decap(struct __sk_buff *skb, __u32 hdr, __u32 reason)
{
	if (bpf_skb_adjust_room(skb, -(__s32)hdr, BPF_ADJ_ROOM_MAC, 0))
		return done(skb, L4LB_B_DROP_DECAP);
	return done(skb, reason);
}

/* IPIP: outer is the IPv4 header at the start of the frame's payload. */
static __always_inline int ipip4(struct __sk_buff *skb, const struct iphdr *outer)
{
	__u32 outer_len = outer->ihl * 4;
	struct iphdr inner;
	__u8 dst[16];

	if (outer->version != 4 || outer->ihl < 5 || outer->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (load(skb, ETH_HLEN + outer_len, &inner, sizeof(inner)))
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (inner.version != 4 ||
	    bpf_ntohs(outer->tot_len) != outer_len + bpf_ntohs(inner.tot_len))
		return done(skb, L4LB_B_PASS_MALFORMED);
	/* Lengths that agree with each other may still exceed a cut frame:
	 * leave that to the stack rather than count it as ours. */
	if (skb->len < ETH_HLEN + bpf_ntohs(outer->tot_len))
		return done(skb, L4LB_B_PASS_MALFORMED);
	addr_from_v4(dst, inner.daddr);
	if (!is_vip(dst))
		return done(skb, L4LB_B_PASS_NOT_VIP);
	return decap(skb, outer_len, L4LB_B_DECAP_IPIP);
}

static __always_inline int ipip6(struct __sk_buff *skb, const struct ipv6hdr *outer)
{
	struct ipv6hdr inner;

	if (outer->version != 6)
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (load(skb, ETH_HLEN + sizeof(*outer), &inner, sizeof(inner)))
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (inner.version != 6 ||
	    bpf_ntohs(outer->payload_len) != sizeof(inner) + bpf_ntohs(inner.payload_len))
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (skb->len < ETH_HLEN + sizeof(*outer) + bpf_ntohs(outer->payload_len))
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (!is_vip((const __u8 *)&inner.daddr))
		return done(skb, L4LB_B_PASS_NOT_VIP);
	return decap(skb, sizeof(*outer), L4LB_B_DECAP_IPIP);
}

/*
 * A packet to UDP 6081 whose UDP header is at frame offset udp_off and
 * whose IP header leaves udp_len bytes for UDP and what follows; family is
 * the outer ethertype, which the inner packet must share (the LB never
 * mixes families). Other senders' Geneve (another first option) is left
 * alone; ours must be exactly what the LB builds (struct l4lb_geneve), and
 * anything else about it is malformed.
 */
static __always_inline int geneve(struct __sk_buff *skb, __u32 udp_off, __u32 udp_len, __be16 family)
{
	struct l4lb_geneve g;
	struct udphdr uh;
	__u32 inner_off = udp_off + sizeof(uh) + sizeof(g);
	__u8 dst[16];

	if (skb->len < udp_off + udp_len)
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (load(skb, udp_off, &uh, sizeof(uh)) || bpf_ntohs(uh.len) != udp_len)
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (load(skb, udp_off + sizeof(uh), &g, sizeof(g)))
		return done(skb, L4LB_B_PASS_MALFORMED);
	if (g.opt_class != bpf_htons(L4LB_GENEVE_CLASS) || g.opt_type != L4LB_GENEVE_TYPE)
		return done(skb, L4LB_B_PASS_OTHER);
	/* Version 0, our one option; no control (O) or critical (C) flag. */
	if (g.ver_optlen != (sizeof(g) - 8) / 4 || (g.flags & 0xc0) || g.proto != family ||
	    g.vni[0] || g.vni[1] || g.vni[2] || (g.opt_len & 0x1f) != (sizeof(g) - 12) / 4)
		return done(skb, L4LB_B_PASS_MALFORMED);

	if (family == bpf_htons(ETH_P_IP)) {
		struct iphdr inner;

		if (load(skb, inner_off, &inner, sizeof(inner)) || inner.version != 4 ||
		    bpf_ntohs(inner.tot_len) != udp_len - sizeof(uh) - sizeof(g))
			return done(skb, L4LB_B_PASS_MALFORMED);
		addr_from_v4(dst, inner.daddr);
	} else {
		struct ipv6hdr inner;

		if (load(skb, inner_off, &inner, sizeof(inner)) || inner.version != 6 ||
		    sizeof(inner) + bpf_ntohs(inner.payload_len) != udp_len - sizeof(uh) - sizeof(g))
			return done(skb, L4LB_B_PASS_MALFORMED);
		copy16(dst, &inner.daddr);
	}
	if (!is_vip(g.vip))
		return done(skb, L4LB_B_PASS_NOT_VIP);
	if (!addr_eq(g.vip, dst))
		return done(skb, L4LB_B_PASS_MALFORMED);
	return decap(skb, inner_off - ETH_HLEN, L4LB_B_DECAP_GENEVE);
}

/* Remember that replies of k speak for vip:port. */
static __always_inline int opt_record(struct __sk_buff *skb, const struct opt_flow_key *k,
				      const __u8 vip[16], __be16 port)
{
	struct opt_flow_value v = {}, *cur;

	if (!is_vip(vip))
		return done(skb, L4LB_B_PASS_NOT_VIP);
	/* UDP brings the option on every datagram: write only what changed. */
	cur = bpf_map_lookup_elem(&opt_flows, k);
	if (!cur || cur->vip_port != port || !addr_eq(cur->vip, vip)) {
		copy16(v.vip, vip);
		v.vip_port = port;
		bpf_map_update_elem(&opt_flows, k, &v, BPF_ANY);
	}
	return done(skb, L4LB_B_OPT_RECORD);
}

/* The source and destination port of the TCP/UDP header at off; -1 for
 * another protocol or a cut header. */
static __always_inline int l4_ports(struct __sk_buff *skb, __u32 off, __u8 proto, __be16 ports[2])
{
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return -1;
	return load(skb, off, ports, 2 * sizeof(__be16)) ? -1 : 0;
}

/* IPv4 whose first option has our type. */
static __always_inline int opt4(struct __sk_buff *skb, const struct iphdr *ip)
{
	struct opt_flow_key k = {};
	struct l4lb_ipv4_opt o;
	__be16 ports[2];
	__u8 vip[16];

	if (load(skb, ETH_HLEN + sizeof(*ip), &o, sizeof(o)) || o.len != sizeof(o) ||
	    ip->ihl * 4 < sizeof(*ip) + sizeof(o))
		return done(skb, L4LB_B_PASS_MALFORMED);
	/* A later fragment has no ports; the first one recorded the flow. */
	if (ip->frag_off & bpf_htons(IP_OFFSET))
		return done(skb, L4LB_B_PASS_OTHER);
	if (skb->len < ETH_HLEN + bpf_ntohs(ip->tot_len) ||
	    l4_ports(skb, ETH_HLEN + ip->ihl * 4, ip->protocol, ports))
		return done(skb, L4LB_B_PASS_MALFORMED);
	addr_from_v4(k.client, ip->saddr);
	k.client_port = ports[0];
	k.local_port = ports[1];
	k.proto = ip->protocol;
	addr_from_v4(vip, o.vip);
	return opt_record(skb, &k, vip, o.port);
}

/* IPv6 whose first extension header is a destination-options header. */
static __always_inline int opt6(struct __sk_buff *skb, const struct ipv6hdr *ip6)
{
	__u32 off = ETH_HLEN + sizeof(*ip6) + sizeof(struct l4lb_ipv6_dstopt);
	struct l4lb_ipv6_dstopt o;
	struct opt_flow_key k = {};
	__be16 ports[2];
	__u8 nexthdr;

	if (load(skb, ETH_HLEN + sizeof(*ip6), &o, sizeof(o)) ||
	    o.pad_type != 1 || o.pad_len != 0 || o.opt_type != L4LB_IPV6_OPT_TYPE)
		return done(skb, L4LB_B_PASS_OTHER);
	if (o.hdrlen != sizeof(o) / 8 - 1 || o.opt_len != sizeof(o) - 6 || addr_is_v4mapped(o.vip) ||
	    skb->len < ETH_HLEN + sizeof(*ip6) + bpf_ntohs(ip6->payload_len))
		return done(skb, L4LB_B_PASS_MALFORMED);

	/* The LB puts its header first, before any the client sent. */
	nexthdr = o.nexthdr;
#pragma unroll
	for (int i = 0; i < OPT_MAX_EXT; i++) {
		__u8 hdr[2];

		if (nexthdr != IPPROTO_ROUTING && nexthdr != IPPROTO_DSTOPTS && nexthdr != IPPROTO_AH)
			break;
		if (load(skb, off, hdr, sizeof(hdr)))
			return done(skb, L4LB_B_PASS_MALFORMED);
		off += nexthdr == IPPROTO_AH ? (hdr[1] + 2) * 4 : (hdr[1] + 1) * 8;
		nexthdr = hdr[0];
	}
	if (l4_ports(skb, off, nexthdr, ports))
		return done(skb, L4LB_B_PASS_MALFORMED);
	copy16(k.client, &ip6->saddr);
	k.client_port = ports[0];
	k.local_port = ports[1];
	k.proto = nexthdr;
	return opt_record(skb, &k, o.vip, o.port);
}

static __always_inline int ingress4(struct __sk_buff *skb)
{
	struct iphdr ip;
	__be16 dport;
	__u8 first;

	if (load(skb, ETH_HLEN, &ip, sizeof(ip)))
		return done(skb, L4LB_B_PASS_OTHER);
	if (ip.protocol == IPPROTO_IPIP)
		return ipip4(skb, &ip);
	if (ip.version != 4 || ip.ihl < 5)
		return done(skb, L4LB_B_PASS_OTHER);
	/* The LB puts its option first, before any the client sent. */
	if (ip.ihl > 5 && !load(skb, ETH_HLEN + sizeof(ip), &first, 1) && first == L4LB_IPV4_OPT_TYPE)
		return opt4(skb, &ip);
	if (ip.protocol == IPPROTO_UDP &&
	    !load(skb, ETH_HLEN + ip.ihl * 4 + offsetof(struct udphdr, dest), &dport, sizeof(dport)) &&
	    dport == bpf_htons(L4LB_GENEVE_PORT)) {
		if (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET) || bpf_ntohs(ip.tot_len) < ip.ihl * 4)
			return done(skb, L4LB_B_PASS_MALFORMED);
		return geneve(skb, ETH_HLEN + ip.ihl * 4, bpf_ntohs(ip.tot_len) - ip.ihl * 4,
			      bpf_htons(ETH_P_IP));
	}
	return done(skb, L4LB_B_PASS_OTHER);
}

static __always_inline int ingress6(struct __sk_buff *skb)
{
	struct ipv6hdr ip6;
	__be16 dport;

	if (load(skb, ETH_HLEN, &ip6, sizeof(ip6)))
		return done(skb, L4LB_B_PASS_OTHER);
	switch (ip6.nexthdr) {
	case IPPROTO_IPV6:
		return ipip6(skb, &ip6);
	case IPPROTO_DSTOPTS:
		if (ip6.version != 6)
			return done(skb, L4LB_B_PASS_OTHER);
		return opt6(skb, &ip6);
	case IPPROTO_UDP:
		if (ip6.version != 6 ||
		    load(skb, ETH_HLEN + sizeof(ip6) + offsetof(struct udphdr, dest), &dport, sizeof(dport)) ||
		    dport != bpf_htons(L4LB_GENEVE_PORT))
			break;
		return geneve(skb, ETH_HLEN + sizeof(ip6), bpf_ntohs(ip6.payload_len), bpf_htons(ETH_P_IPV6));
	}
	return done(skb, L4LB_B_PASS_OTHER);
}

SEC("tcx/ingress")
int l4lb_backend_ingress(struct __sk_buff *skb)
{
	__be16 proto;

	if (load(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)))
		return done(skb, L4LB_B_PASS_OTHER);
	if (proto == bpf_htons(ETH_P_IP))
		return ingress4(skb);
	if (proto == bpf_htons(ETH_P_IPV6))
		return ingress6(skb);
	return done(skb, L4LB_B_PASS_OTHER);
}

/*
 * Give the reply whose L4 header is at l4_off the source port of v, fixing
 * the L4 checksum. bpf_l4_csum_replace knows a partial checksum (TCP/UDP
 * offload, the usual case for what the local stack sends) from a complete
 * one.
 */
static __always_inline int reply_port(struct __sk_buff *skb, __u32 l4_off, __u32 check_off,
				      __u64 mangled, __be16 from, __be16 to)
{
	if (bpf_l4_csum_replace(skb, check_off, from, to, mangled | sizeof(to)))
		return -1;
	return bpf_skb_store_bytes(skb, l4_off, &to, sizeof(to), 0);
}

static __always_inline int egress4(struct __sk_buff *skb)
{
	struct opt_flow_key k = {};
	struct opt_flow_value *found, v;
	__u32 l4_off, check_off;
	__be16 ports[2];
	__u64 mangled;
	struct iphdr ip;
	__be32 vip;

	/* A fragmented reply cannot be matched by port: left alone whole. */
	if (load(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.version != 4 || ip.ihl < 5 ||
	    ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return done(skb, L4LB_B_EGRESS_OTHER);
	l4_off = ETH_HLEN + ip.ihl * 4;
	if (l4_ports(skb, l4_off, ip.protocol, ports))
		return done(skb, L4LB_B_EGRESS_OTHER);
	/* A reply runs from the local port to the client. */
	addr_from_v4(k.client, ip.daddr);
	k.client_port = ports[1];
	k.local_port = ports[0];
	k.proto = ip.protocol;
	found = bpf_map_lookup_elem(&opt_flows, &k);
	if (!found)
		return done(skb, L4LB_B_EGRESS_OTHER);
	v = *found;

	vip = addr_to_v4(v.vip);
	mangled = ip.protocol == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	check_off = l4_off + (ip.protocol == IPPROTO_TCP ? 16 : 6);
	if (bpf_l4_csum_replace(skb, check_off, ip.saddr, vip, BPF_F_PSEUDO_HDR | mangled | sizeof(vip)) ||
	    bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), ip.saddr, vip, sizeof(vip)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), &vip, sizeof(vip), 0) ||
	    reply_port(skb, l4_off, check_off, mangled, ports[0], v.vip_port))
		return done(skb, L4LB_B_DROP_REPLY);
	return done(skb, L4LB_B_OPT_REPLY);
}

static __always_inline int egress6(struct __sk_buff *skb)
{
	__u32 l4_off = ETH_HLEN + sizeof(struct ipv6hdr), check_off;
	struct opt_flow_key k = {};
	struct opt_flow_value *found, v;
	struct ipv6hdr ip6;
	__be16 ports[2];
	__u64 mangled;
	__s64 diff;

	/* The local stack's replies carry no extension headers. */
	if (load(skb, ETH_HLEN, &ip6, sizeof(ip6)) || ip6.version != 6 ||
	    l4_ports(skb, l4_off, ip6.nexthdr, ports))
		return done(skb, L4LB_B_EGRESS_OTHER);
	copy16(k.client, &ip6.daddr);
	k.client_port = ports[1];
	k.local_port = ports[0];
	k.proto = ip6.nexthdr;
	found = bpf_map_lookup_elem(&opt_flows, &k);
	if (!found)
		return done(skb, L4LB_B_EGRESS_OTHER);
	v = *found;

	mangled = ip6.nexthdr == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	check_off = l4_off + (ip6.nexthdr == IPPROTO_TCP ? 16 : 6);
	diff = bpf_csum_diff((__be32 *)&ip6.saddr, 16, (__be32 *)v.vip, 16, 0);
	if (diff < 0 ||
	    bpf_l4_csum_replace(skb, check_off, 0, (__u32)diff, BPF_F_PSEUDO_HDR | mangled) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), v.vip, 16, 0) ||
	    reply_port(skb, l4_off, check_off, mangled, ports[0], v.vip_port))
		return done(skb, L4LB_B_DROP_REPLY);
	return done(skb, L4LB_B_OPT_REPLY);
}

SEC("tcx/egress")
int l4lb_backend_egress(struct __sk_buff *skb)
{
	__be16 proto;

	if (load(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)))
		return done(skb, L4LB_B_EGRESS_OTHER);
	if (proto == bpf_htons(ETH_P_IP))
		return egress4(skb);
	if (proto == bpf_htons(ETH_P_IPV6))
		return egress6(skb);
	return done(skb, L4LB_B_EGRESS_OTHER);
}
