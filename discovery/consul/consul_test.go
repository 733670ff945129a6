// SPDX-License-Identifier: Apache-2.0

package consul_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/internal/discoverytest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// testDefaults: SNAT, so backend ports may differ from frontend ports as
// they do in front of NodePorts.
var testDefaults = lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251}

// waitTimeout bounds every wait for the source to follow Consul. It is far
// below the blocking-query wait the tests configure, so a watch stuck on a
// stale index fails the test instead of passing late.
const waitTimeout = 30 * time.Second

func consulConfig(addr string) *config.Consul {
	return &config.Consul{
		Address:      addr,
		Tag:          "l4lb",
		KVPrefix:     "l4lb/services/",
		Stale:        true,
		WarningState: lb.Draining,
	}
}

// testLog shows the source's log with -v only: the tests provoke errors on
// purpose, and a passing run should not look like a failing one.
func testLog(t *testing.T) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// harness runs one source and collects its snapshots.
type harness struct {
	t    *testing.T
	src  *consul.Source
	ch   chan discovery.Snapshot
	stop context.CancelFunc
	done chan error
	last []lb.Service
	n    int // snapshots received
}

func runSource(t *testing.T, cfg *config.Consul, opts consul.Options) *harness {
	t.Helper()
	if opts.Log == nil {
		opts.Log = testLog(t)
	}
	if opts.Defaults == (lb.Defaults{}) {
		opts.Defaults = testDefaults
	}
	if opts.Wait == 0 {
		// Long, so that only correct index handling makes changes show
		// up within waitTimeout.
		opts.Wait = 5 * time.Minute
	}
	if opts.RetryMax == 0 {
		opts.RetryMin, opts.RetryMax = 50*time.Millisecond, 300*time.Millisecond
	}
	src, err := consul.New(cfg, opts)
	if err != nil {
		t.Fatalf("consul.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, src: src, ch: make(chan discovery.Snapshot), stop: cancel, done: make(chan error, 1)}
	go func() { h.done <- src.Run(ctx, h.ch) }()
	t.Cleanup(h.Stop)
	return h
}

// Stop ends Run and waits for it.
func (h *harness) Stop() {
	h.stop()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
		h.done <- nil
	case <-time.After(waitTimeout):
		h.t.Errorf("Run did not return %v after its context ended", waitTimeout)
	}
}

// waitFor reads snapshots until ok accepts one.
func (h *harness) waitFor(what string, ok func([]lb.Service) bool) []lb.Service {
	h.t.Helper()
	if h.n > 0 && ok(h.last) {
		return h.last
	}
	deadline := time.After(waitTimeout)
	for {
		select {
		case snap := <-h.ch:
			if snap.Source != consul.SourceName {
				h.t.Fatalf("snapshot Source = %q, want %q", snap.Source, consul.SourceName)
			}
			h.last, h.n = snap.Services, h.n+1
			if ok(h.last) {
				return h.last
			}
		case <-deadline:
			h.t.Fatalf("no snapshot with %s after %v; last one:\n%s\nstatus: %+v", what, waitTimeout, discoverytest.Dump(h.last), h.src.Status())
		}
	}
}

// waitStatus polls Status until ok accepts it.
func (h *harness) waitStatus(what string, ok func(discovery.Status) bool) discovery.Status {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		st := h.src.Status()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("status never showed %s; last: %+v", what, st)
		}
		// Keep draining snapshots so Run is never held up by the test.
		select {
		case snap := <-h.ch:
			h.last, h.n = snap.Services, h.n+1
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// backends renders a service's backends as "addr/wN/state" for comparisons.
func backends(svcs []lb.Service, name string) []string {
	s, ok := discoverytest.Find(svcs, name)
	if !ok {
		return nil
	}
	out := []string{}
	for _, b := range s.Backends {
		out = append(out, fmt.Sprintf("%s/w%d/%s", b.Addr, b.Weight, b.State))
	}
	slices.Sort(out)
	return out
}

func hasBackends(name string, want ...string) func([]lb.Service) bool {
	if want == nil {
		want = []string{}
	}
	return func(svcs []lb.Service) bool { return slices.Equal(backends(svcs, name), want) }
}

func absent(name string) func([]lb.Service) bool {
	return func(svcs []lb.Service) bool { _, ok := discoverytest.Find(svcs, name); return !ok }
}

func all(preds ...func([]lb.Service) bool) func([]lb.Service) bool {
	return func(svcs []lb.Service) bool {
		for _, p := range preds {
			if !p(svcs) {
				return false
			}
		}
		return true
	}
}

func meta(vip, port, proto string, extra ...string) map[string]string {
	m := map[string]string{consul.MetaVIP: vip, consul.MetaPort: port, consul.MetaProtocol: proto}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return m
}

func hasError(subs ...string) func(discovery.Status) bool {
	return func(st discovery.Status) bool {
		for _, e := range st.Errors {
			ok := true
			for _, s := range subs {
				ok = ok && strings.Contains(e, s)
			}
			if ok {
				return true
			}
		}
		return false
	}
}

func noError(sub string) func(discovery.Status) bool {
	return func(st discovery.Status) bool {
		for _, e := range st.Errors {
			if strings.Contains(e, sub) {
				return false
			}
		}
		return true
	}
}

// TestServicesFollowConsul drives a real agent through registrations,
// check flips, meta and KV mistakes and conflicts, and checks that the
// published services follow each step.
func TestServicesFollowConsul(t *testing.T) {
	a := startAgent(t, 0)
	h := runSource(t, consulConfig(a.Addr), consul.Options{})
	tags := []string{"l4lb", "v1"}

	// Two services share one VIP on different ports; one instance has no
	// service address and is reached at its node's address.
	webMeta := meta("192.0.2.10", "80", "tcp", consul.MetaTableSize, "509", consul.MetaHealth, "tcp")
	a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: "web-1", service: "web", addr: "10.1.0.11", port: 30080, tags: tags, meta: webMeta, status: api.HealthPassing})
	a.register(t, inst{node: "n2", nodeAddr: "10.1.0.12", id: "web-2", service: "web", port: 30080, tags: tags, meta: webMeta, weight: 3, status: api.HealthPassing})
	a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: "api-1", service: "api", addr: "10.1.0.11", port: 443, tags: tags, meta: meta("192.0.2.10", "443", "tcp", consul.MetaMode, "dsr", consul.MetaDispatch, "geneve")})
	// Not tagged: not l4lb's business, whatever its meta says.
	a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: "db-1", service: "db", addr: "10.1.0.11", port: 5432, tags: []string{"v1"}, meta: meta("192.0.2.10", "5432", "tcp")})

	svcs := h.waitFor("web and api", all(
		hasBackends("web", "10.1.0.11:30080/w1/active", "10.1.0.12:30080/w3/active"),
		hasBackends("api", "10.1.0.11:443/w1/active")))
	web, _ := discoverytest.Find(svcs, "web")
	want := lb.Service{
		Name:      "web",
		Frontend:  lb.Frontend{Addr: netip.MustParseAddr("192.0.2.10"), Port: 80, Proto: lb.TCP},
		TableSize: 509,
		Health:    lb.HealthCheck{Type: lb.HealthTCP, Interval: 5 * time.Second, Timeout: 2 * time.Second, Rise: 2, Fall: 3},
		Backends: []lb.Backend{
			{Addr: netip.MustParseAddrPort("10.1.0.11:30080"), Weight: 1, State: lb.Active},
			{Addr: netip.MustParseAddrPort("10.1.0.12:30080"), Weight: 3, State: lb.Active},
		},
		Source: consul.SourceName,
	}
	if diff := cmp.Diff(want, web, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("web (-want +got):\n%s", diff)
	}
	if api1, _ := discoverytest.Find(svcs, "api"); api1.Mode != lb.ModeDSR || api1.Dispatch != lb.DispatchGeneve {
		t.Errorf("api mode/dispatch = %v/%v, want dsr/geneve from its meta", api1.Mode, api1.Dispatch)
	}
	if _, ok := discoverytest.Find(svcs, "db"); ok {
		t.Errorf("untagged service db was published")
	}
	if st := h.src.Status(); !st.Healthy || st.LastSync.IsZero() || len(st.Errors) > 0 {
		t.Errorf("status after the first sync = %+v, want healthy, synced, no errors", st)
	}

	// Check status flips: warning drains (warning_state = "draining"),
	// critical removes the backend, passing brings it back.
	a.register(t, inst{node: "n2", nodeAddr: "10.1.0.12", id: "web-2", service: "web", port: 30080, tags: tags, meta: webMeta, weight: 3, status: api.HealthWarning})
	h.waitFor("web-2 draining", hasBackends("web", "10.1.0.11:30080/w1/active", "10.1.0.12:30080/w3/draining"))
	a.register(t, inst{node: "n2", nodeAddr: "10.1.0.12", id: "web-2", service: "web", port: 30080, tags: tags, meta: webMeta, weight: 3, status: api.HealthCritical})
	h.waitFor("web-2 gone", hasBackends("web", "10.1.0.11:30080/w1/active"))
	a.register(t, inst{node: "n2", nodeAddr: "10.1.0.12", id: "web-2", service: "web", port: 30080, tags: tags, meta: webMeta, weight: 3, status: api.HealthPassing})
	h.waitFor("web-2 back", hasBackends("web", "10.1.0.11:30080/w1/active", "10.1.0.12:30080/w3/active"))

	// A TTL check on the agent itself, flipped the way an application
	// would.
	ttlReg := &api.AgentServiceRegistration{ID: "cache-1", Name: "cache", Tags: tags, Address: "10.1.0.31", Port: 6379,
		Meta: meta("192.0.2.11", "6379", "tcp"), Check: &api.AgentServiceCheck{CheckID: "cache-1-ttl", TTL: "10m"}}
	if err := a.API.Agent().ServiceRegister(ttlReg); err != nil {
		t.Fatalf("agent register cache-1: %v", err)
	}
	h.waitFor("cache without backend (TTL check starts critical)", hasBackends("cache"))
	for _, step := range []struct{ status, want string }{
		{api.HealthPassing, "10.1.0.31:6379/w1/active"},
		{api.HealthWarning, "10.1.0.31:6379/w1/draining"},
		{api.HealthCritical, ""},
		{api.HealthPassing, "10.1.0.31:6379/w1/active"},
	} {
		if err := a.API.Agent().UpdateTTL("cache-1-ttl", "test", step.status); err != nil {
			t.Fatalf("update TTL to %s: %v", step.status, err)
		}
		var wantB []string
		if step.want != "" {
			wantB = []string{step.want}
		}
		h.waitFor("cache "+step.status, hasBackends("cache", wantB...))
	}

	// A malformed registration is rejected alone, with an error naming it.
	a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: "bad-1", service: "bad", addr: "10.1.0.11", port: 8080, tags: tags, meta: meta("192.0.2.12", "http", "tcp")})
	a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: "bad-vip-1", service: "badvip", addr: "10.1.0.11", port: 8080, tags: tags, meta: meta("192.0.2.300", "80", "tcp")})
	h.waitStatus("the bad services' errors", func(st discovery.Status) bool {
		return hasError(`consul service "bad"`, "l4lb-port")(st) && hasError(`consul service "badvip"`, "192.0.2.300")(st)
	})
	// One instance that disagrees with the others is left out alone.
	a.register(t, inst{node: "n3", nodeAddr: "10.1.0.13", id: "web-3", service: "web", port: 30080, tags: tags, meta: meta("192.0.2.10", "81", "tcp"), status: api.HealthPassing})
	h.waitStatus("web-3's error", hasError(`consul service "web"`, `instance "web-3"`, "l4lb-port"))
	svcs = h.waitFor("the good services still served", all(
		hasBackends("web", "10.1.0.11:30080/w1/active", "10.1.0.12:30080/w3/active"),
		hasBackends("api", "10.1.0.11:443/w1/active"),
		absent("bad"), absent("badvip")))
	if len(svcs) != 3 {
		t.Errorf("published %d services, want web, api and cache:\n%s", len(svcs), discoverytest.Dump(svcs))
	}
	a.deregister(t, "n3", "web-3")
	a.deregister(t, "n1", "bad-vip-1")
	h.waitStatus("web-3's and badvip's errors gone", func(st discovery.Status) bool {
		return noError("web-3")(st) && noError("badvip")(st)
	})

	// Whole definitions in KV, TOML and JSON; a broken one and one whose
	// name contradicts its key are rejected alone.
	a.put(t, "l4lb/services/dns", `name = "dns"
vip = "192.0.2.20"
port = 53
protocol = "udp"
[[backend]]
address = "10.1.0.41"
[[backend]]
address = "10.1.0.42"
weight = 2
`)
	a.put(t, "l4lb/services/ntp", `{"name": "ntp", "vip": "192.0.2.20", "port": 123, "protocol": "udp",
 "backend": [{"address": "10.1.0.43", "state": "draining"}]}`)
	a.put(t, "l4lb/services/broken", "name = \"broken\"\nvip = \"192.0.2.21\"\nport = 99999\nprotocol = \"tcp\"\n")
	a.put(t, "l4lb/services/misnamed", `{"name": "other", "vip": "192.0.2.22", "port": 80, "protocol": "tcp"}`)
	h.waitFor("dns and ntp from KV", all(
		hasBackends("dns", "10.1.0.41:53/w1/active", "10.1.0.42:53/w2/active"),
		hasBackends("ntp", "10.1.0.43:123/w1/draining"),
		hasBackends("web", "10.1.0.11:30080/w1/active", "10.1.0.12:30080/w3/active"),
		absent("broken"), absent("other")))
	h.waitStatus("the KV errors", func(st discovery.Status) bool {
		return hasError("consul KV l4lb/services/broken:3:", "port")(st) && hasError("consul KV l4lb/services/misnamed", "last element")(st)
	})

	// The same frontend from a KV definition and a Consul service: the
	// earlier claim keeps serving, both are told.
	a.put(t, "l4lb/services/api2", `name = "api2"
vip = "192.0.2.10"
port = 443
protocol = "tcp"
`)
	h.waitStatus("the frontend conflict on both", func(st discovery.Status) bool {
		return hasError(`consul KV l4lb/services/api2`, `already served by consul service "api"`)(st) &&
			hasError(`consul service "api"`, "also claimed by consul KV l4lb/services/api2")(st)
	})
	if svcs := h.waitFor("api still served", hasBackends("api", "10.1.0.11:443/w1/active")); !absent("api2")(svcs) {
		t.Errorf("api2 was published despite the conflict:\n%s", discoverytest.Dump(svcs))
	}
	// The loser takes over once the winner goes away.
	a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: "api-1", service: "api", addr: "10.1.0.11", port: 443, tags: []string{"v1"}, meta: meta("192.0.2.10", "443", "tcp")})
	h.waitFor("api untagged, api2 from KV instead", all(absent("api"), hasBackends("api2")))

	a.del(t, "l4lb/services/dns")
	a.deregister(t, "n1", "web-1")
	a.deregister(t, "n2", "web-2")
	h.waitFor("dns deleted, web without instances gone", all(absent("dns"), absent("web"), hasBackends("ntp", "10.1.0.43:123/w1/draining")))
}

