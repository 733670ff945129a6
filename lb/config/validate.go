// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// seedHowTo tells an operator how to make a seed; every box must get the
// same one, so it is generated once and copied.
const seedHowTo = "generate one with `l4lbctl seed new` (or `head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n'`) and put the same value on every LB box"

// ExampleSeed is the seed the documentation used to show. Anyone can read
// it, so a box using it is as predictable as one with DevSeed: refused
// outside --dev.
var ExampleSeed = maglev.Seed{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

// version checks the schema version; false means the file must not be read
// any further.
func (c *checker) version(v any) bool {
	s := scope{c: c}
	n, ok := s.integer("version", v)
	if !ok {
		return v == nil
	}
	if n != CurrentVersion {
		s.errorf("version", "unsupported config version %d (this l4lbd reads version %d)", n, CurrentVersion)
		return false
	}
	return true
}

// config validates a whole decoded file, starting from the defaults so that
// every absent key keeps its documented value.
func (c *checker) config(raw *rawFile, opts Options) *Config {
	cfg := Default()
	c.daemon(raw.Daemon, &cfg.Daemon)
	c.datapath(raw.Datapath, &cfg.Datapath)
	c.maglev(raw.Maglev, &cfg.Maglev, opts)
	if d := raw.Discovery; d != nil {
		if d.Consul != nil {
			cfg.Consul = c.consul(d.Consul)
		}
		if d.Kubernetes != nil {
			cfg.Kubernetes = c.kubernetes(d.Kubernetes)
		}
	}
	if raw.BGP != nil {
		cfg.BGP = c.bgp(raw.BGP)
	}
	if raw.L2 != nil {
		cfg.L2 = c.l2(raw.L2, &cfg.Datapath)
	}
	cfg.Fleet = c.fleet(raw.Fleet, cfg.Consul)
	if raw.IPFIX != nil {
		cfg.IPFIX = c.ipfix(raw.IPFIX)
	}
	c.fleetOverlap(cfg.Fleet, cfg.Consul, raw.Fleet != nil && raw.Fleet.KVPrefix != nil)
	var box []HostAddr
	if opts.Host != nil {
		box = opts.Host.Addresses
	}
	cfg.Services = c.services(raw.Service, cfg.Defaults(), "file:"+c.file, box)
	c.capacity(cfg)
	return cfg
}

func (c *checker) daemon(r *rawDaemon, d *Daemon) {
	if r == nil {
		return
	}
	s := scope{c: c}.sub("daemon")
	if v, ok := s.str("admin_socket", r.AdminSocket); ok {
		// sun_path holds 108 bytes including the terminating NUL.
		if p, ok := s.absPath("admin_socket", v); ok {
			if len(p) > 107 {
				s.errorf("admin_socket", "%s = %q is %d bytes long; unix socket paths are limited to 107: use a shorter path", s.name("admin_socket"), v, len(p))
			} else {
				d.AdminSocket = p
			}
		}
	}
	if list, ok := s.strs("metrics_listen", r.MetricsListen); ok {
		seen := make(map[string]int)
		d.MetricsListen = nil
		for i, hp := range list {
			key := indexPath("metrics_listen", i)
			if err := checkHostPort(hp, false); err != nil {
				s.errorf(key, "%s: %v", s.name(key), err)
				continue
			}
			if first, dup := seen[hp]; dup {
				s.errorf(key, "%s: %q is listed twice (also at index %d): remove one", s.name(key), hp, first)
				continue
			}
			seen[hp] = i
			d.MetricsListen = append(d.MetricsListen, hp)
		}
	}
	if v, ok := s.str("bpffs", r.BPFFS); ok {
		if p, ok := s.absPath("bpffs", v); ok {
			if msg := BPFFSProblem(p); msg != "" {
				s.errorf("bpffs", "daemon.bpffs = %q %s", v, msg)
			} else {
				d.BPFFS = p
			}
		}
	}
	if l, ok := enum(s, "log_level", r.LogLevel, parseLogLevel); ok {
		d.LogLevel = l
	}
	if r.MaxFlowMove != nil {
		if f, ok := s.fraction("max_flow_move", r.MaxFlowMove); ok {
			d.MaxFlowMove = f
		}
	}
	if r.WatchConfig != nil {
		if b, ok := s.boolean("watch_config", r.WatchConfig); ok {
			d.WatchConfig = b
		}
	}
	if r.SelfCheck != nil {
		if t, ok := s.duration("self_check_interval", r.SelfCheck); ok {
			d.SelfCheckInterval = t
		}
	}
}

// fraction converts a share: a number in (0, 1], such as 0.25 for a
// quarter. An integer is accepted only as 1.
func (s scope) fraction(key string, v any) (float64, bool) {
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case int64:
		f = float64(x)
	default:
		s.wrongType(key, v, "a number in (0, 1]")
		return 0, false
	}
	if !(f > 0 && f <= 1) {
		s.errorf(key, "%s = %v is out of range: use a share in (0, 1], e.g. 0.25 for a quarter of a service's flows", s.name(key), v)
		return 0, false
	}
	return f, true
}

