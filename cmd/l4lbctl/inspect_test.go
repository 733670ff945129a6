// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

// inspectProvider answers the inspection routes with fixed state; the
// other routes are not used here (the nil embedded Provider panics if
// they are).
type inspectProvider struct {
	api.Provider
	mu      sync.Mutex
	flushed []api.FlushRequest
	asked   []api.FlowQuery
}

var inspectServices = []api.Service{{
	Name: "web", Frontend: "10.0.0.10:80/tcp", Mode: "dsr", Dispatch: "ipip", TableSize: 251, Source: "file",
	Counters: api.Counters{Packets: 300, Bytes: 30000, NewFlows: 9},
	Backends: []api.Backend{
		{Address: "10.1.0.11:80", Weight: 1, State: "active", ConfigState: "active", Health: "healthy", Slots: 126,
			Counters: api.Counters{Packets: 200, Bytes: 20000, NewFlows: 6}, ActiveConns: 4, InactiveConns: 1},
		{Address: "10.1.0.12:80", Weight: 2, State: "draining", ConfigState: "active", Override: true, Health: "unhealthy",
			Counters: api.Counters{Packets: 100, Bytes: 10000, NewFlows: 3}, ActiveConns: 2, InactiveConns: 7},
	},
}}

var inspectFlows = []api.Flow{
	{Proto: "tcp", Client: "198.51.100.7:40000", VIP: "10.0.0.10:80", Service: "web", Backend: "10.1.0.11:80", State: "established", Active: true, AgeSeconds: 3.4, ExpiresSeconds: 7196.6},
	{Proto: "tcp", Client: "198.51.100.8:40001", VIP: "10.0.0.10:80", Backend: "id 9", State: "closing", AgeSeconds: 61, SNAT: "10.0.0.1:20000"},
}

func (p *inspectProvider) Status() api.Status {
	return api.Status{Version: "test", StartedAt: time.Now(), Interfaces: []api.Interface{
		{Name: "eth0", Attach: "xdp", Mode: "auto", Attached: "xdp generic"},
		{Name: "bond0", Attach: "tc", Attached: "not attached", AttachedError: "read link bond0: not found"},
	}}
}

func (p *inspectProvider) Services() []api.Service { return inspectServices }

func (p *inspectProvider) Service(name string) (api.Service, error) {
	for _, svc := range inspectServices {
		if svc.Name == name {
			return svc, nil
		}
	}
	return api.Service{}, fmt.Errorf("no service %q: %w", name, api.ErrNotFound)
}

func (p *inspectProvider) Flows(q api.FlowQuery) (api.FlowList, error) {
	p.mu.Lock()
	p.asked = append(p.asked, q)
	p.mu.Unlock()
	fl := api.FlowList{Flows: inspectFlows, Matched: len(inspectFlows)}
	if q.Limit > 0 && q.Limit < len(fl.Flows) {
		fl.Flows = fl.Flows[:q.Limit]
	}
	return fl, nil
}

func (p *inspectProvider) Flush(_ context.Context, req api.FlushRequest) (api.FlushResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushed = append(p.flushed, req)
	return api.FlushResult{Flows: 3, Bindings: 1}, nil
}

// inspectDaemon serves p on a real admin socket and returns its path.
func inspectDaemon(t *testing.T, p api.Provider) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "l4lb.sock")
	t.Cleanup(serveAPI(t, sock, p))
	return sock
}

// serveAPI serves p on a real admin socket at sock until the returned
// function stops it.
func serveAPI(t *testing.T, sock string, p api.Provider) (stop func()) {
	t.Helper()
	l, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.NewServer(p, slog.New(slog.DiscardHandler)).Serve(ctx, l) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
}

// rows splits tabwriter output into lines of space-separated fields.
func rows(out string) [][]string {
	var r [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		r = append(r, regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1))
	}
	return r
}

