// SPDX-License-Identifier: Apache-2.0

package ipfix

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// table is a connection table as a test scans it.
func table(flows ...Flow) Walk {
	return func(yield func(Flow) bool) error {
		for _, f := range flows {
			if !yield(f) {
				break
			}
		}
		return nil
	}
}

// summary names records as "event:reason:client-port" in a stable order.
func summary(recs []Record) string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprintf("%s:%d:%d", r.Event, r.Reason, r.Client.Port()))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestTrackerLifecycle follows flows through scans: created once, reported
// again each active timeout, ended when idle (by FIN: end of flow
// detected) or gone (evicted), a flow idle at first sight never reported,
// a re-balanced flow ended and created again, a reused tuple a new flow,
// and a failed walk taking nothing for gone.
func TestTrackerLifecycle(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	be1, be2 := netip.MustParseAddrPort("10.1.0.11:80"), netip.MustParseAddrPort("10.1.0.12:80")
	flow := func(port uint16, last time.Time, be netip.AddrPort) Flow {
		return Flow{Client: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), port), VIP: netip.MustParseAddrPort("192.0.2.10:80"),
			Proto: 6, Backend: be, Service: "web", Mode: "dsr/ipip", LastSeen: last}
	}
	tr := NewTracker(TrackerConfig{ActiveTimeout: time.Minute, IdleTimeout: 30 * time.Second})
	scan := func(at time.Time, w Walk, want string) {
		t.Helper()
		recs, untracked, err := tr.Scan(at, w)
		if err != nil || untracked != 0 {
			t.Fatalf("scan at %s: %v, %d untracked", at, err, untracked)
		}
		if got := summary(recs); got != want {
			t.Errorf("scan at +%s: records %q, want %q", at.Sub(t0), got, want)
		}
	}
	closing := func(f Flow) Flow { f.Closing = true; return f }

	scan(t0, table(flow(1, t0, be1), flow(2, t0, be1), flow(3, t0.Add(-time.Hour), be1)), "created:0:1 created:0:2")
	scan(t0.Add(10*time.Second), table(flow(1, t0.Add(10*time.Second), be1), flow(2, t0.Add(5*time.Second), be1), flow(3, t0.Add(-time.Hour), be1)), "")
	// 1 lasts an active timeout; 2 is re-balanced; 3 is used again.
	at := t0.Add(time.Minute)
	scan(at, table(flow(1, at, be1), flow(2, at, be2), flow(3, at, be1)), "active:2:1 created:0:2 created:0:3 ended:4:2")
	// 1 sent a FIN and went idle; 2 left the table; 3 idles out.
	at2 := at.Add(45 * time.Second)
	scan(at2, table(closing(flow(1, at.Add(5*time.Second), be1)), flow(3, at, be1)), "ended:1:3 ended:3:1 ended:5:2")
	// Idle entries stay in the table: nothing more.
	scan(at2.Add(10*time.Second), table(closing(flow(1, at.Add(5*time.Second), be1)), flow(3, at, be1)), "")
	// A walk that fails half way takes nothing for gone.
	recs, _, err := tr.Scan(at2.Add(20*time.Second), func(yield func(Flow) bool) error { return errors.New("map read failed") })
	if err == nil || len(recs) != 0 || tr.Tracked() != 2 {
		t.Errorf("failed walk: %v, records %q, %d tracked; want its error, none, 2", err, summary(recs), tr.Tracked())
	}
	// Gone: idle flows leave without a record.
	scan(at2.Add(30*time.Second), table(), "")
	if tr.Tracked() != 0 {
		t.Errorf("%d flows tracked after the table emptied", tr.Tracked())
	}
}

// TestTrackerSamplingAndLimit checks that sampling keeps a flow's records
// together (a hash of its tuple picks it) and that max_flows counts what
// it leaves out.
func TestTrackerSamplingAndLimit(t *testing.T) {
	t0 := time.Now()
	var flows []Flow
	for p := range 1000 {
		flows = append(flows, Flow{Client: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), uint16(1000+p)),
			VIP: netip.MustParseAddrPort("192.0.2.10:80"), Proto: 6, LastSeen: t0})
	}
	tr := NewTracker(TrackerConfig{ActiveTimeout: time.Minute, IdleTimeout: time.Minute, Sampling: 4})
	recs, _, _ := tr.Scan(t0, table(flows...))
	if n := len(recs); n < 150 || n > 350 {
		t.Errorf("1 in 4 of 1000 flows sampled: %d records", n)
	}
	again, _, _ := tr.Scan(t0.Add(2*time.Minute), table(flows...))
	if len(again) != len(recs) {
		t.Errorf("the next scan reported %d flows, the first %d: sampling must pick the same flows", len(again), len(recs))
	}

	limited := NewTracker(TrackerConfig{ActiveTimeout: time.Minute, IdleTimeout: time.Minute, MaxFlows: 100})
	recs, untracked, _ := limited.Scan(t0, table(flows...))
	if len(recs) != 100 || untracked != 900 || limited.Tracked() != 100 {
		t.Errorf("max_flows 100 of 1000: %d records, %d untracked, %d tracked", len(recs), untracked, limited.Tracked())
	}
}

