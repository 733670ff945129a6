// SPDX-License-Identifier: Apache-2.0

// Package metrics is the Prometheus face of l4lbd: the last step of the
// data flow, where programmed state and the datapath's per-CPU counters
// become l4lb_* series on /metrics.
//
// Two kinds of metrics live here. State metrics (traffic counters, backend
// state and health, table occupancy, discovery sources, conflicts) are read
// from a Source at scrape time and never stored in this package: the
// datapath's maps and the daemon's view stay the only copy, so a scrape
// always shows what the kernel and the control loop hold right now. Event
// metrics (reconcile durations, configuration reloads, refusals) describe
// things that happened between scrapes and cannot be read back later, so the
// daemon reports them to a Recorder as they happen.
//
// The package speaks plain structs and the lb model only: it imports neither
// the datapath (cilium/ebpf) nor the admin API, and lb/daemon converts.
package metrics

import (
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/l4lb/l4lb/lb"
)

// Source gives the collector the live state at scrape time. lb/daemon
// implements it. Snapshot may be called from several scrapes at once and
// should be cheap: it runs on every scrape.
type Source interface {
	Snapshot() Snapshot
}

// SourceFunc adapts a function to Source.
type SourceFunc func() Snapshot

// Snapshot calls f.
func (f SourceFunc) Snapshot() Snapshot { return f() }

// Snapshot is the daemon's state at one instant, in the shape the collector
// needs. Nil pointers and empty slices mean "not known": the matching series
// are left out rather than reported as zero, because a counter that drops to
// zero looks like a reset to Prometheus and a zero gauge looks like a fact.
type Snapshot struct {
	// Services are the services the daemon serves (after merging, defaults
	// and runtime overrides). Names are unique; a repeated name is skipped.
	Services []Service
	// Reasons count the packets the datapath did not forward to a backend,
	// by what it did instead (names like "drop_no_backend", "pass_fragment").
	Reasons []Reason
	// Events count what the datapath did besides a packet's verdict
	// ("fib_fallback", "ct_insert_limited", "snat_overflow", ...).
	Events []Event
	// Conntrack is the connection table; nil before the datapath is loaded.
	Conntrack *Table
	// SNAT is the source-NAT port pool; nil when the datapath has none.
	SNAT *Table
	// Maps is the occupancy of every BPF map the datapath owns.
	Maps []Map
	// Discovery are the sources that publish services.
	Discovery []Discovery
	// Conflicts are service definitions left out because another source
	// claimed the same frontend or name first.
	Conflicts []Conflict
	// Refused are services the datapath does not serve (unsupported
	// settings, a full map).
	Refused []Refusal
	// PendingRestart names the settings (e.g. "maglev.hash_seed") whose new
	// value waits for a restart of l4lbd; each name once.
	PendingRestart []string
	// SeedFingerprint identifies the hash seed (as `l4lbctl status` shows
	// it); empty when unknown.
	SeedFingerprint string
	// BGP is the BGP speaker; nil when [bgp] is off.
	BGP *BGP
	// L2 is the ARP/NDP responder; nil when [l2] is off.
	L2 *L2
	// Fleet is the fleet check's verdict; nil when it does not run.
	Fleet *Fleet
	// IPFIX is the flow export; nil when [ipfix] is off.
	IPFIX *IPFIX
	// Errors are failures met while taking the snapshot (a map that could
	// not be read). Each fails its part of the scrape: the HTTP handler
	// logs it and serves the rest.
	Errors []error
}

// Event is one datapath event counter.
type Event struct {
	Name  string
	Count uint64
}

// BGP is the speaker's state.
type BGP struct {
	// Announced counts the VIPs in the speaker's routing table.
	Announced int
	Peers     []BGPPeer
}

// BGPPeer is one BGP session.
type BGPPeer struct {
	// Address names the peer in the peer label.
	Address         string
	Up              bool
	Advertised      uint64
	UpdatesSent     uint64
	UpdatesReceived uint64
	// BFD is the peer's BFD session; nil when BFD is off for it.
	BFD *BFD
}

