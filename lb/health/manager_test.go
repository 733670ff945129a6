// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb"
)

// quick is a check fast enough for tests: probes every 10 ms.
func quick(typ lb.HealthType, rise, fall int) lb.HealthCheck {
	return lb.HealthCheck{Type: typ, Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: rise, Fall: fall}
}

func service(name string, hc lb.HealthCheck, backends ...netip.AddrPort) lb.Service {
	s := lb.Service{
		Name:     name,
		Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80, Proto: lb.TCP},
		Health:   hc,
	}
	for _, b := range backends {
		s.Backends = append(s.Backends, lb.Backend{Addr: b, Weight: 1})
	}
	return s
}

func newManager(t *testing.T, opts Options) *Manager {
	t.Helper()
	m := New(opts)
	t.Cleanup(m.Stop)
	return m
}

// script is a Checker whose results are given in advance; the last one
// repeats. Failures name their probe, so a test can tell which probe
// decided.
type script struct {
	mu      sync.Mutex
	results []bool
	n       int
}

func (s *script) Check(context.Context, Target) error {
	s.mu.Lock()
	i := s.n
	s.n++
	s.mu.Unlock()
	if s.results[min(i, len(s.results)-1)] {
		return nil
	}
	return fmt.Errorf("probe %d failed", i+1)
}

func (s *script) probes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func TestManagerRiseFall(t *testing.T) {
	const ok, bad = true, false
	sc := &script{results: []bool{ok, bad, bad, ok, bad, bad, bad, ok, ok}}
	m := newManager(t, Options{NewChecker: func(lb.HealthCheck) (Checker, error) { return sc, nil }})
	b := netip.MustParseAddrPort("10.1.0.11:30080")
	m.Update([]lb.Service{service("web", quick(lb.HealthTCP, 2, 3), b)}, nil)

	e := nextEvent(t, m)
	want := Event{Service: "web", Backend: b, State: Down, Reason: "3 consecutive failed checks (fall 3): probe 7 failed", Time: e.Time}
	if e != want {
		t.Fatalf("first event %+v, want %+v", e, want)
	}
	e = nextEvent(t, m)
	want = Event{Service: "web", Backend: b, State: Up, Reason: "2 consecutive successful checks (rise 2)", Time: e.Time}
	if e != want {
		t.Fatalf("second event %+v, want %+v", e, want)
	}
	waitFor(t, "more probes", func() bool { return sc.probes() > 12 })
	st := m.States()[Key{Service: "web", Backend: b}]
	if st.State != Up || st.Successes < 2 || st.Failures != 0 || st.LastError != "" || st.Transitions != 2 || !st.LastChange.Equal(e.Time) {
		t.Errorf("status after rising: %+v", st)
	}
	if !m.Up("web", b) {
		t.Error("Up says down for a backend that rose")
	}
	select {
	case e := <-m.Events():
		t.Errorf("unexpected event %+v", e)
	default:
	}
}

// TestManagerRealBackends kills and restores real servers of each check
// kind: the backend must go down and come back.
func TestManagerRealBackends(t *testing.T) {
	tcp := newTCPServer(t)
	web := newHTTPServer(t)
	echo := newUDPServer(t, "", false)
	udpCheck := quick(lb.HealthUDP, 2, 2)
	udpCheck.Send, udpCheck.Expect = "ping", "ping"
	httpCheck := quick(lb.HealthHTTP, 2, 2)
	httpCheck.Path = "/"

	tests := []struct {
		name       string
		check      lb.HealthCheck
		addr       netip.AddrPort
		kill, heal func()
		reason     string
	}{
		{"tcp", quick(lb.HealthTCP, 2, 2), tcp.addr, tcp.close, tcp.reopen, "connection refused"},
		{"http", httpCheck, web.addr, func() { web.setStatus(503) }, func() { web.setStatus(200) }, `answered "503 Service Unavailable"`},
		{"udp", udpCheck, echo.addr, func() { echo.mute.Store(true) }, func() { echo.mute.Store(false) }, "no reply from"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newManager(t, Options{Initial: Down})
			m.Update([]lb.Service{service("svc", tt.check, tt.addr)}, nil)
			if m.Up("svc", tt.addr) {
				t.Fatal("backend up before any probe, with Initial Down")
			}
			for _, phase := range []struct {
				do     func()
				state  State
				reason string
			}{
				{nil, Up, "2 consecutive successful checks (rise 2)"},
				{tt.kill, Down, tt.reason},
				{tt.heal, Up, "2 consecutive successful checks (rise 2)"},
			} {
				if phase.do != nil {
					phase.do()
				}
				e := nextEvent(t, m)
				if e.State != phase.state || !strings.Contains(e.Reason, phase.reason) {
					t.Fatalf("event %+v, want state %s with a reason containing %q", e, phase.state, phase.reason)
				}
				if got := m.Up("svc", tt.addr); got != (phase.state == Up) {
					t.Fatalf("Up = %v after the event %+v", got, e)
				}
			}
		})
	}
}

