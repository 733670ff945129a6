// SPDX-License-Identifier: Apache-2.0

// Package api is l4lbd's admin API: HTTP+JSON on a unix socket (mode 0600,
// so only root, or whoever owns the socket, can use it). The daemon serves
// it; l4lbctl is its client. The types here are the wire contract of
// `l4lbctl ... -o json`; add fields, never rename or remove them.
package api

import (
	"time"
)

// Version is the API path prefix.
const Version = "/v1"

// Status is the daemon's overall state (GET /v1/status).
type Status struct {
	Version    string    `json:"version"`
	PID        int       `json:"pid"`
	StartedAt  time.Time `json:"started_at"`
	ConfigFile string    `json:"config_file"`
	// DevSeed is true when l4lbd runs with --dev and no hash_seed: boxes
	// will not agree on backends.
	DevSeed bool `json:"dev_seed"`
	// SeedFingerprint identifies the hash seed without revealing it.
	SeedFingerprint string `json:"seed_fingerprint"`
	LastReload      Reload `json:"last_reload"`
	// PendingRestart names the settings of the configuration in force
	// (e.g. "maglev.hash_seed") whose new value applies only after l4lbd
	// restarts; they keep their running values until then.
	PendingRestart []string    `json:"pending_restart,omitempty"`
	Interfaces     []Interface `json:"interfaces"`
	Services       int         `json:"services"`
	Backends       int         `json:"backends"`
	Conflicts      []string    `json:"conflicts,omitempty"`
	Rejected       []string    `json:"rejected,omitempty"`
	// HealthWarnings name services whose checks all fail and are ignored
	// (fail open).
	HealthWarnings []string `json:"health_warnings,omitempty"`
	ReconcileError string   `json:"reconcile_error,omitempty"`
	Reasons        []Reason `json:"reasons"`
	// Discovery reports the sources that watch something outside l4lbd
	// (Consul, Kubernetes): whether their services may be out of date.
	Discovery []SourceStatus `json:"discovery,omitempty"`
	// BGP and L2 are the VIP announcers' state; nil when off.
	BGP *BGPStatus `json:"bgp,omitempty"`
	L2  *L2Status  `json:"l2,omitempty"`
	// FleetWarnings name the services whose fingerprints differ between
	// LB boxes, and the boxes, as the fleet check sees them.
	FleetWarnings []string `json:"fleet_warnings,omitempty"`
	// SelfCheck is the datapath self-check's record; nil before it runs.
	SelfCheck *SelfCheckStatus `json:"self_check,omitempty"`
}

// SelfCheckStatus is what the datapath self-check found: the passes that
// read the control-plane maps back and wrote again what differed from what
// l4lbd programmed.
type SelfCheckStatus struct {
	IntervalSeconds float64 `json:"interval_seconds"`
	// Passes counts the passes finished since start; the LastPass fields
	// describe the last one.
	Passes          int       `json:"passes"`
	LastPass        time.Time `json:"last_pass,omitzero"`
	LastPassSeconds float64   `json:"last_pass_seconds"`
	// LastPassDrifts and LastPassUnrepaired count the differences the
	// last pass found and those it could not write back.
	LastPassDrifts     int `json:"last_pass_drifts"`
	LastPassUnrepaired int `json:"last_pass_unrepaired"`
	// LastPassError is a read that failed in the last pass.
	LastPassError string `json:"last_pass_error,omitempty"`
	// Drifts counts the differences found since start, by map.
	Drifts map[string]uint64 `json:"drifts,omitempty"`
	// LastDrift describes the last difference found, and when.
	LastDrift   string    `json:"last_drift,omitempty"`
	LastDriftAt time.Time `json:"last_drift_at,omitzero"`
}

