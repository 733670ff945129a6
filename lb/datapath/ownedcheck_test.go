// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"encoding/hex"
	"maps"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
)

// dumpMap reads every entry of m as hex key -> hex value.
func dumpMap(t *testing.T, m *ebpf.Map) map[string]string {
	t.Helper()
	out := map[string]string{}
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[hex.EncodeToString(k)] = hex.EncodeToString(v)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read map %s: %v", m, err)
	}
	return out
}

// TestSelfCheckRepairsOwnedMaps changes, behind l4lbd's back, each map the
// datapath fills from its own records (svc_gen, nexthops, backend_routes,
// local_addrs, ingress_macs, tx_ports), and checks that one self-check
// pass names the map, writes it back to what it held before the change,
// and that the pass after finds nothing. A changed ingress MAC is also
// seen by packets: the box's frames are not forwarded until the repair.
func TestSelfCheckRepairsOwnedMaps(t *testing.T) {
	dir := pinDir(t, "ownedcheck")
	e := newEnvWith(t, envOptions{pinPath: dir})
	svc := withDefaults(dsrService("a", vip4, 80, lb.TCP, backends4[:2]...))
	e.reconcile(t, svc)
	if err := e.ns.Do(func() error { return e.lb.AttachXDP("lb0", datapath.XDPGeneric) }); err != nil {
		t.Fatal(err)
	}
	id := uint32(e.state(t, svc.Frontend).ID)
	pinned := e.lb.Maps()
	if drifts, err := e.rec.NewCheck(e.lb).Run(); err != nil || len(drifts) > 0 {
		t.Fatalf("first pass: %v, %v; want nothing to repair", drifts, err)
	}
	var route bpf.LbBackendRoute
	if err := pinned[bpf.LbMapBackendRoutes].Lookup(uint32(1), &route); err != nil || route.Count == 0 {
		t.Fatalf("backend 1's route: %+v, %v; want a next hop (static neighbours)", route, err)
	}
	hopID := route.Ids[0]

	for _, tc := range []struct {
		name   string
		m      string
		change func(t *testing.T, m *ebpf.Map)
		// packets: the change stops the service's flows until repaired.
		packets bool
	}{
		{"svc_gen word changed", bpf.LbMapSvcGen, func(t *testing.T, m *ebpf.Map) {
			var w uint32
			if err := m.Lookup(id, &w); err != nil {
				t.Fatal(err)
			}
			if err := m.Update(id, w+1<<8, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"next hop MAC changed", bpf.LbMapNexthops, func(t *testing.T, m *ebpf.Map) {
			var h bpf.LbNexthop
			if err := m.Lookup(hopID, &h); err != nil {
				t.Fatal(err)
			}
			h.Dmac[5]++
			if err := m.Update(hopID, &h, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"backend route cleared", bpf.LbMapBackendRoutes, func(t *testing.T, m *ebpf.Map) {
			if err := m.Update(uint32(1), &bpf.LbBackendRoute{}, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"local address deleted and one added", bpf.LbMapLocalAddrs, func(t *testing.T, m *ebpf.Map) {
			k := bpf.LbLocalAddr{Addr: vip4.As16()}
			if err := m.Delete(&k); err != nil {
				t.Fatal(err)
			}
			k = bpf.LbLocalAddr{Addr: netip.MustParseAddr("203.0.113.1").As16()}
			if err := m.Update(&k, uint8(1), ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"ingress MAC changed and one added", bpf.LbMapIngressMacs, func(t *testing.T, m *ebpf.Map) {
			var v bpf.LbIngressMac
			idx := uint32(e.ifindex)
			if err := m.Lookup(idx, &v); err != nil {
				t.Fatal(err)
			}
			v.Mac[5]++
			if err := m.Update(idx, &v, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
			if err := m.Update(uint32(999), &v, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"tx port deleted and one added", bpf.LbMapTxPorts, func(t *testing.T, m *ebpf.Map) {
			if err := m.Delete(uint32(e.ifindex)); err != nil {
				t.Fatal(err)
			}
			// The loopback device, where no LB program runs.
			if err := m.Update(uint32(1), uint32(1), ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := pinned[tc.m]
			before := dumpMap(t, m)
			tc.change(t, m)
			if equalMaps(before, dumpMap(t, m)) {
				t.Fatal("the change changed nothing; the test does not test the repair")
			}
			if tc.packets {
				if n := e.misrouted(t, svc, 3000); n == 0 {
					t.Fatal("the change misroutes none of 32 flows; the test does not test the repair")
				}
			}
			drifts, err := e.rec.NewCheck(e.lb).Run()
			if err != nil {
				t.Fatalf("self-check: %v", err)
			}
			if len(drifts) == 0 {
				t.Fatalf("no drift found, want %s", tc.m)
			}
			for _, d := range drifts {
				t.Logf("drift: %v", d)
				if d.Map != tc.m || d.Err != nil {
					t.Errorf("drift %v: want map %s, repaired", d, tc.m)
				}
			}
			if after := dumpMap(t, m); !equalMaps(before, after) {
				t.Errorf("%s after the repair:\n%v\nwant as before the change:\n%v", tc.m, after, before)
			}
			if tc.packets {
				if n := e.misrouted(t, svc, 3100); n != 0 {
					t.Errorf("%d of 32 flows misrouted after the repair", n)
				}
			}
			if drifts, err := e.rec.NewCheck(e.lb).Run(); err != nil || len(drifts) > 0 {
				t.Errorf("second pass: %v, %v; want nothing to repair", drifts, err)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool { return maps.Equal(a, b) }