func TestServiceListBackends(t *testing.T) {
	sock := inspectDaemon(t, &inspectProvider{})
	out, _, err := run(t, "--socket", sock, "service", "list", "--backends")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"SERVICE / BACKEND", "FRONTEND", "MODE", "STATE", "HEALTH", "WEIGHT", "ACTIVE", "INACT", "PACKETS", "BYTES"},
		{"web", "10.0.0.10:80/tcp", "dsr/ipip", "6", "8", "300", "30000"},
		{"-> 10.1.0.11:80", "active", "healthy", "1", "4", "1", "200", "20000"},
		{"-> 10.1.0.12:80", "draining (override)", "unhealthy", "2", "2", "7", "100", "10000"},
	}
	if got := rows(out); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("service list --backends:\n%s\nrows %q\nwant %q", out, got, want)
	}
	// The columns line up: every backend's ACTIVE under the header's.
	lines := strings.Split(out, "\n")
	col := strings.Index(lines[0], "ACTIVE")
	for _, l := range lines[1:4] {
		if len(l) <= col || l[col] == ' ' {
			t.Errorf("ACTIVE column (at %d) empty in %q", col, l)
		}
	}

	out, _, err = run(t, "--socket", sock, "service", "list")
	if err != nil {
		t.Fatal(err)
	}
	if got := rows(out); len(got) != 2 || fmt.Sprint(got[1]) != fmt.Sprint([]string{"web", "10.0.0.10:80/tcp", "dsr/ipip", "2", "6", "8", "300", "9", "file"}) {
		t.Errorf("service list:\n%s", out)
	}

	out, _, err = run(t, "--socket", sock, "service", "get", "web")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"connections  6 active, 8 inactive", "ACTIVE  INACT"} {
		if !strings.Contains(out, w) {
			t.Errorf("service get lacks %q:\n%s", w, out)
		}
	}
	if !regexp.MustCompile(`10\.1\.0\.12:80\s+draining \(override; configured active\)\s+unhealthy\s+2\s+0\s+2\s+7\s+100`).MatchString(out) {
		t.Errorf("service get: the draining backend's row lacks its connections:\n%s", out)
	}

	out, _, err = run(t, "--socket", sock, "-o", "json", "service", "list", "--backends")
	var svcs []api.Service
	if err != nil || json.Unmarshal([]byte(out), &svcs) != nil || len(svcs) != 1 || svcs[0].Backends[1].InactiveConns != 7 {
		t.Errorf("service list --backends -o json: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"active_conns": 4`) || !strings.Contains(out, `"inactive_conns": 7`) {
		t.Errorf("JSON lacks the connection fields:\n%s", out)
	}
}

