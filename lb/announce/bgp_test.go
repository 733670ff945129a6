// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/bird"
	"github.com/l4lb/l4lb/lb/config"
)

// freePort asks the kernel for a free TCP port on loopback.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// loopbackRouter runs BIRD as AS 65000 on 127.0.0.1:port, waiting for a
// session from AS 65001 and keeping what it learns in its tables only (no
// kernel protocol: the test's own routing table is never touched).
func loopbackRouter(t *testing.T, port int) *bird.Router { return loopbackRouterWith(t, port, "") }

// loopbackRouterWith is loopbackRouter with more options for protocol lb.
func loopbackRouterWith(t *testing.T, port int, extra string) *bird.Router {
	dir := t.TempDir()
	conf := fmt.Sprintf(`
router id 192.0.2.1;
log "%s/bird.log" all;
protocol device {}
# Recursive next hops of the multihop session resolve through these.
protocol static s4 { ipv4; route 127.0.0.1/32 via "lo"; }
protocol static s6 { ipv6; route 2001:db8::/64 via "lo"; }
protocol bgp lb {
	local 127.0.0.1 port %d as 65000;
	neighbor 127.0.0.1 as 65001;
	passive on;
	multihop;
	hold time 3;
	keepalive time 1;
	graceful restart on;
	ipv4 { import all; export none; };
	ipv6 { import all; export none; };
	%s
}
`, dir, port, extra)
	return bird.Start(t, dir, nil, conf)
}

func speakerConfig(port int) *config.BGP {
	return &config.BGP{
		ASN:              65001,
		RouterID:         netip.MustParseAddr("192.0.2.2"),
		NextHop6:         netip.MustParseAddr("2001:db8::2"),
		Communities:      []config.Community{65001<<16 | 100},
		LargeCommunities: []config.LargeCommunity{{Global: 65001, Local1: 1, Local2: 2}},
		MinHealthy:       1,
		GracefulRestart:  true,
		RestartTime:      60 * time.Second,
		DrainTime:        100 * time.Millisecond,
		Peers: []config.BGPPeer{{
			Address: netip.MustParseAddr("127.0.0.1"), ASN: 65000, Port: uint16(port),
			HoldTime: 3 * time.Second, Keepalive: time.Second, ConnectRetry: time.Second,
			Multihop: 2, IPv4: true, IPv6: true,
		}},
	}
}

