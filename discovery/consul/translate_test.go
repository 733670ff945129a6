// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

var unitDefaults = lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251}

type entrySpec struct {
	node, nodeAddr, id, addr string
	port, weight             int
	meta                     map[string]string
	checks                   []string // statuses
}

func entries(specs ...entrySpec) []*api.ServiceEntry {
	var out []*api.ServiceEntry
	for _, s := range specs {
		e := &api.ServiceEntry{
			Node:    &api.Node{Node: s.node, Address: s.nodeAddr},
			Service: &api.AgentService{ID: s.id, Service: "web", Address: s.addr, Port: s.port, Meta: s.meta, Weights: api.AgentWeights{Passing: s.weight}},
		}
		for i, st := range s.checks {
			e.Checks = append(e.Checks, &api.HealthCheck{CheckID: fmt.Sprint(i), Status: st})
		}
		out = append(out, e)
	}
	return out
}

func webMeta(kv ...string) map[string]string {
	m := map[string]string{MetaVIP: "192.0.2.10", MetaPort: "80", MetaProtocol: "tcp"}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(m, kv[i])
		} else {
			m[kv[i]] = kv[i+1]
		}
	}
	return m
}

func backendList(svc lb.Service) []string {
	var out []string
	for _, b := range svc.Backends {
		out = append(out, fmt.Sprintf("%s/w%d/%s", b.Addr, b.Weight, b.State))
	}
	return out
}

func TestFromCatalog(t *testing.T) {
	pass, warn, crit := api.HealthPassing, api.HealthWarning, api.HealthCritical
	tests := []struct {
		name     string
		defaults lb.Defaults
		warning  lb.BackendState
		in       []*api.ServiceEntry
		ok       bool
		backends []string
		problems []string // substrings, one per problem, in order
	}{
		{
			name: "passing, warning, critical and maintenance instances",
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, weight: 2, meta: webMeta(), checks: []string{pass, pass}},
				entrySpec{node: "n1", id: "b", addr: "10.1.0.2", port: 8080, meta: webMeta(), checks: []string{pass, warn}},
				entrySpec{node: "n2", id: "c", addr: "10.1.0.3", port: 8080, meta: webMeta(), checks: []string{warn, crit}},
				entrySpec{node: "n2", id: "d", addr: "10.1.0.4", port: 8080, meta: webMeta(), checks: []string{api.HealthMaint}},
			),
			warning:  lb.Draining,
			ok:       true,
			backends: []string{"10.1.0.1:8080/w2/active", "10.1.0.2:8080/w1/draining"},
		},
		{
			name:     "warning instances served when warning_state is active",
			in:       entries(entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta(), checks: []string{warn}}),
			warning:  lb.Active,
			ok:       true,
			backends: []string{"10.1.0.1:8080/w1/active"},
		},
		{
			name:     "node address when the instance has none",
			in:       entries(entrySpec{node: "n1", nodeAddr: "10.1.0.9", id: "a", port: 8080, meta: webMeta()}),
			ok:       true,
			backends: []string{"10.1.0.9:8080/w1/active"},
		},
		{
			name: "required meta missing",
			in:   entries(entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta(MetaVIP, "", MetaProtocol, "")}),
			problems: []string{
				`consul service "web" meta of instance "a" on node "n1": meta l4lb-vip is missing`,
				`meta l4lb-protocol is missing`,
			},
		},
		{
			name:     "bad values are reported with the file's checks",
			in:       entries(entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta(MetaProtocol, "sctp", MetaTableSize, "1000")}),
			problems: []string{`protocol`, `table_size`},
		},
		{
			name: "meta of the majority wins; the odd instance is left out",
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta(MetaPort, "81")},
				entrySpec{node: "n2", id: "b", addr: "10.1.0.2", port: 8080, meta: webMeta()},
				entrySpec{node: "n3", id: "c", addr: "10.1.0.3", port: 8080, meta: webMeta()},
			),
			ok:       true,
			backends: []string{"10.1.0.2:8080/w1/active", "10.1.0.3:8080/w1/active"},
			problems: []string{`instance "a" on node "n1" declares l4lb-vip="192.0.2.10" l4lb-port="81"`},
		},
		{
			name: "a broken majority does not win over a valid minority",
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta(MetaPort, "eighty")},
				entrySpec{node: "n2", id: "b", addr: "10.1.0.2", port: 8080, meta: webMeta(MetaPort, "eighty")},
				entrySpec{node: "n3", id: "c", addr: "10.1.0.3", port: 8080, meta: webMeta()},
			),
			ok:       true,
			backends: []string{"10.1.0.3:8080/w1/active"},
			problems: []string{`instance "a" on node "n1" (and 1 more): meta l4lb-port = "eighty" is not a number`, `instance "a"`, `instance "b"`},
		},
		{
			name: "bad instance address and family mismatch are left out alone",
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "web.example", port: 8080, meta: webMeta()},
				entrySpec{node: "n1", id: "b", addr: "2001:db8::1", port: 8080, meta: webMeta()},
				entrySpec{node: "n1", id: "c", addr: "10.1.0.3", port: 8080, meta: webMeta()},
			),
			ok:       true,
			backends: []string{"10.1.0.3:8080/w1/active"},
			problems: []string{`instance "a" on node "n1": service "web": backend #1: address: "web.example" is not an IP address`, `instance "b" on node "n1": service "web": backend [2001:db8::1]:8080: address family differs`},
		},
		{
			name: "duplicate address and port",
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta()},
				entrySpec{node: "n2", id: "b", addr: "10.1.0.1", port: 8080, meta: webMeta()},
			),
			ok:       true,
			backends: []string{"10.1.0.1:8080/w1/active"},
			problems: []string{`instance "b" on node "n2" has the same address and port (10.1.0.1:8080) as instance "a" on node "n1"`},
		},
		{
			name:     "DSR over IPIP needs the frontend port on the backend",
			defaults: lb.Defaults{Mode: lb.ModeDSR, Dispatch: lb.DispatchIPIP, TableSize: 251},
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta()},
				entrySpec{node: "n1", id: "b", addr: "10.1.0.2", port: 80, meta: webMeta()},
			),
			ok:       true,
			backends: []string{"10.1.0.2:80/w1/active"},
			problems: []string{`instance "a" on node "n1": service "web": backend 10.1.0.1:8080: port 8080 differs from the service port 80`},
		},
		{
			name: "more backends than table slots reject the service",
			in: entries(
				entrySpec{node: "n1", id: "a", addr: "10.1.0.1", port: 8080, meta: webMeta(MetaTableSize, "3")},
				entrySpec{node: "n1", id: "b", addr: "10.1.0.2", port: 8080, meta: webMeta(MetaTableSize, "3")},
				entrySpec{node: "n1", id: "c", addr: "10.1.0.3", port: 8080, meta: webMeta(MetaTableSize, "3")},
				entrySpec{node: "n1", id: "d", addr: "10.1.0.4", port: 8080, meta: webMeta(MetaTableSize, "3")},
			),
			problems: []string{`consul service "web": service "web": 4 backends have weight > 0 but the Maglev table has only 3 slots`},
		},
		{
			name: "no instances, no service",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.defaults
			if d == (lb.Defaults{}) {
				d = unitDefaults
			}
			tr := fromCatalog("web", tt.in, tt.warning, d)
			if tr.ok != tt.ok {
				t.Fatalf("ok = %v, want %v; problems:\n%s", tr.ok, tt.ok, strings.Join(tr.problems, "\n"))
			}
			if tt.ok {
				if got := backendList(tr.svc); !slices.Equal(got, tt.backends) {
					t.Errorf("backends = %v, want %v", got, tt.backends)
				}
				if tr.svc.Name != "web" || tr.svc.Source != SourceName {
					t.Errorf("name, source = %q, %q; want web, consul", tr.svc.Name, tr.svc.Source)
				}
			}
			if len(tr.problems) != len(tt.problems) {
				t.Fatalf("%d problems, want %d:\n%s", len(tr.problems), len(tt.problems), strings.Join(tr.problems, "\n"))
			}
			for i, want := range tt.problems {
				if !strings.Contains(tr.problems[i], want) || !strings.HasPrefix(tr.problems[i], `consul service "web"`) {
					t.Errorf("problem %d = %q, want it to name the service and contain %q", i, tr.problems[i], want)
				}
			}
		})
	}
}

