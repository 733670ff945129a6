// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/datapath"
)

// BenchmarkConntrackFilterRebuild times a rebuild of the connection
// table's filter over a full table of a million entries: reading the
// table in batches, hashing every key, and the map-in-map updates.
func BenchmarkConntrackFilterRebuild(b *testing.B) {
	testnet.RequireRoot(b)
	const n = 1 << 20
	d, err := datapath.Load(datapath.Config{Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: n})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ct := d.Maps()[bpf.LbMapConntrack]
	const batch = 4096
	keys := make([]bpf.LbFlowKey, batch)
	vals := make([]bpf.LbCtValue, batch)
	for i := 0; i < n; i += batch {
		for j := range keys {
			binary.LittleEndian.PutUint32(keys[j].Src[12:], uint32(i+j))
			keys[j].Proto = 6
			vals[j] = bpf.LbCtValue{BackendId: 1, SvcId: 1}
		}
		if _, err := ct.BatchUpdate(keys, vals, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := d.RebuildConntrackFilter(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(b.N), "ms/rebuild")
	b.ReportMetric(d.ConntrackFilterFill(), "fill")
}
