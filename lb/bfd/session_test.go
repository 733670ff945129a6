// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"net/netip"
	"testing"
	"time"
)

// socketless returns a server and a session of it in state from, without
// sockets or goroutines: enough to drive the state machine by hand.
func socketless(t *testing.T, from State) (*Server, *session) {
	t.Helper()
	s, _ := newServer(t, addrA, freePort(t))
	ss := newSession(testConfig(addrA, addrB, testMult), nil, 0)
	ss.localDiscr = 1
	if from != Down {
		s.mu.Lock()
		s.setState(ss, from, diagNone)
		s.mu.Unlock()
	}
	t.Cleanup(func() { ss.detect.Stop() })
	return s, ss
}

// handleLocked is handle with the lock the server's goroutines take.
func handleLocked(s *Server, ss *session, p *packet) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handle(ss, p)
}

// TestStateMachine is RFC 5880 section 6.8.6's table of transitions.
func TestStateMachine(t *testing.T) {
	tests := []struct {
		local, received State
		want            State
		wantDiag        uint8
	}{
		{Down, AdminDown, Down, diagNone},
		{Down, Down, Init, diagNone},
		{Down, Init, Up, diagNone},
		{Down, Up, Down, diagNone},
		{Init, AdminDown, Down, diagNeighborDown},
		{Init, Down, Init, diagNone},
		{Init, Init, Up, diagNone},
		{Init, Up, Up, diagNone},
		{Up, AdminDown, Down, diagNeighborDown},
		{Up, Down, Down, diagNeighborDown},
		{Up, Init, Up, diagNone},
		{Up, Up, Up, diagNone},
	}
	for _, tt := range tests {
		t.Run(tt.local.String()+"+"+tt.received.String(), func(t *testing.T) {
			s, ss := socketless(t, tt.local)
			p := validPacket()
			p.state, p.myDiscr, p.yourDiscr = tt.received, 42, 1
			kick := handleLocked(s, ss, &p)
			if ss.state != tt.want || ss.diag != tt.wantDiag {
				t.Errorf("state %s diag %d, want %s diag %d", ss.state, ss.diag, tt.want, tt.wantDiag)
			}
			if ss.remoteDiscr != 42 || ss.remoteState != tt.received {
				t.Errorf("remote discr %d state %s, want 42 %s", ss.remoteDiscr, ss.remoteState, tt.received)
			}
			// A change is sent at once, and so is the first
			// packet after the peer's RequiredMinRx became known.
			if !kick {
				t.Error("no immediate transmission")
			}
			armed := !ss.detectAt.IsZero()
			if wantArmed := tt.want == Init || tt.want == Up; armed != wantArmed {
				t.Errorf("detection timer armed %v in state %s", armed, tt.want)
			}
		})
	}
}

// TestPollSequence follows the timers through coming Up, the peer's
// Final, and going Down again.
func TestPollSequence(t *testing.T) {
	s, ss := socketless(t, Init)
	peer := func(state State, poll, final bool) bool {
		p := validPacket()
		p.state, p.myDiscr, p.yourDiscr, p.poll, p.final = state, 42, 1, poll, final
		p.minTx = micros(testInterval)
		return handleLocked(s, ss, &p)
	}
	check := func(step string, advTx, txInForce time.Duration, polling bool) {
		t.Helper()
		if ss.advTx != advTx || ss.txInForce != txInForce || ss.polling != polling {
			t.Errorf("%s: advertised %v, in force %v, polling %v; want %v %v %v", step, ss.advTx, ss.txInForce, ss.polling, advTx, txInForce, polling)
		}
	}
	check("init", slowTx, slowTx, false)
	peer(Up, false, false)
	// A faster rate applies at once (RFC 5880 6.8.3: only a slower one
	// waits for the Final), so a lost Final cannot leave us too slow.
	check("up", testInterval, testInterval, true)
	if p := ss.packet(); !p.poll || p.minTx != micros(testInterval) {
		t.Errorf("packet while polling %+v, want P and the new interval", p)
	}
	peer(Up, true, false)
	if !ss.final {
		t.Error("a received Poll is not answered")
	}
	peer(Up, false, true)
	check("final", testInterval, testInterval, false)
	peer(Down, false, false)
	check("down", slowTx, slowTx, false)
}

