// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
)

func TestNewChecker(t *testing.T) {
	tests := []struct {
		hc      lb.HealthCheck
		want    Checker
		wantErr string
	}{
		{hc: lb.HealthCheck{}, want: None{}},
		{hc: lb.HealthCheck{Type: lb.HealthTCP, Port: 8080}, want: TCP{}},
		{hc: lb.HealthCheck{Type: lb.HealthHTTP, Path: "/healthz", ExpectStatus: 204}, want: HTTP{Path: "/healthz", ExpectStatus: 204}},
		{hc: lb.HealthCheck{Type: lb.HealthUDP, Send: "ping", Expect: "pong"}, want: UDP{Send: "ping", Expect: "pong"}},
		{hc: lb.HealthCheck{Type: 42}, wantErr: "health-42 is not known"},
	}
	for _, tt := range tests {
		t.Run(tt.hc.Type.String(), func(t *testing.T) {
			got, err := NewChecker(tt.hc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewChecker(%+v) error = %v, want one containing %q", tt.hc, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("NewChecker(%+v) (-want +got):\n%s", tt.hc, diff)
			}
		})
	}
}

func TestTargets(t *testing.T) {
	svc := lb.Service{
		Name:     "web",
		Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80, Proto: lb.TCP},
		Health:   lb.HealthCheck{Type: lb.HealthHTTP},
	}
	withPort := svc
	withPort.Health.Port = 8081
	v6 := svc
	v6.Frontend.Addr = netip.MustParseAddr("2001:db8::10")
	b := lb.Backend{Addr: netip.MustParseAddrPort("10.1.0.11:30080")}
	b6 := lb.Backend{Addr: netip.MustParseAddrPort("[2001:db8:1::11]:30080")}

	tests := []struct {
		name string
		got  Target
		want Target
	}{
		{"direct", Direct(svc, b), Target{Addr: b.Addr, Host: "10.0.0.10:80"}},
		{"direct with port override", Direct(withPort, b), Target{Addr: netip.MustParseAddrPort("10.1.0.11:8081"), Host: "10.0.0.10:80"}},
		{"direct v6", Direct(v6, b6), Target{Addr: b6.Addr, Host: "[2001:db8::10]:80"}},
		{"through vip", ThroughVIP(svc, 0x4c420007), Target{Addr: netip.MustParseAddrPort("10.0.0.10:80"), Mark: 0x4c420007, Host: "10.0.0.10:80"}},
		{"through vip with port override", ThroughVIP(withPort, 1), Target{Addr: netip.MustParseAddrPort("10.0.0.10:8081"), Mark: 1, Host: "10.0.0.10:80"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %+v, want %+v", tt.got, tt.want)
			}
		})
	}
	if got, want := (Target{Addr: b.Addr, Mark: 0x10, Local: netip.MustParseAddr("10.0.0.2")}).String(), "10.1.0.11:30080 mark 0x10 from 10.0.0.2"; got != want {
		t.Errorf("Target.String() = %q, want %q", got, want)
	}
}

