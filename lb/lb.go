// Package lb is the service model of the l4lb appliance: the types every other
// part of the control plane speaks. Discovery sources translate their own
// formats into these types at their boundary, the merger combines them into one
// desired state, and the reconciler programs that state into the datapath.
//
// The package holds types and pure helpers only and imports nothing but the
// standard library, so that every component can depend on it without pulling
// in kernel, TOML, Consul or Kubernetes code.
package lb

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is an L4 protocol served by a frontend. Its values are the IANA
// protocol numbers, which is also what the datapath stores.
type Protocol uint8

// Protocols a frontend can serve.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

// String returns the lower-case protocol name used in configs and output.
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ParseProtocol parses "tcp" or "udp" (case-insensitive).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return TCP, nil
	case "udp":
		return UDP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want tcp or udp)", s)
}

// Mode is how the load balancer forwards a service's packets to a backend.
type Mode uint8

// Forwarding modes. ModeDefault means "use the daemon-wide default" and is
// resolved by Service.WithDefaults before a service reaches the reconciler.
const (
	ModeDefault Mode = iota
	// ModeSNAT rewrites destination and source; replies come back through the LB.
	ModeSNAT
	// ModeDSR dispatches the packet to the backend unchanged (encapsulated or
	// tagged); the backend replies to the client directly from the VIP.
	ModeDSR
	// ModeHybrid uses DSR for TCP and SNAT for UDP.
	ModeHybrid
)

var modeNames = []string{ModeDefault: "", ModeSNAT: "snat", ModeDSR: "dsr", ModeHybrid: "hybrid"}

// String returns the config name of the mode ("" for ModeDefault).
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode-%d", uint8(m))
}

// ParseMode parses "snat", "dsr" or "hybrid".
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if n != "" && n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown mode %q (want snat, dsr or hybrid)", s)
}

// Dispatch is how a DSR packet is carried to its backend.
type Dispatch uint8

// DSR dispatch methods. DispatchDefault means "use the daemon-wide default".
const (
	DispatchDefault Dispatch = iota
	// DispatchIPIP encapsulates IPv4 in IPv4 or IPv6 in IPv6.
	DispatchIPIP
	// DispatchGeneve encapsulates in UDP/Geneve with the frontend in an option.
	DispatchGeneve
	// DispatchOpt rewrites the destination to the backend and carries the
	// frontend in an IPv4 option or IPv6 destination option.
	DispatchOpt
)

var dispatchNames = []string{DispatchDefault: "", DispatchIPIP: "ipip", DispatchGeneve: "geneve", DispatchOpt: "opt"}

// String returns the config name of the dispatch ("" for DispatchDefault).
func (d Dispatch) String() string {
	if int(d) < len(dispatchNames) {
		return dispatchNames[d]
	}
	return fmt.Sprintf("dispatch-%d", uint8(d))
}

// ParseDispatch parses "ipip", "geneve" or "opt".
func ParseDispatch(s string) (Dispatch, error) {
	for i, n := range dispatchNames {
		if n != "" && n == s {
			return Dispatch(i), nil
		}
	}
	return 0, fmt.Errorf("unknown dsr_dispatch %q (want ipip, geneve or opt)", s)
}

// BackendState is the administrative state of a backend.
type BackendState uint8

// Backend states.
const (
	// Active backends receive new flows.
	Active BackendState = iota
	// Draining backends keep their established flows but get no new ones.
	Draining
	// Disabled backends get no traffic at all; their flows are re-balanced.
	Disabled
)

var stateNames = []string{Active: "active", Draining: "draining", Disabled: "disabled"}

// String returns the config name of the state.
func (s BackendState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state-%d", uint8(s))
}

// ParseBackendState parses "active", "draining" or "disabled".
func ParseBackendState(s string) (BackendState, error) {
	for i, n := range stateNames {
		if n == s {
			return BackendState(i), nil
		}
	}
	return 0, fmt.Errorf("unknown backend state %q (want active, draining or disabled)", s)
}

// Frontend identifies a service on the wire: the VIP, port and protocol a
// client connects to. It is the key of the datapath's service map, so two
// services can never share one.
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto Protocol
}

// String formats the frontend as "10.0.0.10:80/tcp" or "[2001:db8::10]:80/tcp".
func (f Frontend) String() string {
	return netip.AddrPortFrom(f.Addr, f.Port).String() + "/" + f.Proto.String()
}

// Compare orders frontends by address, port, then protocol.
func (f Frontend) Compare(o Frontend) int {
	if c := f.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if f.Port != o.Port {
		if f.Port < o.Port {
			return -1
		}
		return 1
	}
	return int(f.Proto) - int(o.Proto)
}

// Backend is one server behind a frontend.
type Backend struct {
	// Addr is where the backend receives traffic. Its family always equals
	// the family of the frontend's VIP.
	Addr netip.AddrPort
	// Weight is the backend's relative share of new flows; 0 gives it none.
	Weight uint32
	// State is the backend's administrative state.
	State BackendState
}

// DefaultWeight is the weight of a backend that does not set one.
const DefaultWeight = 1

