// SPDX-License-Identifier: Apache-2.0

// Package config owns the daemon's configuration: it turns the raw bytes of
// l4lb.toml into a validated model, and nothing else. It sits at the very
// start of the data flow. l4lbd parses the file at startup and on SIGHUP,
// `l4lbctl config check` parses it to report problems, the file discovery
// source takes the services from it, and the Consul source parses single
// service definitions with ParseService.
//
// Parsing is a pure function of the input: no file system, network or
// interface lookups happen here, so the same bytes always give the same
// answer on every box and in tests. TOML types stay inside the package;
// callers get lb model types.
//
// Bad input must never reach the kernel, so validation is exhaustive: every
// problem is reported (not only the first), each with the file and line to
// edit and, inside a service, which service and backend it concerns. The
// result is either a complete *Config or an ErrorList, never both.
package config

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// CurrentVersion is the config schema version this package reads. A file
// without `version` is taken to be this version; any other version is
// refused rather than guessed at.
const CurrentVersion = 1

// Options changes how strictly a config is checked.
type Options struct {
	// Dev allows a config without maglev.hash_seed: DevSeed is used instead
	// and Config.Maglev.DevSeed is set so the daemon can say so loudly. For
	// demos and tests on a single box only. It also allows the public
	// example seed of the documentation.
	Dev bool
	// Host, when set, adds the checks that need the machine's facts.
	Host *Host
}

// DevSeed is the hash seed used when Options.Dev is set and the config has
// none. It is public, fixed and therefore not secret: anyone can predict
// which backend a flow gets. Use it only for demos and tests.
var DevSeed = maglev.Seed([]byte("l4lb-dev-seed-00"))

// Defaults applied when a key is absent. Their values are part of the
// documented contract (etc/l4lb.toml repeats them).
const (
	defaultAdminSocket   = "/run/l4lb/l4lb.sock"
	defaultMetricsListen = "127.0.0.1:9842"
	defaultBPFFS         = "/sys/fs/bpf/l4lb"
	defaultSNATPortMin   = 16384
	defaultSNATPortMax   = 32767
	defaultConntrackMax  = 1 << 20
	minConntrackMax      = 1024
	defaultSNATMax       = 1 << 20
	minSNATMax           = 1024
	// Upper bounds of the capacities, far above what one box serves, so
	// a typo cannot ask the kernel for tens of gigabytes. The memory a
	// config needs is checked against the machine as well (Host).
	maxConntrackMax = 1 << 27
	maxSNATMax      = 1 << 27
	maxMaxServices  = 1 << 20
	// Backend ids share a health-probe socket mark with a fixed high byte
	// (lb/datapath HealthMarkMask).
	maxMaxBackends        = 1<<24 - 2
	maxSNATAddresses      = 16 // per family; the datapath's limit
	minSNATTimeout        = time.Second
	defaultSNATTCP        = 6 * time.Hour
	defaultSNATTCPClosing = 10 * time.Second
	defaultSNATUDP        = 60 * time.Second
	defaultMaxServices    = 4096
	// defaultSelfCheckInterval: a pass at 10,000 services fits in it
	// at the self-check's CPU budget (docs/perf-log.md).
	defaultSelfCheckInterval = 10 * time.Second
	defaultMaxBackends       = 65536
	defaultTableSize         = 16381
	defaultAffinityTimeout   = 3 * time.Hour
	defaultICMPRateLimit     = 100
	maxICMPRateLimit         = 1_000_000 // the datapath's limit
	defaultFlowInsertRate    = 50_000
	maxFlowInsertRate        = 100_000_000
	defaultHealthInterval    = 5 * time.Second
	defaultHealthTimeout     = 2 * time.Second
	defaultHealthRise        = 2
	defaultHealthFall        = 3
	defaultHealthPath        = "/"
	defaultHealthStatus      = 200
	defaultConsulAddress     = "127.0.0.1:8500"
	defaultConsulTag         = "l4lb"
	defaultConsulKVPrefix    = "l4lb/services/"
	defaultK8sClass          = "l4lb.io/l4lb"
	defaultK8sQPS            = 20
	defaultK8sBurst          = 40
	defaultK8sLeaseNS        = "kube-system"
	defaultK8sLeaseName      = "l4lb"
	defaultKubeProxyPort     = 10256
)