// TestOutageAndRestart kills the agent: the source keeps its last known
// good services and reports growing staleness. A fresh agent on the same
// port starts with a lower index, which the watches must notice to see its
// registrations before the (5 minute) blocking wait runs out.
func TestOutageAndRestart(t *testing.T) {
	a := startAgent(t, 0)
	h := runSource(t, consulConfig(a.Addr), consul.Options{})
	a.register(t, inst{node: "n1", id: "web-1", service: "web", addr: "10.1.0.11", port: 30080, tags: []string{"l4lb"}, meta: meta("192.0.2.10", "80", "tcp")})
	a.put(t, "l4lb/services/dns", "name = \"dns\"\nvip = \"192.0.2.20\"\nport = 53\nprotocol = \"udp\"\n[[backend]]\naddress = \"10.1.0.41\"\n")
	before := h.waitFor("web and dns", all(hasBackends("web", "10.1.0.11:30080/w1/active"), hasBackends("dns", "10.1.0.41:53/w1/active")))
	// Push the first agent's index well above what the second will have.
	for i := range 30 {
		a.register(t, inst{node: "n2", id: fmt.Sprintf("noise-%d", i), service: "noise", port: 1000 + i})
		a.put(t, fmt.Sprintf("l4lb/services/noise/%d/", i), "")
	}
	high := a.index(t)
	h.waitStatus("healthy", func(st discovery.Status) bool { return st.Healthy })

	a.Kill()
	down := h.waitStatus("unhealthy", func(st discovery.Status) bool { return !st.Healthy })
	if down.Error == "" || down.LastSync.IsZero() {
		t.Errorf("status during the outage = %+v, want an error and the last sync time", down)
	}
	// Last known good: nothing new is published while Consul is away.
	select {
	case snap := <-h.ch:
		t.Errorf("snapshot published during the outage:\n%s", discoverytest.Dump(snap.Services))
	case <-time.After(time.Second):
	}
	later := h.src.Status()
	if later.Healthy || !later.LastSync.Equal(down.LastSync) {
		t.Errorf("status later in the outage = %+v, want unhealthy with LastSync still %v", later, down.LastSync)
	}
	now := time.Now()
	if s1, s2 := down.Staleness(now.Add(-time.Second)), later.Staleness(now); s2 <= s1 || s2 <= 0 {
		t.Errorf("staleness did not grow: %v then %v", s1, s2)
	}
	if !slices.EqualFunc(before, h.last, func(a, b lb.Service) bool { return a.Name == b.Name }) {
		t.Errorf("services changed during the outage")
	}

	b := startAgent(t, a.HTTPPort)
	b.register(t, inst{node: "n9", id: "web2-1", service: "web2", addr: "10.1.0.91", port: 30080, tags: []string{"l4lb"}, meta: meta("192.0.2.10", "80", "tcp")})
	if low := b.index(t); low >= high {
		t.Fatalf("the fresh agent's index %d is not below the old %d: the test does not exercise a backwards index", low, high)
	}
	h.waitFor("the fresh agent's view (web and dns gone, web2 there)", all(absent("web"), absent("dns"), hasBackends("web2", "10.1.0.91:30080/w1/active")))
	up := h.waitStatus("healthy again", func(st discovery.Status) bool { return st.Healthy })
	if !up.LastSync.After(down.LastSync) || up.Staleness(time.Now()) != 0 {
		t.Errorf("status after recovery = %+v, want a newer LastSync and no staleness", up)
	}
}