func TestTCPCheck(t *testing.T) {
	srv := newTCPServer(t)
	closed := freePort(t, "tcp")
	tests := []struct {
		name    string
		target  Target
		wantErr string
	}{
		{"listening", Target{Addr: srv.addr}, ""},
		{"nothing listening", Target{Addr: closed}, "connection refused"},
		{"empty target", Target{}, "no address to dial"},
		{"family mismatch", Target{Addr: srv.addr, Local: netip.MustParseAddr("::1")}, "another address family"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := TCP{}.Check(probeCtx(t, patience), tt.target)
			checkErr(t, err, tt.wantErr)
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("check failed: %v", err)
	case want != "" && err == nil:
		t.Fatalf("check succeeded, want an error containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("check error %q does not contain %q", err, want)
	}
}

func TestLocalAddress(t *testing.T) {
	srv := newTCPServer(t)
	local := netip.MustParseAddr("127.0.0.2")
	if err := (TCP{}).Check(probeCtx(t, patience), Target{Addr: srv.addr, Local: local}); err != nil {
		t.Fatalf("probe from %s: %v", local, err)
	}
	select {
	case peer := <-srv.peers:
		if peer.Addr() != local {
			t.Errorf("server saw the probe from %s, want %s", peer.Addr(), local)
		}
	case <-time.After(patience):
		t.Fatal("server saw no connection")
	}
}

func TestHTTPCheck(t *testing.T) {
	srv := newHTTPServer(t)
	tests := []struct {
		name    string
		check   HTTP
		host    string
		wantErr string
	}{
		{name: "200 by default", check: HTTP{Path: "/status/200"}},
		{name: "empty path is /", check: HTTP{}},
		{name: "503 is not 200", check: HTTP{Path: "/status/503"}, wantErr: `answered "503 Service Unavailable", want status 200`},
		{name: "expected 204", check: HTTP{Path: "/status/204", ExpectStatus: 204}},
		{name: "200 is not the expected 204", check: HTTP{Path: "/status/200", ExpectStatus: 204}, wantErr: "want status 204"},
		{name: "redirect not followed", check: HTTP{Path: "/redirect"}, wantErr: `answered "301 Moved Permanently"`},
		{name: "redirect expected", check: HTTP{Path: "/redirect", ExpectStatus: 301}},
		{name: "query kept", check: HTTP{Path: "/status/200?full=1"}},
		{name: "host header", check: HTTP{Path: "/status/200"}, host: "10.0.0.10:80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for len(srv.seen) > 0 {
				<-srv.seen
			}
			err := tt.check.Check(probeCtx(t, patience), Target{Addr: srv.addr, Host: tt.host})
			checkErr(t, err, tt.wantErr)
			got := <-srv.seen
			want := seenRequest{Host: tt.host, Path: tt.check.Path, UserAgent: "l4lb-health-check"}
			if want.Host == "" {
				want.Host = srv.addr.String()
			}
			if want.Path == "" {
				want.Path = "/"
			}
			if got != want {
				t.Errorf("server saw %+v, want %+v", got, want)
			}
		})
	}
}

func TestHTTPCheckTimeout(t *testing.T) {
	srv := newHTTPServer(t)
	err := HTTP{Path: "/hang"}.Check(probeCtx(t, 30*time.Millisecond), Target{Addr: srv.addr})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("probe of a hanging server: %v, want a deadline exceeded error", err)
	}
}

func TestHTTPCheckCancel(t *testing.T) {
	srv := newHTTPServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- HTTP{Path: "/hang"}.Check(ctx, Target{Addr: srv.addr}) }()
	<-srv.seen
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("cancelled probe succeeded")
		}
	case <-time.After(patience):
		t.Fatal("probe did not end when cancelled")
	}
}

func TestUDPCheck(t *testing.T) {
	echo := newUDPServer(t, "re:", false)
	silent := newUDPServer(t, "", true)
	closed := freePort(t, "udp")
	tests := []struct {
		name    string
		check   UDP
		addr    netip.AddrPort
		wantErr string
	}{
		{name: "echo, reply expected", check: UDP{Send: "ping", Expect: "re:ping"}, addr: echo.addr},
		{name: "echo, wrong reply", check: UDP{Send: "ping", Expect: "pong"}, addr: echo.addr, wantErr: `the reply from ` + echo.addr.String() + ` ("re:ping") does not contain "pong"`},
		{name: "echo, empty datagram, expect the prefix", check: UDP{Expect: "re:"}, addr: echo.addr},
		{name: "echo, nothing expected", check: UDP{}, addr: echo.addr},
		{name: "silent, reply expected", check: UDP{Send: "ping", Expect: "ping"}, addr: silent.addr, wantErr: "no reply from"},
		// The limit of a UDP check with nothing to expect: a server that
		// never answers looks healthy.
		{name: "silent, nothing expected", check: UDP{Send: "ping"}, addr: silent.addr},
		{name: "closed port, nothing expected", check: UDP{}, addr: closed, wantErr: "ICMP port unreachable"},
		{name: "closed port, reply expected", check: UDP{Send: "ping", Expect: "ping"}, addr: closed, wantErr: "ICMP port unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check.Check(probeCtx(t, 100*time.Millisecond), Target{Addr: tt.addr})
			checkErr(t, err, tt.wantErr)
		})
	}
}

func TestUDPCheckWithoutDeadline(t *testing.T) {
	silent := newUDPServer(t, "", true)
	done := make(chan error, 1)
	go func() { done <- UDP{}.Check(context.Background(), Target{Addr: silent.addr}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("silent backend, nothing expected: %v", err)
		}
	case <-time.After(patience):
		t.Fatal("a UDP probe without a deadline did not end")
	}
}

func TestNoneCheck(t *testing.T) {
	if err := (None{}).Check(context.Background(), Target{}); err != nil {
		t.Fatal(err)
	}
}