// Config is a validated daemon configuration.
type Config struct {
	// Version is the schema version the file declared (or CurrentVersion).
	Version  int
	Daemon   Daemon
	Datapath Datapath
	Maglev   Maglev
	// Services are the services defined in the file, in file order, with
	// Source "file:<name>". Unset overrides stay ModeDefault, DispatchDefault
	// and TableSize 0 so that a change of the global default is seen as
	// such; resolve them with Service.WithDefaults(c.Defaults()).
	Services []lb.Service
	// Consul is nil when [discovery.consul] is absent: the source is off.
	Consul *Consul
	// Kubernetes is nil when [discovery.kubernetes] is absent: the source
	// is off.
	Kubernetes *Kubernetes
	// Warnings are settings that work but are likely to harm the box;
	// only checks with Options.Host make them.
	Warnings ErrorList
	// MapMemory is the estimated kernel memory of the datapath maps;
	// zero when Options.Host could not tell.
	MapMemory MapMemory
	// BGP is nil when [bgp] is absent: no VIP is announced over BGP.
	BGP *BGP
	// L2 is nil when [l2] is absent: no ARP or neighbour solicitation for
	// a VIP is answered.
	L2 *L2
	// Fleet is nil when the fleet check does not publish (no
	// [discovery.consul], or fleet.publish = false).
	Fleet *Fleet
	// IPFIX is nil when [ipfix] is absent: no flow records are exported.
	IPFIX *IPFIX
}

// Daemon holds the settings of the l4lbd process itself.
type Daemon struct {
	// AdminSocket is the unix socket of the admin API that l4lbctl uses.
	AdminSocket string
	// MetricsListen are the host:port addresses serving Prometheus
	// metrics; empty turns metrics off.
	MetricsListen []string
	// BPFFS is the bpffs directory where maps and links are pinned so they
	// survive a daemon restart.
	BPFFS string
	// LogLevel is the minimum level logged.
	LogLevel slog.Level
	// MaxFlowMove, when above 0, is the largest share (0..1] of any
	// service's flows a reload may move to another backend; a reload
	// that would move more is refused, naming the service.
	MaxFlowMove float64
	// WatchConfig makes l4lbd reload by itself when the configuration
	// file's content changes, through the same validation and
	// MaxFlowMove guard as an explicit reload. Off by default: saving
	// the file is not applying it; the operator reloads (SIGHUP,
	// `l4lbctl reload`, `systemctl reload l4lb`) once the file is
	// checked and its diff reviewed.
	WatchConfig bool
	// SelfCheckInterval is how often l4lbd reads the maps it programmed
	// back, compares them with its record and writes again what differs
	// (lb/selfcheck): the time from the start of one pass to the start of
	// the next.
	SelfCheckInterval time.Duration
}

// Attach is the kernel hook the load-balancer program runs at.
type Attach uint8

// Attach points. XDP is the default because it sees packets before the
// stack allocates anything; tc is for drivers or setups where XDP cannot
// attach.
const (
	AttachXDP Attach = iota
	AttachTC
)

// String returns the config name of the attach point.
func (a Attach) String() string {
	switch a {
	case AttachXDP:
		return "xdp"
	case AttachTC:
		return "tc"
	}
	return fmt.Sprintf("attach-%d", uint8(a))
}

// XDPMode is how an XDP program is attached to a driver.
type XDPMode uint8

// XDP attach modes. Auto, the zero value, tries native (driver) mode and
// falls back to generic (skb) mode when the driver has no XDP support.
const (
	XDPAuto XDPMode = iota
	XDPNative
	XDPGeneric
)

// String returns the config name of the XDP mode.
func (m XDPMode) String() string {
	switch m {
	case XDPAuto:
		return "auto"
	case XDPNative:
		return "native"
	case XDPGeneric:
		return "generic"
	}
	return fmt.Sprintf("xdp-mode-%d", uint8(m))
}

