// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Two loopback addresses: Linux routes all of 127/8 to lo, so two servers
// can listen on the same port, one on each.
var (
	addrA = netip.MustParseAddr("127.0.0.1")
	addrB = netip.MustParseAddr("127.0.0.2")
)

// Test timers: fast enough for the tests to take seconds, and with a
// detection time (5 × 50 ms) that a loaded machine running -race does not
// trip over.
const (
	testInterval = 50 * time.Millisecond
	testMult     = 5
)

// testConfig is a session from local to peer with the test timers.
func testConfig(local, peer netip.Addr, mult uint8) Config {
	return Config{Peer: peer, Local: local, DetectMultiplier: mult, MinRx: testInterval, MinTx: testInterval}
}

// freePort returns a UDP port free on both test addresses at the time of
// the call.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		a, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrA, 0)))
		if err != nil {
			t.Fatal(err)
		}
		port := a.LocalAddr().(*net.UDPAddr).Port
		b, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrB, uint16(port))))
		a.Close()
		if err == nil {
			b.Close()
			return port
		}
	}
	t.Fatal("no UDP port free on both 127.0.0.1 and 127.0.0.2")
	return 0
}

// recorder keeps the state changes a server notifies.
type recorder struct {
	mu      sync.Mutex
	changes []string
}

func (r *recorder) notify(peer netip.Addr, from, to State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, fmt.Sprintf("%s %s->%s", peer, from, to))
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.changes...)
}

// newServer starts a server listening on addr:port and closes it at the
// end of the test.
func newServer(t *testing.T, addr netip.Addr, port int) (*Server, *recorder) {
	t.Helper()
	r := &recorder{}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s, err := NewServer(Options{Port: port, ListenAddr: addr, Logger: log}, r.notify)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, r
}

// testWriter sends a server's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// upPair starts servers on addrA and addrB with a session to each other,
// and waits for both to come Up.
func upPair(t *testing.T, mult uint8) (a, b *Server, ra, rb *recorder, port int) {
	t.Helper()
	port = freePort(t)
	a, ra = newServer(t, addrA, port)
	b, rb = newServer(t, addrB, port)
	if err := a.Add(testConfig(addrA, addrB, mult), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(testConfig(addrB, addrA, mult), nil); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, addrB, Up)
	waitState(t, b, addrA, Up)
	// notify runs after Status shows Up: wait until both were told, so
	// that a test counting notifications from here counts only its own.
	for _, r := range []*recorder{ra, rb} {
		waitFor(t, "the notification up", func() bool {
			got := r.get()
			return len(got) > 0 && strings.HasSuffix(got[len(got)-1], "->up")
		})
	}
	return a, b, ra, rb, port
}

// waitFor polls cond until it holds, failing the test after a timeout
// long enough for a loaded machine: the tests bound nothing tightly.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitState waits until s's session with peer is in state want.
func waitState(t *testing.T, s *Server, peer netip.Addr, want State) Status {
	t.Helper()
	var st Status
	waitFor(t, fmt.Sprintf("session with %s %s", peer, want), func() bool {
		st = s.Status()[peer]
		return st.State == want
	})
	return st
}

// inForce returns the transmit interval s's session with peer acts on,
// and whether a Poll sequence is in progress.
func (s *Server) inForce(peer netip.Addr) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byPeer[peerKey(peer)]
	if ss == nil {
		return 0, false
	}
	return ss.txInForce, ss.polling
}

// srcPortOf returns the source port of s's session with peer.
func (s *Server) srcPortOf(peer netip.Addr) uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byPeer[peerKey(peer)].srcPort
}

// checkNoLeak fails the test if a goroutine of a server outlives it, after
// a short grace for goroutines that are returning. Called first in a test,
// it checks after every other cleanup, the servers' Close included.
func checkNoLeak(t *testing.T) {
	t.Cleanup(func() { noLeak(t) })
}

func noLeak(t *testing.T) {
	var stacks string
	for range 100 {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "bfd.(*Server)") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("server goroutines left after Close:\n%s", stacks)
}

// fakePeer is a plain UDP socket on src sending with the given TTL: a peer
// that the tests control packet by packet.
func fakePeer(t *testing.T, src netip.Addr, ttl int) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := sockopts(rc, func(fd int) error { return unix.SetsockoptInt(fd, syscall.IPPROTO_IP, unix.IP_TTL, ttl) }); err != nil {
		t.Fatal(err)
	}
	return c
}

// validPacket is a packet every receiver accepts from its peer: state Down,
// not yet knowing our discriminator.
func validPacket() packet {
	return packet{
		version:    1,
		state:      Down,
		detectMult: 3,
		length:     packetLen,
		myDiscr:    0x0a0b0c0d,
		minTx:      micros(time.Second),
		minRx:      micros(testInterval),
	}
}
