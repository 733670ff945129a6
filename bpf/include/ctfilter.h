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
 * bits per entry of capacity, indexed by the flow hash the SYN computes
 * anyway: a clear bit proves the table has no entry for the tuple, and
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
 *     in the table, with the same hash and an atomic OR on a shared
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

/* The bit of a flow hash within its word: bits of the hash that neither
 * the word index nor the handshakes bucket use. */
static __always_inline __u64 ct_filter_bit(__u64 hash)
{
	return 1ULL << ((hash >> 26) & 63);
}

/* The word of a flow hash in the filter in slot, or NULL if there is none. */
static __always_inline __u64 *ct_filter_word(__u32 slot, __u64 hash)
{
	__u32 idx = (__u32)(hash >> 32) & cfg_ct_filter_mask;
	void *f = bpf_map_lookup_elem(&ct_filter, &slot);

	if (!f)
		return NULL;
	return bpf_map_lookup_elem(f, &idx);
}

/* May the connection table hold an entry for a flow of this hash? 0 only
 * when the live filter proves it does not. */
static __always_inline int ct_filter_maybe(__u64 hash)
{
	__u64 *w = ct_filter_word(CT_FILTER_LIVE, hash);

	return !w || (*w & ct_filter_bit(hash));
}

static __always_inline void ct_filter_set(__u32 slot, __u64 hash)
{
	__u64 *w = ct_filter_word(slot, hash);
	__u64 bit = ct_filter_bit(hash);

	/* Read first: a set bit, the common case for a busy filter, leaves
	 * the line clean in every CPU's cache. */
	if (w && !(*w & bit))
		__sync_fetch_and_or(w, bit);
}

/* Record a flow of this hash in every filter present, before its entry
 * is inserted. */
static __always_inline void ct_filter_add(__u64 hash)
{
	ct_filter_set(CT_FILTER_LIVE, hash);
	ct_filter_set(CT_FILTER_NEXT, hash);
}

#endif