// BFD is one peer's BFD session.
type BFD struct {
	Up bool
	// Transitions counts the entries into each state (the state label).
	Transitions map[string]uint64
}

// L2 is the ARP/NDP responder's state.
type L2 struct {
	// Announced counts the VIPs answered for.
	Announced  int
	Interfaces []L2Interface
	// Failover is nil without [l2.failover].
	Failover *L2Failover
}

// L2Failover is this box's part in L2 failover.
type L2Failover struct {
	// Role is "active", "standby" or "listening".
	Role string
	// Transitions counts the entries into each role (the role label).
	Transitions map[string]uint64
	// Peers counts the other boxes of the group heard within the
	// detection time.
	Peers int
	// Conflicts counts adverts of another active box while this one was
	// active.
	Conflicts uint64
}

// L2Interface counts the responder's frames on one interface.
type L2Interface struct {
	Name                              string
	ARPReplies, NDReplies, Gratuitous uint64
}

// Fleet is what the fleet check concluded.
type Fleet struct {
	// Boxes counts the LB boxes whose records are visible, this one
	// included.
	Boxes int
	// Mismatch holds, for every service this box serves, whether another
	// box has a different fingerprint for its frontend.
	Mismatch map[string]bool
}

// IPFIX is the flow export's state.
type IPFIX struct {
	// Collectors count the records each collector was sent, and those
	// the kernel refused to send.
	Collectors []IPFIXCollector
	// Records count the records made, by event (created, active, ended).
	Records map[string]uint64
	// Tracked is how many flows the exporter follows; Untracked counts
	// new flows it could not follow (ipfix.max_flows).
	Tracked   int
	Untracked uint64
	// ScanSeconds is how long the latest scan of the connection table took.
	ScanSeconds float64
}

// IPFIXCollector is one collector's counts.
type IPFIXCollector struct {
	Address       string
	Sent, Dropped uint64
}

// Service is one served service.
type Service struct {
	Name     string
	Frontend lb.Frontend
	// Mode and Dispatch are as programmed (defaults resolved).
	Mode     lb.Mode
	Dispatch lb.Dispatch
	// Source names where the definition came from, as in lb.Service.
	Source string
	// Fingerprint identifies (hash seed, table size, eligible backends) as
	// in `l4lbctl service get`: boxes that disagree on it pick different
	// backends for the same flow.
	Fingerprint string
	// Counters are nil when the service is not programmed yet or its
	// counters could not be read.
	Counters *Counters
	Backends []Backend
}

// Backend is one backend of a service.
type Backend struct {
	Addr   netip.AddrPort
	Weight uint32
	// State is the administrative state in force.
	State lb.BackendState
	// Override is true when State is a runtime override
	// (`l4lbctl backend drain|enable|disable`) rather than the source's.
	Override bool
	Health   Health
	// Counters are nil when the backend is not programmed or its counters
	// could not be read.
	Counters *Counters
	// Connections are the backend's flows in the connection table; nil
	// when not programmed or the table could not be counted.
	Connections *Connections
}

// Connections count a backend's connection-table entries. Active are TCP
// flows that are established (for SNAT flows: the binding is past the
// handshake and saw no FIN or RST) and were seen within
// datapath.snat_timeouts.tcp; Inactive are UDP flows and closing or
// reopening TCP flows, each until its state's timeout runs out (idle
// entries waiting for the LRU to evict them count in neither).
type Connections struct {
	Active, Inactive uint64
}

// Counters are datapath counters of a service or backend, summed over CPUs.
type Counters struct {
	Packets  uint64
	Bytes    uint64
	NewFlows uint64
	// ReplyPackets and ReplyBytes count a SNAT service's replies (its
	// backends' packets sent back to clients); 0 for backends.
	ReplyPackets uint64
	ReplyBytes   uint64
}

