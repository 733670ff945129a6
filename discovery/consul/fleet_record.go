// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/lb/fleet"
)

// A box's record in KV (docs/scale-out.md, "The fleet check"):
//
//	<prefix><name>                the header: the fleet.Box, with "shards": N
//	                              when its services are in shards (then
//	                              "services" is null), without when they are
//	                              inline (a small record, or one written by
//	                              l4lbd before shards)
//	<prefix><name>/services/<i>   shard i, 0 <= i < N: a JSON array of
//	                              fleet.Service
//
// One value cannot hold the record of a large box (about 100 bytes a
// service against kv_max_value_size, 512 KiB by default), and a record
// written whole costs every change O(services) bytes. A service's shard is
// a hash of its frontend, so a change to one service rewrites one shard and
// the header. Readers take the shards the header names, so the hash is the
// writer's alone and may change between versions.

const (
	// shardTarget bounds a shard. N doubles when a shard outgrows it, and
	// halves only when every shard of N/2 would stay under half of it, so
	// that a record hovering at one size does not flip N (each flip
	// rewrites every shard).
	shardTarget = 128 << 10
	// maxShards bounds N: 512 MiB of record at shardTarget, some 5 million
	// services.
	maxShards = 4096

	// Consul's limits on one transaction: txnMaxOps is fixed in the agent,
	// txnMaxBody is the default of txn_max_req_len, less a margin for the
	// estimate. txnOpOverhead is an operation's JSON beyond its key and
	// base64 value, rounded up.
	txnMaxOps     = 128
	txnMaxBody    = 512<<10 - 8<<10
	txnOpOverhead = 256
)

// shardKey is the key of shard i of the record whose header is at head.
func shardKey(head string, i int) string { return head + "/services/" + strconv.Itoa(i) }

// frontendHash places a service in a shard: FNV-1a 64 of its frontend,
// whose low bits pick one of a power of two of shards.
func frontendHash(frontend string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(frontend); i++ {
		h ^= uint64(frontend[i])
		h *= 1099511628211
	}
	return h
}

// largestShard is the size of the largest of n shards holding services of
// these encoded sizes, placed by hash.
func largestShard(hashes []uint64, sizes []int, n int) int {
	total := make([]int, n)
	for i, h := range hashes {
		total[h&uint64(n-1)] += sizes[i] + 1 // and a comma or bracket
	}
	return slices.Max(total) + 1
}

// shardCount is the number of shards for services of these hashes and
// encoded sizes, given the number cur the record has now: the same as cur
// unless a shard would outgrow shardTarget (then doubled, as often as it
// takes) or the record fits in half as many at half the target (halved).
func shardCount(hashes []uint64, sizes []int, cur int) int {
	n := cur
	if n < 1 || n > maxShards || n&(n-1) != 0 {
		n = 1
	}
	for n < maxShards && largestShard(hashes, sizes, n) > shardTarget {
		n *= 2
	}
	for n > 1 && largestShard(hashes, sizes, n/2) <= shardTarget/2 {
		n /= 2
	}
	return n
}

// maxValue is the largest value write can carry at key: Consul's
// kv_max_value_size, or what a transaction of that one operation carries
// once base64 inflates it, whichever is less (by default the second).
func maxValue(key string) int {
	return min(consulKVMaxValue, (txnMaxBody-txnOpOverhead-len(key))/4*3)
}

// encodeRecord lays b out in KV values under head (<prefix><name>), its
// services in shards when they outgrow one value; cur is the number of
// shards of the record it replaces (0 or 1: inline). It returns the values
// by key and the number of shards (1: inline).
func encodeRecord(head string, b *fleet.Box, cur int) (map[string][]byte, int, error) {
	encs := make([][]byte, len(b.Services))
	hashes := make([]uint64, len(b.Services))
	sizes := make([]int, len(b.Services))
	for i, s := range b.Services {
		e, err := json.Marshal(s)
		if err != nil {
			return nil, 0, fmt.Errorf("fleet: encode service %s of this box's record: %w", s.Name, err)
		}
		encs[i], hashes[i], sizes[i] = e, frontendHash(s.Frontend), len(e)
	}
	n := shardCount(hashes, sizes, cur)
	out := map[string][]byte{}
	hdr := *b
	hdr.Shards = 0
	if n > 1 {
		hdr.Services, hdr.Shards = nil, n
		shards := make([]*bytes.Buffer, n)
		for i := range shards {
			shards[i] = bytes.NewBufferString("[")
		}
		for i, e := range encs {
			s := shards[hashes[i]&uint64(n-1)]
			if s.Len() > 1 {
				s.WriteByte(',')
			}
			s.Write(e)
		}
		for i, s := range shards {
			s.WriteByte(']')
			key := shardKey(head, i)
			if err := fits(key, s.Len(), len(b.Services), n); err != nil {
				return nil, 0, err
			}
			out[key] = s.Bytes()
		}
	}
	data, err := json.Marshal(hdr)
	if err != nil {
		return nil, 0, fmt.Errorf("fleet: encode this box's record: %w", err)
	}
	if err := fits(head, len(data), len(b.Services), n); err != nil {
		return nil, 0, err
	}
	out[head] = data
	return out, n, nil
}

