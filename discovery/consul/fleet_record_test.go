// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/lb/fleet"
)

const testHead = "l4lb/fleet/lb1"

// services are n services with distinct frontends, as a box publishes
// them (about 90 bytes each).
func services(n int, fp string) []fleet.Service {
	out := make([]fleet.Service, n)
	for i := range out {
		out[i] = fleet.Service{Name: fmt.Sprintf("service-%06d", i), Frontend: fmt.Sprintf("10.%d.%d.%d:80/tcp", i>>16, i>>8&255, i&255), Fingerprint: fp}
	}
	return out
}

func TestFrontendHashIsFNV1a64(t *testing.T) {
	for _, fe := range []string{"", "10.0.0.1:80/tcp", "[2001:db8::1]:443/udp"} {
		h := fnv.New64a()
		h.Write([]byte(fe))
		if got, want := frontendHash(fe), h.Sum64(); got != want {
			t.Errorf("frontendHash(%q) = %x, want FNV-1a 64 %x", fe, got, want)
		}
	}
}

func TestShardCount(t *testing.T) {
	// Services of 1 KiB spread evenly: k of them make a k KiB record.
	even := func(k int) ([]uint64, []int) {
		hashes, sizes := make([]uint64, k), make([]int, k)
		for i := range k {
			hashes[i], sizes[i] = uint64(i), 1<<10-1
		}
		return hashes, sizes
	}
	tests := []struct {
		name     string
		kib, cur int
		want     int
	}{
		{"empty", 0, 0, 1},
		{"small stays inline", 100, 0, 1},
		{"just under the target stays inline", 127, 1, 1},
		{"past the target doubles", 129, 1, 2},
		{"doubles as often as it takes", 1000, 1, 8},
		{"keeps N while between half and the target per shard", 200, 2, 2},
		{"keeps N a little above the shrink point", 130, 2, 2},
		{"halves when half as many shards stay under half the target", 63, 2, 1},
		{"halves as often as it takes", 10, 64, 1},
		{"a shrunk record keeps what it needs", 1000, 256, 16},
		{"a cur that is not a power of two starts again from one", 300, 3, 4},
		{"stops at maxShards", 1 << 20, maxShards, maxShards},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hashes, sizes := even(tt.kib)
			if got := shardCount(hashes, sizes, tt.cur); got != tt.want {
				t.Errorf("%d KiB from %d shards: %d shards, want %d", tt.kib, tt.cur, got, tt.want)
			}
		})
	}
}