func TestInterval(t *testing.T) {
	for _, tt := range []struct {
		mult     uint8
		low, top time.Duration
	}{
		{3, 750 * time.Millisecond, time.Second},
		{1, 750 * time.Millisecond, 900 * time.Millisecond},
	} {
		ss := newSession(Config{Peer: addrB, DetectMultiplier: tt.mult, MinRx: time.Second, MinTx: time.Second}, nil, 0)
		for range 1000 {
			if d := ss.interval(); d < tt.low || d > tt.top {
				t.Fatalf("multiplier %d: interval %v outside %v..%v", tt.mult, d, tt.low, tt.top)
			}
		}
		// The peer's slower receive rate wins.
		ss.remoteMinRx = 2 * time.Second
		if d := ss.interval(); d < 2*tt.low {
			t.Errorf("multiplier %d: interval %v below the peer's RequiredMinRx", tt.mult, d)
		}
	}
}

// TestIPv6 runs a session from ::1 to itself: its own packets, echoed by
// the loopback, take it Down, Init, Up like a peer's would, through the
// IPv6 listener, hop limit check and transmit socket.
func TestIPv6(t *testing.T) {
	checkNoLeak(t)
	lo := netip.MustParseAddr("::1")
	s, r := newServer(t, lo, freePort(t))
	if err := s.Add(testConfig(lo, lo, testMult), nil); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, s, lo, Up)
	if st.LocalDiscr != st.RemoteDiscr {
		t.Errorf("status %+v: a session with itself has one discriminator", st)
	}
	waitFor(t, "the notifications down->init->up", func() bool { return len(r.get()) >= 2 })
	if got := r.get(); got[0] != "::1 down->init" {
		t.Errorf("notified %v", got)
	}
}

// TestResumeWithNewTimers resumes a session whose configuration changed
// across the restart: the faster transmit interval applies at once, the
// saved receive interval stays in force until the peer acknowledges the
// new one.
func TestResumeWithNewTimers(t *testing.T) {
	s, _ := newServer(t, addrA, freePort(t))
	ss := newSession(testConfig(addrA, addrB, testMult), nil, 0)
	t.Cleanup(func() { ss.detect.Stop() })
	saved := Saved{
		Peer: addrB, LocalDiscr: 1, RemoteDiscr: 42,
		DetectMultiplier: testMult, MinRx: 200 * time.Millisecond, MinTx: 200 * time.Millisecond,
		RemoteDetectMultiplier: 3, RemoteMinRx: 100 * time.Millisecond, RemoteMinTx: 100 * time.Millisecond,
	}
	before := time.Now()
	ss.resume(&saved)
	after := time.Now()
	if ss.state != Up || !ss.polling || ss.txInForce != testInterval || ss.rxInForce != 200*time.Millisecond {
		t.Fatalf("resumed: state %s polling %v tx %v rx %v, want up, polling, tx %v, the saved rx 200ms", ss.state, ss.polling, ss.txInForce, ss.rxInForce, testInterval)
	}
	// The peer's 3 × max(our 200 ms, its 100 ms).
	const want = 600 * time.Millisecond
	if ss.detectAt.Before(before.Add(want)) || ss.detectAt.After(after.Add(want)) {
		t.Errorf("detection at %v after resuming, want %v", ss.detectAt.Sub(before), want)
	}
	if p := ss.packet(); p.state != Up || p.myDiscr != 1 || p.yourDiscr != 42 || !p.poll || p.minTx != micros(testInterval) {
		t.Errorf("first packet %+v", p)
	}
	p := validPacket()
	p.state, p.myDiscr, p.yourDiscr, p.final = Up, 42, 1, true
	handleLocked(s, ss, &p)
	if ss.polling || ss.txInForce != testInterval || ss.rxInForce != testInterval {
		t.Errorf("after Final: polling %v tx %v rx %v, want %v", ss.polling, ss.txInForce, ss.rxInForce, testInterval)
	}
}

// TestResumeWithoutPeerTimers resumes from a Saved that lacks the peer's
// timers: the session is timed by its own until the peer's first packet,
// rather than expiring at once or never transmitting.
func TestResumeWithoutPeerTimers(t *testing.T) {
	ss := newSession(testConfig(addrA, addrB, testMult), nil, 0)
	t.Cleanup(func() { ss.detect.Stop() })
	before := time.Now()
	ss.resume(&Saved{Peer: addrB, LocalDiscr: 1, RemoteDiscr: 42})
	if ss.state != Up {
		t.Fatalf("state %s, want up", ss.state)
	}
	if want := before.Add(testMult * testInterval); ss.detectAt.Before(want) {
		t.Errorf("detection in %v, want at least %v", ss.detectAt.Sub(before), want.Sub(before))
	}
	if ss.remoteMinRx == 0 {
		t.Error("the peer's RequiredMinRx is 0: the session would not transmit")
	}
	if d := ss.interval(); d <= 0 || d > testInterval {
		t.Errorf("transmit interval %v, want at most %v", d, testInterval)
	}
}