// absPath accepts an absolute path: a relative one would depend on the
// daemon's working directory, which systemd sets to /.
func (s scope) absPath(key, p string) (string, bool) {
	if p == "" {
		s.errorf(key, "%s is empty: set an absolute path or remove the key for the default", s.name(key))
		return "", false
	}
	if !filepath.IsAbs(p) {
		s.errorf(key, "%s = %q is not an absolute path: start it with /", s.name(key), p)
		return "", false
	}
	return filepath.Clean(p), true
}

func parseLogLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warn or error)", s)
}

// checkHostPort checks a listen or connect address. Listen addresses must
// use an IP literal (or be empty for every address) because l4lbd binds
// before name resolution can be trusted; connect addresses may use names.
func checkHostPort(hp string, names bool) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("%q is not host:port: write it like 127.0.0.1:9842 or [::1]:9842", hp)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("%q has port %q: use a number in 1..65535", hp, port)
	}
	if host == "" || host == "localhost" {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" && !a.IsLinkLocalUnicast() {
			return fmt.Errorf("%q has a zone on a non-link-local address: remove %%%s", hp, a.Zone())
		}
		return nil
	}
	if !names {
		return fmt.Errorf("%q: host %q must be an IP address, \"localhost\", or empty for all addresses", hp, host)
	}
	if strings.ContainsAny(host, " \t/") {
		return fmt.Errorf("%q: host %q is not a host name or IP address", hp, host)
	}
	return nil
}

