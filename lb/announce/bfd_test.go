// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/bfd"
	"github.com/l4lb/l4lb/lb/config"
)

// TestPeerOfHasNoGobgpBFD: BFD runs in lb/bfd, so gobgp must not run a
// second session with the router on the same port.
func TestPeerOfHasNoGobgpBFD(t *testing.T) {
	s := &Speaker{}
	p := config.BGPPeer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 65000, IPv4: true,
		BFD: config.BFD{Enabled: true, DetectMultiplier: 3, MinRxInterval: 300 * time.Millisecond, MinTxInterval: 300 * time.Millisecond}}
	if b := s.peerOf(p).GetBfd(); b.GetEnabled() {
		t.Errorf("gobgp peer has BFD %+v", b)
	}
}

// TestBFDSessions runs the sessions of a box (127.0.0.1) against a
// router's BFD (127.0.0.2, lb/bfd standing in for it) on loopback:
// sessions follow the peers' configuration (added, restarted when the
// timers change, removed), a session that goes down resets that peer's
// BGP session, and a handed-over session is resumed without the router
// seeing a change.
func TestBFDSessions(t *testing.T) {
	box, router := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	port := freeUDPPort(t, box, router)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	var mu sync.Mutex
	var routerSaw []string
	rs, err := bfd.NewServer(bfd.Options{Port: port, ListenAddr: router}, func(_ netip.Addr, from, to bfd.State) {
		mu.Lock()
		routerSaw = append(routerSaw, from.String()+"->"+to.String())
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	timers := config.BFD{Enabled: true, DetectMultiplier: 5, MinRxInterval: 50 * time.Millisecond, MinTxInterval: 50 * time.Millisecond}
	if err := rs.Add(bfd.Config{Peer: box, Local: router, DetectMultiplier: 5, MinRx: 50 * time.Millisecond, MinTx: 50 * time.Millisecond}, nil); err != nil {
		t.Fatal(err)
	}

	resets := make(chan netip.Addr, 4)
	start := func() *bfdSessions {
		b, err := newBFDSessions(log, bfd.Options{Port: port, ListenAddr: box}, func(a netip.Addr) { resets <- a })
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	peers := func(c config.BFD) []config.BGPPeer {
		return []config.BGPPeer{{Address: router, BFD: c}, {Address: netip.MustParseAddr("127.0.0.3")}}
	}
	waitUp := func(b *bfdSessions) BFDStatus {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := b.status()
			if s, ok := st[router]; ok && s.State == bfdUp {
				if len(st) != 1 {
					t.Errorf("sessions %v, want only the peer with BFD", st)
				}
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("BFD with %s not up after 10s: %+v", router, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	b := start()
	if _, err := b.set(peers(timers), nil); err != nil {
		t.Fatal(err)
	}
	if st := waitUp(b); st.DetectMultiplier != 5 || st.MinTxInterval != 50*time.Millisecond || st.Transitions[bfdUp] != 1 {
		t.Errorf("status %+v", st)
	}

	// Changed timers: the session starts afresh (the router sees it go
	// down and come back), and a session that goes down from Up resets
	// the BGP session.
	slower := timers
	slower.MinRxInterval = 60 * time.Millisecond
	if _, err := b.set(peers(slower), nil); err != nil {
		t.Fatal(err)
	}
	waitUp(b)
	select {
	case a := <-resets:
		if a != router {
			t.Errorf("reset %s, want %s", a, router)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("BFD went down without a BGP reset")
	}

	// A planned restart: hand over, wait less than the detection time,
	// resume in a new set of sessions. The router must see nothing.
	waitUp(b)
	// The router's side of the restarted session must be up, and its
	// notifications delivered, before the handover is watched.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		last := ""
		if len(routerSaw) > 0 {
			last = routerSaw[len(routerSaw)-1]
		}
		mu.Unlock()
		if rs.Status()[box].State == bfd.Up && strings.HasSuffix(last, "->up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's session not up after the restart: %+v, saw %q", rs.Status()[box], last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	routerSaw = nil
	mu.Unlock()
	saved := b.srv.Handoff()
	if len(saved) != 1 {
		t.Fatalf("handed over %+v, want the session", saved)
	}
	time.Sleep(100 * time.Millisecond)
	b2 := start()
	defer b2.srv.Close()
	resumed, err := b2.set(peers(slower), map[netip.Addr]bfd.Saved{router: saved[0]})
	if err != nil || len(resumed) != 1 || resumed[0] != router {
		t.Fatalf("resumed %v, %v; want %s", resumed, err, router)
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	saw := routerSaw
	mu.Unlock()
	if len(saw) != 0 {
		t.Errorf("the router saw %v across the handover, want nothing", saw)
	}
	if st := b2.status()[router]; st.State != bfdUp {
		t.Errorf("resumed session %+v, want up", st)
	}

	// Removed from the configuration: no session.
	if _, err := b2.set(nil, nil); err != nil {
		t.Fatal(err)
	}
	if st := b2.status(); len(st) != 0 {
		t.Errorf("sessions after the peer went: %v", st)
	}
}

// freeUDPPort returns a UDP port free on both addresses when called.
func freeUDPPort(t *testing.T, a, b netip.Addr) int {
	t.Helper()
	for range 20 {
		la, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
		if err != nil {
			t.Fatal(err)
		}
		port := la.LocalAddr().(*net.UDPAddr).Port
		lb, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b, uint16(port))))
		la.Close()
		if err == nil {
			lb.Close()
			return port
		}
	}
	t.Fatalf("no UDP port free on both %s and %s", a, b)
	return 0
}
