// SPDX-License-Identifier: Apache-2.0

// Package bpf holds the l4lb datapath written in C and its compiled objects,
// embedded through bpf2go. lb.c is the load balancer (XDP entry point);
// backend.c is the backend-side companion that accepts DSR traffic;
// digest.c hashes Maglev tables for the self-check (run, never attached);
// floor.c is a benchmark's floor. The C
// headers under include/ declare the structures shared with Go once; bpf2go
// generates the Go types from them (the -type flags below).
//
// Regenerate with `make generate`; the objects are committed and CI checks
// that regenerating changes nothing. Only lb/datapath imports this package.
package bpf

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "$BPF_CFLAGS" -type svc_key -type svc_value -type backend -type flow_key -type flow_count -type ct_value -type handshake -type handshake_bucket -type lb_stats -type reply_stats -type reason_stats -type l4lb_reason -type l4lb_mode -type l4lb_dispatch -type l4lb_svc_flags -type l4lb_backend_flags -type snat_fwd_value -type snat_rev_key -type snat_rev_value -type snat_work -type l4lb_snat_state -type affinity_key -type affinity_value -type src_range_key -type icmp_bucket -type nexthop -type backend_route -type clock_copy -type flow_cache_entry -type svc_cache_entry -type l4lb_event -type walk -type ingress_mac -type local_addr -type ingress_copy -type trace_filter -type trace_note -type trace_event -type bfd_hold_key -type bfd_hold_value -type l4lb_trace_hook -type l4lb_trace_ct -type l4lb_trace_flags Lb lb.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "$BPF_CFLAGS" -type l4lb_backend_reason -type opt_flow_key -type opt_flow_value Backend backend.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "$BPF_CFLAGS" Floor floor.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "$BPF_CFLAGS" -type table_digest Digest digest.c
