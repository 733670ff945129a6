/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * One load balancer, two hooks.
 *
 * The LB logic runs at XDP (struct xdp_md) and at tc ingress through tcx
 * (struct __sk_buff), for interfaces where XDP cannot attach. Both entry
 * points call the same always-inline functions with a struct hook whose
 * `xdp` member is a literal constant; once inlined, the compiler deletes the
 * other hook's branch, including helpers the verifier would refuse for this
 * program type. The helpers below are the only places that differ.
 *
 * Frame layout contract of the grow helpers: after a successful call the
 * frame holds the original Ethernet header at offset 0, then `len` bytes of
 * room for the caller to fill, then the rest of the original frame.
 */
#ifndef L4LB_HOOK_H
#define L4LB_HOOK_H

#include <linux/pkt_cls.h>

#include "common.h"
#include "csum.h"
#include "maps.h"

struct hook {
	void *ctx;
	int xdp; /* 1: XDP, 0: tc; always a literal at the entry point */
};

static __always_inline struct xdp_md *hook_xdp(const struct hook *h) { return h->ctx; }
static __always_inline struct __sk_buff *hook_skb(const struct hook *h) { return h->ctx; }

static __always_inline void *hook_data(const struct hook *h)
{
	if (h->xdp)
		return (void *)(long)hook_xdp(h)->data;
	return (void *)(long)hook_skb(h)->data;
}

static __always_inline void *hook_data_end(const struct hook *h)
{
	if (h->xdp)
		return (void *)(long)hook_xdp(h)->data_end;
	return (void *)(long)hook_skb(h)->data_end;
}

/* The interface the packet arrived on. */
static __always_inline __u32 hook_ifindex(const struct hook *h)
{
	if (h->xdp)
		return hook_xdp(h)->ingress_ifindex;
	return hook_skb(h)->ifindex;
}

/* Verdicts. tc lets a later tcx program see what the LB does not take. */
static __always_inline int hook_pass(const struct hook *h) { return h->xdp ? XDP_PASS : TCX_NEXT; }
static __always_inline int hook_drop(const struct hook *h) { return h->xdp ? XDP_DROP : TCX_DROP; }

/*
 * Make the first n bytes directly accessible. XDP frames are always linear;
 * an skb may carry headers in fragments.
 */
static __always_inline void hook_pull(const struct hook *h, __u32 n)
{
	if (!h->xdp) {
		struct __sk_buff *skb = hook_skb(h);

		bpf_skb_pull_data(skb, skb->len < n ? skb->len : n);
	}
}

/* GSO segment size of the packet (tc only; 0 for a single packet). */
static __always_inline __u32 hook_gso_size(const struct hook *h)
{
	return h->xdp ? 0 : hook_skb(h)->gso_size;
}

/* Cut the frame to len bytes (Ethernet padding after the IP packet). */
static __always_inline int hook_trim(const struct hook *h, __u32 len)
{
	if (h->xdp) {
		struct xdp_md *ctx = hook_xdp(h);
		__u32 cur = ctx->data_end - ctx->data;

		return cur > len ? bpf_xdp_adjust_tail(ctx, -(int)(cur - len)) : 0;
	}
	if (hook_skb(h)->len > len)
		return bpf_skb_change_tail(hook_skb(h), len, 0);
	return 0;
}

/* Largest header block the XDP path moves when it grows the frame. */
#define HOOK_MOVE_MAX (ETH_HLEN + 40)

/*
 * Insert len bytes of room after the first `keep` bytes of the frame (the
 * Ethernet header, or the Ethernet and base IP headers). XDP grows the head
 * and moves the kept bytes forward; tc asks the kernel, with tc_flags
 * describing an encapsulation so that GSO packets are segmented right later.
 * keep must be ETH_HLEN (tc: room at the MAC layer) or ETH_HLEN plus the
 * base IP header (tc: room at the network layer).
 */
