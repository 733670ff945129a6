// SPDX-License-Identifier: Apache-2.0

package health

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// step is one probe result fed to a tracker, at offset at from the start,
// and what it must do.
type step struct {
	at   time.Duration
	ok   bool
	want outcome
}

func TestTracker(t *testing.T) {
	const s = time.Second
	// ok and bad build steps one second apart from the given start.
	run := func(from time.Duration, ok bool, outs ...outcome) []step {
		var st []step
		for i, o := range outs {
			st = append(st, step{at: from + time.Duration(i)*s, ok: ok, want: o})
		}
		return st
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	damp := Damping{Window: 60 * s, MaxTransitions: 2, HoldDown: 30 * s}

	tests := []struct {
		name       string
		rise, fall int
		damping    Damping
		initial    State
		steps      []step
		wantState  State
	}{
		{
			name: "up falls after fall failures", rise: 2, fall: 3, initial: Up,
			steps:     run(0, false, steady, steady, wentDown, steady),
			wantState: Down,
		},
		{
			name: "a success resets the failure count", rise: 2, fall: 3, initial: Up,
			steps: cat(run(0, false, steady, steady), run(2*s, true, steady),
				run(3*s, false, steady, steady, wentDown)),
			wantState: Down,
		},
		{
			name: "down rises after rise successes", rise: 2, fall: 3, initial: Down,
			steps:     run(0, true, steady, wentUp, steady),
			wantState: Up,
		},
		{
			name: "a failure resets the success count", rise: 3, fall: 1, initial: Down,
			steps: cat(run(0, true, steady, steady), run(2*s, false, steady),
				run(3*s, true, steady, steady, wentUp)),
			wantState: Up,
		},
		{
			name: "rise and fall of one", rise: 1, fall: 1, initial: Up,
			steps:     cat(run(0, false, wentDown), run(s, true, wentUp), run(2*s, false, wentDown)),
			wantState: Down,
		},
		{
			// Changes at 0 (down) and 1 (up) use the budget of 2; the
			// return at 3 would be the 4th: held until 33.
			name: "flapping is held down, then returns", rise: 1, fall: 1, damping: damp, initial: Up,
			steps: cat(
				run(0, false, wentDown), run(s, true, wentUp), run(2*s, false, wentDown),
				run(3*s, true, heldDown, steady), // held until 33 s
				[]step{{at: 20 * s, ok: true, want: steady}},
				[]step{{at: 32 * s, ok: false, want: steady}},
				[]step{{at: 33 * s, ok: true, want: wentUp}}, // hold over, rise 1 met
				// The hold cleared the history, but the return counts:
				// one more blip and the next return is held again.
				run(34*s, false, wentDown), run(35*s, true, heldDown),
			),
			wantState: Down,
		},
		{
			name: "damping needs the streak after the hold", rise: 2, fall: 1, damping: damp, initial: Up,
			steps: cat(
				run(0, false, wentDown), run(s, true, steady, wentUp), run(3*s, false, wentDown),
				run(4*s, true, steady, heldDown), // held until 35
				[]step{{at: 34 * s, ok: false, want: steady}},
				[]step{{at: 35 * s, ok: true, want: steady}},
				[]step{{at: 36 * s, ok: true, want: wentUp}},
			),
			wantState: Up,
		},
		{
			name: "changes older than the window are forgotten", rise: 1, fall: 1, damping: damp, initial: Up,
			steps: cat(
				run(0, false, wentDown), run(s, true, wentUp),
				run(62*s, false, wentDown), run(63*s, true, wentUp),
			),
			wantState: Up,
		},
		{
			name: "damping off", rise: 1, fall: 1, damping: Damping{Off: true, MaxTransitions: 1}, initial: Up,
			steps: cat(
				run(0, false, wentDown), run(s, true, wentUp), run(2*s, false, wentDown), run(3*s, true, wentUp),
			),
			wantState: Up,
		},
		{
			name: "defaults allow two blips, hold the third return", rise: 1, fall: 1, initial: Up,
			steps: cat(
				run(0, false, wentDown), run(s, true, wentUp), run(2*s, false, wentDown), run(3*s, true, wentUp),
				run(4*s, false, wentDown), run(5*s, true, heldDown),
				[]step{{at: 5*s + DefaultHoldDown, ok: true, want: wentUp}},
			),
			wantState: Up,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			tr := newTracker(tt.rise, tt.fall, tt.damping, tt.initial, t0)
			for i, st := range tt.steps {
				var err error
				if !st.ok {
					err = errors.New("probe failed")
				}
				got, reason := tr.observe(t0.Add(st.at), err)
				if got != st.want {
					t.Fatalf("step %d (at %s, ok %v): outcome %d, want %d", i, st.at, st.ok, got, st.want)
				}
				if (got == steady) != (reason == "") {
					t.Errorf("step %d: outcome %d with reason %q", i, got, reason)
				}
			}
			if tr.state != tt.wantState {
				t.Errorf("final state %s, want %s", tr.state, tt.wantState)
			}
		})
	}
}