func TestFromKV(t *testing.T) {
	tests := []struct {
		name, key, value string
		ok               bool
		problem          string
	}{
		{name: "toml", key: "l4lb/services/web", ok: true, value: "name = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nprotocol = \"tcp\"\n[[backend]]\naddress = \"10.1.0.1\"\n"},
		{name: "json", key: "l4lb/services/web", ok: true, value: `{"name":"web","vip":"192.0.2.10","port":80,"protocol":"tcp","backend":[{"address":"10.1.0.1"}]}`},
		{name: "nested key", key: "l4lb/services/team-a/web", ok: true, value: `{"name":"web","vip":"192.0.2.10","port":80,"protocol":"tcp"}`},
		{name: "name differs from key", key: "l4lb/services/www", value: `{"name":"web","vip":"192.0.2.10","port":80,"protocol":"tcp"}`,
			problem: `consul KV l4lb/services/www: service "web": the name differs from the key's last element "www"`},
		{name: "toml error has the key and line", key: "l4lb/services/web", value: "name = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nprotocol = \"tcp\"\ncolour = \"red\"\n",
			problem: `consul KV l4lb/services/web:5:`},
		{name: "empty value", key: "l4lb/services/web", value: "", problem: `consul KV l4lb/services/web`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := fromKV(tt.key, []byte(tt.value), unitDefaults)
			if tr.ok != tt.ok {
				t.Fatalf("ok = %v, want %v; problems: %v", tr.ok, tt.ok, tr.problems)
			}
			if tt.ok {
				if tr.svc.Name != "web" || tr.svc.Source != SourceName {
					t.Errorf("name, source = %q, %q", tr.svc.Name, tr.svc.Source)
				}
				return
			}
			if len(tr.problems) == 0 || !strings.HasPrefix(tr.problems[0], tt.problem) {
				t.Errorf("problems = %q, want the first to start with %q", tr.problems, tt.problem)
			}
		})
	}
}