// unicast parses an address that traffic is sent to or from. Zones, the
// unspecified address and multicast cannot be programmed into the datapath;
// IPv4-mapped IPv6 would make the address family ambiguous, and the family
// decides which map and which encapsulation a packet gets.
func unicast(text string) (netip.Addr, error) {
	a, err := netip.ParseAddr(text)
	switch {
	case err != nil:
		return a, fmt.Errorf("%q is not an IP address", text)
	case a.Zone() != "":
		return a, fmt.Errorf("%q has an IPv6 zone: zones are not supported, write the address without %%%s", text, a.Zone())
	case a.Is4In6():
		return a, fmt.Errorf("%q is an IPv4-mapped IPv6 address: write it as %s", text, a.Unmap())
	case a.IsUnspecified():
		return a, fmt.Errorf("%q is the unspecified address: use a concrete address", text)
	case a.IsMulticast():
		return a, fmt.Errorf("%q is a multicast address: use a unicast address", text)
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return a, fmt.Errorf("%q is the limited broadcast address: use a unicast address", text)
	case a.IsLoopback():
		return a, fmt.Errorf("%q is a loopback address, which never leaves the box it is on: use an address reachable over the network", text)
	}
	return a, nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func (c *checker) datapath(r *rawDatapath, d *Datapath) {
	s := scope{c: c}.sub("datapath")
	var ifaces any
	if r != nil {
		ifaces = r.Interfaces
	}
	if ifaces == nil {
		s.errorf("interfaces", "datapath.interfaces is missing: list the interfaces l4lbd attaches to, e.g. interfaces = [\"eth0\"]")
	} else if list, ok := s.strs("interfaces", ifaces); ok {
		if len(list) == 0 {
			s.errorf("interfaces", "datapath.interfaces is empty: list at least one interface, e.g. interfaces = [\"eth0\"]")
		}
		seen := make(map[string]bool)
		for i, name := range list {
			key := indexPath("interfaces", i)
			if err := checkIfName(name); err != nil {
				s.errorf(key, "%s: %v", s.name(key), err)
				continue
			}
			if seen[name] {
				s.errorf(key, "%s: interface %q is listed twice: remove one", s.name(key), name)
				continue
			}
			seen[name] = true
			d.Interfaces = append(d.Interfaces, name)
		}
	}
	if r == nil {
		return
	}
	if a, ok := enum(s, "attach", r.Attach, parseAttach); ok {
		d.Attach = a
	}
	if m, ok := enum(s, "xdp_mode", r.XDPMode, parseXDPMode); ok {
		d.XDPMode = m
		if d.Attach == AttachTC && m != XDPAuto {
			s.errorf("xdp_mode", "datapath.xdp_mode = %q has no effect with attach = \"tc\": remove it or use attach = \"xdp\"", m)
		}
	}
	if m, ok := enum(s, "mode", r.Mode, lb.ParseMode); ok {
		d.Mode = m
	}
	if m, ok := enum(s, "dsr_dispatch", r.DSRDispatch, lb.ParseDispatch); ok {
		d.Dispatch = m
	}
	if list, ok := s.strs("snat_addresses", r.SNATAddresses); ok {
		seen := make(map[netip.Addr]bool)
		for i, text := range list {
			key := indexPath("snat_addresses", i)
			a, err := unicast(text)
			if err != nil {
				s.errorf(key, "%s: %v", s.name(key), err)
				continue
			}
			if seen[a] {
				s.errorf(key, "%s: %s is listed twice: remove one", s.name(key), a)
				continue
			}
			seen[a] = true
			if n := countFamily(d.SNATAddresses, a.Is4()); n == maxSNATAddresses {
				s.errorf(key, "%s: more than %d %s SNAT addresses; the datapath holds at most %d per family: remove some", s.name(key), maxSNATAddresses, family(a), maxSNATAddresses)
				continue
			}
			d.SNATAddresses = append(d.SNATAddresses, a)
		}
	}
	if v, ok := s.str("snat_port_range", r.SNATPortRange); ok {
		if lo, hi, err := parsePortRange(v); err != nil {
			s.errorf("snat_port_range", "datapath.snat_port_range = %q: %v", v, err)
		} else {
			d.SNATPortMin, d.SNATPortMax = lo, hi
		}
	}
	capacity := func(key string, v any, lo, hi, def int64, dst *uint32) {
		if n, ok := s.intIn(key, v, lo, hi, fmt.Sprintf("use %d to %d entries (default %d)", lo, hi, def)); ok {
			*dst = uint32(n)
		}
	}
	capacity("conntrack_max", r.ConntrackMax, minConntrackMax, maxConntrackMax, defaultConntrackMax, &d.ConntrackMax)
	capacity("max_services", r.MaxServices, 1, maxMaxServices, defaultMaxServices, &d.MaxServices)
	capacity("max_backends", r.MaxBackends, 1, maxMaxBackends, defaultMaxBackends, &d.MaxBackends)
	capacity("snat_max", r.SNATMax, minSNATMax, maxSNATMax, defaultSNATMax, &d.SNATMax)
	if r.SNATTimeouts != nil {
		snatTimeouts(s.sub("snat_timeouts"), r.SNATTimeouts, &d.SNATTimeouts)
	}
	if r.DrainTimeout != nil {
		if t, ok := s.duration("drain_timeout", r.DrainTimeout); ok {
			d.DrainTimeout = t
		}
	}
	if n, ok := s.intIn("icmp_rate_limit", r.ICMPRateLimit, 0, maxICMPRateLimit,
		fmt.Sprintf("use 0 (send none) to %d messages per second per CPU (default %d)", maxICMPRateLimit, defaultICMPRateLimit)); ok {
		d.ICMPRateLimit = uint32(n)
	}
	if n, ok := s.intIn("flow_insert_rate", r.FlowInsertRate, 0, maxFlowInsertRate,
		fmt.Sprintf("use 0 (no limit) to %d new flows per second per CPU (default %d)", maxFlowInsertRate, defaultFlowInsertRate)); ok {
		d.FlowInsertRate = uint32(n)
	}
}

// snatTimeouts validates [datapath.snat_timeouts]. Below a second a
// binding could expire between two packets of a live flow, and the
// datapath's clock is coarse anyway.
func snatTimeouts(s scope, r *rawSNATTimeouts, t *SNATTimeouts) {
	set := func(key string, v any, dst *time.Duration) bool {
		if v == nil {
			return true
		}
		d, ok := s.duration(key, v)
		if !ok {
			return false
		}
		if d < minSNATTimeout {
			s.errorf(key, "%s = %q is too short: use at least %s", s.name(key), v, minSNATTimeout)
			return false
		}
		*dst = d
		return true
	}
	tcpOK := set("tcp", r.TCP, &t.TCP)
	closingOK := set("tcp_closing", r.TCPClosing, &t.TCPClosing)
	set("udp", r.UDP, &t.UDP)
	if tcpOK && closingOK && t.TCPClosing > t.TCP {
		key := "tcp_closing"
		if r.TCPClosing == nil {
			key = "tcp"
		}
		s.errorf(key, "%s (%s) is longer than %s (%s): a closing connection would outlive an established one; shorten tcp_closing or lengthen tcp",
			s.name("tcp_closing"), t.TCPClosing, s.name("tcp"), t.TCP)
	}
}

func countFamily(addrs []netip.Addr, v4 bool) int {
	n := 0
	for _, a := range addrs {
		if a.Is4() == v4 {
			n++
		}
	}
	return n
}

func parseAttach(s string) (Attach, error) {
	switch s {
	case "xdp":
		return AttachXDP, nil
	case "tc":
		return AttachTC, nil
	}
	return 0, fmt.Errorf("unknown attach point %q (want xdp or tc)", s)
}

func parseXDPMode(s string) (XDPMode, error) {
	switch s {
	case "auto":
		return XDPAuto, nil
	case "native":
		return XDPNative, nil
	case "generic":
		return XDPGeneric, nil
	}
	return 0, fmt.Errorf("unknown XDP mode %q (want native, generic or auto)", s)
}

// checkIfName applies the kernel's rules for interface names, so a typo is
// caught here rather than as a failed attach at startup.
func checkIfName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("interface name is empty")
	case len(name) > 15:
		return fmt.Errorf("interface name %q is longer than 15 bytes, the kernel's limit", name)
	case name == "." || name == "..":
		return fmt.Errorf("%q is not a valid interface name", name)
	case strings.ContainsAny(name, "/: \t\n"):
		return fmt.Errorf("interface name %q contains '/', ':' or whitespace, which the kernel does not allow", name)
	}
	return nil
}