func TestTrackerReasonsAndStatus(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := newTracker(2, 2, Damping{Window: time.Minute, MaxTransitions: 1, HoldDown: time.Minute}, Up, t0)
	if _, r := tr.observe(t0.Add(1*time.Second), errors.New("refused")); r != "" {
		t.Fatalf("first failure: reason %q", r)
	}
	out, r := tr.observe(t0.Add(2*time.Second), errors.New("refused"))
	if out != wentDown || r != "2 consecutive failed checks (fall 2): refused" {
		t.Errorf("down: %d %q", out, r)
	}
	if tr.lastErr != "refused" || tr.fail != 2 || tr.succ != 0 || !tr.lastChange.Equal(t0.Add(2*time.Second)) {
		t.Errorf("after down: %+v", tr)
	}
	tr.observe(t0.Add(3*time.Second), nil)
	out, r = tr.observe(t0.Add(4*time.Second), nil)
	if out != heldDown || !strings.HasPrefix(r, "flapping: 1 state changes within 1m0s (at most 1 allowed); held down until 2026-01-01T00:01:04Z") {
		t.Errorf("hold: %d %q", out, r)
	}
	if tr.lastErr != "" || tr.succ != 2 || tr.fail != 0 || tr.state != Down {
		t.Errorf("after hold: %+v", tr)
	}
	out, r = tr.observe(t0.Add(64*time.Second), nil)
	if out != wentUp || r != "3 consecutive successful checks (rise 2) after a hold-down for flapping" {
		t.Errorf("return: %d %q", out, r)
	}
	if n := tr.transitions(t0.Add(64 * time.Second)); n != 1 {
		t.Errorf("transitions after the return: %d, want 1", n)
	}
	if n := tr.transitions(t0.Add(200 * time.Second)); n != 0 {
		t.Errorf("transitions long after: %d, want 0", n)
	}
}

// TestTrackerPassed: Up by the initial state alone is not evidence; the
// first successful probe is, and a restarted prober keeps it.
func TestTrackerPassed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := newTracker(2, 3, Damping{}, Up, t0)
	if tr.passed {
		t.Fatal("a new tracker has passed")
	}
	tr.observe(t0.Add(time.Second), errors.New("refused"))
	if tr.passed || tr.state != Up {
		t.Fatalf("after a failure: passed %v, state %s; want not passed, still up", tr.passed, tr.state)
	}
	tr.observe(t0.Add(2*time.Second), nil)
	if !tr.passed {
		t.Fatal("a success did not count as passed")
	}
	tr.observe(t0.Add(3*time.Second), errors.New("refused"))
	if !tr.passed {
		t.Fatal("a later failure took passed back")
	}
	next := newTracker(2, 3, Damping{}, Up, t0.Add(4*time.Second))
	next.carry(tr)
	if !next.passed {
		t.Error("a restarted prober lost passed")
	}
}

func TestJitter(t *testing.T) {
	const d = time.Second
	lo, hi := 900*time.Millisecond, 1100*time.Millisecond
	if got := jittered(d, 0); got != lo {
		t.Errorf("jittered(r=0) = %s, want %s", got, lo)
	}
	if got := jittered(d, 0.5); got != d {
		t.Errorf("jittered(r=0.5) = %s, want %s", got, d)
	}
	if got := firstDelay(d, 0); got != 0 {
		t.Errorf("firstDelay(r=0) = %s, want 0", got)
	}
	// r is in [0, 1): the top of the range is approached, never reached.
	const top = 1 - 1e-12
	if got := jittered(d, top); got >= hi || got < hi-time.Microsecond {
		t.Errorf("jittered(r→1) = %s, want just under %s", got, hi)
	}
	if got := firstDelay(d, top); got >= d/10 || got < d/10-time.Microsecond {
		t.Errorf("firstDelay(r→1) = %s, want just under %s", got, d/10)
	}
	// And with the random source the Manager uses, the spread is real.
	minJ, maxJ := hi, lo
	for range 10000 {
		j := jittered(d, randFloat())
		if j < lo || j >= hi {
			t.Fatalf("jittered interval %s outside [%s, %s)", j, lo, hi)
		}
		minJ, maxJ = min(minJ, j), max(maxJ, j)
		if f := firstDelay(d, randFloat()); f < 0 || f >= d/10 {
			t.Fatalf("first delay %s outside [0, %s)", f, d/10)
		}
	}
	if maxJ-minJ < 150*time.Millisecond {
		t.Errorf("10000 jittered intervals span only %s..%s", minJ, maxJ)
	}
}
