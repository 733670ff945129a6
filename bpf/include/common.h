/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Includes and small helpers every l4lb program needs. */
#ifndef L4LB_COMMON_H
#define L4LB_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* tcx verdicts (linux/bpf.h >= 6.6; older UAPI headers lack them). */
#ifndef TCX_NEXT
#define TCX_NEXT -1
#define TCX_PASS 0
#define TCX_DROP 2
#endif

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

/* Make the compiler treat var as changed here, so it keeps using the
 * register that holds it instead of recomputing the value. */
#ifndef barrier_var
#define barrier_var(var) asm volatile("" : "+r"(var))
#endif

/* Fixed-size copies the compiler turns into plain loads and stores. */
#define copy16(dst, src) __builtin_memcpy((dst), (src), 16)

/* Write an IPv4 address (network order) as IPv4-mapped IPv6 (::ffff:a.b.c.d). */
static __always_inline void addr_from_v4(__u8 dst[16], __be32 v4)
{
	__u32 *w = (__u32 *)dst;

	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0x0000ffff);
	w[3] = v4;
}

/* The IPv4 address (network order) held in an IPv4-mapped address. */
static __always_inline __be32 addr_to_v4(const __u8 addr[16])
{
	return ((const __u32 *)addr)[3];
}

/* True for ::ffff:0:0/96, which never appears as a real IPv6 destination. */
static __always_inline int addr_is_v4mapped(const __u8 addr[16])
{
	const __u32 *w = (const __u32 *)addr;

	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0x0000ffff);
}

#endif