// parsePortRange parses "lo-hi". Ports below 1024 are left to privileged
// local services, so SNAT never takes them.
func parsePortRange(v string) (uint16, uint16, error) {
	const hint = "write it as \"lo-hi\" with 1024 <= lo <= hi <= 65535, e.g. \"32768-60999\""
	los, his, ok := strings.Cut(v, "-")
	if !ok {
		return 0, 0, fmt.Errorf("not a range: %s", hint)
	}
	lo, err1 := strconv.ParseUint(strings.TrimSpace(los), 10, 32)
	hi, err2 := strconv.ParseUint(strings.TrimSpace(his), 10, 32)
	if err1 != nil || err2 != nil || lo < 1024 || hi > 65535 || lo > hi {
		return 0, 0, fmt.Errorf("invalid range: %s", hint)
	}
	return uint16(lo), uint16(hi), nil
}

func (c *checker) maglev(r *rawMaglev, m *Maglev, opts Options) {
	s := scope{c: c}.sub("maglev")
	var seed any
	if r != nil {
		seed = r.HashSeed
	}
	if seed == nil {
		if opts.Dev {
			m.Seed, m.DevSeed = DevSeed, true
		} else {
			s.errorf("hash_seed", "maglev.hash_seed is missing: every LB box must use the same secret seed so that all boxes pick the same backend for a flow; %s (or run l4lbd --dev for a throwaway setup)", seedHowTo)
		}
	} else if v, ok := s.str("hash_seed", seed); ok {
		parsed, err := maglev.ParseSeed(v)
		switch {
		case err != nil:
			s.errorf("hash_seed", "maglev.hash_seed is malformed: %v; %s", err, seedHowTo)
		case parsed == maglev.Seed{} && !opts.Dev:
			s.errorf("hash_seed", "maglev.hash_seed is all zeros, which is what an unset seed looks like: %s", seedHowTo)
		case parsed == ExampleSeed && !opts.Dev:
			s.errorf("hash_seed", "maglev.hash_seed is the public example seed of the documentation: anyone can predict which backend a flow gets; %s (or run l4lbd --dev for a throwaway setup)", seedHowTo)
		default:
			m.Seed = parsed
			// A public seed is flagged like the dev seed.
			m.DevSeed = parsed == ExampleSeed
		}
	}
	if r == nil {
		return
	}
	if n, ok := s.tableSize("table_size", r.TableSize); ok {
		m.TableSize = n
	}
}

