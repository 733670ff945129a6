// SPDX-License-Identifier: Apache-2.0

package cow

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSlice changes random elements of Slices of several lengths and
// checks every version against a plain slice copied at that version: a new
// version holds the change, and every older one still holds what it held.
func TestSlice(t *testing.T) {
	for _, n := range []int{0, 1, chunkLen - 1, chunkLen, chunkLen + 1, 5*chunkLen + 7} {
		r := rand.New(rand.NewPCG(uint64(n), 1))
		plain := make([]int, n)
		for i := range plain {
			plain[i] = r.Int()
		}
		versions := []Slice[int]{SliceOf(plain)}
		want := [][]int{slices.Clone(plain)}
		for range min(n, 50) {
			i, v := r.IntN(n), r.Int()
			versions = append(versions, versions[len(versions)-1].With(i, v))
			plain[i] = v
			want = append(want, slices.Clone(plain))
		}
		for k, s := range versions {
			if s.Len() != len(want[k]) {
				t.Fatalf("n=%d version %d: Len %d, want %d", n, k, s.Len(), len(want[k]))
			}
			var got []int
			for i, v := range s.All() {
				if i != len(got) || s.At(i) != v {
					t.Fatalf("n=%d version %d: All yields index %d value %d, At says %d", n, k, i, v, s.At(i))
				}
				got = append(got, v)
			}
			if !slices.Equal(got, want[k]) && (len(got) > 0 || len(want[k]) > 0) {
				t.Errorf("n=%d version %d differs from the plain slice of that version", n, k)
			}
		}
	}
}

// TestMap sets and deletes random keys through editors, one or several
// changes per version, and checks every version against a plain map copied
// at that version.
func TestMap(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	plain := map[int]int{}
	for i := range 3000 {
		plain[i*7] = i
	}
	versions := []Map[int, int]{MapOf(plain)}
	want := []map[int]int{maps.Clone(plain)}
	for range 200 {
		e := versions[len(versions)-1].Edit()
		for range 1 + r.IntN(5) {
			k := r.IntN(25000)
			if r.IntN(3) == 0 {
				e.Delete(k)
				delete(plain, k)
			} else {
				v := r.Int()
				e.Set(k, v)
				plain[k] = v
			}
			want, in := plain[k]
			if got, ok := e.Get(k); ok != in || got != want {
				t.Fatalf("editor Get(%d) = %d, %v; want %d, %v", k, got, ok, want, in)
			}
		}
		versions = append(versions, e.Map())
		want = append(want, maps.Clone(plain))
	}
	for k, m := range versions {
		if m.Len() != len(want[k]) {
			t.Fatalf("version %d: Len %d, want %d", k, m.Len(), len(want[k]))
		}
		got := maps.Collect(m.All())
		if !maps.Equal(got, want[k]) {
			t.Fatalf("version %d differs from the plain map of that version", k)
		}
		for key, v := range want[k] {
			if g, ok := m.Get(key); !ok || g != v {
				t.Fatalf("version %d: Get(%d) = %d, %v; want %d", k, key, g, ok, v)
			}
		}
	}
	var zero Map[string, int]
	if _, ok := zero.Get("x"); ok || zero.Len() != 0 {
		t.Errorf("the zero Map is not empty")
	}
	for range zero.All() {
		t.Errorf("the zero Map yields a key")
	}
}