// BGPStatus is the BGP speaker's state (GET /v1/bgp).
type BGPStatus struct {
	ASN      uint32 `json:"asn"`
	RouterID string `json:"router_id"`
	// GracefulRestart and OnStop are the settings in force: whether a
	// stop keeps the routes for a restart ("keep") or withdraws ("drain").
	GracefulRestart bool      `json:"graceful_restart"`
	OnStop          string    `json:"on_stop"`
	Peers           []BGPPeer `json:"peers"`
	// VIPs are the addresses the services ask to announce, announced or
	// not (then with the reason).
	VIPs []AnnouncedVIP `json:"vips"`
}

// BGPPeer is one BGP session.
type BGPPeer struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	// State is idle, connect, active, opensent, openconfirm or
	// established.
	State string `json:"state"`
	Up    bool   `json:"up"`
	// Since is when the session came up, or last went down.
	Since           time.Time `json:"since,omitzero"`
	UpdatesSent     uint64    `json:"updates_sent"`
	UpdatesReceived uint64    `json:"updates_received"`
	// Advertised counts the prefixes sent on the session.
	Advertised uint64 `json:"advertised"`
	// GracefulRestart is true when both sides negotiated it.
	GracefulRestart bool   `json:"graceful_restart"`
	LastError       string `json:"last_error,omitempty"`
	// BFD is the peer's BFD session; absent when BFD is off for it.
	BFD *BFDSession `json:"bfd,omitempty"`
}

// BFDSession is the state of one peer's BFD session.
type BFDSession struct {
	// State is up, down, init or admin_down.
	State string `json:"state"`
	// Since is when State began, if it changed since l4lbd started.
	Since time.Time `json:"since,omitzero"`
	// Transitions counts the entries into each state since l4lbd started.
	Transitions map[string]uint64 `json:"transitions"`
	// PacketsSent and PacketsReceived count the current session's control
	// packets.
	PacketsSent     uint64 `json:"packets_sent"`
	PacketsReceived uint64 `json:"packets_received"`
	// DetectMultiplier, MinRxInterval and MinTxInterval are the
	// configured timers; the intervals as Go durations ("300ms").
	DetectMultiplier uint8  `json:"detect_multiplier"`
	MinRxInterval    string `json:"min_rx_interval"`
	MinTxInterval    string `json:"min_tx_interval"`
}

// AnnouncedVIP is the announcement decision about one VIP.
type AnnouncedVIP struct {
	VIP       string   `json:"vip"`
	Announced bool     `json:"announced"`
	Services  []string `json:"services"`
	Reason    string   `json:"reason,omitempty"`
}

// L2Status is the ARP/NDP responder's state.
type L2Status struct {
	VIPs       []AnnouncedVIP `json:"vips"`
	Interfaces []L2Interface  `json:"interfaces"`
	// Failover is nil without [l2.failover].
	Failover *L2Failover `json:"failover,omitempty"`
}

// L2Failover is this box's part in active/standby failover between the
// L2 boxes of its segment.
type L2Failover struct {
	Name     string `json:"name"`
	Group    uint8  `json:"group"`
	Priority uint8  `json:"priority"`
	// Role is "active" (answering for the VIPs), "standby" or
	// "listening" (started or back from a stall, not yet claiming).
	Role  string    `json:"role"`
	Since time.Time `json:"since"`
	// Ready: every checked backend has had a probe end.
	Ready bool `json:"ready"`
	// Transitions counts the entries into each role since l4lbd started.
	Transitions map[string]uint64 `json:"transitions"`
	// Conflicts counts adverts of another active box while this one was
	// active.
	Conflicts        uint64   `json:"conflicts"`
	Interval         string   `json:"interval"`
	DetectMultiplier uint8    `json:"detect_multiplier"`
	Peers            []L2Peer `json:"peers"`
}

// L2Peer is another box of the failover group, as its last advert said.
type L2Peer struct {
	Name      string    `json:"name"`
	MAC       string    `json:"mac"`
	Interface string    `json:"interface"`
	Priority  uint8     `json:"priority"`
	Role      string    `json:"role"`
	Ready     bool      `json:"ready"`
	LastSeen  time.Time `json:"last_seen"`
}