// Health is what the health checker last concluded about a backend.
type Health uint8

// Health states. The zero value is HealthUnchecked, so a daemon without a
// health checker reports every backend as unchecked, never as healthy.
const (
	// HealthUnchecked: the service has no health check (type "none").
	HealthUnchecked Health = iota
	// HealthUnknown: checked, but no verdict yet (fewer than rise or fall
	// results since the backend appeared).
	HealthUnknown
	// HealthHealthy: the backend passed rise checks in a row.
	HealthHealthy
	// HealthUnhealthy: the backend failed fall checks in a row and left
	// the Maglev table.
	HealthUnhealthy
)

var healthNames = []string{
	HealthUnchecked: "unchecked",
	HealthUnknown:   "unknown",
	HealthHealthy:   "healthy",
	HealthUnhealthy: "unhealthy",
}

// String returns the value of the state label for h.
func (h Health) String() string {
	if int(h) < len(healthNames) {
		return healthNames[h]
	}
	return fmt.Sprintf("health-%d", uint8(h))
}

// Reason counts what the datapath did with packets it did not forward.
type Reason struct {
	Name    string
	Packets uint64
	Bytes   uint64
}

// Table is the occupancy of a table whose capacity the operator sizes.
type Table struct {
	Entries  uint64
	Capacity uint64
}

// Map is the occupancy of one BPF map.
type Map struct {
	// Name is the map's name as pinned ("services", "conntrack", …).
	Name     string
	Entries  uint64
	Capacity uint64
}

// Discovery is one discovery source.
type Discovery struct {
	// Name is the source's name, as in lb.Service.Source.
	Name string
	// LastSync is when the source last published a snapshot; zero if never.
	LastSync time.Time
	// Services is how many services its last snapshot held.
	Services int
}

// Conflict is a service definition left out of the desired state.
type Conflict struct {
	Service string
	Source  string
	// Reason is what collided: "frontend" or "name".
	Reason string
}

// RefusalReason says why the datapath does not serve a service. Its values
// become label values, so the set is small and fixed.
type RefusalReason string

// Refusal reasons.
const (
	// RefusedUnsupported: the service asks for something this datapath
	// cannot do (a mode, dispatch or option it does not implement).
	RefusedUnsupported RefusalReason = "unsupported"
	// RefusedMapFull: a datapath map has no room for the service or its
	// backends.
	RefusedMapFull RefusalReason = "map_full"
	// RefusedLocalVIP: the VIP is one of the box's own addresses (a
	// service from a discovery source; the file refuses it outright).
	RefusedLocalVIP RefusalReason = "local_vip"
	// RefusedCannotWork: the service can never work as defined: a
	// backend that is the box itself, the service's own VIP or another
	// service's VIP, a VIP that is another service's backend, or weights
	// that leave a backend without a Maglev slot (the file refuses
	// these outright; config.ServiceProblems, config.AcrossServices).
	RefusedCannotWork RefusalReason = "cannot_work"
)

// refusalReasons are pre-set to zero so that rate() works from the first
// refusal on.
var refusalReasons = []RefusalReason{RefusedUnsupported, RefusedMapFull, RefusedLocalVIP, RefusedCannotWork}

// Refusal is a service the datapath does not serve.
type Refusal struct {
	Service string
	Source  string
	Reason  RefusalReason
}

// NewRegistry returns a registry holding everything l4lbd exposes: the
// collector reading src, the event metrics of rec, build information, and
// the Go runtime and process metrics. rec may be nil (no event metrics).
func NewRegistry(src Source, rec *Recorder, version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		NewCollector(src),
		BuildInfo(version),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if rec != nil {
		reg.MustRegister(rec)
	}
	return reg
}

// BuildInfo returns the l4lb_build_info gauge: always 1, with the l4lbd
// version and the Go version it was built with as labels, so dashboards can
// show which boxes run what.
func BuildInfo(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "l4lb_build_info",
		Help:        "Always 1; labels carry the l4lbd version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