// TestTrackerCounts checks the counts records carry: each record what the
// flow's totals grew by since its previous one (RFC 7012's delta counts),
// so that a collector's sum is the flow's total; a re-balanced flow's
// ended record takes the packets up to that scan and its new record starts
// from there; a counter made again (evicted, or deleted at an end) counts
// from zero; a gone flow's ended record carries what the last scan read;
// only ends that are not re-balances are a flow's final record.
func TestTrackerCounts(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)
	be1, be2 := netip.MustParseAddrPort("10.1.0.11:80"), netip.MustParseAddrPort("10.1.0.12:80")
	flow := func(last time.Time, be netip.AddrPort, packets, bytes uint64) Flow {
		return Flow{Client: netip.MustParseAddrPort("198.51.100.7:4000"), VIP: netip.MustParseAddrPort("192.0.2.10:80"),
			Proto: 17, Backend: be, LastSeen: last, Packets: packets, Bytes: bytes}
	}
	type want struct {
		ev             Event
		reason         EndReason
		packets, bytes uint64
		final          bool
	}
	tr := NewTracker(TrackerConfig{ActiveTimeout: time.Minute, IdleTimeout: 30 * time.Second})
	steps := []struct {
		at    time.Duration
		flows []Flow
		want  []want
	}{
		{0, []Flow{flow(t0, be1, 3, 300)}, []want{{EventCreated, 0, 3, 300, false}}},
		{10 * time.Second, []Flow{flow(t0.Add(10*time.Second), be1, 5, 500)}, nil},
		{time.Minute, []Flow{flow(t0.Add(time.Minute), be1, 9, 900)}, []want{{EventActive, EndActiveTimeout, 6, 600, false}}},
		// Re-balanced: the old flow's end takes all up to now.
		{70 * time.Second, []Flow{flow(t0.Add(70*time.Second), be2, 12, 1200)},
			[]want{{EventEnded, EndForced, 3, 300, false}, {EventCreated, 0, 0, 0, false}}},
		// The counter was made again (evicted): 2 packets since.
		{130 * time.Second, []Flow{flow(t0.Add(130*time.Second), be2, 2, 100)}, []want{{EventActive, EndActiveTimeout, 2, 100, false}}},
		{140 * time.Second, []Flow{flow(t0.Add(140*time.Second), be2, 4, 300)}, nil},
		// Gone: the last scan's reading, not yet reported.
		{150 * time.Second, nil, []want{{EventEnded, EndLackOfResources, 2, 200, true}}},
	}
	for _, s := range steps {
		recs, _, err := tr.Scan(t0.Add(s.at), table(s.flows...))
		if err != nil {
			t.Fatal(err)
		}
		var got []want
		for _, r := range recs {
			got = append(got, want{r.Event, r.Reason, r.Packets, r.Bytes, r.Final()})
		}
		if fmt.Sprint(got) != fmt.Sprint(s.want) {
			t.Errorf("scan at +%s: records %+v, want %+v", s.at, got, s.want)
		}
	}

	// An idle end is final; the tuple used again (its counter deleted at
	// the end, made again) is a new flow counted from zero.
	tr = NewTracker(TrackerConfig{ActiveTimeout: time.Minute, IdleTimeout: 30 * time.Second})
	tr.Scan(t0, table(flow(t0, be1, 4, 400)))
	recs, _, _ := tr.Scan(t0.Add(40*time.Second), table(flow(t0, be1, 4, 400)))
	if len(recs) != 1 || !recs[0].Final() || recs[0].Packets != 0 {
		t.Errorf("idle end: %+v, want one final record with no packets since the created one", recs)
	}
	recs, _, _ = tr.Scan(t0.Add(50*time.Second), table(flow(t0.Add(50*time.Second), be1, 1, 60)))
	if len(recs) != 1 || recs[0].Event != EventCreated || recs[0].Packets != 1 || recs[0].Bytes != 60 {
		t.Errorf("tuple used again: %+v, want a created record of 1 packet, 60 bytes", recs)
	}
}
