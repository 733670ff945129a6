// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

//go:build ignore
/*
 * The self-check's reader of Maglev tables (lb/datapath/digest.go), not part
 * of the datapath: run with BPF_PROG_TEST_RUN, never attached. The packet
 * it is given is an array of struct table_digest; for each, it walks the
 * table in the slot d->id of l4lbd's maglev map (loaded in place of the one
 * declared here) and writes back how many chunks the table has and four
 * running hashes of its words. The control plane computes the same hashes
 * from its record of the table and reads the table itself only when they
 * differ: reading a 16,381-slot table out of the kernel costs a copy per
 * chunk, a thousand per table, where hashing it here costs a lookup per
 * chunk.
 *
 * The hash: the table's chunks, in order, read as 8 little-endian 64-bit
 * words each; word j of a chunk goes into lane j % 4 as
 * lane = (lane ^ word) * DIGEST_PRIME, every lane starting at DIGEST_BASIS
 * (FNV-1a's constants, over 64-bit words). Each step is a bijection of the
 * lane, so a table that differs from the record in one word always gives
 * another lane; the four lanes are independent chains, so the multiplies
 * overlap.
 */
#include "include/common.h"
#include "include/types.h"
#include "include/maglevmap.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define DIGEST_LANES 4
/* Records per run: 64 * 40 bytes fits the page a test run's packet gets. */
#define DIGEST_MAX 64
#define DIGEST_BASIS 0xcbf29ce484222325ULL
#define DIGEST_PRIME 0x100000001b3ULL
/* More chunks than the largest table has (2^20 slots). */
#define DIGEST_MAX_CHUNKS (1 << 17)
/* Chunks per bpf_loop step. */
#define DIGEST_STEP 8

/* One table to read; id in, the rest out. Host byte order. */
struct table_digest {
	__u32 id;                  /* the maglev slot (service id) */
	__u32 chunks;              /* chunks of the table; 0: no table in the slot */
	__u64 lane[DIGEST_LANES];  /* the hashes */
};

/*
 * DIGEST_STEP chunks from chunk k * DIGEST_STEP: one callback and one slot
 * lookup serve several chunks. The slot is looked up again for each step:
 * a map pointer cannot be handed to the callback. A table swapped in during
 * the walk makes a mix of two tables, which matches no record: the control
 * plane then reads the slot the slow way.
 */
static long digest_step(__u64 k, struct table_digest *w)
{
	void *table;
	__u64 *c;

	table = bpf_map_lookup_elem(&maglev, &w->id);
	if (!table)
		return 1;
#pragma unroll
	for (int s = 0; s < DIGEST_STEP; s++) {
		__u32 idx = (__u32)k * DIGEST_STEP + s;

		c = bpf_map_lookup_elem(table, &idx);
		if (!c)
			return 1;
		w->chunks++;
#pragma unroll
		for (int j = 0; j < MAGLEV_CHUNK / 2; j++)
			w->lane[j % DIGEST_LANES] = (w->lane[j % DIGEST_LANES] ^ c[j]) * DIGEST_PRIME;
	}
	return 0;
}

SEC("xdp")
int l4lb_table_digest(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	/* bpf_loop's context must be on the stack: copied in and out. */
	struct table_digest w;

	for (int i = 0; i < DIGEST_MAX; i++) {
		struct table_digest *d = data + i * sizeof(*d);

		if ((void *)(d + 1) > data_end)
			break;
		w.id = d->id;
		w.chunks = 0;
#pragma unroll
		for (int j = 0; j < DIGEST_LANES; j++)
			w.lane[j] = DIGEST_BASIS;
		bpf_loop(DIGEST_MAX_CHUNKS / DIGEST_STEP, digest_step, &w, 0);
		d->chunks = w.chunks;
#pragma unroll
		for (int j = 0; j < DIGEST_LANES; j++)
			d->lane[j] = w.lane[j];
	}
	return XDP_PASS;
}