// L2Interface counts what the responder sent on one interface.
type L2Interface struct {
	Name           string `json:"name"`
	ARPReplies     uint64 `json:"arp_replies"`
	NDReplies      uint64 `json:"nd_replies"`
	GratuitousSent uint64 `json:"gratuitous_sent"`
}

// SourceStatus is the state of one discovery source.
type SourceStatus struct {
	Name string `json:"name"`
	// LastSync is when the source last had a complete, current view.
	LastSync time.Time `json:"last_sync"`
	// Stale is true while the source cannot reach what it watches: its
	// last known services keep serving, possibly out of date.
	Stale bool `json:"stale"`
	// StaleSeconds is how long it has been stale (0 when not).
	StaleSeconds float64 `json:"stale_seconds"`
	// Error is why it is stale.
	Error string `json:"error,omitempty"`
	// Errors are the definitions it left out, each naming its origin.
	Errors []string `json:"errors,omitempty"`
	// StatusWriter (Kubernetes) is true while this box holds the Lease
	// and so is the one that writes Service status and Events.
	StatusWriter bool `json:"status_writer,omitempty"`
}

// Reload is the outcome of the latest configuration (re)load.
type Reload struct {
	Time  time.Time `json:"time"`
	OK    bool      `json:"ok"`
	Error string    `json:"error,omitempty"`
	// Count is the number of reloads since start, successful or not.
	Count uint64 `json:"count"`
}

// Interface is one interface the datapath is attached to.
type Interface struct {
	Name string `json:"name"`
	// Attach and Mode are what the configuration asks for
	// (datapath.attach, datapath.xdp_mode).
	Attach string `json:"attach"`
	Mode   string `json:"mode,omitempty"`
	// Attached is what the kernel reports, read back from it: "xdp
	// native", "xdp generic", "xdp offload", "tc tcx" or "not attached"
	// (then possibly naming another program on the XDP hook).
	Attached string `json:"attached"`
	// AttachedError is why Attached could not be read.
	AttachedError string `json:"attached_error,omitempty"`
}

