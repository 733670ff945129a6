// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
)

// cachedServices returns the service ids the CPUs' service caches
// (bpf/include/svccache.h) hold a copy of fe's entry under.
func (e *env) cachedServices(t testing.TB, fe lb.Frontend) []uint32 {
	t.Helper()
	m := e.lb.Maps()[bpf.LbMapSvcCache]
	want := fe.Addr.As16()
	var ids []uint32
	for i := uint32(0); i < m.MaxEntries(); i++ {
		var per []bpf.LbSvcCacheEntry
		if err := m.Lookup(i, &per); err != nil {
			t.Fatalf("read service-cache slot %d: %v", i, err)
		}
		for _, s := range per {
			if s.Used == 1 && s.Addr == want && s.Port == htons(fe.Port) && s.Proto == uint8(fe.Proto) {
				ids = append(ids, s.Val.Id)
			}
		}
	}
	return ids
}

// TestServiceCacheFollowsChanges checks that every new flow meets its
// service as the control plane last wrote it, never as a CPU's service
// cache copied it before: a source range that shuts the client out, its
// removal, and another dispatch each apply from the next SYN on, on the
// CPU whose cache holds the old entry.
func TestServiceCacheFollowsChanges(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			// The caches are per CPU: every packet on the same one.
			onOneCPU(t)
			e := newEnv(t)
			svc := dsrService("web", fam.vip, 80, lb.TCP, fam.backends[:2]...)
			e.reconcile(t, svc)
			flows := randomFlows(svc.Frontend, 6, 3)
			syn := func(i int) ([]byte, result) {
				in := e.frame(t, packet(flows[i], true, false, nil))
				return in, e.run(t, in)
			}

			// The first SYN fills this CPU's slot, the second reads it.
			// (The thread that enters the namespace may run elsewhere
			// than onOneCPU's: a copy per CPU it ran on.)
			for i := range 2 {
				in, r := syn(i)
				e.checkTX(t, in, r)
			}
			id := uint32(e.state(t, svc.Frontend).ID)
			ids := e.cachedServices(t, svc.Frontend)
			if len(ids) == 0 {
				t.Fatalf("after two SYNs no service cache holds %s", svc.Frontend)
			}
			for _, got := range ids {
				if got != id {
					t.Fatalf("after two SYNs the service caches hold service ids %v for %s, want only id %d", ids, svc.Frontend, id)
				}
			}

			// A source range without the client: refused from now on.
			other := netip.MustParsePrefix("198.51.100.0/24")
			if fam.vip.Is6() {
				other = netip.MustParsePrefix("2001:db8:ffff::/48")
			}
			svc.SourceRanges = []netip.Prefix{other}
			e.reconcile(t, svc)
			before := e.reasons(t)
			if _, r := syn(2); r.verdict != xdpDrop {
				t.Fatalf("a SYN after the source range shut its client out: verdict %s, want XDP_DROP", verdictName(r.verdict))
			}
			e.expectReasons(t, before, map[string]uint64{"drop_source_range": 1})

			// No range again: let in.
			svc.SourceRanges = nil
			e.reconcile(t, svc)
			in, r := syn(3)
			e.checkTX(t, in, r)

			// Geneve instead of IPIP.
			svc.Dispatch = lb.DispatchGeneve
			e.reconcile(t, svc)
			_, r = syn(4)
			if r.verdict != xdpTX {
				t.Fatalf("a SYN after the switch to Geneve: verdict %s, want XDP_TX", verdictName(r.verdict))
			}
			if d := pkttest.Decode(r.out); d.UDP == nil || d.UDP.DstPort != 6081 {
				t.Fatalf("a SYN after the switch to Geneve did not leave over Geneve (UDP 6081):\n%s", d.Dump())
			}
		})
	}
}