// decodeRecord reads back what encodeRecord laid out, as a reader would.
func decodeRecord(t *testing.T, kv map[string][]byte) fleet.Box {
	t.Helper()
	var pairs api.KVPairs
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		pairs = append(pairs, &api.KVPair{Key: k, Value: kv[k], Session: "s1"})
	}
	boxes, _ := assembleBoxes("l4lb/fleet/", pairs, nil, quiet)
	if len(boxes) != 1 {
		t.Fatalf("%d boxes from %d keys", len(boxes), len(kv))
	}
	return boxes[0]
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestEncodeRecordInline(t *testing.T) {
	b := &fleet.Box{Name: "lb1", SeedFingerprint: "s1", Services: services(10, "f1")}
	kv, n, err := encodeRecord(testHead, b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || len(kv) != 1 || kv[testHead] == nil {
		t.Fatalf("a record of 10 services: %d shards, keys %v; want it inline in %s", n, slices.Collect(maps.Keys(kv)), testHead)
	}
	// What the previous version wrote and reads: the Box as it was.
	var old struct {
		Services []fleet.Service `json:"services"`
	}
	if err := json.Unmarshal(kv[testHead], &old); err != nil || len(old.Services) != 10 || strings.Contains(string(kv[testHead]), "shards") {
		t.Errorf("inline header %s: %v", kv[testHead], err)
	}
}

func TestEncodeRecordSharded(t *testing.T) {
	b := &fleet.Box{Name: "lb1", SeedFingerprint: "s1", Services: services(20000, "0123456789abcdef")}
	kv, n, err := encodeRecord(testHead, b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 || n&(n-1) != 0 || len(kv) != n+1 {
		t.Fatalf("20,000 services: %d shards in %d keys, want a power of two > 1, and a header", n, len(kv))
	}
	for k, v := range kv {
		if len(v) > shardTarget {
			t.Errorf("%s is %d bytes, over the %d target", k, len(v), shardTarget)
		}
	}
	var hdr fleet.Box
	if err := json.Unmarshal(kv[testHead], &hdr); err != nil || hdr.Shards != n || hdr.Services != nil || hdr.Name != "lb1" {
		t.Fatalf("header %s (%v): want shards %d and no services", kv[testHead], err, n)
	}
	for i := range n {
		var svcs []fleet.Service
		if err := json.Unmarshal(kv[shardKey(testHead, i)], &svcs); err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs {
			if got := int(frontendHash(s.Frontend) & uint64(n-1)); got != i {
				t.Fatalf("%s in shard %d, hashes to %d", s.Frontend, i, got)
			}
		}
	}
	if got := decodeRecord(t, kv); len(got.Services) != 20000 {
		t.Errorf("read back %d services, want 20000", len(got.Services))
	}

	// One service changed: one shard differs, the header does not (the
	// daemon's Updated would change it).
	c := *b
	c.Services = slices.Clone(b.Services)
	c.Services[12345].Fingerprint = "fedcba9876543210"
	kv2, n2, err := encodeRecord(testHead, &c, n)
	if err != nil || n2 != n {
		t.Fatalf("after one change: %d shards (%v), want %d", n2, err, n)
	}
	var changed []string
	for k := range kv {
		if string(kv[k]) != string(kv2[k]) {
			changed = append(changed, k)
		}
	}
	if want := []string{shardKey(testHead, int(frontendHash(c.Services[12345].Frontend)&uint64(n-1)))}; !slices.Equal(changed, want) {
		t.Errorf("one service changed, keys changed %v, want %v", changed, want)
	}

	// Shrunk to 10 services: inline again.
	c.Services = c.Services[:10]
	kv3, n3, err := encodeRecord(testHead, &c, n)
	if err != nil || n3 != 1 || len(kv3) != 1 {
		t.Errorf("shrunk to 10 services: %d shards, %d keys (%v); want inline", n3, len(kv3), err)
	}
}

func TestEncodeRecordTooLarge(t *testing.T) {
	// No number of shards splits one service.
	b := &fleet.Box{Name: "lb1", Services: []fleet.Service{{Name: strings.Repeat("x", 600<<10), Frontend: "10.0.0.1:80/tcp"}}}
	_, _, err := encodeRecord(testHead, b, 0)
	if err == nil || !strings.Contains(err.Error(), "kv_max_value_size") || !strings.Contains(err.Error(), "KiB") || !strings.Contains(err.Error(), "fleet.publish = false") {
		t.Errorf("a 600 KiB service: error %v; want one naming the limit, the size and what to do", err)
	}
}

func TestRecordOps(t *testing.T) {
	k := func(i int) string { return shardKey(testHead, i) }
	have := map[string][]byte{testHead: []byte("h1"), k(0): []byte("a"), k(1): []byte("b"), k(2): []byte("c"), k(3): []byte("d")}
	want := map[string][]byte{testHead: []byte("h2"), k(0): []byte("a"), k(1): []byte("B")}
	var got []string
	for _, op := range recordOps(testHead, "s1", want, have) {
		if op.KV.Verb == api.KVLock && op.KV.Session != "s1" {
			t.Errorf("%s written without the session", op.KV.Key)
		}
		got = append(got, string(op.KV.Verb)+" "+op.KV.Key)
	}
	// Changed shards, then the header, then the stale shards.
	exp := []string{"lock " + k(1), "lock " + testHead, "delete " + k(2), "delete " + k(3)}
	if !slices.Equal(got, exp) {
		t.Errorf("ops %q, want %q", got, exp)
	}
	if ops := recordOps(testHead, "s1", want, want); len(ops) != 0 {
		t.Errorf("nothing changed, yet %d ops", len(ops))
	}
}

func TestTxnBatches(t *testing.T) {
	op := func(i, size int) *api.TxnOp {
		return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: shardKey(testHead, i), Value: make([]byte, size)}}
	}
	tests := []struct {
		name  string
		sizes []int
		want  []int // operations per transaction
	}{
		{"no ops, no transaction", nil, nil},
		{"small ops: 128 a transaction", slices.Repeat([]int{10}, 300), []int{128, 128, 44}},
		{"large ops: as many as fit the request", slices.Repeat([]int{128 << 10}, 5), []int{2, 2, 1}},
		{"a mix", []int{300 << 10, 10, 10, 200 << 10, 100 << 10}, []int{3, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ops api.TxnOps
			for i, s := range tt.sizes {
				ops = append(ops, op(i, s))
			}
			var got []int
			var all api.TxnOps
			for _, b := range txnBatches(ops) {
				got = append(got, len(b))
				all = append(all, b...)
				// The request as the client sends it stays within
				// Consul's default limit.
				body, err := json.Marshal(b)
				if err != nil {
					t.Fatal(err)
				}
				if len(body) > 512<<10 || len(b) > 128 {
					t.Errorf("a transaction of %d ops and %d bytes", len(b), len(body))
				}
			}
			if !slices.Equal(got, tt.want) || !slices.Equal(all, ops) {
				t.Errorf("batches of %v ops, want %v, in order", got, tt.want)
			}
		})
	}
	// The limit on one value is what one transaction carries.
	big := op(0, maxValue(shardKey(testHead, 0)))
	body, _ := json.Marshal(api.TxnOps{big})
	if len(body) > 512<<10 {
		t.Errorf("a value of maxValue makes a %d-byte transaction", len(body))
	}
	if n := base64.StdEncoding.EncodedLen(maxValue("k")); n > 512<<10 {
		t.Errorf("maxValue is %d bytes in base64", n)
	}
}