// tableSize converts a Maglev table size; package maglev owns the rule and
// suggests sizes in its error.
func (s scope) tableSize(key string, v any) (uint32, bool) {
	n, ok := s.integer(key, v)
	if !ok {
		return 0, false
	}
	if n < 0 || n > maglev.MaxTableSize {
		s.errorf(key, "%s = %d is out of range: use a prime in %d..%d (e.g. %d)", s.name(key), n, maglev.MinTableSize, maglev.MaxTableSize, defaultTableSize)
		return 0, false
	}
	if err := maglev.ValidateSize(uint32(n)); err != nil {
		s.errorf(key, "%s = %d: %v", s.name(key), n, err)
		return 0, false
	}
	return uint32(n), true
}

func (c *checker) consul(r *rawConsul) *Consul {
	s := scope{c: c}.sub("discovery").sub("consul")
	out := &Consul{
		Address:      defaultConsulAddress,
		Tag:          defaultConsulTag,
		KVPrefix:     defaultConsulKVPrefix,
		Stale:        true,
		WarningState: lb.Active,
		MaxWatches:   DefaultConsulMaxWatches,
	}
	if v, ok := s.str("address", r.Address); ok {
		if err := checkHostPort(v, true); err != nil {
			s.errorf("address", "%s: %v", s.name("address"), err)
		} else {
			out.Address = v
		}
	}
	if v, ok := s.str("tag", r.Tag); ok {
		if v == "" {
			s.errorf("tag", "%s is empty: backends are the Consul instances carrying this tag; set one (default %q)", s.name("tag"), defaultConsulTag)
		} else {
			out.Tag = v
		}
	}
	if v, ok := s.str("kv_prefix", r.KVPrefix); ok {
		if strings.HasPrefix(v, "/") {
			s.errorf("kv_prefix", "%s = %q: Consul KV keys do not start with '/': remove it", s.name("kv_prefix"), v)
		} else {
			out.KVPrefix = v
		}
	}
	str := func(key string, v any, dst *string) {
		if x, ok := s.str(key, v); ok {
			*dst = x
		}
	}
	str("token_file", r.TokenFile, &out.TokenFile)
	str("datacenter", r.Datacenter, &out.Datacenter)
	str("tls_ca_file", r.TLSCAFile, &out.TLSCAFile)
	str("tls_cert_file", r.TLSCertFile, &out.TLSCertFile)
	str("tls_key_file", r.TLSKeyFile, &out.TLSKeyFile)
	str("tls_server_name", r.TLSServerName, &out.TLSServerName)
	if (out.TLSCertFile == "") != (out.TLSKeyFile == "") {
		key := "tls_cert_file"
		if out.TLSCertFile == "" {
			key = "tls_key_file"
		}
		s.errorf(key, "%s and %s must be set together: a client certificate needs its key", s.name("tls_cert_file"), s.name("tls_key_file"))
	}
	if v, ok := s.boolean("stale", r.Stale); ok {
		out.Stale = v
	}
	if st, ok := enum(s, "warning_state", r.WarningState, lb.ParseBackendState); ok {
		if st == lb.Disabled {
			s.errorf("warning_state", "%s = \"disabled\" is not allowed: use \"active\" or \"draining\"", s.name("warning_state"))
		} else {
			out.WarningState = st
		}
	}
	if v, ok := s.boolean("register_self", r.RegisterSelf); ok {
		out.RegisterSelf = v
	}
	if v, ok := s.intIn("max_watches", r.MaxWatches, 1, 10000, "use 1 to 10000, and stay below the agent's limits.http_max_conns_per_client (default 200)"); ok {
		out.MaxWatches = int(v)
	}
	return out
}