// TestSelfRegistration: the box registers as service "l4lb" with a TTL
// check that follows Options.Healthy, and deregisters on a clean stop.
func TestSelfRegistration(t *testing.T) {
	a := startAgent(t, 0)
	cfg := consulConfig(a.Addr)
	cfg.RegisterSelf = true
	var sick atomic.Pointer[error]
	h := runSource(t, cfg, consul.Options{
		Hostname:     "box1",
		SelfInterval: 100 * time.Millisecond,
		Healthy: func() error {
			if e := sick.Load(); e != nil {
				return *e
			}
			return nil
		},
	})
	id := consul.SelfID("box1")
	checkStatus := func() (string, string) {
		checks, _, err := a.API.Health().Checks(consul.SelfService, nil)
		if err != nil {
			t.Fatalf("read checks: %v", err)
		}
		for _, c := range checks {
			if c.ServiceID == id {
				return c.Status, c.Output
			}
		}
		return "", ""
	}
	waitCheck := func(want, output string) {
		t.Helper()
		deadline := time.Now().Add(waitTimeout)
		for {
			st, out := checkStatus()
			if st == want && strings.Contains(out, output) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("check of %s is %q (%q), want %q with %q", id, st, out, want, output)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCheck(api.HealthPassing, "healthy")
	bad := errors.New("reconcile failed: datapath full")
	sick.Store(&bad)
	waitCheck(api.HealthCritical, "datapath full")
	sick.Store(nil)
	waitCheck(api.HealthPassing, "healthy")
	// l4lb's own registration carries no l4lb tag: it is not a frontend.
	h.waitFor("nothing published", func(svcs []lb.Service) bool { return len(svcs) == 0 })

	h.Stop()
	svcs, err := a.API.Agent().Services()
	if err != nil {
		t.Fatalf("list agent services: %v", err)
	}
	if _, ok := svcs[id]; ok {
		t.Errorf("%s still registered after a clean stop", id)
	}
}

// TestTokenFile: the token is read from the file, sent to Consul, and
// never shows up in errors; a missing file is an error at New.
func TestTokenFile(t *testing.T) {
	cfg := consulConfig("127.0.0.1:1")
	cfg.TokenFile = t.TempDir() + "/missing"
	if _, err := consul.New(cfg, consul.Options{}); err == nil || !strings.Contains(err.Error(), "token_file") {
		t.Errorf("New with a missing token file: %v, want an error naming token_file", err)
	}
	empty := t.TempDir() + "/empty"
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.TokenFile = empty
	if _, err := consul.New(cfg, consul.Options{}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("New with an empty token file: %v, want an error saying it is empty", err)
	}

	// A stand-in agent that refuses the token, as Consul does with ACLs on.
	const secret = "3f1c9b0e-secret-token"
	var seen atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("X-Consul-Token"))
		http.Error(w, "ACL not found", http.StatusForbidden)
	}))
	defer srv.Close()
	tok := t.TempDir() + "/token"
	if err := os.WriteFile(tok, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = consulConfig(strings.TrimPrefix(srv.URL, "http://"))
	cfg.TokenFile = tok
	h := runSource(t, cfg, consul.Options{})
	// The agent's answer, not just "403": until the first answer the
	// status names the agent's address, whose port may contain 403.
	st := h.waitStatus("the ACL error", func(st discovery.Status) bool { return strings.Contains(st.Error, "403 (ACL not found)") })
	if got, _ := seen.Load().(string); got != secret {
		t.Errorf("agent saw token %q, want the file's content without the newline", got)
	}
	if strings.Contains(fmt.Sprintf("%+v", st), secret) {
		t.Errorf("status shows the token: %+v", st)
	}
}