static __always_inline int hook_grow(const struct hook *h, __u32 keep, int len, __u64 tc_flags)
{
	if (h->xdp) {
		struct xdp_md *ctx = hook_xdp(h);
		__u8 saved[HOOK_MOVE_MAX];
		void *data, *data_end;

		if (keep > HOOK_MOVE_MAX)
			return -1;
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		/* Copy a fixed size the verifier can bound; only keep bytes matter. */
		if (keep == ETH_HLEN) {
			if (data + ETH_HLEN > data_end)
				return -1;
			__builtin_memcpy(saved, data, ETH_HLEN);
		} else if (keep == ETH_HLEN + 20) {
			if (data + ETH_HLEN + 20 > data_end)
				return -1;
			__builtin_memcpy(saved, data, ETH_HLEN + 20);
		} else {
			if (data + ETH_HLEN + 40 > data_end)
				return -1;
			__builtin_memcpy(saved, data, ETH_HLEN + 40);
		}
		if (bpf_xdp_adjust_head(ctx, -len))
			return -1;
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		if (keep == ETH_HLEN) {
			if (data + ETH_HLEN > data_end)
				return -1;
			__builtin_memcpy(data, saved, ETH_HLEN);
		} else if (keep == ETH_HLEN + 20) {
			if (data + ETH_HLEN + 20 > data_end)
				return -1;
			__builtin_memcpy(data, saved, ETH_HLEN + 20);
		} else {
			if (data + ETH_HLEN + 40 > data_end)
				return -1;
			__builtin_memcpy(data, saved, ETH_HLEN + 40);
		}
		return 0;
	}
	if (keep == ETH_HLEN)
		return bpf_skb_adjust_room(hook_skb(h), len, BPF_ADJ_ROOM_MAC, tc_flags);
	return bpf_skb_adjust_room(hook_skb(h), len, BPF_ADJ_ROOM_NET, tc_flags);
}

/*
 * Send the frame out of ifindex. XDP transmits on the ingress interface
 * with XDP_TX and elsewhere through the tx_ports devmap (interfaces l4lb
 * attached to); *not_sent is set when the devmap has no such port and the
 * frame goes to the stack instead. tc redirects to the interface's egress.
 */
static __always_inline int hook_redirect(const struct hook *h, __u32 ifindex, int *not_sent)
{
	*not_sent = 0;
	if (h->xdp) {
		long ret;

		if (ifindex == hook_ifindex(h))
			return XDP_TX;
		ret = bpf_redirect_map(&tx_ports, ifindex, XDP_PASS);
		if (ret == XDP_PASS)
			*not_sent = 1;
		return ret;
	}
	return bpf_redirect(ifindex, 0);
}

/* Largest frame offset of a TCP/UDP checksum field the helper below accepts. */
#define HOOK_CSUM_OFF_MAX 1024

/*
 * Apply delta (the sum of csum_delta16/32 over the changed fields, see
 * csum.h) to the TCP/UDP checksum at byte off of the frame. flags as for
 * bpf_l4_csum_replace: BPF_F_PSEUDO_HDR when the changed field is in the
 * pseudo-header (an address), BPF_F_MARK_MANGLED_0 for UDP (a zero checksum
 * means none and stays zero; a sum that comes out zero is sent as 0xffff).
 * Call it once for pseudo-header changes and once for the rest.
 *
 * tc leaves it to the kernel: an skb from a local sender (over veth, say)
 * may carry CHECKSUM_PARTIAL, whose field holds only the pseudo-header sum;
 * only pseudo-header changes may touch it then. XDP frames come from the
 * wire with complete checksums. Returns 0, or negative on failure.
 */
static __always_inline int hook_l4_csum_update(const struct hook *h, __u32 off, __u64 delta, __u64 flags)
{
	if (h->xdp) {
		void *data = hook_data(h);
		void *data_end = hook_data_end(h);
		__sum16 *check;

		if (off > HOOK_CSUM_OFF_MAX)
			return -1;
		check = data + off;
		if ((void *)(check + 1) > data_end)
			return -1;
		if ((flags & BPF_F_MARK_MANGLED_0) && !*check)
			return 0;
		*check = csum_apply_delta(*check, delta);
		if ((flags & BPF_F_MARK_MANGLED_0) && !*check)
			*check = 0xffff;
		return 0;
	}
	delta = (delta & 0xffffffff) + (delta >> 32);
	delta = (delta & 0xffffffff) + (delta >> 32);
	return bpf_l4_csum_replace(hook_skb(h), off, 0, (__u32)delta,
				   flags & (BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0));
}

#endif
