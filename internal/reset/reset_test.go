// SPDX-License-Identifier: Apache-2.0

package reset

import "testing"

func TestMap(t *testing.T) {
	small := map[int]bool{1: true, 2: true}
	if got := Map(small); len(got) != 0 || len(small) != 0 {
		t.Errorf("a small map: got %v, and the map itself holds %v; want both empty (cleared in place)", got, small)
	}
	large := map[int]bool{}
	for i := range 5000 {
		large[i] = true
	}
	got := Map(large)
	if len(got) != 0 {
		t.Errorf("a large map: got %d entries, want none", len(got))
	}
	if len(large) != 5000 {
		t.Errorf("a large map was cleared in place (%d entries left), want it replaced and left as it was", len(large))
	}
}
