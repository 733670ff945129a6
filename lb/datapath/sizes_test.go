// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// mapLayout is the key and value size a map must have.
type mapLayout struct{ key, value int }

func size(v any) int { return binary.Size(v) }

// The layout of every map of each object, from the generated Go types. A
// map added in C without a line here fails the test, so a new layout cannot
// slip past it.
var (
	lbLayouts = map[string]mapLayout{
		bpf.LbMapServices:        {size(bpf.LbSvcKey{}), size(bpf.LbSvcValue{})},
		bpf.LbMapBackends:        {size(uint32(0)), size(bpf.LbBackend{})},
		bpf.LbMapMaglev:          {size(uint32(0)), size(uint32(0))}, // value: an inner map
		bpf.LbMapConntrack:       {size(bpf.LbFlowKey{}), size(bpf.LbCtValue{})},
		bpf.LbMapFlowCounts:      {size(bpf.LbFlowKey{}), size(bpf.LbFlowCount{})},
		bpf.LbMapHandshakes:      {size(uint32(0)), size(bpf.LbHandshakeBucket{})},
		bpf.LbMapSvcStats:        {size(uint32(0)), size(bpf.LbLbStats{})},
		bpf.LbMapBackendStats:    {size(uint32(0)), size(bpf.LbLbStats{})},
		bpf.LbMapSvcReplyStats:   {size(uint32(0)), size(bpf.LbReplyStats{})},
		bpf.LbMapReasons:         {size(uint32(0)), size(bpf.LbReasonStats{})},
		bpf.LbMapTxPorts:         {size(uint32(0)), size(uint32(0))},
		bpf.LbMapSnatFwd:         {size(bpf.LbFlowKey{}), size(bpf.LbSnatFwdValue{})},
		bpf.LbMapSnatRev:         {size(bpf.LbSnatRevKey{}), size(bpf.LbSnatRevValue{})},
		bpf.LbMapSnatFwdOvf:      {size(bpf.LbFlowKey{}), size(bpf.LbSnatFwdValue{})},
		bpf.LbMapSnatRevOvf:      {size(bpf.LbSnatRevKey{}), size(bpf.LbSnatRevValue{})},
		bpf.LbMapSnatScratch:     {size(uint32(0)), size(bpf.LbSnatWork{})},
		bpf.LbMapValidateScratch: {size(uint32(0)), size(bpf.LbWalk{})},
		bpf.LbMapAffinity:        {size(bpf.LbAffinityKey{}), size(bpf.LbAffinityValue{})},
		bpf.LbMapSrcRanges:       {size(bpf.LbSrcRangeKey{}), size(uint8(0))},
		bpf.LbMapIcmpBuckets:     {size(uint32(0)), size(bpf.LbIcmpBucket{})},
		bpf.LbMapInsertBuckets:   {size(uint32(0)), size(bpf.LbIcmpBucket{})},
		bpf.LbMapReadmitBuckets:  {size(uint32(0)), size(bpf.LbIcmpBucket{})},
		bpf.LbMapClockCache:      {size(uint32(0)), size(bpf.LbClockCopy{})},
		bpf.LbMapSvcGen:          {size(uint32(0)), size(uint32(0))},
		bpf.LbMapVipFilter:       {size(uint32(0)), size(uint64(0))},
		bpf.LbMapEvents:          {size(uint32(0)), size(uint64(0))},
		bpf.LbMapBackendRoutes:   {size(uint32(0)), size(bpf.LbBackendRoute{})},
		bpf.LbMapNexthops:        {size(uint32(0)), size(bpf.LbNexthop{})},
		bpf.LbMapFlowCache:       {size(uint32(0)), size(bpf.LbFlowCacheEntry{})},
		bpf.LbMapFlowCacheGen:    {size(uint32(0)), size(uint32(0))},
		bpf.LbMapSvcCache:        {size(uint32(0)), size(bpf.LbSvcCacheEntry{})},
		bpf.LbMapSnatOvfSeen:     {size(uint32(0)), size(uint64(0))},
		bpf.LbMapBfdHold:         {size(bpf.LbBfdHoldKey{}), size(bpf.LbBfdHoldValue{})},
		bpf.LbMapCtFilter:        {size(uint32(0)), size(uint32(0))}, // value: an inner map of uint64 words
		bpf.LbMapMaglevSwapped:   {size(uint32(0)), size(uint64(0))},
		bpf.LbMapIngressMacs:     {size(uint32(0)), size(bpf.LbIngressMac{})},
		bpf.LbMapIngressCache:    {size(uint32(0)), size(bpf.LbIngressCopy{})},
		bpf.LbMapLocalAddrs:      {size(bpf.LbLocalAddr{}), size(uint8(0))},
		bpf.LbMapTraceCtl:        {size(uint32(0)), size(bpf.LbTraceFilter{})},
		bpf.LbMapTraceNotes:      {size(uint32(0)), size(bpf.LbTraceNote{})},
		bpf.LbMapTraceEvents:     {0, 0}, // a ring buffer
	}
	// One Maglev chunk: maglevChunk backend ids.
	maglevInnerLayout = mapLayout{size(uint32(0)), datapath.MaglevChunk * size(uint32(0))}

	backendLayouts = map[string]mapLayout{
		bpf.BackendMapVips:           {size([16]byte{}), size(uint8(0))},
		bpf.BackendMapBackendReasons: {size(uint32(0)), size(bpf.BackendReasonStats{})},
		bpf.BackendMapOptFlows:       {size(bpf.BackendOptFlowKey{}), size(bpf.BackendOptFlowValue{})},
	}
)