func (c *checker) kubernetes(r *rawKubernetes) *Kubernetes {
	s := scope{c: c}.sub("discovery").sub("kubernetes")
	out := &Kubernetes{
		LoadBalancerClass: defaultK8sClass,
		Backends:          K8sNodePort,
		QPS:               defaultK8sQPS,
		Burst:             defaultK8sBurst,
		LeaseNamespace:    defaultK8sLeaseNS,
		LeaseName:         defaultK8sLeaseName,
		Health: K8sHealth{
			Cluster: ClusterCheckNodePort, KubeProxyPort: defaultKubeProxyPort, Pod: lb.HealthTCP,
			Interval: defaultHealthInterval, Timeout: defaultHealthTimeout, Rise: defaultHealthRise, Fall: defaultHealthFall,
		},
	}
	if v, ok := s.str("kubeconfig", r.Kubeconfig); ok {
		out.Kubeconfig = v
	}
	if v, ok := s.str("load_balancer_class", r.LoadBalancerClass); ok {
		if v == "" {
			s.errorf("load_balancer_class", "%s is empty: set the class of the LoadBalancer Services this box serves (default %q)", s.name("load_balancer_class"), defaultK8sClass)
		} else {
			out.LoadBalancerClass = v
		}
	}
	if v, ok := s.boolean("include_classless", r.IncludeClassless); ok {
		out.IncludeClassless = v
	}
	out.NodeSelector = nodeSelector(s, r.NodeSelector)
	var all []namedPrefix
	if v, ok := s.strs("pools", r.Pools); ok || v != nil {
		out.Pools, all = pools(s, "pools", v, "", all)
	}
	if len(r.NamedPools) > 0 {
		np := s.sub("named_pools")
		out.NamedPools = map[string][]netip.Prefix{}
		for _, name := range slices.Sorted(maps.Keys(r.NamedPools)) {
			if !labelValue.MatchString(name) || name == "" {
				np.errorf(name, "pool name %q is not usable as an l4lb.io/pool annotation value: use letters, digits, '-', '_' and '.', starting and ending with a letter or digit", name)
				continue
			}
			if v, ok := np.strs(name, r.NamedPools[name]); ok {
				out.NamedPools[name], all = pools(np, name, v, name, all)
			}
		}
	}
	if b, ok := enum(s, "backends", r.Backends, ParseK8sBackends); ok {
		out.Backends = b
	}
	if r.QPS != nil {
		switch v := r.QPS.(type) {
		case int64:
			out.QPS = float64(v)
		case float64:
			out.QPS = v
		default:
			s.wrongType("qps", v, "a number")
		}
		if out.QPS <= 0 {
			s.errorf("qps", "%s = %v must be positive: it is the client's steady request rate to the apiserver (default %d)", s.name("qps"), r.QPS, defaultK8sQPS)
			out.QPS = defaultK8sQPS
		}
	}
	if n, ok := s.intIn("burst", r.Burst, 1, 1<<20, fmt.Sprintf("use at least 1 (default %d)", defaultK8sBurst)); ok {
		out.Burst = int(n)
	}
	if v, ok := s.str("lease_namespace", r.LeaseNamespace); ok {
		if !dnsLabel.MatchString(v) {
			s.errorf("lease_namespace", "%s = %q is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)", s.name("lease_namespace"), v)
		} else {
			out.LeaseNamespace = v
		}
	}
	if v, ok := s.str("lease_name", r.LeaseName); ok {
		if !dnsSubdomain(v) {
			s.errorf("lease_name", "%s = %q is not a Kubernetes object name (lower-case letters, digits, '-' and '.', at most 253)", s.name("lease_name"), v)
		} else {
			out.LeaseName = v
		}
	}
	if r.Health != nil {
		kubernetesHealth(s.sub("health"), r.Health, &out.Health)
	}
	return out
}