// waitRoutes polls BIRD until its table (from protocol lb) satisfies ok.
func waitRoutes(t *testing.T, r *bird.Router, what string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var out string
	for time.Now().Before(deadline) {
		out, _ = r.Show("show", "route", "all", "protocol", "lb")
		if ok(out) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
	proto, _ := r.Show("show", "protocols", "all", "lb")
	t.Fatalf("BIRD never had %s; routes:\n%s\nprotocol:\n%s\n%s", what, out, proto, r.Logs())
	return ""
}

func has(subs ...string) func(string) bool {
	return func(out string) bool {
		for _, s := range subs {
			if !strings.Contains(out, s) {
				return false
			}
		}
		return true
	}
}

func lacks(sub string) func(string) bool {
	return func(out string) bool { return !strings.Contains(out, sub) }
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestSpeakerAgainstBIRD announces and withdraws VIPs of both families to a
// real BIRD with communities, and checks graceful restart is negotiated.
func TestSpeakerAgainstBIRD(t *testing.T) {
	port := freePort(t)
	r := loopbackRouter(t, port)
	s, err := NewSpeaker(speakerConfig(port), SpeakerOptions{Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(config.StopDrain, 0)

	v4, v6 := netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("2001:db8:100::10")
	if err := s.Set([]netip.Addr{v4, v6}); err != nil {
		t.Fatal(err)
	}
	out := waitRoutes(t, r, "both VIPs", has("198.51.100.10/32", "2001:db8:100::10/128"))
	for _, want := range []string{"(65001,100)", "(65001, 1, 2)", "BGP.next_hop: 2001:db8::2", "BGP.as_path: 65001"} {
		if !strings.Contains(out, want) {
			t.Errorf("BIRD's routes lack %q:\n%s", want, out)
		}
	}
	proto, _ := r.Show("show", "protocols", "all", "lb")
	if !strings.Contains(proto, "Graceful restart") {
		t.Errorf("graceful restart not negotiated:\n%s", proto)
	}
	st := s.Status()
	if len(st.Peers) != 1 || !st.Peers[0].Up || !st.Peers[0].GracefulRestart || st.Peers[0].UpdatesSent == 0 {
		t.Errorf("status = %+v, want one established peer with graceful restart and updates sent", st)
	}
	if len(st.Announced) != 2 {
		t.Errorf("announced = %v, want both VIPs", st.Announced)
	}

	// Withdrawing one keeps the other.
	if err := s.Set([]netip.Addr{v6}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, r, "only the IPv6 VIP", func(out string) bool {
		return lacks("198.51.100.10/32")(out) && strings.Contains(out, "2001:db8:100::10/128")
	})

	// A reload with other communities re-announces with them.
	cfg := speakerConfig(port)
	cfg.Communities = []config.Community{65001<<16 | 200}
	if restart, err := s.Reconfigure(cfg); err != nil || len(restart) != 0 {
		t.Fatalf("Reconfigure = %v, %v", restart, err)
	}
	waitRoutes(t, r, "the new community", has("(65001,200)"))
}

// TestSpeakerPassword: with a TCP-MD5 key on both sides the session comes
// up; BIRD drops every segment that does not carry it, so this proves the
// speaker signs them.
func TestSpeakerPassword(t *testing.T) {
	port := freePort(t)
	r := loopbackRouterWith(t, port, `password "l4lb-test-key";`)
	cfg := speakerConfig(port)
	cfg.Peers[0].Password = "l4lb-test-key"
	s, err := NewSpeaker(cfg, SpeakerOptions{Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(config.StopDrain, 0)
	if err := s.Set([]netip.Addr{netip.MustParseAddr("198.51.100.10")}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, r, "the VIP over the signed session", has("198.51.100.10/32"))
}

// TestSpeakerStop checks the two ways of stopping: drain withdraws before
// closing, keep closes without a NOTIFICATION so BIRD keeps the routes
// as stale (graceful restart helper).
func TestSpeakerStop(t *testing.T) {
	v4 := netip.MustParseAddr("198.51.100.10")
	for _, tt := range []struct {
		action config.StopAction
		// check runs once the session is down; port is the router's.
		check func(t *testing.T, r *bird.Router, port int)
	}{
		{config.StopDrain, func(t *testing.T, r *bird.Router, _ int) {
			waitRoutes(t, r, "the withdrawal", lacks("198.51.100.10/32"))
		}},
		{config.StopKeep, func(t *testing.T, r *bird.Router, port int) {
			// BIRD marks the kept routes stale while it waits for the
			// restart; they stay in its table.
			out := waitRoutes(t, r, "the stale route", has("198.51.100.10/32"))
			proto, _ := r.Show("show", "protocols", "all", "lb")
			if !strings.Contains(proto, "Neighbor graceful restart active") {
				t.Fatalf("BIRD is not helping a graceful restart:\n%s\n%s", proto, out)
			}
			// The next l4lbd comes back restarting and announces again:
			// BIRD ends the restart with the route in place.
			s2, err := NewSpeaker(speakerConfig(port), SpeakerOptions{Log: testLog(t), Restarting: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Stop(config.StopDrain, 0)
			if err := s2.Set([]netip.Addr{netip.MustParseAddr("198.51.100.10")}); err != nil {
				t.Fatal(err)
			}
			waitProto(t, r, func(p string) bool {
				return strings.Contains(p, "Established") && !strings.Contains(p, "graceful restart active")
			})
			waitRoutes(t, r, "the route after the restart", has("198.51.100.10/32"))
		}},
	} {
		t.Run(tt.action.String(), func(t *testing.T) {
			port := freePort(t)
			r := loopbackRouter(t, port)
			s, err := NewSpeaker(speakerConfig(port), SpeakerOptions{Log: testLog(t)})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Set([]netip.Addr{v4}); err != nil {
				t.Fatal(err)
			}
			waitRoutes(t, r, "the VIP", has("198.51.100.10/32"))
			s.Stop(tt.action, 50*time.Millisecond)
			waitProto(t, r, func(p string) bool { return !strings.Contains(p, "Established") })
			tt.check(t, r, port)
		})
	}
}

func waitProto(t *testing.T, r *bird.Router, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, _ := r.Show("show", "protocols", "all", "lb")
		if ok(p) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p, _ := r.Show("show", "protocols", "all", "lb")
	t.Fatalf("BGP protocol never reached the state:\n%s", p)
}