// Service is one load-balanced service as the control plane wants it.
type Service struct {
	// Name is unique across all sources; it labels metrics and API output.
	Name     string
	Frontend Frontend
	// Mode and Dispatch may be ModeDefault / DispatchDefault until
	// WithDefaults resolves them.
	Mode     Mode
	Dispatch Dispatch
	// TableSize is the Maglev table size (a prime); 0 until WithDefaults.
	TableSize uint32
	// Algorithm picks the backend of a new flow.
	Algorithm Algorithm
	// Affinity pins a client to one backend for a while (zero: off).
	Affinity Affinity
	// SourceRanges, when not empty, is the allow-list of client prefixes;
	// packets from other sources are dropped.
	SourceRanges []netip.Prefix
	// Health says how backends are checked; the zero value checks nothing.
	Health HealthCheck
	// DrainTimeout, when positive, cuts the established flows of a
	// draining backend that long after it started draining; 0 lets them
	// run until they end (or inherits Defaults.DrainTimeout).
	DrainTimeout time.Duration
	// Announce says whether and when the service's VIP is announced to
	// the network (BGP, ARP/NDP); the zero value announces it with the
	// daemon's threshold.
	Announce Announce
	Backends []Backend
	// Source names where the definition came from, for example
	// "file:/etc/l4lb/l4lb.toml" or "consul".
	Source string
}

// Announce is a service's say in whether its VIP is announced. A VIP is
// announced while at least one service on it that takes part is programmed
// with at least its threshold of healthy backends.
type Announce struct {
	// Off keeps the service from causing its VIP to be announced; the VIP
	// is still announced when another service on it asks.
	Off bool
	// MinHealthy overrides the announcers' announce_min_healthy for this
	// service; 0 means theirs.
	MinHealthy int
}

// Defaults are the daemon-wide values a service inherits when it does not
// override them.
type Defaults struct {
	Mode         Mode
	Dispatch     Dispatch
	TableSize    uint32
	DrainTimeout time.Duration
}

// WithDefaults returns a copy of s with every unset field taken from d.
func (s Service) WithDefaults(d Defaults) Service {
	if s.Mode == ModeDefault {
		s.Mode = d.Mode
	}
	if s.Dispatch == DispatchDefault {
		s.Dispatch = d.Dispatch
	}
	if s.TableSize == 0 {
		s.TableSize = d.TableSize
	}
	if s.DrainTimeout == 0 {
		s.DrainTimeout = d.DrainTimeout
	}
	return s
}

// ModeFor returns how packets of protocol p are forwarded: Hybrid resolves to
// DSR for TCP and SNAT for everything else.
func (s Service) ModeFor(p Protocol) Mode {
	if s.Mode == ModeHybrid {
		if p == TCP {
			return ModeDSR
		}
		return ModeSNAT
	}
	return s.Mode
}

// Algorithm selects the backend for a new flow.
type Algorithm uint8

// Algorithms.
const (
	// Maglev picks table[flowhash % M]: every LB box with the same seed
	// picks the same backend for the same flow.
	Maglev Algorithm = iota
	// Random picks a uniformly random slot of the same table; boxes disagree.
	Random
)

// String returns the config name of the algorithm.
func (a Algorithm) String() string {
	switch a {
	case Maglev:
		return "maglev"
	case Random:
		return "random"
	}
	return fmt.Sprintf("algorithm-%d", uint8(a))
}

// ParseAlgorithm parses "maglev" or "random".
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "maglev":
		return Maglev, nil
	case "random":
		return Random, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want maglev or random)", s)
}

// Affinity is client-IP session affinity: new flows from a client that was
// seen within Timeout go to the backend it used last.
type Affinity struct {
	// ClientIP turns affinity on.
	ClientIP bool
	// Timeout is how long the client's choice is remembered after its last
	// new flow.
	Timeout time.Duration
}

// HealthType is the kind of health check run against backends.
type HealthType uint8

// Health check kinds.
const (
	HealthNone HealthType = iota
	HealthTCP
	HealthHTTP
	HealthUDP
)

var healthNames = []string{HealthNone: "none", HealthTCP: "tcp", HealthHTTP: "http", HealthUDP: "udp"}

// String returns the config name of the check kind.
func (h HealthType) String() string {
	if int(h) < len(healthNames) {
		return healthNames[h]
	}
	return fmt.Sprintf("health-%d", uint8(h))
}

// ParseHealthType parses "none", "tcp", "http" or "udp".
func ParseHealthType(s string) (HealthType, error) {
	for i, n := range healthNames {
		if n == s {
			return HealthType(i), nil
		}
	}
	return 0, fmt.Errorf("unknown health check type %q (want tcp, http, udp or none)", s)
}

// HealthCheck describes how a service's backends are probed.
type HealthCheck struct {
	Type HealthType
	// Port overrides the backend port for the probe (0: the backend's port).
	Port     uint16
	Interval time.Duration
	Timeout  time.Duration
	// Rise consecutive successes bring a backend up, Fall failures take it down.
	Rise int
	Fall int
	// HTTP: the path requested and the status expected.
	Path         string
	ExpectStatus int
	// UDP: an optional payload sent and a substring expected in the reply.
	Send   string
	Expect string
}

// Equal reports whether s and o define the same service, field by field
// (backends and source ranges in order).
func (s Service) Equal(o Service) bool {
	return s.Name == o.Name && s.Frontend == o.Frontend && s.Mode == o.Mode && s.Dispatch == o.Dispatch &&
		s.TableSize == o.TableSize && s.Algorithm == o.Algorithm && s.Affinity == o.Affinity &&
		s.Health == o.Health && s.DrainTimeout == o.DrainTimeout && s.Announce == o.Announce && s.Source == o.Source &&
		slices.Equal(s.Backends, o.Backends) && slices.Equal(s.SourceRanges, o.SourceRanges)
}

// Clone returns a deep copy of s, so snapshots can be handed between
// goroutines without sharing the backend slice.
func (s Service) Clone() Service {
	s.Backends = append([]Backend(nil), s.Backends...)
	s.SourceRanges = append([]netip.Prefix(nil), s.SourceRanges...)
	return s
}