func kubernetesHealth(s scope, r *rawKubernetesHealth, h *K8sHealth) {
	if v, ok := enum(s, "cluster", r.Cluster, ParseClusterCheck); ok {
		h.Cluster = v
	}
	if p, ok := s.port("kube_proxy_port", r.KubeProxyPort); ok {
		h.KubeProxyPort = p
	}
	if v, ok := enum(s, "pod", r.Pod, lb.ParseHealthType); ok {
		if v != lb.HealthTCP && v != lb.HealthNone {
			s.errorf("pod", "%s = %q: pod backends are checked with \"tcp\" or not at all (\"none\")", s.name("pod"), v)
		} else {
			h.Pod = v
		}
	}
	intervalOK, timeoutOK := true, true
	if r.Interval != nil {
		h.Interval, intervalOK = s.duration("interval", r.Interval)
	}
	if r.Timeout != nil {
		h.Timeout, timeoutOK = s.duration("timeout", r.Timeout)
	} else if intervalOK {
		h.Timeout = min(h.Timeout, h.Interval)
	}
	if intervalOK && timeoutOK && h.Timeout > h.Interval {
		s.errorf("timeout", "%s (%s) is longer than %s (%s): a probe must finish before the next one starts", s.name("timeout"), h.Timeout, s.name("interval"), h.Interval)
	}
	if n, ok := s.intIn("rise", r.Rise, 1, 1<<31-1, "use at least 1 (default 2)"); ok {
		h.Rise = int(n)
	}
	if n, ok := s.intIn("fall", r.Fall, 1, 1<<31-1, "use at least 1 (default 3)"); ok {
		h.Fall = int(n)
	}
}

// namedPrefix is a pool prefix with the pool it belongs to ("" for pools),
// to find overlaps across every pool.
type namedPrefix struct {
	pool string
	p    netip.Prefix
}

