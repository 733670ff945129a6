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
	SeedFingerprint string      `json:"seed_fingerprint"`
	LastReload      Reload      `json:"last_reload"`
	Interfaces      []Interface `json:"interfaces"`
	Services        int         `json:"services"`
	Backends        int         `json:"backends"`
	Conflicts       []string    `json:"conflicts,omitempty"`
	Rejected        []string    `json:"rejected,omitempty"`
	// HealthWarnings name services whose checks all fail and are ignored
	// (fail open).
	HealthWarnings []string `json:"health_warnings,omitempty"`
	ReconcileError string   `json:"reconcile_error,omitempty"`
	Reasons        []Reason `json:"reasons"`
	// Discovery reports the sources that watch something outside l4lbd
	// (Consul, Kubernetes): whether their services may be out of date.
	Discovery []SourceStatus `json:"discovery,omitempty"`
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
	Name   string `json:"name"`
	Attach string `json:"attach"`
	Mode   string `json:"mode,omitempty"`
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

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
}
