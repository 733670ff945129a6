/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The Maglev tables' map, alone in a header because two objects declare it:
 * the LB program (maps.h), which reads a slot per packet, and the self-check's
 * digest program (digest.c), which is loaded with l4lbd's map in its place.
 */
#ifndef L4LB_MAGLEVMAP_H
#define L4LB_MAGLEVMAP_H

#include "common.h"
#include "types.h"

/*
 * Service id -> that service's Maglev table, in chunks of MAGLEV_CHUNK ids. The table
 * carries its own size in id 0, so a swapped-in table always matches the
 * size it was built for. The control plane builds a new inner map and
 * replaces the outer element: a packet sees the old table or the new one,
 * never a mix.
 */
struct maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32[MAGLEV_CHUNK]);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, 4097);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct maglev_inner);
} maglev SEC(".maps");

#endif