func TestManagerTimeout(t *testing.T) {
	web := newHTTPServer(t)
	hc := lb.HealthCheck{Type: lb.HealthHTTP, Path: "/hang", Interval: 40 * time.Millisecond, Timeout: 20 * time.Millisecond, Rise: 1, Fall: 1}
	m := newManager(t, Options{})
	m.Update([]lb.Service{service("svc", hc, web.addr)}, nil)
	e := nextEvent(t, m)
	if e.State != Down || !strings.Contains(e.Reason, "context deadline exceeded") {
		t.Fatalf("event %+v, want down for a timeout", e)
	}
	if st := m.States()[Key{"svc", web.addr}]; !strings.Contains(st.LastError, "deadline exceeded") {
		t.Errorf("last error %q, want a timeout", st.LastError)
	}
}

func TestManagerInitialState(t *testing.T) {
	never := &script{results: []bool{false}}
	b := netip.MustParseAddrPort("10.1.0.11:30080")
	slow := lb.HealthCheck{Type: lb.HealthTCP, Interval: time.Hour, Rise: 1, Fall: 1}
	for _, initial := range []State{Up, Down} {
		m := newManager(t, Options{Initial: initial, NewChecker: func(lb.HealthCheck) (Checker, error) { return never, nil }})
		m.Update([]lb.Service{service("web", slow, b), service("plain", lb.HealthCheck{}, b)}, nil)
		if got := m.Up("web", b); got != (initial == Up) {
			t.Errorf("Initial %s: Up = %v before the first probe", initial, got)
		}
		if !m.Up("plain", b) {
			t.Errorf("Initial %s: an unchecked backend is down", initial)
		}
		if !m.Up("unknown", b) {
			t.Errorf("Initial %s: a backend unknown to the manager is down", initial)
		}
		st := m.States()
		if len(st) != 1 || st[Key{"web", b}].State != initial {
			t.Errorf("Initial %s: States = %+v", initial, st)
		}
	}
}

func TestManagerUnknownCheckType(t *testing.T) {
	b := netip.MustParseAddrPort("10.1.0.11:30080")
	hc := quick(7, 1, 1)
	m := newManager(t, Options{})
	m.Update([]lb.Service{service("web", hc, b)}, nil)
	e := nextEvent(t, m)
	if e.State != Down || !strings.Contains(e.Reason, "health-7 is not known") {
		t.Fatalf("event %+v, want down with the reason", e)
	}
}

// TestManagerDamping flaps a real HTTP backend until it is held down, and
// checks that it returns only after the hold.
func TestManagerDamping(t *testing.T) {
	web := newHTTPServer(t)
	hc := quick(lb.HealthHTTP, 1, 1)
	hc.Path = "/"
	m := newManager(t, Options{Damping: Damping{Window: time.Minute, MaxTransitions: 2, HoldDown: 300 * time.Millisecond}})
	m.Update([]lb.Service{service("web", hc, web.addr)}, nil)
	key := Key{"web", web.addr}

	for i, status := range []int{503, 200, 503} {
		web.setStatus(status)
		e := nextEvent(t, m)
		if want := map[int]State{503: Down, 200: Up}[status]; e.State != want {
			t.Fatalf("change %d: event %+v, want %s", i, e, want)
		}
	}
	web.setStatus(200)
	var held Status
	waitFor(t, "the hold-down", func() bool {
		held = m.States()[key]
		return !held.HeldUntil.IsZero()
	})
	if held.State != Down || held.Successes < 1 {
		t.Errorf("held status %+v, want down with a success", held)
	}
	e := nextEvent(t, m)
	if e.State != Up || !strings.Contains(e.Reason, "after a hold-down for flapping") || e.Time.Before(held.HeldUntil) {
		t.Fatalf("event %+v, want up after the hold ending %s", e, held.HeldUntil)
	}
	if st := m.States()[key]; !st.HeldUntil.IsZero() || st.Transitions != 1 {
		t.Errorf("status after the hold %+v, want no hold and a fresh history", st)
	}
}