// Datapath holds the settings of the eBPF datapath.
type Datapath struct {
	// Interfaces are the interfaces the program attaches to; never empty
	// in a parsed config.
	Interfaces []string
	Attach     Attach
	// XDPMode only matters when Attach is AttachXDP.
	XDPMode XDPMode
	// Mode and Dispatch are the defaults of services that set none.
	Mode     lb.Mode
	Dispatch lb.Dispatch
	// SNATAddresses are the source addresses of SNAT-ed packets; empty
	// means the primary address of each interface.
	SNATAddresses []netip.Addr
	// SNATPortMin and SNATPortMax bound the source ports allocated for
	// SNAT, inclusive.
	SNATPortMin, SNATPortMax uint16
	// ConntrackMax is the capacity of the connection table.
	ConntrackMax uint32
	// MaxServices and MaxBackends are the capacities of the service and
	// backend maps, shared by all discovery sources.
	MaxServices uint32
	MaxBackends uint32
	// SNATMax is the capacity of each of the two SNAT tables (bindings).
	SNATMax uint32
	// DrainTimeout is how long a draining backend keeps its established
	// flows before they are moved; 0: until they end. Services may
	// override it.
	DrainTimeout time.Duration
	// SNATTimeouts are the idle timeouts of SNAT bindings.
	SNATTimeouts SNATTimeouts
	// ICMPRateLimit is how many ICMP fragmentation-needed / packet-too-big
	// messages each CPU may send per second to clients whose packets are
	// too big for the path to a backend; 0 sends none.
	ICMPRateLimit uint32
	// FlowInsertRate is how many new flows per second each CPU records
	// in the connection table (and in the main SNAT tables); above it a
	// DSR flow goes by Maglev alone and a SNAT binding to the overflow
	// tables, so that floods cannot evict established flows. 0: no limit.
	FlowInsertRate uint32
}

// SNATTimeouts are how long a SNAT binding may stay idle before its port
// is free for another flow.
type SNATTimeouts struct {
	// TCP applies to established TCP flows.
	TCP time.Duration
	// TCPClosing applies after a FIN or RST in either direction, and to
	// flows whose backend has not answered (or, for a SYN, whose client
	// has not acknowledged the answer) yet.
	TCPClosing time.Duration
	// UDP applies to UDP flows.
	UDP time.Duration
}

// Maglev holds the consistent-hashing settings shared by every LB box.
type Maglev struct {
	// Seed keys both the backend permutations and the flow hash; every box
	// must use the same one.
	Seed maglev.Seed
	// DevSeed is true when Seed is DevSeed because the config had none and
	// Options.Dev allowed that.
	DevSeed bool
	// TableSize is the default Maglev table size (a prime).
	TableSize uint32
}

// Consul holds the settings of the Consul discovery source.
type Consul struct {
	// Address is the host:port of the Consul agent's HTTP API.
	Address string
	// Tag marks the Consul service instances that are l4lb backends.
	Tag string
	// KVPrefix is where whole service definitions are stored in the KV
	// store, one key per service (parsed with ParseService).
	KVPrefix string
	// TokenFile holds the ACL token; empty means no token.
	TokenFile  string
	Datacenter string
	// Stale allows any Consul server to answer reads, so discovery keeps
	// working while the cluster has no leader.
	Stale bool
	// TLS settings for the agent connection; all empty means plain HTTP.
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	TLSServerName string
	// WarningState is what an instance whose checks are in the warning
	// state becomes: lb.Active or lb.Draining.
	WarningState lb.BackendState
	// RegisterSelf registers this LB box as a Consul service.
	RegisterSelf bool
	// MaxWatches is the most blocking queries the source holds open, one
	// per tagged service, each an HTTP connection to the agent (which
	// refuses more than limits.http_max_conns_per_client, 200 by
	// default, from one address). With more tagged services than this
	// the source watches them all with two queries instead (docs/consul.md).
	// Zero means DefaultConsulMaxWatches.
	MaxWatches int
}

// DefaultConsulMaxWatches leaves room under the agent's default of 200
// connections per client for the catalog, KV and fleet watches, the
// self-registration and other clients on the box.
const DefaultConsulMaxWatches = 128

