// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// patience bounds every wait in these tests. It is generous on purpose:
// the tests check what happens, never how fast.
const patience = 10 * time.Second

func addrPort(t *testing.T, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatalf("parse %s: %v", a, err)
	}
	return ap
}

// tcpServer is a TCP listener a test can close and reopen on the same port,
// standing for a backend whose server dies and comes back.
type tcpServer struct {
	t    *testing.T
	addr netip.AddrPort
	mu   sync.Mutex
	ln   net.Listener
	wg   sync.WaitGroup
	// peers records the remote address of every accepted connection.
	peers chan netip.AddrPort
}

func newTCPServer(t *testing.T) *tcpServer {
	t.Helper()
	s := &tcpServer{t: t, peers: make(chan netip.AddrPort, 1024)}
	s.open("127.0.0.1:0")
	t.Cleanup(s.close)
	return s
}

func (s *tcpServer) open(addr string) {
	s.t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Fatalf("listen on %s: %v", addr, err)
	}
	s.mu.Lock()
	s.ln = ln
	s.addr = addrPort(s.t, ln.Addr())
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case s.peers <- addrPort(s.t, c.RemoteAddr()):
			default:
			}
			_ = c.Close()
		}
	}()
}

func (s *tcpServer) reopen() { s.open(s.addr.String()) }

func (s *tcpServer) close() {
	s.mu.Lock()
	ln := s.ln
	s.ln = nil
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	s.wg.Wait()
}

// freePort returns a loopback address with nothing listening on it (for
// network "tcp" or "udp").
func freePort(t *testing.T, network string) netip.AddrPort {
	t.Helper()
	switch network {
	case "udp":
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return addrPort(t, c.LocalAddr())
	default:
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return addrPort(t, ln.Addr())
	}
}

// seenRequest is what the HTTP test server saw of a probe.
type seenRequest struct {
	Host, Path, UserAgent string
}

// httpServer answers /status/NNN with NNN, /hang by waiting until the probe
// gives up, and anything else with the status set by setStatus (200 at
// first).
type httpServer struct {
	addr   netip.AddrPort
	mu     sync.Mutex
	status int
	seen   chan seenRequest
}

func newHTTPServer(t *testing.T) *httpServer {
	t.Helper()
	s := &httpServer{status: http.StatusOK, seen: make(chan seenRequest, 1024)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.seen <- seenRequest{Host: r.Host, Path: r.URL.RequestURI(), UserAgent: r.UserAgent()}:
		default:
		}
		switch {
		case r.URL.Path == "/hang":
			<-r.Context().Done()
			return
		case r.URL.Path == "/redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusMovedPermanently)
			return
		case strings.HasPrefix(r.URL.Path, "/status/"):
			code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(code)
			return
		}
		s.mu.Lock()
		code := s.status
		s.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	s.addr = addrPort(t, srv.Listener.Addr())
	return s
}

func (s *httpServer) setStatus(code int) {
	s.mu.Lock()
	s.status = code
	s.mu.Unlock()
}

// udpServer is a UDP socket that echoes every datagram with a prefix, or
// stays silent while muted.
type udpServer struct {
	addr netip.AddrPort
	mute atomic.Bool
}

func newUDPServer(t *testing.T, prefix string, silent bool) *udpServer {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &udpServer{addr: addrPort(t, c.LocalAddr())}
	s.mute.Store(silent)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if !s.mute.Load() {
				_, _ = c.WriteTo(append([]byte(prefix), buf[:n]...), from)
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.Close()
		wg.Wait()
	})
	return s
}

// waitFor polls cond until it holds or patience runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// nextEvent returns the next event of m or fails the test.
func nextEvent(t *testing.T, m *Manager) Event {
	t.Helper()
	select {
	case e, ok := <-m.Events():
		if !ok {
			t.Fatal("events channel closed")
		}
		return e
	case <-time.After(patience):
		t.Fatal("no health event")
	}
	return Event{}
}

// probeCtx is the context of a probe run directly in a test.
func probeCtx(t *testing.T, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}