func TestAssembleBoxes(t *testing.T) {
	const p = "l4lb/fleet/"
	enc := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	svc := func(fe, fp string) fleet.Service {
		return fleet.Service{Name: "web-" + fe, Frontend: fe, Fingerprint: fp}
	}
	pair := func(key, session string, v any) *api.KVPair {
		return &api.KVPair{Key: p + key, Value: enc(v), Session: session, ModifyIndex: 7}
	}
	tests := []struct {
		name  string
		pairs api.KVPairs
		want  map[string][]string // box: frontends
	}{
		{
			name:  "a record of the previous version: services inline, no shards",
			pairs: api.KVPairs{pair("lb1", "s1", map[string]any{"name": "lb1", "seed_fingerprint": "x", "services": []fleet.Service{svc("a", "1"), svc("b", "1")}})},
			want:  map[string][]string{"lb1": {"a", "b"}},
		},
		{
			name: "a sharded record",
			pairs: api.KVPairs{
				pair("lb1", "s1", fleet.Box{Name: "lb1", Shards: 2}),
				pair("lb1/services/0", "s1", []fleet.Service{svc("a", "1")}),
				pair("lb1/services/1", "s1", []fleet.Service{svc("b", "1"), svc("c", "1")}),
				pair("lb2", "s2", fleet.Box{Name: "lb2", Services: []fleet.Service{svc("a", "1")}}),
			},
			want: map[string][]string{"lb1": {"a", "b", "c"}, "lb2": {"a"}},
		},
		{
			name: "a missing shard: the rest",
			pairs: api.KVPairs{
				pair("lb1", "s1", fleet.Box{Name: "lb1", Shards: 4}),
				pair("lb1/services/0", "s1", []fleet.Service{svc("a", "1")}),
				pair("lb1/services/3", "s1", []fleet.Service{svc("d", "1")}),
			},
			want: map[string][]string{"lb1": {"a", "d"}},
		},
		{
			name: "keys no session holds, shards of another session, shards past N, other keys: left out",
			pairs: api.KVPairs{
				pair("lb0", "", fleet.Box{Name: "lb0"}),
				pair("lb1", "s1", fleet.Box{Name: "lb1", Shards: 2}),
				pair("lb1/services/0", "s1", []fleet.Service{svc("a", "1")}),
				pair("lb1/services/1", "old", []fleet.Service{svc("b", "1")}),
				pair("lb1/services/2", "s1", []fleet.Service{svc("c", "1")}),
				pair("lb1/services/01", "s1", []fleet.Service{svc("e", "1")}),
				pair("lb1/future/0", "s1", []fleet.Service{svc("f", "1")}),
				pair("lb2/services/0", "s2", []fleet.Service{svc("a", "1")}),
			},
			want: map[string][]string{"lb1": {"a"}},
		},
		{
			name: "records that are not boxes: left out",
			pairs: api.KVPairs{
				{Key: p + "lb1", Value: []byte("{"), Session: "s1"},
				pair("lb2", "s2", map[string]any{"name": ""}),
				pair("lb3", "s3", fleet.Box{Name: "lb3", Shards: maxShards + 1}),
				pair("lb4", "s4", fleet.Box{Name: "lb4", Shards: 1}),
				{Key: p + "lb4/services/0", Value: []byte("{}"), Session: "s4"},
			},
			want: map[string][]string{"lb4": nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			boxes, _ := assembleBoxes(p, tt.pairs, nil, quiet)
			got := map[string][]string{}
			for _, b := range boxes {
				var fes []string
				for _, s := range b.Services {
					fes = append(fes, s.Frontend)
				}
				slices.Sort(fes)
				got[b.Name] = fes
			}
			if !maps.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("boxes %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("shards are decoded again only when they change", func(t *testing.T) {
		pairs := api.KVPairs{
			pair("lb1", "s1", fleet.Box{Name: "lb1", Shards: 2}),
			pair("lb1/services/0", "s1", []fleet.Service{svc("a", "1")}),
			pair("lb1/services/1", "s1", []fleet.Service{svc("b", "1")}),
		}
		_, cache := assembleBoxes(p, pairs, nil, quiet)
		if len(cache) != 2 {
			t.Fatalf("cache of %d shards, want 2", len(cache))
		}
		// Marked: a shard read from the cache shows the mark.
		for k, d := range cache {
			d.services = []fleet.Service{svc(d.services[0].Frontend, "cached")}
			cache[k] = d
		}
		pairs[2] = pair("lb1/services/1", "s1", []fleet.Service{svc("b", "2")})
		pairs[2].ModifyIndex = 8
		boxes, next := assembleBoxes(p, pairs, cache, quiet)
		fps := map[string]string{}
		for _, s := range boxes[0].Services {
			fps[s.Frontend] = s.Fingerprint
		}
		if want := map[string]string{"a": "cached", "b": "2"}; !maps.Equal(fps, want) {
			t.Errorf("fingerprints %v, want %v", fps, want)
		}
		pairs = pairs[:2]
		pairs[0] = pair("lb1", "s1", fleet.Box{Name: "lb1", Shards: 1})
		if _, next = assembleBoxes(p, pairs, next, quiet); len(next) != 1 {
			t.Errorf("the cache keeps %d shards, want only the one read", len(next))
		}
	})
}