func TestConntrackListAndFlush(t *testing.T) {
	p := &inspectProvider{}
	sock := inspectDaemon(t, p)
	out, _, err := run(t, "--socket", sock, "conntrack", "list", "--service", "web", "--backend", "10.1.0.11:80")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"PROTO", "CLIENT", "VIP", "SERVICE", "BACKEND", "STATE", "AGE", "EXPIRE", "SNAT"},
		{"tcp", "198.51.100.7:40000", "10.0.0.10:80", "web", "10.1.0.11:80", "established", "3s", "1h59m57s", "-"},
		{"tcp", "198.51.100.8:40001", "10.0.0.10:80", "-", "id 9", "closing", "1m1s", "0s", "10.0.0.1:20000"},
	}
	if got := rows(out); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("conntrack list:\n%s\nrows %q\nwant %q", out, got, want)
	}
	out, _, err = run(t, "--socket", sock, "-o", "json", "conntrack", "list")
	var fl api.FlowList
	if err != nil || json.Unmarshal([]byte(out), &fl) != nil || len(fl.Flows) != 2 || fl.Matched != 2 ||
		fl.Flows[1].SNAT != "10.0.0.1:20000" || !fl.Flows[0].Active {
		t.Errorf("conntrack list -o json: %v\n%s", err, out)
	}
	// A listing cut short by --limit says so, on stderr.
	out, errOut, err := run(t, "--socket", sock, "conntrack", "list", "--limit", "1")
	if err != nil || len(rows(out)) != 2 || errOut != "listed 1 of 2 matching flows; --limit 0 lists all\n" {
		t.Errorf("conntrack list --limit 1: %v\n%s\nstderr %q", err, out, errOut)
	}
	_, errOut, err = run(t, "--socket", sock, "conntrack", "list", "--limit", "0")
	if err != nil || errOut != "" {
		t.Errorf("conntrack list --limit 0: %v, stderr %q", err, errOut)
	}
	want2 := []api.FlowQuery{{Service: "web", Backend: "10.1.0.11:80", Limit: 1000}, {Limit: 1000}, {Limit: 1}, {}}
	if fmt.Sprint(p.asked) != fmt.Sprint(want2) {
		t.Errorf("the daemon was asked for %+v, want %+v", p.asked, want2)
	}

	// A flush names what it flushes.
	for _, args := range [][]string{
		{"conntrack", "flush"},
		{"conntrack", "flush", "--all", "--backend", "10.1.0.11:80"},
		{"conntrack", "flush", "--backend", "10.1.0.11"},
		{"conntrack", "list", "--backend", "nonsense"},
		{"conntrack", "list", "--limit", "-1"},
	} {
		_, _, err := run(t, append([]string{"--socket", sock}, args...)...)
		if err == nil || exitCode(err) != 2 {
			t.Errorf("l4lbctl %v: %v (exit %d), want a usage error", args, err, exitCode(err))
		}
	}
	if len(p.flushed) != 0 {
		t.Fatalf("a refused flush reached the daemon: %+v", p.flushed)
	}
	out, _, err = run(t, "--socket", sock, "conntrack", "flush", "--backend", "10.1.0.11:80")
	if err != nil || out != "flushed 3 flows and 1 SNAT bindings\n" {
		t.Errorf("flush: %v %q", err, out)
	}
	out, _, err = run(t, "--socket", sock, "-o", "json", "conntrack", "flush", "--all")
	var res api.FlushResult
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res != (api.FlushResult{Flows: 3, Bindings: 1}) {
		t.Errorf("flush --all -o json: %v %q", err, out)
	}
	if fmt.Sprint(p.flushed) != fmt.Sprint([]api.FlushRequest{{Backend: "10.1.0.11:80"}, {All: true}}) {
		t.Errorf("daemon got flushes %+v", p.flushed)
	}
}

func TestStatusShowsAttachedMode(t *testing.T) {
	sock := inspectDaemon(t, &inspectProvider{})
	out, _, err := run(t, "--socket", sock, "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^interfaces\s+eth0: xdp generic \(configured xdp auto\)$`),
		regexp.MustCompile(`(?m)^\s+bond0: not attached \(read link bond0: not found\) \(configured tc\)$`),
	} {
		if !w.MatchString(out) {
			t.Errorf("status lacks %s:\n%s", w, out)
		}
	}
}

// TestCompletionServiceNames: shell completion offers the running l4lbd's
// service names and a service's backends, and nothing (no file names, no
// hang) when no l4lbd answers.
func TestCompletionServiceNames(t *testing.T) {
	sock := inspectDaemon(t, &inspectProvider{})
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"service", "get", ""}, []string{"web\t10.0.0.10:80/tcp"}},
		{[]string{"service", "get", "x"}, nil},
		{[]string{"backend", "drain", "w"}, []string{"web\t10.0.0.10:80/tcp"}},
		{[]string{"backend", "drain", "web", "10.1.0.1"}, []string{"10.1.0.11:80\tactive", "10.1.0.12:80\tdraining"}},
		{[]string{"conntrack", "list", "--service", ""}, []string{"web\t10.0.0.10:80/tcp"}},
		{[]string{"maglev", "table", "--service", "we"}, []string{"web\t10.0.0.10:80/tcp"}},
	} {
		out, _, err := run(t, append([]string{"--socket", sock, "__complete"}, tt.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		got := lines[:len(lines)-1] // the last line is the directive
		if fmt.Sprint(got) != fmt.Sprint(tt.want) || lines[len(lines)-1] != ":4" {
			t.Errorf("complete %q: %q, want %q and :4 (no file names)", tt.args, lines, tt.want)
		}
	}
	out, _, err := run(t, "--socket", filepath.Join(t.TempDir(), "none.sock"), "__complete", "service", "get", "")
	if err != nil || strings.TrimSpace(out) != ":4" {
		t.Errorf("without a daemon: %v %q", err, out)
	}
}
