// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestUpAndFastTimers(t *testing.T) {
	checkNoLeak(t)
	a, b, ra, rb, _ := upPair(t, testMult)
	for _, side := range []struct {
		name string
		s    *Server
		peer netip.Addr
	}{{"a", a, addrB}, {"b", b, addrA}} {
		// The switch to the configured interval waits for the
		// peer's Final.
		waitFor(t, side.name+" fast timers in force", func() bool {
			tx, polling := side.s.inForce(side.peer)
			return tx == testInterval && !polling
		})
		before := side.s.Status()[side.peer].PacketsSent
		time.Sleep(500 * time.Millisecond)
		// At the slow rate half a second holds at most one packet.
		if sent := side.s.Status()[side.peer].PacketsSent - before; sent < 3 {
			t.Errorf("%s sent %d packets in 500 ms at a %v interval", side.name, sent, testInterval)
		}
		st := side.s.Status()[side.peer]
		if st.State != Up || st.LocalDiscr == 0 || st.RemoteDiscr == 0 || st.PacketsReceived == 0 {
			t.Errorf("%s status %+v", side.name, st)
		}
		if len(st.Transitions) != 4 || st.Transitions[Up] != 1 || st.Transitions[Down] != 0 {
			t.Errorf("%s transitions %v, want one entry into up and none into down", side.name, st.Transitions)
		}
	}
	if as, bs := a.Status()[addrB], b.Status()[addrA]; as.LocalDiscr != bs.RemoteDiscr || as.RemoteDiscr != bs.LocalDiscr {
		t.Errorf("discriminators do not match: a %+v, b %+v", as, bs)
	}
	for name, r := range map[string]*recorder{"a": ra, "b": rb} {
		// notify runs after Status shows the state: wait for it.
		waitFor(t, name+"'s notification up", func() bool {
			got := r.get()
			return len(got) > 0 && strings.HasSuffix(got[len(got)-1], "->up")
		})
		if got := r.get(); len(got) == 0 || !strings.HasSuffix(got[len(got)-1], "->up") || slices.ContainsFunc(got, func(c string) bool { return strings.HasSuffix(c, "->down") }) {
			t.Errorf("%s notified %v, want changes up and none down", name, got)
		}
	}
}

// TestPeerGoesAway covers the two ways a session ends on the other side:
// silence (Close, or a crash) is found by the detection timer, a Remove
// is told in AdminDown packets.
func TestPeerGoesAway(t *testing.T) {
	tests := []struct {
		name     string
		stop     func(b *Server)
		wantDiag uint8
		// What b itself notifies.
		wantB []string
	}{
		{"close", func(b *Server) { b.Close() }, diagTimeExpired, nil},
		{"remove", func(b *Server) { b.Remove(addrA) }, diagNeighborDown, []string{"127.0.0.1 up->admin_down"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkNoLeak(t)
			a, b, ra, rb, _ := upPair(t, testMult)
			nb := len(rb.get())
			start := time.Now()
			tt.stop(b)
			st := waitState(t, a, addrB, Down)
			// Detection takes 5 × 50 ms; the bound only catches a
			// session that never times out.
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("a went down after %v", d)
			}
			if st.Diag != tt.wantDiag {
				t.Errorf("a's diag %d, want %d", st.Diag, tt.wantDiag)
			}
			waitFor(t, "a's notification up->down", func() bool {
				got := ra.get()
				return len(got) > 0 && got[len(got)-1] == "127.0.0.2 up->down"
			})
			if tt.name == "remove" {
				waitFor(t, "b's notification", func() bool { return len(rb.get()) > nb })
				if _, ok := b.Status()[addrA]; ok {
					t.Error("removed session still in b's status")
				}
			}
			if got := rb.get()[nb:]; !slices.Equal(got, tt.wantB) {
				t.Errorf("b notified %v, want %v", got, tt.wantB)
			}
		})
	}
}

