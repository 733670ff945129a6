// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb/maglev"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// recorder passes every call to the LB and records its name.
type recorder struct {
	*datapath.LB
	ops []string
}

func (r *recorder) SetBackend(id reconciler.BackendID, b reconciler.Backend) error {
	r.ops = append(r.ops, fmt.Sprintf("SetBackend %d %s", id, b.Addr))
	return r.LB.SetBackend(id, b)
}

func (r *recorder) DeleteBackend(id reconciler.BackendID) error {
	r.ops = append(r.ops, fmt.Sprintf("DeleteBackend %d", id))
	return r.LB.DeleteBackend(id)
}

func (r *recorder) SetTable(svc reconciler.ServiceID, t []reconciler.BackendID) error {
	r.ops = append(r.ops, fmt.Sprintf("SetTable %d", svc))
	return r.LB.SetTable(svc, t)
}

func (r *recorder) DeleteTable(svc reconciler.ServiceID) error {
	r.ops = append(r.ops, fmt.Sprintf("DeleteTable %d", svc))
	return r.LB.DeleteTable(svc)
}

func (r *recorder) SetTables(svcs []reconciler.ServiceID, t [][]reconciler.BackendID) []error {
	r.ops = append(r.ops, fmt.Sprintf("SetTables %v", svcs))
	return r.LB.SetTables(svcs, t)
}

func (r *recorder) DeleteTables(svcs []reconciler.ServiceID) []error {
	r.ops = append(r.ops, fmt.Sprintf("DeleteTables %v", svcs))
	return r.LB.DeleteTables(svcs)
}

func (r *recorder) SetService(id reconciler.ServiceID, svc lb.Service) error {
	r.ops = append(r.ops, fmt.Sprintf("SetService %d %s", id, svc.Frontend))
	return r.LB.SetService(id, svc)
}

func (r *recorder) DeleteService(id reconciler.ServiceID, fe lb.Frontend) error {
	r.ops = append(r.ops, fmt.Sprintf("DeleteService %d %s", id, fe))
	return r.LB.DeleteService(id, fe)
}

// TestRestartAffinityAndSourceRanges programs services with affinity and
// source ranges into pinned maps, loads a second datapath from the pins as
// a restarted l4lbd does, and adopts its State: reconciling the same
// services issues no operation at all. A later change of an allow-list
// then replaces exactly the adopted prefixes.
func TestRestartAffinityAndSourceRanges(t *testing.T) {
	testnet.RequireRoot(t)
	dir := pinDir(t, "restart")
	cfg := datapath.Config{
		PinPath: dir, Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: 1024,
		SNATAddresses: []netip.Addr{lbAddr4, lbAddr6},
		Log:           slog.New(slog.DiscardHandler),
	}
	rcfg := reconciler.Config{Seed: testSeed, MaxServices: 16, MaxBackends: 64}

	web := dsrService("web", vip4, 80, lb.TCP, backends4[:3]...)
	web.Affinity = lb.Affinity{ClientIP: true, Timeout: 90*time.Minute + 1500*time.Millisecond}
	// Unsorted, unmasked spellings: the entry's canonical form must come back.
	web.SourceRanges = prefixes("203.0.113.0/24", "192.0.2.77/32", "198.51.100.9/16")
	dns := dsrService("dns", vip6, 53, lb.UDP, backends6[:2]...)
	dns.SourceRanges = prefixes("2001:db8:2::/48", "2001:db8:1::/48", "::/0")
	dns.Affinity = lb.Affinity{ClientIP: true, Timeout: time.Second}
	snat := snatService("snat", vip4, 8080, lb.UDP, backends4[3])
	snat.Affinity = lb.Affinity{Timeout: time.Minute} // off, but a timeout all the same
	plain := dsrService("plain", vip6, 80, lb.TCP, backends6[2:]...)
	desired := []lb.Service{withDefaults(web), withDefaults(dns), withDefaults(snat), withDefaults(plain)}

	d1, err := datapath.Load(cfg)
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	r1 := reconciler.New(rcfg, d1, nil)
	if err := r1.Reconcile(desired); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	programmed := r1.Programmed()
	d1.Close()

	// The restart.
	d2, err := datapath.Load(cfg)
	if err != nil {
		t.Fatalf("load datapath from the pins: %v", err)
	}
	defer d2.Close()
	st, err := d2.State()
	if err != nil {
		t.Fatalf("read state: %v", err)
	}
	names := map[lb.Frontend]string{}
	for _, s := range desired {
		names[s.Frontend] = s.Name
	}
	for i := range st.Services {
		st.Services[i].Service.Name = names[st.Services[i].Service.Frontend]
	}
	sortState := func(s reconciler.State) reconciler.State {
		sort.Slice(s.Services, func(i, j int) bool { return s.Services[i].ID < s.Services[j].ID })
		return s
	}
	if diff := cmp.Diff(sortState(programmed), sortState(st), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("State after the restart differs from what was programmed (-programmed +read back):\n%s", diff)
	}

	rec := &recorder{LB: d2}
	r2, err := reconciler.NewFromState(rcfg, rec, nil, st)
	if err != nil {
		t.Fatalf("NewFromState: %v", err)
	}
	if err := r2.Reconcile(desired); err != nil {
		t.Fatalf("reconcile after the restart: %v", err)
	}
	if len(rec.ops) != 0 {
		t.Errorf("reconciling the same services after a restart issued %d operations, want none: %v", len(rec.ops), rec.ops)
	}

	// The adopted prefixes are known to the restarted datapath: changing
	// the list replaces them, leaving none behind.
	web2 := web.Clone()
	web2.SourceRanges = prefixes("10.0.0.0/8")
	desired[0] = withDefaults(web2)
	if err := r2.Reconcile(desired); err != nil {
		t.Fatalf("reconcile a changed allow-list: %v", err)
	}
	if len(rec.ops) != 1 {
		t.Errorf("changing one allow-list issued %v, want one SetService", rec.ops)
	}
	st, err = d2.State()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Services {
		if s.Service.Frontend == web.Frontend && !cmp.Equal(s.Service.SourceRanges, prefixes("10.0.0.0/8"), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })) {
			t.Errorf("after the change %s holds %v, want only 10.0.0.0/8", web.Frontend, s.Service.SourceRanges)
		}
	}
}

