// SPDX-License-Identifier: Apache-2.0

package health

import (
	"fmt"
	"time"
)

// Damping configures how a flapping backend is held down. A zero field takes
// its default; see the package documentation for the rule.
type Damping struct {
	// Off disables damping: a backend returns whenever Rise probes succeed.
	Off bool
	// Window is how long a state change is remembered.
	Window time.Duration
	// MaxTransitions is how many state changes a backend may make within
	// Window; a return that would exceed it starts a hold-down.
	MaxTransitions int
	// HoldDown is how long a flapping backend is kept down.
	HoldDown time.Duration
}

// Damping defaults: a backend may go down and come back twice within five
// minutes; a third return waits two minutes.
const (
	DefaultDampingWindow  = 5 * time.Minute
	DefaultMaxTransitions = 4
	DefaultHoldDown       = 2 * time.Minute
)

func (d Damping) withDefaults() Damping {
	if d.Window <= 0 {
		d.Window = DefaultDampingWindow
	}
	if d.MaxTransitions <= 0 {
		d.MaxTransitions = DefaultMaxTransitions
	}
	if d.HoldDown <= 0 {
		d.HoldDown = DefaultHoldDown
	}
	return d
}

// outcome is what one probe result did to a backend.
type outcome uint8

const (
	steady   outcome = iota
	wentUp           // Down -> Up
	wentDown         // Up -> Down
	heldDown         // a return was refused: the backend flaps
)

// tracker is one backend's state machine: probe results in, state changes
// out. It is pure (time comes in with every result), so that its rules can
// be tested without waiting.
type tracker struct {
	rise, fall int
	damping    Damping

	state      State
	succ, fail int
	lastChange time.Time
	lastCheck  time.Time
	lastErr    string
	// passed is true once a probe succeeded: the state rests on evidence,
	// not only on the initial state.
	passed bool
	// changes are the times of the state changes within the damping window,
	// oldest first.
	changes   []time.Time
	heldUntil time.Time
}

func newTracker(rise, fall int, d Damping, initial State, now time.Time) *tracker {
	return &tracker{rise: max(rise, 1), fall: max(fall, 1), damping: d.withDefaults(), state: initial, lastChange: now}
}

// observe records the result of a probe that ended at now and says what it
// changed; reason explains any outcome but steady.
func (t *tracker) observe(now time.Time, err error) (outcome, string) {
	t.lastCheck = now
	t.forget(now)
	if err != nil {
		t.fail++
		t.succ = 0
		t.lastErr = err.Error()
		if t.state == Up && t.fail >= t.fall {
			t.change(Down, now)
			return wentDown, fmt.Sprintf("%d consecutive failed checks (fall %d): %v", t.fail, t.fall, err)
		}
		return steady, ""
	}
	t.succ++
	t.fail = 0
	t.lastErr = ""
	t.passed = true
	if t.state == Up || t.succ < t.rise || now.Before(t.heldUntil) {
		return steady, ""
	}
	reason := fmt.Sprintf("%d consecutive successful checks (rise %d)", t.succ, t.rise)
	if !t.heldUntil.IsZero() {
		t.heldUntil = time.Time{}
		reason += " after a hold-down for flapping"
	} else if !t.damping.Off && len(t.changes)+1 > t.damping.MaxTransitions {
		t.heldUntil = now.Add(t.damping.HoldDown)
		n := len(t.changes)
		// The hold is the penalty; afterwards the backend starts afresh.
		t.changes = t.changes[:0]
		return heldDown, fmt.Sprintf("flapping: %d state changes within %s (at most %d allowed); held down until %s",
			n, t.damping.Window, t.damping.MaxTransitions, t.heldUntil.Format(time.RFC3339))
	}
	t.change(Up, now)
	return wentUp, reason
}

func (t *tracker) change(s State, now time.Time) {
	t.state = s
	t.lastChange = now
	t.changes = append(t.changes, now)
}

// forget drops state changes older than the damping window.
func (t *tracker) forget(now time.Time) {
	cut := now.Add(-t.damping.Window)
	i := 0
	for i < len(t.changes) && !t.changes[i].After(cut) {
		i++
	}
	t.changes = append(t.changes[:0], t.changes[i:]...)
}

// carry continues old's state and flap history in t, for a prober restarted
// because its check or target changed: the change of configuration says
// nothing about the backend's health, so neither a flapping backend nor a
// down one gets a fresh start from it.
func (t *tracker) carry(old *tracker) {
	t.state = old.state
	t.lastChange = old.lastChange
	t.changes = append([]time.Time(nil), old.changes...)
	t.heldUntil = old.heldUntil
	t.passed = old.passed
}

// transitions counts the state changes within the window ending at now.
func (t *tracker) transitions(now time.Time) int {
	cut := now.Add(-t.damping.Window)
	n := 0
	for _, c := range t.changes {
		if c.After(cut) {
			n++
		}
	}
	return n
}