// TestManyServicesWatchedTogether: with more tagged services than
// max_watches the source must not hold a blocking query per service. The
// agent here allows 16 connections per client, as its default 200 would
// against a few hundred services: one query per service would leave most
// services unread (the agent answers 429). The source watches them
// together and still follows check flips, new instances and removals, and
// goes back to a query per service when few are left.
func TestManyServicesWatchedTogether(t *testing.T) {
	a := startAgent(t, 0, "limits { http_max_conns_per_client = 16 }")
	const n = 40
	tags := []string{"l4lb"}
	reg := func(i int, id, addr, status string) {
		a.register(t, inst{node: "n1", nodeAddr: "10.1.0.1", id: id, service: fmt.Sprintf("svc-%02d", i), addr: addr, port: 8080,
			tags: tags, meta: meta(fmt.Sprintf("192.0.2.%d", 10+i), "80", "tcp"), status: status})
	}
	for i := range n {
		reg(i, fmt.Sprintf("svc-%02d-a", i), "10.1.1.1", api.HealthPassing)
	}
	cfg := consulConfig(a.Addr)
	cfg.MaxWatches = 8
	h := runSource(t, cfg, consul.Options{})
	everyOne := func(svcs []lb.Service) bool {
		for i := range n {
			if !hasBackends(fmt.Sprintf("svc-%02d", i), "10.1.1.1:8080/w1/active")(svcs) {
				return false
			}
		}
		return true
	}
	h.waitFor("all 40 services", everyOne)
	h.waitStatus("healthy", func(st discovery.Status) bool { return st.Healthy })

	// A check flip reaches its service alone.
	reg(7, "svc-07-a", "10.1.1.1", api.HealthCritical)
	h.waitFor("svc-07 without its critical backend", hasBackends("svc-07"))
	reg(7, "svc-07-a", "10.1.1.1", api.HealthWarning)
	h.waitFor("svc-07 draining", hasBackends("svc-07", "10.1.1.1:8080/w1/draining"))
	// A new instance without any check: only the catalog says so.
	reg(11, "svc-11-b", "10.1.1.2", "")
	h.waitFor("svc-11's new backend", hasBackends("svc-11", "10.1.1.1:8080/w1/active", "10.1.1.2:8080/w1/active"))
	// A node check fails: every service on the node loses its backend.
	if _, err := a.API.Catalog().Register(&api.CatalogRegistration{Node: "n1", Address: "10.1.0.1",
		Check: &api.AgentCheck{Node: "n1", CheckID: "node-ok", Name: "node", Status: api.HealthCritical}}, nil); err != nil {
		t.Fatalf("register node check: %v", err)
	}
	h.waitFor("no backend on the failed node", func(svcs []lb.Service) bool {
		for i := range n {
			if len(backends(svcs, fmt.Sprintf("svc-%02d", i))) != 0 {
				return false
			}
		}
		return true
	})
	// Removing the failing check is seen although the answer no longer
	// lists it.
	if _, err := a.API.Catalog().Deregister(&api.CatalogDeregistration{Node: "n1", CheckID: "node-ok"}, nil); err != nil {
		t.Fatalf("deregister node check: %v", err)
	}
	h.waitFor("backends back", hasBackends("svc-00", "10.1.1.1:8080/w1/active"))

	// Down to four services: one query each again, and they still follow.
	for i := 4; i < n; i++ {
		a.deregister(t, "n1", fmt.Sprintf("svc-%02d-a", i))
	}
	a.deregister(t, "n1", "svc-11-b")
	h.waitFor("four services", func(svcs []lb.Service) bool { return len(svcs) == 4 && absent("svc-39")(svcs) })
	reg(2, "svc-02-a", "10.1.1.1", api.HealthCritical)
	h.waitFor("svc-02 follows its own watch", hasBackends("svc-02"))
	if st := h.src.Status(); !st.Healthy {
		t.Errorf("status = %+v, want healthy", st)
	}
}