// Kubernetes holds the settings of the Kubernetes discovery source.
type Kubernetes struct {
	// Kubeconfig is the path of a kubeconfig file; empty means the
	// in-cluster configuration.
	Kubeconfig string
	// LoadBalancerClass selects the LoadBalancer Services this box serves.
	LoadBalancerClass string
	// IncludeClassless also serves LoadBalancer Services that set no
	// spec.loadBalancerClass. Off by default: turning on a class must
	// never take over Services another controller serves.
	IncludeClassless bool
	// NodeSelector, when not empty, limits node backends to the Nodes
	// carrying every one of these labels with these values.
	NodeSelector map[string]string
	// Pools hand out VIPs to Services that ask for none (lowest free
	// address first). NamedPools are chosen with the l4lb.io/pool
	// annotation. A requested address must lie in one of either.
	Pools      []netip.Prefix
	NamedPools map[string][]netip.Prefix
	// Backends is what a Service's backends are unless its l4lb.io/backends
	// annotation says otherwise.
	Backends K8sBackends
	// Health holds the checks given to Kubernetes backends.
	Health K8sHealth
	// QPS and Burst bound the client's request rate to the apiserver.
	QPS   float64
	Burst int
	// LeaseNamespace and LeaseName name the coordination.k8s.io Lease that
	// elects the one box that writes Service status and Events.
	LeaseNamespace string
	LeaseName      string
}

// K8sBackends is what the Kubernetes source turns into a Service's backends.
type K8sBackends uint8

// Backend kinds.
const (
	// K8sNodePort: the eligible Nodes, at the Service's NodePort.
	K8sNodePort K8sBackends = iota
	// K8sPod: the ready endpoints of the Service's EndpointSlices, for
	// pod networks routable from the LB box.
	K8sPod
)

// String returns the config name.
func (b K8sBackends) String() string {
	if b == K8sPod {
		return "pod"
	}
	return "nodeport"
}

// ParseK8sBackends parses "nodeport" or "pod".
func ParseK8sBackends(s string) (K8sBackends, error) {
	switch s {
	case "nodeport":
		return K8sNodePort, nil
	case "pod":
		return K8sPod, nil
	}
	return 0, fmt.Errorf("unknown backends %q (want nodeport or pod)", s)
}

// ClusterCheck is how node backends of an externalTrafficPolicy=Cluster
// Service are checked (Local ones are always checked on their
// healthCheckNodePort).
type ClusterCheck uint8

// Cluster checks.
const (
	// ClusterCheckNodePort connects with TCP to the Service's NodePort.
	ClusterCheckNodePort ClusterCheck = iota
	// ClusterCheckKubeProxy asks kube-proxy's /healthz on KubeProxyPort.
	ClusterCheckKubeProxy
	// ClusterCheckNone checks nothing.
	ClusterCheckNone
)

var clusterCheckNames = []string{"nodeport", "kube-proxy", "none"}

// String returns the config name.
func (c ClusterCheck) String() string {
	if int(c) < len(clusterCheckNames) {
		return clusterCheckNames[c]
	}
	return fmt.Sprintf("cluster-check-%d", uint8(c))
}

// ParseClusterCheck parses "nodeport", "kube-proxy" or "none".
func ParseClusterCheck(s string) (ClusterCheck, error) {
	for i, n := range clusterCheckNames {
		if n == s {
			return ClusterCheck(i), nil
		}
	}
	return 0, fmt.Errorf("unknown check %q (want nodeport, kube-proxy or none)", s)
}

// K8sHealth are the health checks of Kubernetes backends; Services override
// them with l4lb.io/health-* annotations.
type K8sHealth struct {
	Cluster       ClusterCheck
	KubeProxyPort uint16
	// Pod is the check of pod backends: HealthTCP or HealthNone.
	Pod lb.HealthType
	// Timing of every check.
	Interval, Timeout time.Duration
	Rise, Fall        int
}

