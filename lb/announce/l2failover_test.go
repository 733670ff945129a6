// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/config"
)

func TestAdvertRoundTrip(t *testing.T) {
	for _, a := range []advert{
		{group: 1, priority: 100, interval: 200 * time.Millisecond, name: "lb-a"},
		{group: 255, priority: 1, active: true, ready: true, interval: 10 * time.Second, name: "a-very-long-box-name.example.net"},
		{group: 7, priority: 200, leaving: true, ready: true, interval: 10 * time.Millisecond, name: "x"},
	} {
		b := a.marshal()
		if len(b) < minEthPayload {
			t.Errorf("%+v: %d bytes, want at least %d", a, len(b), minEthPayload)
		}
		got, err := parseAdvert(b)
		if err != nil || got != a {
			t.Errorf("parse(marshal(%+v)) = %+v, %v", a, got, err)
		}
	}
	good := advert{group: 1, priority: 1, interval: time.Second, name: "lb"}.marshal()
	for name, b := range map[string][]byte{
		"short":        good[:advertHeader-1],
		"other magic":  append([]byte("XXXX"), good[4:]...),
		"version 2":    append(append(append([]byte{}, good[:4]...), 2), good[5:]...),
		"no name":      append(append(append([]byte{}, good[:10]...), 0), good[11:]...),
		"name too big": append(append(append([]byte{}, good[:10]...), 200), good[11:]...),
		"interval 0":   append(append(append([]byte{}, good[:8]...), 0, 0), good[10:]...),
	} {
		if a, err := parseAdvert(b); err == nil {
			t.Errorf("%s: parsed as %+v", name, a)
		}
	}
}

func TestCandidateRank(t *testing.T) {
	mac1, mac2 := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	base := candidate{ready: true, priority: 100, name: "lb-b", mac: mac2}
	for _, c := range []struct {
		name   string
		better candidate
	}{
		{"ready beats a higher priority not ready", candidate{ready: true, priority: 1, name: "z", mac: mac2}},
		{"higher priority", candidate{ready: true, priority: 101, name: "z", mac: mac2}},
		{"active on equal priority", candidate{ready: true, priority: 100, active: true, name: "z", mac: mac2}},
		{"lower name", candidate{ready: true, priority: 100, name: "lb-a", mac: mac2}},
		{"lower MAC on the same name", candidate{ready: true, priority: 100, name: "lb-b", mac: mac1}},
	} {
		worse := base
		if c.name == "ready beats a higher priority not ready" {
			worse = candidate{priority: 255, name: "a", mac: mac1}
		}
		if !c.better.beats(worse) || worse.beats(c.better) {
			t.Errorf("%s: %+v should beat %+v, and not the reverse", c.name, c.better, worse)
		}
	}
	if base.beats(base) {
		t.Error("a box beats itself")
	}
}

// box is an elector whose adverts land in a slice, driven by the test's
// clock: the election's rules without sockets.
type box struct {
	*elector
	sent      []advert
	activated int
}

