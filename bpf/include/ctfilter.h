/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The connection table's presence filter: lets a SYN skip the lookup of an
 * entry it almost never has.
 *
 * A SYN must follow the entry of its 5-tuple when there is one (a client
 * reusing the tuple of a flow the table still holds: its first ACK will
 * find that entry), so every SYN used to look the table up, and nearly
 * always missed: a random bucket of a bucket array as large as the table
 * (16 MB at the default million entries), and that one cold read was half
 * of what a SYN cost (docs/datapath.md). The filter is a bit array, eight
 * bits per entry of capacity, indexed by a cheap mix of the flow key: a
 * clear bit proves the table has no entry for the tuple, and
 * the SYN goes on without the lookup. A set bit (the flow's, or another
 * tuple's) takes the lookup as before. The filter never decides anything
 * the table would not.
 *
 * It stays exact because a clear bit can only be wrong if an entry was
 * added without setting it:
 *   - the datapath sets the flow's bit, atomically, before it inserts the
 *     entry (select_backend), in every filter slot present;
 *   - lb/datapath installs a filter only once it holds a bit for every
 *     entry in the table: it puts a new, empty filter in CT_FILTER_NEXT
 *     (the kernel returns from that update only when no program still runs
 *     that could have missed the slot), then sets the bit of every entry
 *     in the table, with the same mix and an atomic OR on a shared
 *     mapping of the filter, then moves that filter to CT_FILTER_LIVE.
 *     Entries inserted meanwhile set their bits in it themselves;
 *   - it does so only once no program of an earlier l4lb, which would not
 *     set bits, still runs on the table: at once for a table it created,
 *     after attaching (Retire) for a pinned one; until then
 *     CT_FILTER_LIVE is empty and SYNs look up.
 * Entries leave the table (LRU eviction, expiry, a flush) without clearing
 * their bits, which only costs the lookup to a few more SYNs; lb/datapath
 * rebuilds the filter the same way when too many of its bits are set.
 */
#ifndef L4LB_CTFILTER_H
#define L4LB_CTFILTER_H

#include "config.h"
#include "maps.h"

#define CT_FILTER_LIVE 0
#define CT_FILTER_NEXT 1

/*
 * A multiplicative mix of the five words of a flow key, computed once per
 * packet: it picks the flow-cache slot (flowcache.h) and indexes the
 * filter. Not the flow hash: a SYN's filter read then does not wait for
 * SipHash, and overlaps it. lb/datapath (filterMix) computes the same. The
 * filter's word is bits 32.. of the mix, the bit within it bits 58..63:
 * the top bits of the last product, which every bit of the key reaches.
 */
static __always_inline __u64 flow_key_mix(const struct flow_key *k)
{
	const __u64 *m = (const __u64 *)k;
	__u64 x = (m[0] ^ m[1] ^ (m[2] << 1) ^ (m[3] << 1)) * 0x9e3779b97f4a7c15ULL;

	return (x ^ m[4]) * 0xff51afd7ed558ccdULL;
}

static __always_inline __u64 ct_filter_bit(__u64 mix)
{
	return 1ULL << (mix >> 58);
}

/* The word of a key's mix in the filter in slot, or NULL if there is none. */
static __always_inline __u64 *ct_filter_word(__u32 slot, __u64 mix)
{
	__u32 idx = (__u32)(mix >> 32) & cfg_ct_filter_mask;
	void *f = bpf_map_lookup_elem(&ct_filter, &slot);

	if (!f)
		return NULL;
	return bpf_map_lookup_elem(f, &idx);
}

/* May the connection table hold an entry for a key of this mix? 0 only
 * when the live filter proves it does not. */
static __always_inline int ct_filter_maybe(__u64 mix)
{
	__u64 *w = ct_filter_word(CT_FILTER_LIVE, mix);

	return !w || (*w & ct_filter_bit(mix));
}

/* Has the live filter seen a key of this mix: 1 only when there is a
 * filter and the key's bit is set in it. */
static __always_inline int ct_filter_seen(__u64 mix)
{
	__u64 *w = ct_filter_word(CT_FILTER_LIVE, mix);

	return w && (*w & ct_filter_bit(mix));
}

/*
 * Read the live filter's word of a key's mix, and nothing more: a packet
 * without SYN does this right before its table lookup. Most such packets
 * are established and lose nothing (the read overlaps the lookup's own
 * miss); a new flow's insert then finds the word in cache for its atomic
 * OR, which would otherwise wait for it.
 */
static __always_inline void ct_filter_prefetch(__u64 mix)
{
	__u64 *w = ct_filter_word(CT_FILTER_LIVE, mix);

	if (w) {
		__u64 x = *(volatile __u64 *)w;

		barrier_var(x);
	}
}

static __always_inline void ct_filter_set(__u32 slot, __u64 mix)
{
	__u64 *w = ct_filter_word(slot, mix);
	__u64 bit = ct_filter_bit(mix);

	/* Read first: a set bit, the common case for a busy filter, leaves
	 * the line clean in every CPU's cache. */
	if (w && !(*w & bit))
		__sync_fetch_and_or(w, bit);
}

/* Record a key in every filter present, before its entry is inserted. */
static __always_inline void ct_filter_add(const struct flow_key *k)
{
	__u64 mix = flow_key_mix(k);

	ct_filter_set(CT_FILTER_LIVE, mix);
	ct_filter_set(CT_FILTER_NEXT, mix);
}

#endif
