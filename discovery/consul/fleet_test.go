// SPDX-License-Identifier: Apache-2.0

package consul_test

import (
	"context"
	"fmt"
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

// TestFleetRecordTooLarge: a record over Consul's default value limit (a
// box with about 6,000 services) is refused by Consul, and the error says
// how large the record is and what to do; a burst of records is published
// as its newest.
func TestFleetRecordTooLarge(t *testing.T) {
	a := startAgent(t, 0)
	b := runFleet(t, a.Addr, "lb1")
	for i := range 5 {
		b.f.Publish(rec(fmt.Sprint("f", i)))
	}
	boxes := waitBoxes(t, b.f, func(bs []fleet.Box) bool { return bs[0].Services[0].Fingerprint == "f4" }, "lb1")
	big := fleet.Box{SeedFingerprint: "s1"}
	for i := range 6000 {
		big.Services = append(big.Services, fleet.Service{Name: fmt.Sprintf("service-%05d", i), Frontend: fmt.Sprintf("10.0.%d.%d:80/tcp", i/256, i%256), Fingerprint: "0123456789abcdef0123"})
	}
	b.f.Publish(big)
	deadline := time.Now().Add(waitTimeout)
	for {
		_, st := b.f.Boxes()
		if strings.Contains(st.Error, "kv_max_value_size") && strings.Contains(st.Error, "KiB") {
			t.Logf("the error: %s", st.Error)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a record of %d services: status %+v, want an error naming kv_max_value_size", len(big.Services), st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The last record Consul took is still the one the others see.
	if got, _ := b.f.Boxes(); len(got) != 1 || got[0].Services[0].Fingerprint != boxes[0].Services[0].Fingerprint {
		t.Errorf("after the refused write the fleet holds %+v", got)
	}
}