func newBox(t *testing.T, name string, priority uint8, mac byte) *box {
	t.Helper()
	ifi := &net.Interface{Name: "eth0", HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, mac}}
	e, err := newElector(config.L2Failover{Name: name, Group: 1, Priority: priority, Interval: 200 * time.Millisecond, DetectMultiplier: 3}, []*l2Iface{{ifi: ifi}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b := &box{elector: e}
	e.out = func(a advert) { b.sent = append(b.sent, a) }
	e.onActive = func() { b.activated++ }
	return b
}

// start is what run does first, at now.
func (b *box) start(now time.Time) {
	b.mu.Lock()
	b.setRole(RoleListening, now)
	b.holdUntil = now.Add(b.detection())
	b.mu.Unlock()
	b.tick(now)
}

// deliver hands b's newest advert to each of to.
func (b *box) deliver(now time.Time, to ...*box) {
	a := b.sent[len(b.sent)-1]
	for _, o := range to {
		o.heard(o.ifaces[0], b.mac, a, now)
	}
}

func (b *box) current() Role {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.elector.role
}

// run ticks a and b every quarter interval from *now for d, delivering each
// box's new adverts to the other unless it is cut off.
func run(now *time.Time, d time.Duration, boxes []*box, cut map[*box]bool) {
	end := now.Add(d)
	for now.Before(end) {
		*now = now.Add(50 * time.Millisecond)
		for _, b := range boxes {
			n := len(b.sent)
			b.tick(*now)
			if len(b.sent) > n && !cut[b] {
				for _, o := range boxes {
					if o != b && !cut[o] {
						b.deliver(*now, o)
					}
				}
			}
		}
	}
}

func TestElection(t *testing.T) {
	t0 := time.Now()
	t.Run("a box alone claims after listening", func(t *testing.T) {
		a := newBox(t, "lb-a", 100, 1)
		now := t0
		a.start(now)
		if a.current() != RoleListening || a.holds(now) {
			t.Fatalf("a starting box is %s, holding %v", a.current(), a.holds(now))
		}
		run(&now, 550*time.Millisecond, []*box{a}, nil)
		if a.current() != RoleListening {
			t.Fatalf("claimed before the detection time: %s", a.current())
		}
		run(&now, 100*time.Millisecond, []*box{a}, nil)
		if a.current() != RoleActive || !a.holds(now) || a.activated != 1 {
			t.Fatalf("after the detection time: %s, holding %v, activated %d", a.current(), a.holds(now), a.activated)
		}
		if last := a.sent[len(a.sent)-1]; !last.active || last.name != "lb-a" || last.priority != 100 {
			t.Errorf("advert of the active box: %+v", last)
		}
	})

	// pair starts a and b together and returns them settled: a active.
	pair := func(t *testing.T, pa, pb uint8) (a, b *box, now time.Time) {
		a, b = newBox(t, "lb-a", pa, 1), newBox(t, "lb-b", pb, 2)
		now = t0
		a.start(now)
		b.start(now)
		a.setReady(now)
		b.setReady(now)
		run(&now, time.Second, []*box{a, b}, nil)
		if a.current() != RoleActive || b.current() != RoleStandby {
			t.Fatalf("after start: a %s, b %s; want the lower name active", a.current(), b.current())
		}
		return a, b, now
	}

	t.Run("the standby takes over when the active box goes silent", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		cut := map[*box]bool{a: true}
		failed := now
		run(&now, 550*time.Millisecond, []*box{a, b}, cut)
		if b.current() != RoleStandby {
			t.Fatalf("b took over %s after a went silent, before the detection time", now.Sub(failed))
		}
		run(&now, 150*time.Millisecond, []*box{a, b}, cut)
		if b.current() != RoleActive || !b.holds(now) || b.activated != 1 {
			t.Fatalf("b after a's detection time: %s, activated %d", b.current(), b.activated)
		}
	})

	t.Run("a box coming back with equal priority stays standby", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		run(&now, time.Second, []*box{a, b}, map[*box]bool{a: true})
		// a is a new process: it starts over.
		a = newBox(t, "lb-a", 100, 1)
		a.start(now)
		a.setReady(now)
		run(&now, 2*time.Second, []*box{a, b}, nil)
		if a.current() != RoleStandby || b.current() != RoleActive || a.holds(now) {
			t.Fatalf("after a came back: a %s (holding %v), b %s", a.current(), a.holds(now), b.current())
		}
	})

	t.Run("a higher priority takes over at once and the other stays silent", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		run(&now, time.Second, []*box{a, b}, map[*box]bool{a: true})
		a = newBox(t, "lb-a", 200, 1)
		a.start(now)
		a.setReady(now)
		for i := 0; i < 40 && a.current() != RoleActive; i++ {
			run(&now, 50*time.Millisecond, []*box{a, b}, nil)
			if a.holds(now) && b.holds(now) {
				t.Fatalf("both boxes answer at %s", now.Sub(t0))
			}
		}
		if a.current() != RoleActive || b.current() != RoleStandby || b.holds(now) {
			t.Fatalf("a %s, b %s (holding %v)", a.current(), b.current(), b.holds(now))
		}
	})

	t.Run("a stalled active box steps down and listens", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		// a is frozen: it neither ticks nor sends; b takes over.
		run(&now, time.Second, []*box{b}, nil)
		if b.current() != RoleActive {
			t.Fatalf("b did not take over from the frozen a: %s", b.current())
		}
		if a.holds(now) {
			t.Fatal("the frozen box's lease still runs after the other took over")
		}
		// a resumes. What it reads first may be b's advert queued
		// while it was frozen (b active): it must not take that for
		// a conflict it wins.
		activated := a.activated
		b.deliver(now, a)
		if a.current() != RoleListening || a.holds(now) || a.activated != activated {
			t.Fatalf("a after its stall, hearing b: %s (holding %v, announced again %v), want listening", a.current(), a.holds(now), a.activated != activated)
		}
		a.tick(now)
		if a.current() != RoleListening {
			t.Fatalf("a after its stall: %s, want listening", a.current())
		}
		run(&now, 2*time.Second, []*box{a, b}, nil)
		if a.current() != RoleStandby || b.current() != RoleActive {
			t.Fatalf("after a resumed: a %s, b %s", a.current(), b.current())
		}
	})

	t.Run("a stall shorter than the detection time moves nothing", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		// a freezes for 550 ms: its lease lapses, b does not take
		// over yet.
		run(&now, 550*time.Millisecond, []*box{b}, nil)
		if a.holds(now) || b.current() != RoleStandby {
			t.Fatalf("during a's stall: a holding %v, b %s", a.holds(now), b.current())
		}
		activated := a.activated
		for range 20 {
			run(&now, 50*time.Millisecond, []*box{a, b}, nil)
			if b.current() == RoleActive {
				t.Fatalf("b took over from a that stalled for less than the detection time")
			}
		}
		if a.current() != RoleActive || !a.holds(now) || a.activated != activated+1 {
			t.Fatalf("a after its stall: %s (holding %v), announced again %d times; want active, once", a.current(), a.holds(now), a.activated-activated)
		}
	})

	t.Run("a leaving box hands over at once", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		leave := a.advertLocked()
		leave.leaving = true
		b.heard(b.ifaces[0], a.mac, leave, now)
		if b.current() != RoleActive || b.activated != 1 {
			t.Fatalf("b after a left: %s", b.current())
		}
	})

	t.Run("a box not ready yields", func(t *testing.T) {
		a, b := newBox(t, "lb-a", 200, 1), newBox(t, "lb-b", 100, 2)
		now := t0
		a.start(now)
		b.start(now)
		b.setReady(now)
		run(&now, time.Second, []*box{a, b}, nil)
		if a.current() != RoleStandby || b.current() != RoleActive {
			t.Fatalf("a (not ready) %s, b %s", a.current(), b.current())
		}
		a.setReady(now)
		run(&now, 200*time.Millisecond, []*box{a, b}, nil)
		if a.current() != RoleActive || b.current() != RoleStandby {
			t.Fatalf("once a is ready: a %s, b %s; its priority is higher", a.current(), b.current())
		}
	})

	t.Run("two active boxes after a split: the lower ranked steps down, the other announces again", func(t *testing.T) {
		a, b, now := pair(t, 100, 100)
		run(&now, time.Second, []*box{a, b}, map[*box]bool{a: true, b: true})
		if a.current() != RoleActive || b.current() != RoleActive {
			t.Fatalf("split: a %s, b %s; both should be active", a.current(), b.current())
		}
		before := a.activated
		run(&now, 300*time.Millisecond, []*box{a, b}, nil)
		if a.current() != RoleActive || b.current() != RoleStandby {
			t.Fatalf("healed: a %s, b %s", a.current(), b.current())
		}
		if a.activated != before+1 || a.status().Conflicts == 0 {
			t.Errorf("the box that kept the VIPs announced them %d times again, %d conflicts; want once", a.activated-before, a.status().Conflicts)
		}
	})
}