// Default returns a configuration holding every default: no services, no
// discovery source, no interfaces and no hash seed, so it is a starting
// point rather than something l4lbd can run with.
func Default() *Config {
	return &Config{
		Version: CurrentVersion,
		Daemon: Daemon{
			AdminSocket:   defaultAdminSocket,
			MetricsListen: []string{defaultMetricsListen},
			BPFFS:         defaultBPFFS,
			LogLevel:      slog.LevelInfo,

			SelfCheckInterval: defaultSelfCheckInterval,
		},
		Datapath: Datapath{
			Attach:         AttachXDP,
			XDPMode:        XDPAuto,
			Mode:           lb.ModeSNAT,
			Dispatch:       lb.DispatchIPIP,
			SNATPortMin:    defaultSNATPortMin,
			SNATPortMax:    defaultSNATPortMax,
			ConntrackMax:   defaultConntrackMax,
			MaxServices:    defaultMaxServices,
			MaxBackends:    defaultMaxBackends,
			SNATMax:        defaultSNATMax,
			SNATTimeouts:   SNATTimeouts{TCP: defaultSNATTCP, TCPClosing: defaultSNATTCPClosing, UDP: defaultSNATUDP},
			ICMPRateLimit:  defaultICMPRateLimit,
			FlowInsertRate: defaultFlowInsertRate,
		},
		Maglev: Maglev{TableSize: defaultTableSize},
	}
}

// Defaults returns what a service inherits when it does not override it.
func (c *Config) Defaults() lb.Defaults {
	return lb.Defaults{
		Mode:         c.Datapath.Mode,
		Dispatch:     c.Datapath.Dispatch,
		TableSize:    c.Maglev.TableSize,
		DrainTimeout: c.Datapath.DrainTimeout,
	}
}

// Parse parses and validates a config file's contents. name is used in
// error locations and in each service's Source. On failure the error is an
// ErrorList with every problem found, sorted by line.
func Parse(name string, data []byte, opts Options) (*Config, error) {
	c := &checker{file: name}
	var raw rawFile
	strict, ok := c.decodeTOML(data, &raw)
	if !ok {
		return nil, c.errs
	}
	if !c.version(raw.Version) {
		// The rest of a file written for another schema would only produce
		// misleading errors.
		return nil, c.errs
	}
	c.addStrict(strict, raw.Service, reflect.TypeOf(raw), true)
	cfg := c.config(&raw, opts)
	c.host(&raw, cfg, opts.Host)
	if len(c.errs) > 0 {
		c.errs.sortByLine()
		return nil, c.errs
	}
	c.warns.sortByLine()
	cfg.Warnings = c.warns
	return cfg, nil
}

// MaxFileSize is the largest config file Load reads: room for about
// 400,000 services of ten backends (a service of ten backends takes about
// 600 bytes), and small enough that a wrong path cannot exhaust memory.
const MaxFileSize = 256 << 20

// Load reads and parses the config file at path.
func Load(path string, opts Options) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, opts)
}

// ReadFile reads a config file: a regular file (or a symbolic link to one)
// of at most MaxFileSize bytes. Anything else is refused before a byte is
// read, so a FIFO cannot block the caller (the daemon's control loop) and a
// device such as /dev/zero cannot grow its memory without bound.
func ReadFile(path string) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO would otherwise wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot read config file: %w (check the --config path and its permissions)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read config file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("config file %s is not a regular file (%s): point --config at a regular file", path, fi.Mode().Type())
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("config file %s is %d bytes, more than the %d MiB a config file may have", path, fi.Size(), MaxFileSize>>20)
	}
	// One buffer of the size Stat gave, with room to see the end of the
	// file: io.ReadAll would start small and double, copying a large
	// file about twenty times over and leaving the copies to the
	// collector. The file may grow between Stat and the read: readAll
	// grows the buffer then, up to the limit.
	data, err := readAll(f, int(fi.Size())+512, MaxFileSize+1)
	if err != nil {
		return nil, fmt.Errorf("cannot read config file %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("config file %s is more than the %d MiB a config file may have", path, MaxFileSize>>20)
	}
	return data, nil
}

// readAll reads r to its end into a buffer of capacity size to start with,
// reading at most limit bytes.
func readAll(r io.Reader, size, limit int) ([]byte, error) {
	buf := make([]byte, 0, min(size, limit))
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(max(cap(buf), 512), limit-len(buf)))
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
	return buf, nil
}