// checkLayouts compares the maps of an object with want, both ways.
func checkLayouts(t *testing.T, object string, got map[string]mapLayout, want map[string]mapLayout) {
	t.Helper()
	for name, g := range got {
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: map %s has no expected layout in this test; add it", object, name)
			continue
		}
		if g != w {
			t.Errorf("%s: map %s has key/value size %d/%d, the generated Go types %d/%d", object, name, g.key, g.value, w.key, w.value)
		}
	}
	for name := range want {
		if _, ok := got[name]; !ok {
			t.Errorf("%s: map %s is missing", object, name)
		}
	}
}

// isDataSection reports .rodata and friends: they hold the load-time
// variables, not a layout shared with Go.
func isDataSection(name string) bool { return strings.HasPrefix(name, ".") }

func specLayouts(spec *ebpf.CollectionSpec) map[string]mapLayout {
	out := map[string]mapLayout{}
	for name, m := range spec.Maps {
		if isDataSection(name) {
			continue
		}
		out[name] = mapLayout{int(m.KeySize), int(m.ValueSize)}
	}
	return out
}

func loadedLayouts(maps map[string]*ebpf.Map) map[string]mapLayout {
	out := map[string]mapLayout{}
	for name, m := range maps {
		if isDataSection(name) {
			continue
		}
		out[name] = mapLayout{int(m.KeySize()), int(m.ValueSize())}
	}
	return out
}

// TestMapLayoutsSpec checks the compiled objects (no kernel needed).
func TestMapLayoutsSpec(t *testing.T) {
	lbSpec, err := bpf.LoadLb()
	if err != nil {
		t.Fatal(err)
	}
	checkLayouts(t, "LB object", specLayouts(lbSpec), lbLayouts)
	inner := lbSpec.Maps[bpf.LbMapMaglev].InnerMap
	if inner == nil {
		t.Fatalf("map %s has no inner map", bpf.LbMapMaglev)
	}
	if got := (mapLayout{int(inner.KeySize), int(inner.ValueSize)}); got != maglevInnerLayout {
		t.Errorf("Maglev inner map has key/value size %d/%d, want %d/%d (MAGLEV_CHUNK ids)", got.key, got.value, maglevInnerLayout.key, maglevInnerLayout.value)
	}

	beSpec, err := bpf.LoadBackend()
	if err != nil {
		t.Fatal(err)
	}
	checkLayouts(t, "backend object", specLayouts(beSpec), backendLayouts)

	// The flow key is the flow hash's input: lb/maglev must hash exactly
	// its bytes.
	if got, want := size(bpf.LbFlowKey{}), len(maglev.FlowKey(maglev.Flow{})); got != want {
		t.Errorf("struct flow_key is %d bytes, lb/maglev hashes %d", got, want)
	}
	if got, want := int(lbSpec.Maps[bpf.LbMapReasons].MaxEntries), int(bpf.LbL4lbReasonL4LB_R_MAX); got != want {
		t.Errorf("reasons map has %d entries, enum l4lb_reason %d", got, want)
	}
}

// TestMapLayoutsLoaded checks the maps the kernel created through the
// binding, including a Maglev table made by SetTable.
func TestMapLayoutsLoaded(t *testing.T) {
	e := newEnv(t)
	svc := dsrService("web", vip4, 80, lb.TCP, backends4[:2]...)
	e.reconcile(t, svc)
	checkLayouts(t, "loaded LB", loadedLayouts(e.lb.Maps()), lbLayouts)

	outer := e.lb.Maps()[bpf.LbMapMaglev]
	key := uint32(e.state(t, svc.Frontend).ID)
	var id ebpf.MapID
	if err := outer.Lookup(&key, &id); err != nil {
		t.Fatalf("look up the Maglev table of service id %d: %v", key, err)
	}
	inner, err := ebpf.NewMapFromID(id)
	if err != nil {
		t.Fatalf("open Maglev table (map id %d): %v", id, err)
	}
	defer inner.Close()
	if got := (mapLayout{int(inner.KeySize()), int(inner.ValueSize())}); got != maglevInnerLayout {
		t.Errorf("Maglev table has key/value size %d/%d, want %d/%d", got.key, got.value, maglevInnerLayout.key, maglevInnerLayout.value)
	}
	wantChunks := (testTableSize + 1 + datapath.MaglevChunk - 1) / datapath.MaglevChunk
	if got := int(inner.MaxEntries()); got != wantChunks {
		t.Errorf("Maglev table has %d chunks, want %d for %d slots and the size word", got, wantChunks, testTableSize)
	}

	if got, want := len(e.lb.ReasonNames()), int(bpf.LbL4lbReasonL4LB_R_MAX); got != want {
		t.Errorf("%d reason names, enum l4lb_reason has %d values", got, want)
	}
	names := e.lb.ReasonNames()
	if slices.Contains(names, "") {
		t.Errorf("a reason has no name: %q", names)
	}

	c, err := datapath.LoadCompanion(datapath.CompanionConfig{MaxFlows: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Maps()[bpf.BackendMapOptFlows].MaxEntries(); got != 4096 {
		t.Errorf("companion opt flow table holds %d entries, want the configured 4096", got)
	}
	checkLayouts(t, "loaded companion", loadedLayouts(c.Maps()), backendLayouts)
	counters, err := c.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(counters), int(bpf.BackendL4lbBackendReasonL4LB_B_MAX); got != want {
		t.Errorf("companion has %d counters, enum l4lb_backend_reason %d", got, want)
	}
}