func TestManagerUpdate(t *testing.T) {
	live := newTCPServer(t)
	dead := freePort(t, "tcp")
	other := newTCPServer(t)
	check := quick(lb.HealthTCP, 1, 1)
	slower := check
	slower.Interval = 20 * time.Millisecond

	m := newManager(t, Options{})
	ka, kd, kb := Key{"a", live.addr}, Key{"a", dead}, Key{"b", other.addr}
	probers := func() map[Key]*prober {
		m.mu.Lock()
		defer m.mu.Unlock()
		out := map[Key]*prober{}
		for k, p := range m.probers {
			out[k] = p
		}
		return out
	}
	keys := func() []Key {
		var ks []Key
		for k := range m.States() {
			ks = append(ks, k)
		}
		return ks
	}
	sameKeys := func(step string, want ...Key) {
		t.Helper()
		got := m.States()
		if len(got) != len(want) {
			t.Fatalf("%s: checked %v, want %v", step, keys(), want)
		}
		for _, k := range want {
			if _, ok := got[k]; !ok {
				t.Fatalf("%s: checked %v, want %v", step, keys(), want)
			}
		}
	}

	// Start: a none-type service gets no prober.
	m.Update([]lb.Service{
		service("a", check, live.addr, dead),
		service("b", check, other.addr),
		service("c", lb.HealthCheck{Type: lb.HealthNone}, live.addr),
	}, nil)
	sameKeys("start", ka, kd, kb)
	if e := nextEvent(t, m); e.Backend != dead || e.State != Down {
		t.Fatalf("event %+v, want the dead backend down", e)
	}
	waitFor(t, "probes of b", func() bool { return m.States()[kb].Successes >= 3 })
	before := probers()
	downSince := m.States()[kd].LastChange

	// Reconfigure a: its probers restart with their state; b's keeps
	// running with its counts.
	m.Update([]lb.Service{
		service("a", slower, live.addr, dead),
		service("b", check, other.addr),
	}, nil)
	after := probers()
	sameKeys("reconfigure", ka, kd, kb)
	if after[ka] == before[ka] || after[kd] == before[kd] {
		t.Error("a changed check did not restart its probers")
	}
	if after[kb] != before[kb] {
		t.Error("an unchanged check was restarted")
	}
	st := m.States()
	if st[kd].State != Down || !st[kd].LastChange.Equal(downSince) || st[kd].Check.Interval != slower.Interval {
		t.Errorf("restarted prober of the dead backend: %+v, want it still down since %s with the new interval", st[kd], downSince)
	}
	n := st[kb].Successes
	waitFor(t, "b to keep counting", func() bool { return m.States()[kb].Successes > n })

	// A changed target restarts only that backend's prober; an empty Host
	// is filled with the VIP:port.
	local := netip.MustParseAddr("127.0.0.2")
	via := func(svc lb.Service, b lb.Backend) Target {
		if svc.Name == "b" {
			return Target{Addr: b.Addr, Local: local}
		}
		return Direct(svc, b)
	}
	m.Update([]lb.Service{
		service("a", slower, live.addr, dead),
		service("b", check, other.addr),
	}, via)
	again := probers()
	if again[kb] == after[kb] || again[ka] != after[ka] || again[kd] != after[kd] {
		t.Error("a changed target restarted the wrong probers")
	}
	if got := m.States()[kb].Target; got.Local != local || got.Host != "10.0.0.10:80" {
		t.Errorf("target of b %+v", got)
	}
	waitFor(t, "probes of b from the new address", func() bool {
		select {
		case peer := <-other.peers:
			return peer.Addr() == local
		default:
			return false
		}
	})

	// Remove a backend, then a service, then everything.
	m.Update([]lb.Service{service("a", slower, live.addr), service("b", check, other.addr)}, via)
	sameKeys("backend removed", ka, kb)
	if !m.Up("a", dead) {
		t.Error("a removed backend is still reported down")
	}
	m.Update([]lb.Service{service("b", check, other.addr)}, via)
	sameKeys("service removed", kb)
	m.Update(nil, nil)
	sameKeys("all removed")
}

