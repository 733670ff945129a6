// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// netipComparers lets go-cmp compare the netip types, whose fields are
// unexported; == is their documented equality.
var netipComparers = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

var testSeed = maglev.Seed{0x5f, 0x1c, 0x0f, 0xfe, 0xe0, 0xdd, 0xba, 0x11, 0xde, 0xad, 0xbe, 0xef, 0x00, 0xc0, 0xff, 0xee}

// head is the smallest valid config; cases append to it.
const head = `
[datapath]
interfaces = ["eth0"]

[maglev]
hash_seed = "5f1c0ffee0ddba11deadbeef00c0ffee"
`

// base is what Parse returns for head alone.
func base() *Config {
	c := Default()
	c.Datapath.Interfaces = []string{"eth0"}
	c.Maglev.Seed = testSeed
	return c
}

// noBackends is the warning of the service at index i, line, without
// backends.
func noBackends(line, i int, name string) *Error {
	return &Error{File: "test.toml", Line: line, Service: name, Key: indexPath("service", i), Msg: noBackendsMsg}
}

func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func ap(s string) netip.AddrPort   { return netip.MustParseAddrPort(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func fe(a string, port uint16, p lb.Protocol) lb.Frontend {
	return lb.Frontend{Addr: addr(a), Port: port, Proto: p}
}

func TestParseValid(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		doc  string
		want func() *Config
	}{
		{
			name: "minimal",
			doc:  head,
			want: base,
		},
		{
			name: "every global key",
			doc: `
version = 1
[daemon]
admin_socket = "/run/l4lb//admin.sock"
metrics_listen = ["127.0.0.1:9842", "[::1]:9842", ":9843"]
bpffs = "/sys/fs/bpf/lb/"
log_level = "debug"
self_check_interval = "2s"
[datapath]
interfaces = ["eth0", "eth1"]
attach = "tc"
xdp_mode = "auto"
mode = "hybrid"
dsr_dispatch = "geneve"
snat_addresses = ["10.1.0.1", "2001:db8:1::1"]
snat_port_range = "40000-50000"
conntrack_max = 2048
max_services = 10
max_backends = 20
snat_max = 4096
icmp_rate_limit = 0
flow_insert_rate = 1000
[datapath.snat_timeouts]
tcp = "1h"
tcp_closing = "1s"
udp = "90s"
[maglev]
hash_seed = "5F1C0FFEE0DDBA11DEADBEEF00C0FFEE"
table_size = 251
`,
			want: func() *Config {
				c := base()
				c.Daemon = Daemon{
					AdminSocket:   "/run/l4lb/admin.sock",
					MetricsListen: []string{"127.0.0.1:9842", "[::1]:9842", ":9843"},
					BPFFS:         "/sys/fs/bpf/lb",
					LogLevel:      slog.LevelDebug,

					SelfCheckInterval: 2 * time.Second,
				}
				c.Datapath = Datapath{
					Interfaces:     []string{"eth0", "eth1"},
					Attach:         AttachTC,
					XDPMode:        XDPAuto,
					Mode:           lb.ModeHybrid,
					Dispatch:       lb.DispatchGeneve,
					SNATAddresses:  []netip.Addr{addr("10.1.0.1"), addr("2001:db8:1::1")},
					SNATPortMin:    40000,
					SNATPortMax:    50000,
					ConntrackMax:   2048,
					MaxServices:    10,
					MaxBackends:    20,
					SNATMax:        4096,
					SNATTimeouts:   SNATTimeouts{TCP: time.Hour, TCPClosing: time.Second, UDP: 90 * time.Second},
					ICMPRateLimit:  0, // 0 is a value (send none), not "unset"
					FlowInsertRate: 1000,
				}
				c.Maglev.TableSize = 251
				return c
			},
		},
		{
			name: "metrics off",
			doc:  head + "[daemon]\nmetrics_listen = []\n",
			want: func() *Config {
				c := base()
				c.Daemon.MetricsListen = nil
				return c
			},
		},
		{
			name: "dev without seed",
			opts: Options{Dev: true},
			doc:  "[datapath]\ninterfaces = [\"lo\"]\n",
			want: func() *Config {
				c := Default()
				c.Datapath.Interfaces = []string{"lo"}
				c.Maglev.Seed, c.Maglev.DevSeed = DevSeed, true
				return c
			},
		},
		{
			name: "dev with seed keeps it",
			opts: Options{Dev: true},
			doc:  head,
			want: base,
		},
		{
			name: "service defaults",
			doc: head + `
[[service]]
name = "web"
vip = "10.0.0.10"
port = 80
protocol = "TCP"
[[service.backend]]
address = "10.1.0.11"
[[service.backend]]
address = "10.1.0.12"
port = 8080
weight = 0
state = "draining"
`,
			want: func() *Config {
				c := base()
				// Overrides stay unset so a change of the global default
				// is visible to the reconciler as such.
				c.Services = []lb.Service{{
					Name:     "web",
					Frontend: fe("10.0.0.10", 80, lb.TCP),
					Backends: []lb.Backend{
						{Addr: ap("10.1.0.11:80"), Weight: 1, State: lb.Active},
						{Addr: ap("10.1.0.12:8080"), Weight: 0, State: lb.Draining},
					},
					Source: "file:test.toml",
				}}
				return c
			},
		},
		{
			name: "service with every key",
			doc: head + `
[[service]]
name = "dns6.v2_x"
vip = "2001:db8::53"
port = 53
protocol = "udp"
mode = "dsr"
dsr_dispatch = "opt"
algorithm = "random"
table_size = 509
affinity = "client-ip"
affinity_timeout = "90s"
source_ranges = ["2001:db8:100::/48", "2001:db8:200::/48"]
[service.health]
type = "udp"
port = 5300
interval = "10s"
timeout = "3s"
rise = 5
fall = 1
send = "ping"
expect = "pong"
[[service.backend]]
address = "2001:db8:1::11"
port = 5353
weight = 3
state = "disabled"
`,
			want: func() *Config {
				c := base()
				c.Services = []lb.Service{{
					Name:         "dns6.v2_x",
					Frontend:     fe("2001:db8::53", 53, lb.UDP),
					Mode:         lb.ModeDSR,
					Dispatch:     lb.DispatchOpt,
					TableSize:    509,
					Algorithm:    lb.Random,
					Affinity:     lb.Affinity{ClientIP: true, Timeout: 90 * time.Second},
					SourceRanges: []netip.Prefix{prefix("2001:db8:100::/48"), prefix("2001:db8:200::/48")},
					Health: lb.HealthCheck{
						Type: lb.HealthUDP, Port: 5300, Interval: 10 * time.Second, Timeout: 3 * time.Second,
						Rise: 5, Fall: 1, Send: "ping", Expect: "pong",
					},
					Backends: []lb.Backend{{Addr: ap("[2001:db8:1::11]:5353"), Weight: 3, State: lb.Disabled}},
					Source:   "file:test.toml",
				}}
				return c
			},
		},
		{
			name: "health defaults",
			doc: head + `
[[service]]
name = "a"
vip = "10.0.0.10"
port = 80
protocol = "tcp"
affinity = "client-ip"
[service.health]
type = "http"
[[service]]
name = "b"
vip = "10.0.0.10"
port = 81
protocol = "tcp"
affinity = "none"
[service.health]
type = "tcp"
interval = "1s"
[[service]]
name = "c"
vip = "10.0.0.10"
port = 82
protocol = "tcp"
[service.health]
type = "none"
`,
			want: func() *Config {
				c := base()
				c.Services = []lb.Service{
					{
						Name: "a", Frontend: fe("10.0.0.10", 80, lb.TCP),
						Affinity: lb.Affinity{ClientIP: true, Timeout: 3 * time.Hour},
						Health: lb.HealthCheck{Type: lb.HealthHTTP, Interval: 5 * time.Second, Timeout: 2 * time.Second,
							Rise: 2, Fall: 3, Path: "/", ExpectStatus: 200},
						Source: "file:test.toml",
					},
					{
						Name: "b", Frontend: fe("10.0.0.10", 81, lb.TCP),
						// The default timeout shrinks to a shorter interval.
						Health: lb.HealthCheck{Type: lb.HealthTCP, Interval: time.Second, Timeout: time.Second, Rise: 2, Fall: 3},
						Source: "file:test.toml",
					},
					{
						Name: "c", Frontend: fe("10.0.0.10", 82, lb.TCP),
						Source: "file:test.toml",
					},
				}
				c.Warnings = ErrorList{noBackends(8, 0, "a"), noBackends(16, 1, "b"), noBackends(25, 2, "c")}
				return c
			},
		},
		{
			name: "ports that DSR allows",
			doc: `
[datapath]
interfaces = ["eth0"]
mode = "hybrid"
[maglev]
hash_seed = "5f1c0ffee0ddba11deadbeef00c0ffee"
# Hybrid sends UDP by SNAT, so the backend port is free.
[[service]]
name = "udp"
vip = "10.0.0.10"
port = 53
protocol = "udp"
[[service.backend]]
address = "10.1.0.11"
port = 5353
# opt rewrites the destination port, so the backend port is free.
[[service]]
name = "opt"
vip = "10.0.0.10"
port = 80
protocol = "tcp"
dsr_dispatch = "opt"
[[service.backend]]
address = "10.1.0.11"
port = 8080
# SNAT override.
[[service]]
name = "snat"
vip = "10.0.0.10"
port = 81
protocol = "tcp"
mode = "snat"
[[service.backend]]
address = "10.1.0.11"
port = 8081
# IPIP with the service's own port.
[[service]]
name = "same-port"
vip = "10.0.0.10"
port = 82
protocol = "tcp"
[[service.backend]]
address = "10.1.0.11"
port = 82
`,
			want: func() *Config {
				c := base()
				c.Datapath.Mode = lb.ModeHybrid
				c.Services = []lb.Service{
					{Name: "udp", Frontend: fe("10.0.0.10", 53, lb.UDP),
						Backends: []lb.Backend{{Addr: ap("10.1.0.11:5353"), Weight: 1}}, Source: "file:test.toml"},
					{Name: "opt", Frontend: fe("10.0.0.10", 80, lb.TCP), Dispatch: lb.DispatchOpt,
						Backends: []lb.Backend{{Addr: ap("10.1.0.11:8080"), Weight: 1}}, Source: "file:test.toml"},
					{Name: "snat", Frontend: fe("10.0.0.10", 81, lb.TCP), Mode: lb.ModeSNAT,
						Backends: []lb.Backend{{Addr: ap("10.1.0.11:8081"), Weight: 1}}, Source: "file:test.toml"},
					{Name: "same-port", Frontend: fe("10.0.0.10", 82, lb.TCP),
						Backends: []lb.Backend{{Addr: ap("10.1.0.11:82"), Weight: 1}}, Source: "file:test.toml"},
				}
				return c
			},
		},
		{
			name: "same address and port, different protocol",
			doc: head + `
[[service]]
name = "dns-udp"
vip = "10.0.0.53"
port = 53
protocol = "udp"
[[service]]
name = "dns-tcp"
vip = "10.0.0.53"
port = 53
protocol = "tcp"
`,
			want: func() *Config {
				c := base()
				c.Services = []lb.Service{
					{Name: "dns-udp", Frontend: fe("10.0.0.53", 53, lb.UDP), Source: "file:test.toml"},
					{Name: "dns-tcp", Frontend: fe("10.0.0.53", 53, lb.TCP), Source: "file:test.toml"},
				}
				c.Warnings = ErrorList{noBackends(8, 0, "dns-udp"), noBackends(13, 1, "dns-tcp")}
				return c
			},
		},
		{
			name: "inline tables",
			doc: `service = [
  { name = "web", vip = "10.0.0.10", port = 80, protocol = "tcp", health = { type = "tcp" }, backend = [
    { address = "10.1.0.11" },
    { address = "10.1.0.12", weight = 2 },
  ] },
]
` + head,
			want: func() *Config {
				c := base()
				c.Services = []lb.Service{{
					Name: "web", Frontend: fe("10.0.0.10", 80, lb.TCP),
					Health: lb.HealthCheck{Type: lb.HealthTCP, Interval: 5 * time.Second, Timeout: 2 * time.Second, Rise: 2, Fall: 3},
					Backends: []lb.Backend{
						{Addr: ap("10.1.0.11:80"), Weight: 1},
						{Addr: ap("10.1.0.12:80"), Weight: 2},
					},
					Source: "file:test.toml",
				}}
				return c
			},
		},
		{
			name: "discovery defaults",
			doc:  head + "[discovery.consul]\n[discovery.kubernetes]\n",
			want: func() *Config {
				c := base()
				c.Consul = &Consul{Address: "127.0.0.1:8500", Tag: "l4lb", KVPrefix: "l4lb/services/", Stale: true, WarningState: lb.Active, MaxWatches: DefaultConsulMaxWatches}
				c.Kubernetes = k8sDefaults()
				c.Fleet = &Fleet{KVPrefix: "l4lb/fleet/", SessionTTL: 15 * time.Second}
				return c
			},
		},
		{
			name: "bgp and l2 defaults",
			doc:  head + "[bgp]\nasn = 65001\nrouter_id = \"10.0.0.2\"\n[[bgp.peer]]\naddress = \"2001:db8::1\"\nasn = 65000\n[l2]\n",
			want: func() *Config {
				c := base()
				c.BGP = &BGP{
					ASN: 65001, RouterID: netip.MustParseAddr("10.0.0.2"), MinHealthy: 1,
					GracefulRestart: true, RestartTime: 120 * time.Second, OnStop: StopKeep, DrainTime: 5 * time.Second,
					Peers: []BGPPeer{{
						Address: netip.MustParseAddr("2001:db8::1"), ASN: 65000, Port: 179,
						HoldTime: 90 * time.Second, Keepalive: 30 * time.Second, ConnectRetry: 5 * time.Second, IPv6: true,
					}},
				}
				c.L2 = &L2{Interfaces: c.Datapath.Interfaces, MinHealthy: 1}
				return c
			},
		},
		{
			name: "l2 failover defaults",
			doc:  head + "[l2]\n[l2.failover]\n",
			want: func() *Config {
				c := base()
				c.L2 = &L2{Interfaces: c.Datapath.Interfaces, MinHealthy: 1, Failover: &L2Failover{Group: 1, Priority: 100, Interval: 200 * time.Millisecond, DetectMultiplier: 3}}
				return c
			},
		},
		{
			name: "l2 failover set",
			doc:  head + "[l2]\n[l2.failover]\nname = \"lb-a\"\ngroup = 7\npriority = 200\ninterval = \"100ms\"\ndetect_multiplier = 4\n",
			want: func() *Config {
				c := base()
				c.L2 = &L2{Interfaces: c.Datapath.Interfaces, MinHealthy: 1, Failover: &L2Failover{Name: "lb-a", Group: 7, Priority: 200, Interval: 100 * time.Millisecond, DetectMultiplier: 4}}
				return c
			},
		},
		{
			name: "l2 failover disabled",
			doc:  head + "[l2]\n[l2.failover]\nenabled = false\npriority = 200\n",
			want: func() *Config {
				c := base()
				c.L2 = &L2{Interfaces: c.Datapath.Interfaces, MinHealthy: 1}
				return c
			},
		},
		{
			name: "fleet without publishing",
			doc:  head + "[discovery.consul]\n[fleet]\npublish = false\n",
			want: func() *Config {
				c := base()
				c.Consul = &Consul{Address: "127.0.0.1:8500", Tag: "l4lb", KVPrefix: "l4lb/services/", Stale: true, WarningState: lb.Active, MaxWatches: DefaultConsulMaxWatches}
				return c
			},
		},
		{
			name: "discovery every key",
			doc: head + `
[discovery.consul]
address = "consul.service.consul:8501"
tag = "edge"
kv_prefix = "lb/"
token_file = "/etc/l4lb/token"
datacenter = "dc2"
stale = false
tls_ca_file = "/ca.pem"
tls_cert_file = "/cert.pem"
tls_key_file = "/key.pem"
tls_server_name = "consul"
warning_state = "draining"
register_self = true
max_watches = 150
[discovery.kubernetes]
kubeconfig = "/etc/l4lb/kubeconfig"
load_balancer_class = "example.com/lb"
include_classless = true
node_selector = { "node-role.kubernetes.io/edge" = "", zone = "a" }
pools = ["192.0.2.0/28", "2001:db8::/124", "198.51.100.7"]
backends = "pod"
qps = 7.5
burst = 15
lease_namespace = "l4lb"
lease_name = "edge.l4lb"
[discovery.kubernetes.named_pools]
gold = ["203.0.113.0/29"]
[discovery.kubernetes.health]
cluster = "kube-proxy"
kube_proxy_port = 10257
pod = "none"
interval = "1s"
rise = 1
fall = 2
`,
			want: func() *Config {
				c := base()
				c.Consul = &Consul{
					Address: "consul.service.consul:8501", Tag: "edge", KVPrefix: "lb/", TokenFile: "/etc/l4lb/token",
					Datacenter: "dc2", Stale: false, TLSCAFile: "/ca.pem", TLSCertFile: "/cert.pem", TLSKeyFile: "/key.pem",
					TLSServerName: "consul", WarningState: lb.Draining, RegisterSelf: true, MaxWatches: 150,
				}
				k := k8sDefaults()
				k.Kubeconfig, k.LoadBalancerClass, k.IncludeClassless = "/etc/l4lb/kubeconfig", "example.com/lb", true
				k.NodeSelector = map[string]string{"node-role.kubernetes.io/edge": "", "zone": "a"}
				k.Pools = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28"), netip.MustParsePrefix("2001:db8::/124"), netip.MustParsePrefix("198.51.100.7/32")}
				k.NamedPools = map[string][]netip.Prefix{"gold": {netip.MustParsePrefix("203.0.113.0/29")}}
				k.Backends, k.QPS, k.Burst, k.LeaseNamespace, k.LeaseName = K8sPod, 7.5, 15, "l4lb", "edge.l4lb"
				k.Health = K8sHealth{Cluster: ClusterCheckKubeProxy, KubeProxyPort: 10257, Pod: lb.HealthNone,
					Interval: time.Second, Timeout: time.Second, Rise: 1, Fall: 2}
				c.Kubernetes = k
				c.Fleet = &Fleet{KVPrefix: "l4lb/fleet/", SessionTTL: 15 * time.Second}
				return c
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("test.toml", []byte(tt.doc), tt.opts)
			if err != nil {
				t.Fatalf("Parse:\n%v", err)
			}
			if diff := cmp.Diff(tt.want(), got, netipComparers); diff != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse("t.toml", []byte(head+`
[[service]]
name = "web"
vip = "10.0.0.10"
port = 80
protocol = "tcp"
mode = "dsr"
`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Defaults()
	want := lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 16381}
	if d != want {
		t.Errorf("Defaults() = %+v, want %+v", d, want)
	}
	svc := c.Services[0].WithDefaults(d)
	if svc.Mode != lb.ModeDSR || svc.Dispatch != lb.DispatchIPIP || svc.TableSize != 16381 {
		t.Errorf("WithDefaults: mode %v dispatch %v table %d; the override must survive and the rest be filled", svc.Mode, svc.Dispatch, svc.TableSize)
	}
}

func TestDefaultIsNotRunnable(t *testing.T) {
	// Default documents the defaults; it must not pretend to be a usable
	// config (no interface, no seed).
	d := Default()
	if len(d.Datapath.Interfaces) != 0 || d.Maglev.Seed != (maglev.Seed{}) || d.Maglev.DevSeed {
		t.Errorf("Default() has interfaces %v, seed %v, dev %t", d.Datapath.Interfaces, d.Maglev.Seed, d.Maglev.DevSeed)
	}
	if d.Version != CurrentVersion {
		t.Errorf("Default().Version = %d, want %d", d.Version, CurrentVersion)
	}
	// Each call returns a fresh value: callers may modify it.
	d.Daemon.MetricsListen[0] = "changed"
	if Default().Daemon.MetricsListen[0] == "changed" {
		t.Error("Default() shares slices between calls")
	}
}

func TestDevSeedIsValid(t *testing.T) {
	parsed, err := maglev.ParseSeed(DevSeed.String())
	if err != nil || parsed != DevSeed {
		t.Fatalf("DevSeed %v does not round-trip: %v", DevSeed, err)
	}
	if DevSeed == (maglev.Seed{}) {
		t.Fatal("DevSeed is all zeros")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(good, []byte(head), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(head+"[daemon]\nlog_level = \"loud\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	if _, err := Load(good, Options{}); err != nil {
		t.Errorf("Load(good): %v", err)
	}

	_, err := Load(bad, Options{})
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 1 {
		t.Fatalf("Load(bad) = %v, want one error in an ErrorList", err)
	}
	if list[0].File != bad || list[0].Line != 8 {
		t.Errorf("error at %s:%d, want %s:8", list[0].File, list[0].Line, bad)
	}

	_, err = Load(filepath.Join(dir, "missing.toml"), Options{})
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "--config") {
		t.Errorf("Load(missing) = %v, want a not-exist error mentioning --config", err)
	}
}

// TestReadAll: the whole content whether the size hint is short, exact or
// long (a file that grew or shrank after Stat), read in one piece or a byte
// at a time, and no more than the limit.
func TestReadAll(t *testing.T) {
	content := strings.Repeat("0123456789", 100)
	cases := []struct {
		name        string
		size, limit int
		want        int // bytes read
	}{
		{"hint exact", 1000, 2000, 1000},
		{"hint short", 10, 2000, 1000},
		{"hint zero", 0, 2000, 1000},
		{"hint long", 5000, 2000, 1000},
		{"limit inside", 10, 700, 700},
		{"limit at the end", 1000, 1000, 1000},
		{"limit one past", 1000, 1001, 1000},
	}
	for _, c := range cases {
		for _, oneByte := range []bool{false, true} {
			var r io.Reader = strings.NewReader(content)
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			got, err := readAll(r, c.size, c.limit)
			if err != nil || string(got) != content[:c.want] {
				t.Errorf("%s (one byte at a time %t): read %d bytes, error %v; want the first %d", c.name, oneByte, len(got), err, c.want)
			}
		}
	}
	if _, err := readAll(iotest.ErrReader(io.ErrUnexpectedEOF), 10, 100); err != io.ErrUnexpectedEOF {
		t.Errorf("a failing read gave error %v, want it passed on", err)
	}
}

func TestServicesSource(t *testing.T) {
	c, err := Parse("/etc/l4lb/l4lb.toml", []byte(head+"[[service]]\nname=\"a\"\nvip=\"10.0.0.1\"\nport=1\nprotocol=\"udp\"\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Services[0].Source; got != "file:/etc/l4lb/l4lb.toml" {
		t.Errorf("Source = %q, want file:/etc/l4lb/l4lb.toml", got)
	}
}

// k8sDefaults is [discovery.kubernetes] with every default.
func k8sDefaults() *Kubernetes {
	return &Kubernetes{
		LoadBalancerClass: "l4lb.io/l4lb", Backends: K8sNodePort, QPS: 20, Burst: 40,
		LeaseNamespace: "kube-system", LeaseName: "l4lb",
		Health: K8sHealth{Cluster: ClusterCheckNodePort, KubeProxyPort: 10256, Pod: lb.HealthTCP,
			Interval: 5 * time.Second, Timeout: 2 * time.Second, Rise: 2, Fall: 3},
	}
}

// TestFileModeWarnings: a config file its group can write, or every user
// can read while it holds the seed, is accepted with a warning; a file
// only root reads and writes, or the dev seed, is not warned about.
func TestFileModeWarnings(t *testing.T) {
	doc := []byte(head)
	for _, tt := range []struct {
		mode fs.FileMode
		dev  bool
		want []string
	}{
		{0o600, false, nil},
		{0o640, false, nil},
		{0o660, false, []string{"writable by its group (mode 0660)"}},
		{0o644, false, []string{"maglev.hash_seed is readable by every user (mode 0644)"}},
		{0o664, false, []string{"writable by its group (mode 0664)", "maglev.hash_seed is readable by every user (mode 0664)"}},
	} {
		h := &Host{Stat: func(string) (fs.FileMode, bool) { return tt.mode, true }}
		cfg, err := Parse("f.toml", doc, Options{Host: h})
		if err != nil {
			t.Fatalf("mode %#o: %v", tt.mode, err)
		}
		if len(cfg.Warnings) != len(tt.want) {
			t.Errorf("mode %#o: warnings %v, want %q", tt.mode, cfg.Warnings, tt.want)
			continue
		}
		for i, w := range tt.want {
			if !strings.Contains(cfg.Warnings[i].Error(), w) {
				t.Errorf("mode %#o: warning %q, want %q", tt.mode, cfg.Warnings[i], w)
			}
		}
	}
}
