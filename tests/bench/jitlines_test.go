// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
)

// TestHotLines feeds hotLines what `perf script -F ip,sym` prints for five
// samples: two in the program (one past the last line's start, one on a
// line's first byte), one in a kernel function it called, one elsewhere,
// and one in a kernel function called by another process's LB program.
func TestHotLines(t *testing.T) {
	jit := &jitMap{
		lines: []jitLine{
			{0xffffffffc0001000, "./lb.c:10 a"},
			{0xffffffffc0001010, "./lb.c:11 b"},
			{0xffffffffc0001040, "./include/x.h:3 c"},
		},
		ranges: []jitRange{{0xffffffffc0001000, 0xffffffffc0001080}},
	}
	perf := `
	ffffffffc0001018 bpf_prog_0123456789abcdef_lb_process_xdp
	ffffffff81000000 bpf_test_run

	ffffffffc0001010 bpf_prog_0123456789abcdef_lb_process_xdp

	ffffffff814eec09 lookup_nulls_elem_raw
	ffffffff814eec00 __htab_map_lookup_elem
	ffffffffc0001044 bpf_prog_0123456789abcdef_lb_process_xdp
	ffffffffc0002000 bpf_prog_fedcba9876543210_l4lb_xdp

	ffffffff813ae493 finish_task_switch.isra.0
	ffffffff822587c4 __schedule

	ffffffff814eec09 lookup_nulls_elem_raw
	ffffffffc0001080 bpf_prog_aaaaaaaaaaaaaaaa_lb_process_xdp
`
	got, total, err := hotLines(strings.NewReader(perf), jit)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"./lb.c:11 b": 2, "[kernel] lookup_nulls_elem_raw": 1}
	if total != 3 || len(got) != len(want) {
		t.Fatalf("total %d, lines %+v; want 3 samples on %v", total, got, want)
	}
	for _, l := range got {
		if want[l.line] != l.n {
			t.Errorf("%q: %d samples, want %d", l.line, l.n, want[l.line])
		}
	}
	if got[0].line != "./lb.c:11 b" {
		t.Errorf("hottest line %q, want ./lb.c:11 b", got[0].line)
	}
}