// TestHandoff restarts a's process: b must not notice.
func TestHandoff(t *testing.T) {
	checkNoLeak(t)
	// Detection time 20 × 50 ms = 1 s, well over the gap below.
	const mult = 20
	a, b, _, rb, port := upPair(t, mult)
	waitFor(t, "a's fast timers", func() bool { tx, _ := a.inForce(addrB); return tx == testInterval })
	before := a.Status()[addrB]
	srcPort := a.srcPortOf(addrB)
	nb := len(rb.get())

	saved := a.Handoff()
	if len(saved) != 1 {
		t.Fatalf("handoff saved %d sessions, want 1", len(saved))
	}
	// The state crosses processes as JSON.
	js, err := json.Marshal(saved)
	if err != nil {
		t.Fatal(err)
	}
	var resumed []Saved
	if err := json.Unmarshal(js, &resumed); err != nil {
		t.Fatal(err)
	}
	if resumed[0] != saved[0] {
		t.Fatalf("JSON round trip: %+v, want %+v", resumed[0], saved[0])
	}
	want := Saved{
		Peer: addrB, Local: addrA, LocalDiscr: before.LocalDiscr, RemoteDiscr: before.RemoteDiscr, SrcPort: srcPort,
		DetectMultiplier: mult, MinRx: testInterval, MinTx: testInterval,
		RemoteDetectMultiplier: mult, RemoteMinRx: testInterval, RemoteMinTx: testInterval,
	}
	if saved[0] != want {
		t.Errorf("saved %+v\nwant  %+v", saved[0], want)
	}
	if a.Status()[addrB].State != 0 || len(a.Status()) != 0 {
		t.Errorf("closed server reports sessions: %v", a.Status())
	}

	time.Sleep(100 * time.Millisecond) // the gap between the processes
	a2, ra2 := newServer(t, addrA, port)
	if err := a2.Add(testConfig(addrA, addrB, mult), &resumed[0]); err != nil {
		t.Fatal(err)
	}
	st := a2.Status()[addrB]
	if st.State != Up || st.LocalDiscr != before.LocalDiscr || st.RemoteDiscr != before.RemoteDiscr {
		t.Errorf("resumed status %+v, want up with discriminators of %+v", st, before)
	}
	if got := a2.srcPortOf(addrB); got != srcPort {
		t.Errorf("resumed source port %d, want %d", got, srcPort)
	}
	waitFor(t, "packets both ways", func() bool {
		st := a2.Status()[addrB]
		return st.PacketsReceived >= 5 && st.PacketsSent >= 5
	})
	time.Sleep(300 * time.Millisecond)
	if got := rb.get()[nb:]; len(got) != 0 {
		t.Errorf("b saw the restart: %v", got)
	}
	if got := ra2.get(); len(got) != 0 {
		t.Errorf("resumed session changed state: %v", got)
	}
	if tx, polling := a2.inForce(addrB); tx != testInterval || polling {
		t.Errorf("resumed session transmits every %v (polling %v), want %v", tx, polling, testInterval)
	}
	if bs := b.Status()[addrA]; bs.State != Up || bs.RemoteDiscr != before.LocalDiscr {
		t.Errorf("b's status %+v", bs)
	}
}

// TestPeerRestartsSession is what BIRD does with every new BGP session: a
// new BFD session, new discriminator, from the same address.
func TestPeerRestartsSession(t *testing.T) {
	checkNoLeak(t)
	// b's silence must not trip a's detection (20 × 50 ms) first.
	const mult = 20
	a, b, ra, _, port := upPair(t, mult)
	old := a.Status()[addrB]
	b.Close()
	b2, _ := newServer(t, addrB, port)
	if err := b2.Add(testConfig(addrB, addrA, mult), nil); err != nil {
		t.Fatal(err)
	}
	newDiscr := b2.Status()[addrA].LocalDiscr
	var st Status
	waitFor(t, "a up with b's new session", func() bool {
		st = a.Status()[addrB]
		return st.State == Up && st.RemoteDiscr == newDiscr
	})
	waitState(t, b2, addrA, Up)
	if st.LocalDiscr != old.LocalDiscr {
		t.Errorf("a's discriminator changed from %d to %d", old.LocalDiscr, st.LocalDiscr)
	}
	if st.Diag != diagNeighborDown || st.Transitions[Down] != 1 || st.Transitions[Up] != 2 {
		t.Errorf("a's status %+v, want one down (diag 3) and up again", st)
	}
	waitFor(t, "a's notification up->down", func() bool { return slices.Contains(ra.get(), "127.0.0.2 up->down") })
}

