// SPDX-License-Identifier: Apache-2.0

package discovery_test

import (
	"testing"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// BenchmarkUpdateOneChange is the merger's share of a source's snapshot
// that changes one backend of one service, at 1,000 to 100,000 services of
// 10 backends: what every Consul, Kubernetes or file change pays before
// the pass; compared (every service looked at) and hinted (the snapshot
// names the changed service, as the Consul and Kubernetes sources do).
func BenchmarkUpdateOneChange(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
		hint bool
	}{{"compared/1000", 1000, false}, {"compared/10000", 10000, false}, {"compared/100000", 100000, false},
		{"hinted/1000", 1000, true}, {"hinted/10000", 10000, true}, {"hinted/100000", 100000, true}} {
		n := c.n
		b.Run(c.name, func(b *testing.B) {
			svcs := reconcilertest.Many(n, 10)
			m := discovery.NewMerger()
			m.Update(discovery.Snapshot{Source: "bench", Services: svcs})
			m.Desired()
			m.Changes()
			b.ResetTimer()
			for i := range b.N {
				k := (i * 7919) % n
				s := svcs[k].Clone()
				s.Backends[3].Weight = uint32(2 + i%2)
				svcs[k] = s
				snap := discovery.Snapshot{Source: "bench", Services: svcs}
				if c.hint {
					snap.Changed = []string{s.Name}
				}
				m.Update(snap)
				if names, all := m.Changes(); all || len(names) != 1 {
					b.Fatalf("changes %v, all %v", names, all)
				}
			}
		})
	}
}