// fits refuses a value too large to write. Sharding keeps values far
// below the limit; only a record past maxShards shards comes near.
func fits(key string, size, services, shards int) error {
	if limit := maxValue(key); size > limit {
		return fmt.Errorf("fleet: %s would be %d KiB, over the %d KiB one Consul write carries (kv_max_value_size and txn_max_req_len, 512 KiB unless raised; a transaction carries values in base64): this box's %d services do not fit %d shards; set fleet.publish = false and compare boxes with `l4lbctl fleet compare`",
			key, size>>10, limit>>10, services, shards)
	}
	return nil
}

// recordOps are the operations that turn have (what the session holds) into
// want: the values that differ, taken under session, shards before the
// header so that a header never names shards not yet written, and then
// deletes of keys want lacks (shards past a shrunk N).
func recordOps(head, session string, want, have map[string][]byte) api.TxnOps {
	var ops api.TxnOps
	for _, key := range slices.Sorted(maps.Keys(want)) {
		if key == head {
			continue
		}
		if v, ok := have[key]; !ok || !bytes.Equal(v, want[key]) {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Value: want[key], Session: session}})
		}
	}
	if v, ok := have[head]; want[head] != nil && (!ok || !bytes.Equal(v, want[head])) {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: head, Value: want[head], Session: session}})
	}
	for _, key := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want[key]; !ok {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: key}})
		}
	}
	return ops
}

// txnBatches splits ops, in order, into transactions within Consul's
// limits on operations and request size.
func txnBatches(ops api.TxnOps) []api.TxnOps {
	var out []api.TxnOps
	var cur api.TxnOps
	size := 0
	for _, op := range ops {
		n := txnOpOverhead + len(op.KV.Key) + base64.StdEncoding.EncodedLen(len(op.KV.Value))
		if len(cur) > 0 && (len(cur) == txnMaxOps || size+n > txnMaxBody) {
			out, cur, size = append(out, cur), nil, 0
		}
		cur, size = append(cur, op), size+n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// decodedShard is a shard as last decoded, by its modify index.
type decodedShard struct {
	index    uint64
	services []fleet.Service
}

// assembleBoxes makes each box's record from one answer of the watch (the
// pairs under prefix): its header's fields and inline services, and the
// services of each shard the header names. Keys count only while a session
// holds them, shards only when it is the header's session (a restarted
// box's previous session may still hold old ones). A missing shard leaves
// its services out: Consul has not applied that write yet, and the next
// answer brings it. cache holds the shards decoded last time, so that only
// changed shards are decoded again; the cache for the next answer is
// returned.
func assembleBoxes(prefix string, pairs api.KVPairs, cache map[string]decodedShard, log *slog.Logger) ([]fleet.Box, map[string]decodedShard) {
	var heads []*api.KVPair
	shards := map[string]map[int]*api.KVPair{}
	for _, p := range pairs {
		if p.Session == "" {
			continue
		}
		name, sub, ok := strings.Cut(strings.TrimPrefix(p.Key, prefix), "/")
		if !ok {
			heads = append(heads, p)
			continue
		}
		// Other keys below a box are a later version's: not ours to read.
		num, ok := strings.CutPrefix(sub, "services/")
		i, err := strconv.Atoi(num)
		if !ok || err != nil || i < 0 || num != strconv.Itoa(i) {
			continue
		}
		if shards[name] == nil {
			shards[name] = map[int]*api.KVPair{}
		}
		shards[name][i] = p
	}
	next := map[string]decodedShard{}
	var boxes []fleet.Box
	for _, p := range heads {
		var b fleet.Box
		if err := json.Unmarshal(p.Value, &b); err != nil || b.Name == "" {
			log.Warn("fleet check: ignoring a record that is not a fleet box", "key", p.Key, "error", err)
			continue
		}
		if b.Shards < 0 || b.Shards > maxShards {
			log.Warn("fleet check: ignoring a record with an impossible number of shards", "key", p.Key, "shards", b.Shards)
			continue
		}
		name := strings.TrimPrefix(p.Key, prefix)
		var parts [][]fleet.Service
		total := len(b.Services)
		for i := range b.Shards {
			sp := shards[name][i]
			if sp == nil || sp.Session != p.Session {
				log.Debug("fleet check: a shard of a box's record is not in Consul's answer yet; the next answer brings it", "key", shardKey(p.Key, i))
				continue
			}
			d, ok := cache[sp.Key]
			if !ok || d.index != sp.ModifyIndex {
				var svcs []fleet.Service
				if err := json.Unmarshal(sp.Value, &svcs); err != nil {
					log.Warn("fleet check: ignoring a shard that is not a list of services", "key", sp.Key, "error", err)
					continue
				}
				d = decodedShard{index: sp.ModifyIndex, services: svcs}
			}
			next[sp.Key] = d
			parts = append(parts, d.services)
			total += len(d.services)
		}
		if len(parts) > 0 {
			b.Services = slices.Grow(b.Services, total-len(b.Services))
			for _, s := range parts {
				b.Services = append(b.Services, s...)
			}
		}
		boxes = append(boxes, b)
	}
	return boxes, next
}