// TestManagerStop checks that Stop ends every goroutine the Manager started,
// even with events nobody read, and closes the Events channel.
func TestManagerStop(t *testing.T) {
	tcp := newTCPServer(t)
	web := newHTTPServer(t)
	echo := newUDPServer(t, "", false)
	dead := freePort(t, "tcp")
	httpCheck := quick(lb.HealthHTTP, 1, 1)
	httpCheck.Path = "/"
	udpCheck := quick(lb.HealthUDP, 1, 1)
	udpCheck.Send, udpCheck.Expect = "x", "x"

	var services []lb.Service
	for i := range 5 {
		services = append(services,
			service(fmt.Sprint("tcp", i), quick(lb.HealthTCP, 1, 1), tcp.addr, dead),
			service(fmt.Sprint("http", i), httpCheck, web.addr),
			service(fmt.Sprint("udp", i), udpCheck, echo.addr))
	}
	runtime.GC()
	before := runtime.NumGoroutine()

	m := New(Options{})
	m.Update(services, nil)
	waitFor(t, "every backend probed", func() bool {
		st := m.States()
		for _, s := range st {
			if s.LastCheck.IsZero() {
				return false
			}
		}
		return len(st) == 20
	})
	if runtime.NumGoroutine() <= before+20 {
		t.Fatalf("%d goroutines with 20 probers, %d before: the count cannot show a leak", runtime.NumGoroutine(), before)
	}
	m.Stop()
	m.Stop()
	m.Update(services, nil)
	if st := m.States(); len(st) != 0 {
		t.Errorf("%d probers after Stop", len(st))
	}
	select {
	case _, open := <-m.Events():
		if open {
			t.Error("an event after Stop")
		}
	case <-time.After(patience):
		t.Fatal("Stop did not close the Events channel")
	}
	waitFor(t, "the probers' goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestManagerUpdateServices: UpdateServices changes the probers of the
// services it is given, as Update would, and leaves every other service's
// probers running untouched, although the list does not name them.
func TestManagerUpdateServices(t *testing.T) {
	check := quick(lb.HealthTCP, 1, 1)
	ok := &script{results: []bool{true}}
	m := newManager(t, Options{NewChecker: func(lb.HealthCheck) (Checker, error) { return ok, nil }})
	a1, a2, a3 := netip.MustParseAddrPort("10.1.0.1:80"), netip.MustParseAddrPort("10.1.0.2:80"), netip.MustParseAddrPort("10.1.0.3:80")
	b1 := netip.MustParseAddrPort("10.2.0.1:80")
	m.Update([]lb.Service{service("a", check, a1, a2), service("b", check, b1)}, nil)
	before := map[Key]*prober{}
	m.mu.Lock()
	for k, p := range m.probers {
		before[k] = p
	}
	m.mu.Unlock()

	// a loses a2 and gains a3; b is not in the list and keeps its prober.
	m.UpdateServices([]lb.Service{service("a", check, a1, a3)}, nil)
	m.mu.Lock()
	defer m.mu.Unlock()
	want := []Key{{"a", a1}, {"a", a3}, {"b", b1}}
	if len(m.probers) != len(want) {
		t.Fatalf("%d probers after UpdateServices, want %d", len(m.probers), len(want))
	}
	for _, k := range want {
		if m.probers[k] == nil {
			t.Errorf("no prober for %v", k)
		}
	}
	for _, k := range []Key{{"a", a1}, {"b", b1}} {
		if m.probers[k] != before[k] {
			t.Errorf("the prober of %v was restarted", k)
		}
	}
	if got := len(m.bySvc["a"]); got != 2 || !m.bySvc["a"][a3] || m.bySvc["a"][a2] {
		t.Errorf("index of a's probers: %v", m.bySvc["a"])
	}
}
