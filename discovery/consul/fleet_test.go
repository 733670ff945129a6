// SPDX-License-Identifier: Apache-2.0

package consul_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/fleet"
)

type fleetBox struct {
	f    *consul.Fleet
	stop context.CancelFunc
	done chan struct{}
}

func runFleet(t *testing.T, addr, name string) *fleetBox {
	t.Helper()
	f, err := consul.NewFleet(consulConfig(addr), &config.Fleet{Name: name, KVPrefix: "l4lb/fleet/", SessionTTL: 10 * time.Second},
		consul.FleetOptions{Log: testLog(t), Wait: 5 * time.Minute, RetryMin: 50 * time.Millisecond, RetryMax: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &fleetBox{f: f, stop: cancel, done: make(chan struct{})}
	go func() { f.Run(ctx); close(b.done) }()
	t.Cleanup(b.Stop)
	return b
}

func (b *fleetBox) Stop() {
	b.stop()
	<-b.done
}

// waitBoxes waits until f sees exactly the named boxes, ok with them.
func waitBoxes(t *testing.T, f *consul.Fleet, ok func([]fleet.Box) bool, names ...string) []fleet.Box {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		boxes, st := f.Boxes()
		var got []string
		for _, b := range boxes {
			got = append(got, b.Name)
		}
		slices.Sort(got)
		if slices.Equal(got, names) && (ok == nil || ok(boxes)) {
			return boxes
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s sees boxes %v (%+v), want %v", f.Name(), got, st, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rec(fp string) fleet.Box {
	return fleet.Box{SeedFingerprint: "s1", Services: []fleet.Service{{Name: "web", Frontend: "10.0.0.10:80/tcp", Fingerprint: fp}}}
}

// TestFleet runs two boxes' fleet checks against a real agent: each sees
// the other's record, a change after a quiet second shows at once, a stopped box's record goes,
// and a box restarted after a crash takes its record back from the session
// its previous process left.
func TestFleet(t *testing.T) {
	a := startAgent(t, 0)
	b1 := runFleet(t, a.Addr, "lb1")
	b2 := runFleet(t, a.Addr, "lb2")
	b1.f.Publish(rec("f1"))
	b2.f.Publish(rec("f1"))
	boxes := waitBoxes(t, b1.f, nil, "lb1", "lb2")
	if r := fleet.Compare(boxes); len(r.Mismatches) != 0 {
		t.Fatalf("identical boxes flagged: %v", r.Warnings())
	}

	// After a quiet second a change is written at once.
	time.Sleep(1100 * time.Millisecond)
	start := time.Now()
	b2.f.Publish(rec("f2"))
	boxes = waitBoxes(t, b1.f, func(bs []fleet.Box) bool { return len(fleet.Compare(bs).Mismatches) == 1 }, "lb1", "lb2")
	t.Logf("MEASURE lb2 published a different fingerprint -> seen by lb1: %s", time.Since(start).Round(time.Millisecond))
	if m := fleet.Compare(boxes).Mismatched("lb1"); !m["web"] {
		t.Errorf("lb1's web not flagged: %v", m)
	}

	b2.Stop()
	waitBoxes(t, b1.f, nil, "lb1")
	if _, st := b1.f.Boxes(); st.Gone["lb2"].IsZero() || st.Gone["lb2"].Before(start) {
		t.Errorf("lb1 does not remember lb2 as gone since its last sighting: %v", st.Gone)
	}

	// A crashed lb2 left its session holding the key: the next lb2 takes
	// the key back rather than fail.
	// As l4lbd creates them: with a lock delay of 1ms.
	sess, _, err := a.API.Session().Create(&api.SessionEntry{Name: "l4lb-fleet lb2", TTL: "60s", Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := a.API.KV().Acquire(&api.KVPair{Key: "l4lb/fleet/lb2", Value: []byte(`{"name":"lb2","seed_fingerprint":"old"}`), Session: sess}, nil); !ok || err != nil {
		t.Fatalf("acquire as the old lb2: %v %v", ok, err)
	}
	b2 = runFleet(t, a.Addr, "lb2")
	b2.f.Publish(rec("f1"))
	waitBoxes(t, b1.f, func(bs []fleet.Box) bool {
		return len(fleet.Compare(bs).Mismatches) == 0 && len(fleet.Compare(bs).Seeds) == 1
	}, "lb1", "lb2")
	if _, st := b1.f.Boxes(); len(st.Gone) != 0 {
		t.Errorf("lb2 is back but still listed as gone: %v", st.Gone)
	}

	// A box of another name cannot take lb1's record.
	sess2, _, err := a.API.Session().Create(&api.SessionEntry{Name: "something else", TTL: "60s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := a.API.KV().Acquire(&api.KVPair{Key: "l4lb/fleet/lb1", Value: []byte(`{}`), Session: sess2}, nil); ok {
		t.Errorf("another session acquired lb1's record while lb1 holds it")
	}
}

// testServices are n services with distinct frontends and fingerprint fp,
// about 90 bytes each in the record.
func testServices(n int, fp string) []fleet.Service {
	out := make([]fleet.Service, n)
	for i := range out {
		out[i] = fleet.Service{Name: fmt.Sprintf("service-%06d", i), Frontend: fmt.Sprintf("10.%d.%d.%d:80/tcp", i>>16, i>>8&255, i&255), Fingerprint: fp}
	}
	return out
}

// fingerprints are the fingerprints of the box named, by frontend, as
// boxes has them (nil: no such box).
func fingerprints(boxes []fleet.Box, name string) map[string]string {
	for _, b := range boxes {
		if b.Name == name {
			out := make(map[string]string, len(b.Services))
			for _, s := range b.Services {
				out[s.Frontend] = s.Fingerprint
			}
			return out
		}
	}
	return nil
}

// holds says whether boxes has the box named with exactly these services.
func holds(boxes []fleet.Box, name string, svcs []fleet.Service) bool {
	fps := fingerprints(boxes, name)
	if len(fps) != len(svcs) {
		return false
	}
	for _, s := range svcs {
		if fp, ok := fps[s.Frontend]; !ok || fp != s.Fingerprint {
			return false
		}
	}
	return true
}

// recordKeys are the keys of the named box's record in the agent's KV.
func recordKeys(t *testing.T, a *agent, name string) map[string]*api.KVPair {
	t.Helper()
	head := "l4lb/fleet/" + name
	pairs, _, err := a.API.KV().List(head, nil)
	if err != nil {
		t.Fatalf("list %s: %v", head, err)
	}
	out := map[string]*api.KVPair{}
	for _, p := range pairs {
		if p.Key == head || strings.HasPrefix(p.Key, head+"/") {
			out[p.Key] = p
		}
	}
	return out
}

// waitKeys waits until the named box's record is in keys that ok accepts.
func waitKeys(t *testing.T, a *agent, name string, ok func(map[string]*api.KVPair) bool) map[string]*api.KVPair {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		keys := recordKeys(t, a, name)
		if ok(keys) {
			return keys
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's record is in keys %v", name, slices.Sorted(maps.Keys(keys)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitWrites waits until f has written more than txns transactions, and
// returns its counts.
func waitWrites(t *testing.T, f *consul.Fleet, txns int) (int, int, int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		n, keys, bytes := f.WriteStats()
		if n > txns {
			return n, keys, bytes
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s wrote no transaction past %d", f.Name(), txns)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFleetShardedRecord: a record of 20,000 services (some 1.8 MB, over
// Consul's 512 KiB value limit) is published in shards and read whole by
// another box; a change to one service rewrites one shard (and at most the
// header); a record that shrinks leaves no stale shard; a burst of records
// is published as its newest; a stopped box's keys all go.
func TestFleetShardedRecord(t *testing.T) {
	a := startAgent(t, 0)
	b1 := runFleet(t, a.Addr, "lb1")
	b2 := runFleet(t, a.Addr, "lb2")
	for i := range 5 {
		b1.f.Publish(rec(fmt.Sprint("f", i)))
	}
	waitBoxes(t, b2.f, func(bs []fleet.Box) bool { return fingerprints(bs, "lb1")["10.0.0.10:80/tcp"] == "f4" }, "lb1")
	if keys := recordKeys(t, a, "lb1"); len(keys) != 1 {
		t.Errorf("a one-service record is in %d keys, want 1 (inline)", len(keys))
	}

	big := fleet.Box{SeedFingerprint: "s1", Services: testServices(20000, "0123456789abcdef")}
	b1.f.Publish(big)
	waitBoxes(t, b2.f, func(bs []fleet.Box) bool { return holds(bs, "lb1", big.Services) }, "lb1")
	keys := recordKeys(t, a, "lb1")
	head := keys["l4lb/fleet/lb1"]
	if head == nil || len(keys) < 3 {
		t.Fatalf("20,000 services in keys %v: want a header and shards", slices.Sorted(maps.Keys(keys)))
	}
	var hdr fleet.Box
	if err := json.Unmarshal(head.Value, &hdr); err != nil || hdr.Shards != len(keys)-1 {
		t.Fatalf("header %s (%v) for %d shard keys", head.Value, err, len(keys)-1)
	}
	total := 0
	for k, p := range keys {
		if p.Session != head.Session {
			t.Errorf("%s held by session %q, the header by %q", k, p.Session, head.Session)
		}
		if len(p.Value) > 128<<10 {
			t.Errorf("%s is %d KiB", k, len(p.Value)>>10)
		}
		total += len(p.Value)
	}
	if total <= 512<<10 {
		t.Fatalf("the record is %d KiB, meant to be over Consul's 512 KiB value limit", total>>10)
	}
	t.Logf("MEASURE 20,000 services: %d KiB in a header and %d shards", total>>10, hdr.Shards)

	// One service changes.
	txns0, keys0, bytes0 := b1.f.WriteStats()
	changed := big
	changed.Services = slices.Clone(big.Services)
	changed.Services[777].Fingerprint = "fedcba9876543210"
	b1.f.Publish(changed)
	waitBoxes(t, b2.f, func(bs []fleet.Box) bool { return holds(bs, "lb1", changed.Services) }, "lb1")
	txns1, keys1, bytes1 := waitWrites(t, b1.f, txns0)
	after := recordKeys(t, a, "lb1")
	var rewritten []string
	for k, p := range after {
		if keys[k] == nil || keys[k].ModifyIndex != p.ModifyIndex {
			rewritten = append(rewritten, k)
		}
	}
	shards := slices.DeleteFunc(slices.Clone(rewritten), func(k string) bool { return k == "l4lb/fleet/lb1" })
	if len(after) != len(keys) || len(shards) != 1 || len(rewritten) > 2 {
		t.Errorf("one service changed: keys rewritten %v (%d keys before, %d after); want one shard and at most the header", rewritten, len(keys), len(after))
	}
	if txns1-txns0 != 1 || keys1-keys0 > 2 {
		t.Errorf("one service changed: %d transactions writing %d keys, want 1 writing at most 2", txns1-txns0, keys1-keys0)
	}
	t.Logf("MEASURE one change at 20,000 services: keys written %d, bytes of values %d, transactions %d", keys1-keys0, bytes1-bytes0, txns1-txns0)

	// The record shrinks: its shards go.
	small := fleet.Box{SeedFingerprint: "s1", Services: big.Services[:10]}
	b1.f.Publish(small)
	waitBoxes(t, b2.f, func(bs []fleet.Box) bool { return holds(bs, "lb1", small.Services) }, "lb1")
	waitKeys(t, a, "lb1", func(keys map[string]*api.KVPair) bool { return len(keys) == 1 && keys["l4lb/fleet/lb1"] != nil })

	// It grows again, and the box stops: every key goes with its session.
	b1.f.Publish(big)
	waitBoxes(t, b2.f, func(bs []fleet.Box) bool { return holds(bs, "lb1", big.Services) }, "lb1")
	if keys := recordKeys(t, a, "lb1"); len(keys) < 3 {
		t.Fatalf("grown again, the record is in %d keys", len(keys))
	}
	b1.Stop()
	if keys := recordKeys(t, a, "lb1"); len(keys) != 0 {
		t.Errorf("lb1 stopped, its keys stay: %v", slices.Sorted(maps.Keys(keys)))
	}
	waitBoxes(t, b2.f, nil)
}

// TestFleetReadsPreviousFormat: a record as l4lbd wrote it before shards
// (the services inline, no "shards") is read, beside a sharded one, as
// during an upgrade.
func TestFleetReadsPreviousFormat(t *testing.T) {
	a := startAgent(t, 0)
	sess, _, err := a.API.Session().Create(&api.SessionEntry{Name: "l4lb-fleet old", TTL: "60s", Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := `{"name":"old","version":"0.9.0","seed_fingerprint":"s1","services":[` +
		`{"name":"service-000000","frontend":"10.0.0.0:80/tcp","fingerprint":"0123456789abcdef"},` +
		`{"name":"service-000001","frontend":"10.0.0.1:80/tcp","fingerprint":"fedcba9876543210"}],"updated":"2026-01-01T00:00:00Z"}`
	if ok, _, err := a.API.KV().Acquire(&api.KVPair{Key: "l4lb/fleet/old", Value: []byte(old), Session: sess}, nil); !ok || err != nil {
		t.Fatalf("acquire as a box of the previous version: %v %v", ok, err)
	}
	b := runFleet(t, a.Addr, "new")
	svcs := testServices(20000, "0123456789abcdef")
	b.f.Publish(fleet.Box{SeedFingerprint: "s1", Services: svcs})
	boxes := waitBoxes(t, b.f, func(bs []fleet.Box) bool { return holds(bs, "new", svcs) && len(fingerprints(bs, "old")) == 2 }, "new", "old")
	r := fleet.Compare(boxes)
	if len(r.Mismatches) != 1 || r.Mismatches[0].Frontend != "10.0.0.1:80/tcp" {
		t.Errorf("mismatches %v, want 10.0.0.1:80/tcp alone", r.Warnings())
	}
}

// TestFleetShardTakeBack: a box restarted after a crash takes back every
// key its previous session left, shards included, and those it no longer
// writes go with that session; a shard held by a box of another name is
// that box's, and the error says two boxes share a name.
func TestFleetShardTakeBack(t *testing.T) {
	a := startAgent(t, 0)
	acquire := func(sess, key, value string) {
		t.Helper()
		if ok, _, err := a.API.KV().Acquire(&api.KVPair{Key: key, Value: []byte(value), Session: sess}, nil); !ok || err != nil {
			t.Fatalf("acquire %s: %v %v", key, ok, err)
		}
	}
	sess, _, err := a.API.Session().Create(&api.SessionEntry{Name: "l4lb-fleet lb1", TTL: "60s", Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		acquire(sess, fmt.Sprintf("l4lb/fleet/lb1/services/%d", i), `[]`)
	}
	acquire(sess, "l4lb/fleet/lb1/services/999", `[]`)
	acquire(sess, "l4lb/fleet/lb1", `{"name":"lb1","seed_fingerprint":"old","services":null,"shards":4}`)

	b1 := runFleet(t, a.Addr, "lb1")
	b2 := runFleet(t, a.Addr, "lb2")
	svcs := testServices(20000, "0123456789abcdef")
	b1.f.Publish(fleet.Box{SeedFingerprint: "s1", Services: svcs})
	waitBoxes(t, b2.f, func(bs []fleet.Box) bool { return holds(bs, "lb1", svcs) }, "lb1")
	keys := recordKeys(t, a, "lb1")
	if keys["l4lb/fleet/lb1/services/999"] != nil {
		t.Errorf("the previous session's stale shard stays")
	}
	for k, p := range keys {
		if p.Session == sess {
			t.Errorf("%s still held by the previous session", k)
		}
	}

	other, _, err := a.API.Session().Create(&api.SessionEntry{Name: "something else", TTL: "60s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	acquire(other, "l4lb/fleet/lb3/services/0", `[]`)
	b3 := runFleet(t, a.Addr, "lb3")
	b3.f.Publish(fleet.Box{SeedFingerprint: "s1", Services: svcs})
	deadline := time.Now().Add(waitTimeout)
	for {
		_, st := b3.f.Boxes()
		if strings.Contains(st.Error, "another box uses the name") && strings.Contains(st.Error, "lb3/services/0") {
			t.Logf("the error: %s", st.Error)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lb3's shard held by another box: status %+v, want an error naming the shared name", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := recordKeys(t, a, "lb3")["l4lb/fleet/lb3/services/0"]; p == nil || p.Session != other {
		t.Errorf("the other box's key was taken: %+v", p)
	}
}

// TestFleetShardWriteCost measures what one service's change writes to
// Consul, and how soon another box has it, at 10,000 and 100,000
// services (docs/scale-out.md quotes it).
func TestFleetShardWriteCost(t *testing.T) {
	a := startAgent(t, 0)
	watcher := runFleet(t, a.Addr, "watcher")
	for _, n := range []int{10000, 100000} {
		name := fmt.Sprint("lb-", n)
		b := runFleet(t, a.Addr, name)
		box := fleet.Box{Version: "test", SeedFingerprint: "s1", Updated: time.Now(), Services: testServices(n, "0123456789abcdef")}
		start := time.Now()
		b.f.Publish(box)
		waitBoxes(t, watcher.f, func(bs []fleet.Box) bool { return holds(bs, name, box.Services) }, name)
		full := time.Since(start)
		txns0, keys0, bytes0 := b.f.WriteStats()
		keys := recordKeys(t, a, name)
		size := 0
		for _, p := range keys {
			size += len(p.Value)
		}
		// What every other box reads for any change: the whole prefix.
		start = time.Now()
		if _, _, err := a.API.KV().List("l4lb/fleet/", nil); err != nil {
			t.Fatal(err)
		}
		list := time.Since(start)
		t.Logf("MEASURE %d services: record %d KiB in %d keys, first write %d transactions, seen by another box after %s; one List of the prefix takes %s",
			n, size>>10, len(keys), txns0, full.Round(time.Millisecond), list.Round(time.Millisecond))

		// As the daemon publishes a change: the record with one entry
		// made again and a new Updated.
		time.Sleep(1100 * time.Millisecond)
		box.Services = slices.Clone(box.Services)
		box.Services[n/2].Fingerprint = "fedcba9876543210"
		box.Updated = time.Now()
		start = time.Now()
		b.f.Publish(box)
		txns1, keys1, bytes1 := waitWrites(t, b.f, txns0)
		written := time.Since(start)
		waitBoxes(t, watcher.f, func(bs []fleet.Box) bool { return holds(bs, name, box.Services) }, name)
		seen := time.Since(start)
		if txns1-txns0 != 1 || keys1-keys0 != 2 {
			t.Errorf("%d services, one changed: %d transactions writing %d keys, want 1 writing the header and a shard", n, txns1-txns0, keys1-keys0)
		}
		t.Logf("MEASURE %d services, one changed: %d keys, %d bytes of values (%.1f%% of the record) in %d transaction, written after %s, seen by another box after %s",
			n, keys1-keys0, bytes1-bytes0, 100*float64(bytes1-bytes0)/float64(size), txns1-txns0, written.Round(time.Millisecond), seen.Round(time.Millisecond))
		b.Stop()
		waitBoxes(t, watcher.f, nil)
	}
}
