// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func TestServeAnswersMetrics(t *testing.T) {
	reg := NewRegistry(&fakeSource{snap: smallSnapshot()}, NewRecorder(), "v1.2.3")
	s, err := Listen([]string{"127.0.0.1:0", "[::1]:0"}, reg, nil)
	if err != nil {
		// Hosts without IPv6 on loopback still test IPv4.
		if s, err = Listen([]string{"127.0.0.1:0"}, reg, nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()

	for _, a := range s.Addrs() {
		base := "http://" + a.String()
		code, body := get(t, base+Path)
		if code != http.StatusOK {
			t.Fatalf("%s%s: status %d: %s", base, Path, code, body)
		}
		for _, want := range []string{
			`l4lb_build_info{goversion="go`,
			`l4lb_service_packets_total{service="web"} 100`,
			`l4lb_config_reloads_total{result="success"} 0`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s%s lacks %q", base, Path, want)
			}
		}
		if code, _ := get(t, base+"/other"); code != http.StatusNotFound {
			t.Errorf("%s/other: status %d, want 404", base, code)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(ShutdownTimeout + 5*time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	for _, a := range s.Addrs() {
		if c, err := net.Dial("tcp", a.String()); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after shutdown", a)
		}
	}
}

// TestServePartialFailure checks that a snapshot error still serves the
// other series (and is counted) rather than failing the whole scrape.
func TestServePartialFailure(t *testing.T) {
	snap := smallSnapshot()
	snap.Errors = []error{errors.New("read conntrack: permission denied")}
	reg := NewRegistry(SourceFunc(func() Snapshot { return snap }), nil, "v1")
	s, err := Listen([]string{"127.0.0.1:0"}, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Serve(ctx) }()
	url := "http://" + s.Addrs()[0].String() + Path
	code, body := get(t, url)
	if code != http.StatusOK || !strings.Contains(body, "l4lb_conntrack_entries 12") {
		t.Fatalf("status %d, want 200 with the other series; body:\n%s", code, body)
	}
	_, body = get(t, url)
	if !strings.Contains(body, `promhttp_metric_handler_errors_total{cause="gathering"} 1`) {
		t.Error("the gathering error was not counted in promhttp_metric_handler_errors_total")
	}
}

func TestListenErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	tests := []struct {
		name  string
		addrs []string
		want  []string
	}{
		{"port in use", []string{busy.Addr().String()}, []string{busy.Addr().String(), "another process uses this port"}},
		{"not host:port", []string{"127.0.0.1"}, []string{`"127.0.0.1" is not host:port`}},
		{"address not on this host", []string{"192.0.2.1:9842"}, []string{"192.0.2.1:9842", "not configured on any interface"}},
		{"listed twice", []string{"127.0.0.1:0", "127.0.0.1:0"}, []string{"listed twice"}},
		// The good first address must be released when the second fails.
		{"second fails", []string{freeAddr, busy.Addr().String()}, []string{busy.Addr().String()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "address not on this host" && nonlocalBind() {
				t.Skip("net.ipv4.ip_nonlocal_bind is set: any address can be bound")
			}
			s, err := Listen(tt.addrs, NewRegistry(&fakeSource{}, nil, "v1"), nil)
			if err == nil {
				s.closeListeners()
				t.Fatalf("Listen(%v) succeeded", tt.addrs)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if s, err := Listen([]string{"127.0.0.1:0"}, nil, nil); err == nil || !strings.Contains(err.Error(), "registry") {
		if s != nil {
			s.closeListeners()
		}
		t.Errorf("Listen without a registry: %v, want an error naming the registry", err)
	}
	ln, err := net.Listen("tcp", freeAddr)
	if err != nil {
		t.Errorf("%s still bound after a failed Listen: %v", freeAddr, err)
	} else {
		ln.Close()
	}
}

func TestServeNoAddresses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, nil, NewRegistry(&fakeSource{}, nil, "v1"), nil) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve with no addresses did not return")
	}
}

func nonlocalBind() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_nonlocal_bind")
	return err == nil && strings.TrimSpace(string(b)) != "0"
}