// Reason counts packets by what the datapath did with them.
type Reason struct {
	Name    string `json:"name"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Counters are per-service or per-backend datapath counters.
type Counters struct {
	Packets  uint64 `json:"packets"`
	Bytes    uint64 `json:"bytes"`
	NewFlows uint64 `json:"new_flows"`
	// ReplyPackets and ReplyBytes count a SNAT service's replies: its
	// backends' packets sent back to clients (L3 bytes as received from
	// the backend). Absent for backends and DSR services: the SNAT reply
	// path knows the service of a binding, not the backend's id, and DSR
	// replies bypass the box.
	ReplyPackets uint64 `json:"reply_packets,omitempty"`
	ReplyBytes   uint64 `json:"reply_bytes,omitempty"`
}

// Service is one programmed service (GET /v1/services, /v1/services/NAME).
type Service struct {
	Name        string    `json:"name"`
	Frontend    string    `json:"frontend"`
	Mode        string    `json:"mode"`
	Dispatch    string    `json:"dispatch,omitempty"`
	TableSize   uint32    `json:"table_size"`
	Source      string    `json:"source"`
	Fingerprint string    `json:"fingerprint"`
	Counters    Counters  `json:"counters"`
	Backends    []Backend `json:"backends"`
}

// Backend is one backend of a service.
type Backend struct {
	Address string `json:"address"`
	Weight  uint32 `json:"weight"`
	// State is the state in force: the configured one, or a runtime
	// override when Override is set.
	State string `json:"state"`
	// ConfigState is what the service's source says.
	ConfigState string `json:"config_state"`
	// Override is true when `l4lbctl backend drain|enable|disable` set State.
	Override bool `json:"override"`
	// Health is "healthy", "unhealthy", "unknown" (not probed yet) or
	// "unchecked" (the service has no health check). An unhealthy backend
	// is out of the Maglev table (Slots 0) but keeps its flows.
	Health      string   `json:"health"`
	HealthError string   `json:"health_error,omitempty"`
	Slots       int      `json:"slots"`
	Counters    Counters `json:"counters"`
	// ActiveConns and InactiveConns count the backend's flows in the
	// connection table (as of at most a few seconds ago). Active: TCP,
	// established (for SNAT: the binding is past the handshake and saw no
	// FIN or RST) and seen within datapath.snat_timeouts.tcp; inactive:
	// UDP flows and closing or reopening TCP flows, each until its
	// state's timeout runs out (idle entries count in neither).
	ActiveConns   uint64 `json:"active_conns"`
	InactiveConns uint64 `json:"inactive_conns"`
}

// BackendAction is a runtime override: POST
// /v1/services/NAME/backends/ADDR:PORT/ACTION.
type BackendAction string

// Backend actions. Clear removes the override.
const (
	ActionDrain   BackendAction = "drain"
	ActionEnable  BackendAction = "enable"
	ActionDisable BackendAction = "disable"
	ActionClear   BackendAction = "clear"
)

// Conntrack is the connection table's occupancy (GET /v1/conntrack).
type Conntrack struct {
	Entries  int    `json:"entries"`
	Capacity uint32 `json:"capacity"`
	// InsertFailures counts flows the datapath could not record.
	InsertFailures uint64 `json:"insert_failures"`
}

// Flow is one connection-table entry (GET /v1/conntrack/flows, `l4lbctl
// conntrack list`).
type Flow struct {
	Proto  string `json:"proto"`
	Client string `json:"client"`
	// VIP is the frontend's address and port.
	VIP string `json:"vip"`
	// Service is empty, and Backend the datapath's id ("id N"), for an
	// entry whose service or backend is no longer programmed: its next
	// packet is balanced again.
	Service string `json:"service"`
	Backend string `json:"backend"`
	// State is established, syn_sent, closing, idle or udp; Active is
	// true for established (see Backend.ActiveConns).
	State  string `json:"state"`
	Active bool   `json:"active"`
	// AgeSeconds is the time since the flow's latest client packet (the
	// datapath refreshes it at most once a second).
	AgeSeconds float64 `json:"age_seconds"`
	// ExpiresSeconds is how long until the flow, without another packet,
	// is idle (its state's timeout less its age; 0 once idle), as
	// ipvsadm -Lnc's expire column.
	ExpiresSeconds float64 `json:"expires_seconds"`
	// SNAT is the source the flow's SNAT binding uses towards the backend.
	SNAT string `json:"snat,omitempty"`
}

// FlowQuery selects the flows GET /v1/conntrack/flows lists: those of
// Service and/or Backend (ip:port) when not empty, at most Limit of them
// (0: all).
type FlowQuery struct {
	Service string
	Backend string
	Limit   int
}

// FlowList is what GET /v1/conntrack/flows answers: the flows (at most the
// query's limit) and how many entries the query matched in all, so that a
// listing cut short says so. Only the listed flows are held in memory, on
// either side: a full table is counted, not copied.
type FlowList struct {
	Flows   []Flow `json:"flows"`
	Matched int    `json:"matched"`
}

// FlushRequest selects the flows POST /v1/conntrack/flush deletes: those of
// Backend (ip:port; of Service only, when set), those of Service, or with
// All every flow. An empty request is refused.
type FlushRequest struct {
	Service string `json:"service,omitempty"`
	Backend string `json:"backend,omitempty"`
	All     bool   `json:"all,omitempty"`
}

// FlushResult counts what a flush deleted: connection-table entries and
// SNAT bindings.
type FlushResult struct {
	Flows    int `json:"flows"`
	Bindings int `json:"bindings"`
}

// MaglevTable is a service's live Maglev table (GET
// /v1/services/NAME/maglev), in the shape of `l4lbctl maglev table -o json`.
type MaglevTable struct {
	Size     uint32   `json:"size"`
	Backends []string `json:"backends"`
	Table    []int32  `json:"table"`
}

// Lookup is where a flow goes (GET /v1/services/NAME/lookup?src=&sport=).
type Lookup struct {
	Backend string `json:"backend"`
	Index   int32  `json:"index"`
	Slot    uint32 `json:"slot"`
	Hash    string `json:"hash"`
	// Conntrack is set when the flow is in the connection table: the
	// datapath follows it rather than the table.
	Conntrack string `json:"conntrack,omitempty"`
}

// ConfigDiffRequest asks what a configuration file would change (POST
// /v1/config/diff): its name (for errors) and content.
type ConfigDiffRequest struct {
	Name    string `json:"name"`
	Content string `json:"content"`
}

// ConfigDiff is what loading a configuration would change, per service,
// before anything is applied (`l4lbctl config diff`).
type ConfigDiff struct {
	// Old and New name the two sides: "running" for the daemon's state,
	// or file names.
	Old string `json:"old"`
	New string `json:"new"`
	// PendingRestart are settings that would change only at a restart
	// (against the running daemon).
	PendingRestart []string `json:"pending_restart,omitempty"`
	// MaxFlowMove is the new file's daemon.max_flow_move (0: no guard);
	// Refused names the services over it, which make a reload fail.
	MaxFlowMove float64         `json:"max_flow_move,omitempty"`
	Refused     []string        `json:"refused,omitempty"`
	Services    []ServiceChange `json:"services"`
}

// ServiceChange is what a change does to one service.
type ServiceChange struct {
	Name string `json:"name"`
	// Status is "added", "removed", "changed" or "unchanged".
	Status     string          `json:"status"`
	Added      []string        `json:"added,omitempty"`
	Removed    []string        `json:"removed,omitempty"`
	Reweighted []BackendChange `json:"reweighted,omitempty"`
	Restated   []BackendChange `json:"restated,omitempty"`
	// Other names changed settings besides the backends.
	Other []string `json:"other,omitempty"`
	// MovedFlows is the share (0..1) of the service's flows whose
	// backend would change: Maglev slots changing owner, computed as
	// l4lbd builds its tables.
	MovedFlows float64 `json:"moved_flows"`
}

// BackendChange is a backend whose weight or state changes.
type BackendChange struct {
	Backend string `json:"backend"`
	Old     string `json:"old"`
	New     string `json:"new"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
}

// Fleet is the fleet check's view (GET /v1/fleet, and `l4lbctl fleet
// compare`): every box's fingerprints side by side and where they differ.
type Fleet struct {
	// Self is this box's name; empty for an on-demand comparison.
	Self string `json:"self,omitempty"`
	// LastSync is when Consul last answered; Error why it does not.
	LastSync time.Time  `json:"last_sync,omitzero"`
	Error    string     `json:"error,omitempty"`
	Boxes    []FleetBox `json:"boxes"`
	// Frontends are every frontend a box serves, with each box's
	// fingerprint.
	Frontends []FleetFrontend `json:"frontends"`
	// Mismatches are the frontends whose boxes have different
	// fingerprints: they send a flow to different backends.
	Mismatches []FleetFrontend `json:"mismatches"`
	// Missing maps a frontend to the boxes that do not serve it.
	Missing map[string][]string `json:"missing,omitempty"`
	// Warnings say the above in sentences.
	Warnings []string `json:"warnings,omitempty"`
	// Gone are the boxes that left the fleet lately; they are not
	// compared.
	Gone []FleetGone `json:"gone,omitempty"`
}

// FleetBox is one box's record.
type FleetBox struct {
	Name            string `json:"name"`
	Version         string `json:"version,omitempty"`
	SeedFingerprint string `json:"seed_fingerprint"`
	// Updated is when the box last changed its record.
	Updated time.Time `json:"updated,omitzero"`
	// LastSeen is when the box was last found running: its record in
	// Consul, held by its live session, as of Consul's last answer (this
	// box: now); for `fleet compare`, when it answered.
	LastSeen time.Time      `json:"last_seen,omitzero"`
	Services []FleetService `json:"services"`
}

// FleetGone is a box whose record went (it stopped, or its Consul session
// expired) within the last hour.
type FleetGone struct {
	Name     string    `json:"name"`
	LastSeen time.Time `json:"last_seen"`
}

// FleetService is one service of a box.
type FleetService struct {
	Name        string `json:"name"`
	Frontend    string `json:"frontend"`
	Fingerprint string `json:"fingerprint"`
}

// FleetFrontend is one frontend across the boxes.
type FleetFrontend struct {
	Frontend string   `json:"frontend"`
	Services []string `json:"services"`
	// Fingerprints maps box names to their fingerprint.
	Fingerprints map[string]string `json:"fingerprints"`
	// Differ is true when the fingerprints differ.
	Differ bool `json:"differ"`
}

// TraceRequest selects what GET /v1/trace reports (`l4lbctl trace`): the
// packets of clients in Client (an address or prefix), to VIP:Port/Proto
// (or to the frontend of Service), that went to Backend (ip or ip:port),
// each when set. Count ends the trace after that many events, Timeout
// after that long (0: neither; the client's disconnect always does).
// Rate is how many events each CPU sends per second; the rest of the
// selected packets are counted as sampled.
type TraceRequest struct {
	Client  string        `json:"client,omitempty"`
	VIP     string        `json:"vip,omitempty"`
	Port    uint16        `json:"port,omitempty"`
	Proto   string        `json:"proto,omitempty"`
	Service string        `json:"service,omitempty"`
	Backend string        `json:"backend,omitempty"`
	Count   int           `json:"count,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
	Rate    uint32        `json:"rate,omitempty"`
}

// TraceMessage is one line of GET /v1/trace's stream (newline-delimited
// JSON): an event, the trace's counts (at most once a second while they
// change, and last), or, last, why the trace ended.
type TraceMessage struct {
	Event *TraceEvent `json:"event,omitempty"`
	Stats *TraceStats `json:"stats,omitempty"`
	// End is "count", "timeout" or "closed" (the daemon stopped).
	End string `json:"end,omitempty"`
}

// TraceEvent is what the datapath did with one packet.
type TraceEvent struct {
	Time time.Time `json:"time"`
	// Hook is xdp or tc; Interface the interface the packet came in on.
	Hook      string `json:"hook"`
	Interface string `json:"interface"`
	Proto     string `json:"proto"`
	// Client and VIP (ip:port) are the flow as its client sends it; for a
	// backend's reply (Direction "reply"), the flow it belongs to.
	Client    string `json:"client"`
	VIP       string `json:"vip"`
	Direction string `json:"direction"`
	Length    int    `json:"length"`
	TCPFlags  string `json:"tcp_flags,omitempty"`
	// Verdict is the program's action (tx, redirect, pass, drop, next,
	// aborted); Reason the reason it counted (docs/metrics.md), empty for
	// a plain forward.
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	Service string `json:"service,omitempty"`
	Backend string `json:"backend,omitempty"`
	// Mode is snat or dsr; Dispatch (DSR) ipip, geneve or opt.
	Mode     string `json:"mode,omitempty"`
	Dispatch string `json:"dispatch,omitempty"`
	// Conntrack is hit, miss (balanced without an entry), created,
	// insert_failed, or empty for a packet not forwarded.
	Conntrack string `json:"conntrack,omitempty"`
	// SNAT is the flow's SNAT source (address:port) when it has a binding.
	SNAT string `json:"snat,omitempty"`
	// Sent says what left the box: the encapsulation, the rewrite, or
	// the ICMP answer; empty when nothing was sent on.
	Sent string `json:"sent,omitempty"`
}

// TraceStats counts a trace's packets: Matched were selected, Sent
// reported, Sampled selected but over the rate, Lost selected but the
// datapath's buffer to l4lbd was full. Reported = events l4lbd streamed.
type TraceStats struct {
	Matched  uint64 `json:"matched"`
	Sent     uint64 `json:"sent"`
	Sampled  uint64 `json:"sampled"`
	Lost     uint64 `json:"lost"`
	Reported int    `json:"reported"`
}