func TestDiscard(t *testing.T) {
	checkNoLeak(t)
	port := freePort(t)
	// a's peer is whatever sends from 127.0.0.2: plain sockets here.
	a, _ := newServer(t, addrA, port)
	if err := a.Add(testConfig(addrA, addrB, testMult), nil); err != nil {
		t.Fatal(err)
	}
	local := a.Status()[addrB].LocalDiscr
	ttl255 := fakePeer(t, addrB, 255)
	ttl64 := fakePeer(t, addrB, 64)
	stranger := fakePeer(t, netip.MustParseAddr("127.0.0.3"), 255)

	tests := []struct {
		name     string
		from     *net.UDPConn
		mutate   func(*packet)
		accepted bool
	}{
		{"valid", ttl255, func(*packet) {}, true},
		{"valid with our discriminator", ttl255, func(p *packet) { p.yourDiscr = local; p.state = Init }, true},
		{"ttl 64", ttl64, func(*packet) {}, false},
		{"version 2", ttl255, func(p *packet) { p.version = 2 }, false},
		{"my discr 0", ttl255, func(p *packet) { p.myDiscr = 0 }, false},
		{"your discr 0 in state up", ttl255, func(p *packet) { p.state = Up }, false},
		{"your discr 0 in state init", ttl255, func(p *packet) { p.state = Init }, false},
		{"unknown your discr", ttl255, func(p *packet) { p.yourDiscr = local + 1; p.state = Up }, false},
		{"our discr from another address", stranger, func(p *packet) { p.yourDiscr = local }, false},
		{"unknown source, your discr 0", stranger, func(*packet) {}, false},
		{"auth bit", ttl255, func(p *packet) { p.auth = true }, false},
		{"detect mult 0", ttl255, func(p *packet) { p.detectMult = 0 }, false},
		{"short", ttl255, func(p *packet) { p.length = 20 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validPacket()
			tt.mutate(&p)
			received, discarded := a.Status()[addrB].PacketsReceived, a.discarded.Load()
			if _, err := tt.from.WriteToUDPAddrPort(p.appendTo(nil), netip.AddrPortFrom(addrA, uint16(port))); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the packet to be handled", func() bool {
				return a.Status()[addrB].PacketsReceived != received || a.discarded.Load() != discarded
			})
			gotReceived := a.Status()[addrB].PacketsReceived - received
			gotDiscarded := a.discarded.Load() - discarded
			if want := map[bool]uint64{true: 1, false: 0}[tt.accepted]; gotReceived != want || gotDiscarded != 1-want {
				t.Errorf("received %d, discarded %d; want accepted %v", gotReceived, gotDiscarded, tt.accepted)
			}
		})
	}
}

func TestAddRejects(t *testing.T) {
	checkNoLeak(t)
	port := freePort(t)
	a, _ := newServer(t, addrA, port)
	good := testConfig(addrA, addrB, testMult)
	if err := a.Add(good, nil); err != nil {
		t.Fatal(err)
	}
	v6 := netip.MustParseAddr("::1")
	tests := []struct {
		name   string
		cfg    func(c *Config)
		resume *Saved
	}{
		{"no peer", func(c *Config) { c.Peer = netip.Addr{} }, nil},
		{"existing peer", func(*Config) {}, nil},
		{"other family than the listener", func(c *Config) { c.Peer, c.Local = v6, netip.Addr{} }, nil},
		{"local of the other family", func(c *Config) { c.Peer, c.Local = netip.MustParseAddr("127.0.0.9"), v6 }, nil},
		{"detect mult 0", func(c *Config) { c.Peer, c.DetectMultiplier = netip.MustParseAddr("127.0.0.9"), 0 }, nil},
		{"zero interval", func(c *Config) { c.Peer, c.MinRx = netip.MustParseAddr("127.0.0.9"), 0 }, nil},
		{"resume of another peer", func(c *Config) { c.Peer = netip.MustParseAddr("127.0.0.9") }, &Saved{Peer: addrB, LocalDiscr: 1, RemoteDiscr: 2, RemoteDetectMultiplier: 3}},
		{"resume without discriminators", func(c *Config) { c.Peer = netip.MustParseAddr("127.0.0.9") }, &Saved{Peer: netip.MustParseAddr("127.0.0.9")}},
		{"resume of a discriminator in use", func(c *Config) { c.Peer = netip.MustParseAddr("127.0.0.9") }, &Saved{Peer: netip.MustParseAddr("127.0.0.9"), LocalDiscr: a.Status()[addrB].LocalDiscr, RemoteDiscr: 2, RemoteDetectMultiplier: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.cfg(&cfg)
			if err := a.Add(cfg, tt.resume); err == nil {
				t.Errorf("Add(%+v) succeeded", cfg)
			} else {
				t.Log(err)
			}
		})
	}
	if n := len(a.Status()); n != 1 {
		t.Errorf("%d sessions after rejected adds, want 1", n)
	}
	a.Close()
	if err := a.Add(testConfig(addrA, netip.MustParseAddr("127.0.0.9"), testMult), nil); err == nil {
		t.Error("Add after Close succeeded")
	}
}
