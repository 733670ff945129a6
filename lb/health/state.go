// SPDX-License-Identifier: Apache-2.0

package health

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/l4lb/l4lb/lb"
)

// State is a backend's health as the checks see it.
type State uint8

// Backend health states. Up is the zero value, the state a Manager starts
// backends in unless Options.Initial says otherwise.
const (
	Up State = iota
	Down
)

// String returns "up" or "down".
func (s State) String() string {
	switch s {
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return fmt.Sprintf("state-%d", uint8(s))
}

// MarshalText makes a State read as "up" or "down" in JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Key names one checked backend of one service. The same address behind two
// services is checked twice, since the services' checks may differ.
type Key struct {
	Service string
	Backend netip.AddrPort
}

// String formats the key as "web/10.1.0.11:30080".
func (k Key) String() string { return k.Service + "/" + k.Backend.String() }

// MarshalText lets a map keyed by Key be written as JSON.
func (k Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Event is a backend's change of state.
type Event struct {
	Service string
	Backend netip.AddrPort
	// State is the new state.
	State State
	// Reason says why, for logs and status, for example "3 consecutive
	// failed checks (fall 3): tcp check: dial tcp 10.1.0.11:30080: connect:
	// connection refused".
	Reason string
	// Time is when the probe that decided it ended.
	Time time.Time
}

// Status is what a prober knows about its backend, for status and metrics.
type Status struct {
	Service string
	Backend netip.AddrPort
	// Check is the check run, with defaults resolved; Target where it goes.
	Check  lb.HealthCheck
	Target Target
	State  State
	// LastChange is when State last changed, or when the backend's prober
	// first started if it never did.
	LastChange time.Time
	// LastCheck is when the last probe ended (zero before the first).
	LastCheck time.Time
	// LastError is the error of the last probe, empty if it succeeded.
	LastError string
	// Successes and Failures count the consecutive results that ended with
	// the last probe; one of them is zero.
	Successes int
	Failures  int
	// Passed is true once a probe of the backend succeeded since its
	// prober started (a prober restarted for a changed check keeps it).
	// An Up backend that has not passed yet is Up only by Options.Initial:
	// the announcers wait for the evidence.
	Passed bool
	// Transitions counts the state changes within the damping window.
	Transitions int
	// HeldUntil, when not zero, is when a hold-down for flapping ends; until
	// then the backend stays Down whatever its probes say.
	HeldUntil time.Time
}