// TestMigrateOldLayouts upgrades from a datapath that pinned its connection
// and SNAT tables as per-CPU LRU maps under their old names: the new one
// pins shared LRUs under new names, moves every entry into them when it
// loads, moves what the old program added later on Retire, and then unpins
// the old maps.
func TestMigrateOldLayouts(t *testing.T) {
	testnet.RequireRoot(t)
	dir := pinDir(t, "migrate")

	// What an l4lbd of the previous layout left pinned.
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]*ebpf.MapSpec{
		"conntrack": {Type: ebpf.LRUHash, KeySize: uint32(binary.Size(bpf.LbFlowKey{})), ValueSize: uint32(binary.Size(bpf.LbCtValue{}))},
		"snat_fwd":  {Type: ebpf.LRUHash, KeySize: uint32(binary.Size(bpf.LbFlowKey{})), ValueSize: uint32(binary.Size(bpf.LbSnatFwdValue{}))},
		"snat_rev":  {Type: ebpf.LRUHash, KeySize: uint32(binary.Size(bpf.LbSnatRevKey{})), ValueSize: uint32(binary.Size(bpf.LbSnatRevValue{}))},
	}
	// The reasons of that version: one value per CPU for 25 reasons.
	old["reasons"] = &ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: uint32(binary.Size(bpf.LbReasonStats{})), MaxEntries: 25}
	oldMaps := map[string]*ebpf.Map{}
	for name, spec := range old {
		spec.Name = name
		if spec.Type == ebpf.LRUHash {
			spec.MaxEntries, spec.Flags = uint32(1024*cpus), unix.BPF_F_NO_COMMON_LRU
		}
		spec.Pinning = ebpf.PinByName
		m, err := ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatalf("create the old %s: %v", name, err)
		}
		t.Cleanup(func() { m.Close() })
		oldMaps[name] = m
	}
	flowKey := func(port uint16) bpf.LbFlowKey {
		k := maglev.FlowKey(flowTo(lb.Frontend{Addr: vip4, Port: 80, Proto: lb.TCP}, client4, port))
		var fk bpf.LbFlowKey
		if err := binary.Read(bytes.NewReader(k[:]), binary.NativeEndian, &fk); err != nil {
			t.Fatal(err)
		}
		return fk
	}
	ct := bpf.LbCtValue{BackendId: 7, SvcId: 3, LastSeen: 12345, Hash: 0xabcdef}
	fwd := bpf.LbSnatFwdValue{BackendId: 7, SnatPort: htons(40000), LastSeen: 999}
	revKey := bpf.LbSnatRevKey{SnatPort: htons(40000), Proto: 6}
	rev := bpf.LbSnatRevValue{SvcId: 3, ClientPort: htons(1000), LastSeen: 999}
	for i := range uint16(100) {
		k := flowKey(1000 + i)
		if err := oldMaps["conntrack"].Put(&k, &ct); err != nil {
			t.Fatal(err)
		}
	}
	k0 := flowKey(1000)
	if err := oldMaps["snat_fwd"].Put(&k0, &fwd); err != nil {
		t.Fatal(err)
	}
	if err := oldMaps["snat_rev"].Put(&revKey, &rev); err != nil {
		t.Fatal(err)
	}
	notService := uint32(1) // L4LB_R_PASS_NOT_SERVICE, the same index in both versions
	perCPU := make([]bpf.LbReasonStats, cpus)
	perCPU[0] = bpf.LbReasonStats{Packets: 41, Bytes: 4100}
	if err := oldMaps["reasons"].Put(&notService, perCPU); err != nil {
		t.Fatal(err)
	}

	d, err := datapath.Load(datapath.Config{
		PinPath: dir, Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: 4096,
		SNATAddresses: []netip.Addr{lbAddr4, lbAddr6}, Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("load over the old layout: %v", err)
	}
	defer d.Close()
	maps := d.Maps()
	if n, err := d.ConntrackEntries(); err != nil || n != 100 {
		t.Errorf("connection table after the load: %d entries (%v), want the 100 moved", n, err)
	}
	var got bpf.LbCtValue
	if err := maps[bpf.LbMapConntrack].Lookup(&k0, &got); err != nil || got != ct {
		t.Errorf("moved connection entry %+v (%v), want %+v", got, err, ct)
	}
	var gf bpf.LbSnatFwdValue
	if err := maps[bpf.LbMapSnatFwd].Lookup(&k0, &gf); err != nil || gf != fwd {
		t.Errorf("moved SNAT forward entry %+v (%v), want %+v", gf, err, fwd)
	}
	var gr bpf.LbSnatRevValue
	if err := maps[bpf.LbMapSnatRev].Lookup(&revKey, &gr); err != nil || gr != rev {
		t.Errorf("moved SNAT reverse entry %+v (%v), want %+v", gr, err, rev)
	}
	if r, err := d.Reasons(); err != nil || r["pass_not_service"].Packets != 41 {
		t.Errorf("reason counters after the load: pass_not_service %+v (%v), want the old 41 packets", r["pass_not_service"], err)
	}
	for name, m := range maps {
		if name == bpf.LbMapConntrack || name == bpf.LbMapSnatFwd || name == bpf.LbMapSnatRev {
			if info, err := m.Info(); err != nil || info.Flags&unix.BPF_F_NO_COMMON_LRU != 0 {
				t.Errorf("%s: flags %#x (%v), want a shared LRU", name, info.Flags, err)
			}
		}
	}

	// The old program adds a flow, and its entry in the new table is
	// newer than the old map's copy: Retire moves the first and keeps
	// the second.
	late := flowKey(5000)
	if err := oldMaps["conntrack"].Put(&late, &ct); err != nil {
		t.Fatal(err)
	}
	newer := ct
	newer.BackendId = 8
	if err := maps[bpf.LbMapConntrack].Put(&k0, &newer); err != nil {
		t.Fatal(err)
	}
	if err := d.Retire(); err != nil {
		t.Fatalf("retire the old maps: %v", err)
	}
	if err := maps[bpf.LbMapConntrack].Lookup(&late, &got); err != nil {
		t.Errorf("the entry the old program added after the load was not moved: %v", err)
	}
	if err := maps[bpf.LbMapConntrack].Lookup(&k0, &got); err != nil || got.BackendId != 8 {
		t.Errorf("Retire overwrote a newer entry: %+v (%v)", got, err)
	}
	for name := range old {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("old map %s still pinned after Retire (%v)", name, err)
		}
	}

	// A restart now finds only the new layout.
	d.Close()
	d2, err := datapath.Load(datapath.Config{
		PinPath: dir, Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: 4096,
		SNATAddresses: []netip.Addr{lbAddr4, lbAddr6}, Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer d2.Close()
	if n, err := d2.ConntrackEntries(); err != nil || n != 101 {
		t.Errorf("connection table after the restart: %d entries (%v), want 101", n, err)
	}
}

// TestMigrateReasonsV2 loads the datapath over the reason counters of the
// version before the refusals of frames not for the box, martian and local
// sources and AH (30 reasons, pinned as reasons_v2): they are carried
// into reasons_v3, the old map unpinned once Retire runs.
func TestMigrateReasonsV2(t *testing.T) {
	testnet.RequireRoot(t)
	dir := pinDir(t, "migrate-reasons")
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "reasons_v2", Type: ebpf.PerCPUArray, KeySize: 4,
		ValueSize: uint32(binary.Size(bpf.LbReasonStats{})), MaxEntries: 30, Pinning: ebpf.PinByName},
		ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatalf("create the old reasons_v2: %v", err)
	}
	t.Cleanup(func() { old.Close() })
	icmpCsum := uint32(29) // L4LB_R_PASS_ICMP_CSUM, the last reason of that version
	perCPU := make([]bpf.LbReasonStats, cpus)
	perCPU[0] = bpf.LbReasonStats{Packets: 7, Bytes: 700}
	if err := old.Put(&icmpCsum, perCPU); err != nil {
		t.Fatal(err)
	}
	d, err := datapath.Load(datapath.Config{PinPath: dir, Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: 4096,
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("load over reasons_v2: %v", err)
	}
	defer d.Close()
	r, err := d.Reasons()
	if err != nil || r["pass_icmp_csum"].Packets != 7 || r["pass_not_for_host"].Packets != 0 {
		t.Errorf("reasons after the load: pass_icmp_csum %+v, pass_not_for_host %+v (%v), want the old 7 packets and 0",
			r["pass_icmp_csum"], r["pass_not_for_host"], err)
	}
	if err := d.Retire(); err != nil {
		t.Fatalf("retire the old maps: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "reasons_v2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reasons_v2 still pinned after Retire (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "reasons_v3")); err != nil {
		t.Errorf("reasons_v3 not pinned: %v", err)
	}
}