func TestClaims(t *testing.T) {
	svc := func(name, vip string, port uint16) lb.Service {
		s := lb.Service{Name: name}
		s.Frontend.Addr = netip.MustParseAddr(vip)
		s.Frontend.Port, s.Frontend.Proto = port, lb.TCP
		return s
	}
	c := newClaims()
	// Both claim 192.0.2.10:80; origins are taken in order on a fresh
	// start, so the catalog service (sorted first) wins.
	out, probs := c.resolve([]candidate{
		{origin: "consul service \"web\"", svc: svc("web", "192.0.2.10", 80)},
		{origin: "consul KV k/web2", svc: svc("web2", "192.0.2.10", 80)},
		{origin: "consul KV k/api", svc: svc("api", "192.0.2.10", 443)},
	})
	if names := serviceNames(out); !slices.Equal(names, []string{"api", "web2"}) {
		t.Errorf("published %v, want api and web2 (the KV claim sorts first)", names)
	}
	if len(probs["consul KV k/web2"]) != 1 || len(probs["consul service \"web\""]) != 1 {
		t.Errorf("problems = %v, want one on each side of the conflict", probs)
	}
	// The earlier claim keeps serving even when it would sort later.
	out, _ = c.resolve([]candidate{
		{origin: "consul KV k/web2", svc: svc("web2", "192.0.2.10", 80)},
		{origin: "consul service \"web\"", svc: svc("web", "192.0.2.10", 80)},
		{origin: "consul service \"aaa\"", svc: svc("web2", "192.0.2.11", 80)},
	})
	if names := serviceNames(out); !slices.Equal(names, []string{"web2"}) {
		t.Errorf("published %v, want the earlier claim web2 alone (web: same frontend, aaa: same name)", names)
	}
	// The winner leaves: the loser takes over.
	out, probs = c.resolve([]candidate{{origin: "consul service \"web\"", svc: svc("web", "192.0.2.10", 80)}})
	if names := serviceNames(out); !slices.Equal(names, []string{"web"}) || len(probs) != 0 {
		t.Errorf("published %v with %v, want web alone without problems", names, probs)
	}
}

func serviceNames(svcs []lb.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Name)
	}
	return out
}

func TestNextIndex(t *testing.T) {
	tests := []struct{ prev, got, want uint64 }{
		{0, 10, 10},
		{10, 10, 10}, // wait timed out
		{10, 12, 12},
		{10, 3, 0}, // backwards: re-read without blocking
		{0, 0, 1},  // never block on 0
		{5, 0, 0},  // backwards to 0 resets too, and the next answer then lands on 1 at least
	}
	for _, tt := range tests {
		if got := nextIndex(tt.prev, tt.got); got != tt.want {
			t.Errorf("nextIndex(%d, %d) = %d, want %d", tt.prev, tt.got, got, tt.want)
		}
	}
}

// TestLoopIndexes runs the catalog watch against a stand-in agent that
// answers with a scripted sequence of indexes, and checks the index each
// query blocked on.
func TestLoopIndexes(t *testing.T) {
	answers := []uint64{10, 10, 20, 5, 5, 0, 0, 7}
	var (
		mu   sync.Mutex
		seen []string
	)
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/catalog/services" {
			// KV: answer once, then hold the query like an idle agent.
			if r.URL.Query().Get("index") != "" {
				<-r.Context().Done()
				return
			}
			w.Header().Set("X-Consul-Index", "1")
			http.Error(w, "", http.StatusNotFound)
			return
		}
		mu.Lock()
		n := len(seen)
		seen = append(seen, r.URL.Query().Get("index"))
		if n >= len(answers) {
			mu.Unlock()
			select {
			case <-done:
			default:
				close(done)
			}
			<-r.Context().Done()
			return
		}
		mu.Unlock()
		w.Header().Set("X-Consul-Index", fmt.Sprint(answers[n]))
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	cfg := &config.Consul{Address: strings.TrimPrefix(srv.URL, "http://"), Tag: "l4lb", KVPrefix: "l4lb/services/"}
	s, err := New(cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), MinInterval: time.Millisecond, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan discovery.Snapshot, 16)
	ran := make(chan error)
	go func() { ran <- s.Run(ctx, out) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not make its queries")
	}
	// The KV watch answers on its own schedule; give it time to.
	for deadline := time.Now().Add(5 * time.Second); !s.Status().Healthy && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	// index "" is a query without index: a plain read that returns at once.
	want := []string{"", "10", "10", "20", "", "5", "", "1", "7"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, want) {
		t.Errorf("queries blocked on %q, want %q", seen, want)
	}
	if st := s.Status(); !st.Healthy {
		t.Errorf("status = %+v, want healthy", st)
	}
}