// pools parses one pool's prefixes. Overlapping pools would hand out one
// address twice, so every prefix is checked against all seen so far.
func pools(s scope, key string, v []string, pool string, all []namedPrefix) ([]netip.Prefix, []namedPrefix) {
	var out []netip.Prefix
	for i, str := range v {
		k := indexPath(key, i)
		p, err := netip.ParsePrefix(str)
		if err != nil {
			if a, aerr := netip.ParseAddr(str); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				s.errorf(k, "%s[%d] = %q is not a prefix: write it like \"192.0.2.0/28\" or \"2001:db8::/120\"", s.name(key), i, str)
				continue
			}
		}
		if p.Addr().Zone() != "" || p.Addr().Is4In6() {
			s.errorf(k, "%s[%d] = %q: write IPv4 pools as IPv4, without a zone", s.name(key), i, str)
			continue
		}
		if p.Masked() != p {
			s.errorf(k, "%s[%d] = %q has host bits set: did you mean %q?", s.name(key), i, str, p.Masked().String())
			continue
		}
		clash := false
		for _, o := range all {
			if o.p.Overlaps(p) {
				where := "pools"
				if o.pool != "" {
					where = "named_pools." + o.pool
				}
				s.errorf(k, "%s[%d] = %q overlaps %s in %s: one address would belong to two pools", s.name(key), i, str, o.p, where)
				clash = true
				break
			}
		}
		if clash {
			continue
		}
		all = append(all, namedPrefix{pool: pool, p: p})
		out = append(out, p)
	}
	return out, all
}

// Kubernetes name rules, checked here so that a typo is a file:line error
// rather than a selector that silently matches nothing.
var (
	dnsLabel   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

func dnsSubdomain(v string) bool {
	if v == "" || len(v) > 253 {
		return false
	}
	for _, part := range strings.Split(v, ".") {
		if !dnsLabel.MatchString(part) {
			return false
		}
	}
	return true
}

// labelKey checks a label key: an optional DNS-subdomain prefix and '/',
// then a name of at most 63 characters.
func labelKey(k string) bool {
	prefix, name, found := strings.Cut(k, "/")
	if !found {
		name, prefix = prefix, ""
	} else if !dnsSubdomain(prefix) {
		return false
	}
	return name != "" && labelValue.MatchString(name)
}

func nodeSelector(s scope, v any) map[string]string {
	if v == nil {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		s.wrongType("node_selector", v, `a table of labels, like { "node-role.kubernetes.io/edge" = "" }`)
		return nil
	}
	out := map[string]string{}
	ns := s.sub("node_selector")
	for _, k := range slices.Sorted(maps.Keys(m)) {
		val, ok := ns.str(k, m[k])
		switch {
		case !ok:
		case !labelKey(k):
			ns.errorf(k, "%s: %q is not a label key (an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.')", s.name("node_selector"), k)
		case !labelValue.MatchString(val):
			ns.errorf(k, "%s: label value %q of %q is not valid (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)", s.name("node_selector"), val, k)
		default:
			out[k] = val
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// capacity checks that the file's own services fit in the datapath maps;
// other sources share the same maps, so this is a lower bound.
func (c *checker) capacity(cfg *Config) {
	s := scope{c: c}.sub("datapath")
	if n := len(cfg.Services); n > int(cfg.Datapath.MaxServices) {
		s.errorf("max_services", "the file defines %d services but datapath.max_services = %d: raise max_services", n, cfg.Datapath.MaxServices)
	}
	total := 0
	for _, svc := range cfg.Services {
		total += len(svc.Backends)
	}
	if total > int(cfg.Datapath.MaxBackends) {
		s.errorf("max_backends", "the file defines %d backends but datapath.max_backends = %d: raise max_backends", total, cfg.Datapath.MaxBackends)
	}
}

// BPFFSProblem says why dir cannot be l4lbd's bpffs directory without
// looking at the machine, or "" when nothing is wrong with it that way:
// the conventional bpffs mount (and /) hold every other BPF program's pins,
// and `l4lbd --cleanup` empties and removes l4lbd's directory. A mount
// root elsewhere is found by the host check (lb/datapath CheckPinPath).
func BPFFSProblem(dir string) string {
	switch filepath.Clean(dir) {
	case "/sys/fs/bpf", "/":
		return fmt.Sprintf("is the bpffs mount itself, shared with every other BPF program's pins: "+
			"l4lbd needs a directory of its own there; use %q", defaultBPFFS)
	}
	return ""
}
