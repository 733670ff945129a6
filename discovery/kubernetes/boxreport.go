// SPDX-License-Identifier: Apache-2.0

package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/l4lb/l4lb/lb"
)

// Reasons of the Events a box that does not write status gives about its
// own datapath.
const (
	// ReasonNotProgrammedOnBox: a Service the Lease holder serves has been
	// missing from this box's datapath for longer than BoxReportGrace.
	ReasonNotProgrammedOnBox = "NotProgrammedOnBox"
	// ReasonProgrammedOnBox: this box's datapath holds it again.
	ReasonProgrammedOnBox = "ProgrammedOnBox"
)

// boxReportRepeat is how often a box repeats its Warning while a Service
// stays missing: the recorder folds the repeat into the same Event (its
// count goes up), which keeps it from expiring with the cluster's event TTL.
const boxReportRepeat = 15 * time.Minute

// DefaultBoxReportGrace is how long a Service may be missing from a box's
// datapath before the box says so: long enough for a reconcile pass and a
// discovery source starting, short enough to be seen while it matters.
const DefaultBoxReportGrace = 10 * time.Second

// boxReport remembers, for a box that does not hold the Lease, since when
// each Service has been missing from its datapath and when it last said
// so. The Lease holder's condition speaks for the holder's datapath only;
// a box whose datapath refused a Service (a frontend another source on it
// serves, a full table) would otherwise go unseen from the cluster. Such a
// box writes Events, never status: Events from several boxes add up where
// status writes would overwrite each other.
type boxReport struct {
	since  map[key]time.Time
	warned map[key]time.Time
}

func newBoxReport() *boxReport {
	return &boxReport{since: map[key]time.Time{}, warned: map[key]time.Time{}}
}

// boxReporter runs next to the election for as long as ctx: whenever the
// translation or the datapath changes, and when a grace period ends, it
// compares the two for this box while the box does not lead.
func (s *Source) boxReporter(ctx context.Context, rec record.EventRecorder) {
	br := newBoxReport()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.boxKick:
		case <-timer.C:
		}
		next := s.reportBox(br, rec, time.Now())
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
	}
}

// reportBox is one comparison: a Warning Event for each Service missing
// from this box's datapath for BoxReportGrace (repeated every
// boxReportRepeat while it stays missing), a Normal one when a Service it
// warned about is back. It returns when the next grace period ends
// (zero: none runs). While the box leads, or before the first full list,
// it forgets what it knew: the holder's condition speaks for its datapath.
func (s *Source) reportBox(br *boxReport, rec record.EventRecorder, now time.Time) time.Time {
	s.mu.Lock()
	res, programmed, lead, synced := s.result, s.programmed, s.leader, s.synced
	s.mu.Unlock()
	if lead || !synced || res == nil {
		clear(br.since)
		clear(br.warned)
		return time.Time{}
	}
	grace := s.opts.BoxReportGrace
	var next time.Time
	seen := map[key]bool{}
	services := s.current().services
	for k, o := range res.outcomes {
		if len(o.frontends) == 0 || !o.served() {
			continue
		}
		svc, err := services.Services(k.ns).Get(k.name)
		if err != nil || svc.DeletionTimestamp != nil {
			continue
		}
		seen[k] = true
		missing := o.missing(programmed)
		if len(missing) == 0 {
			if _, ok := br.warned[k]; ok {
				rec.Event(svc, corev1.EventTypeNormal, ReasonProgrammedOnBox,
					fmt.Sprintf("box %s: the Service's VIPs are in this box's datapath again", s.opts.Identity))
			}
			delete(br.since, k)
			delete(br.warned, k)
			continue
		}
		since, ok := br.since[k]
		if !ok {
			since = now
			br.since[k] = now
		}
		due := since.Add(grace)
		if last, ok := br.warned[k]; ok {
			due = last.Add(boxReportRepeat)
		}
		if now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		br.warned[k] = now
		rec.Event(svc, corev1.EventTypeWarning, ReasonNotProgrammedOnBox, truncate(fmt.Sprintf(
			"box %s: %s missing from this box's datapath for more than %s: another discovery source on this box may claim the frontend, or its datapath refused it; see `l4lbctl status` on that box",
			s.opts.Identity, frontendList(missing), grace), 1024))
	}
	for k := range br.since {
		if !seen[k] {
			delete(br.since, k)
			delete(br.warned, k)
		}
	}
	return next
}

func frontendList(fes []lb.Frontend) string {
	out := make([]string, 0, len(fes))
	for _, fe := range fes {
		out = append(out, fe.String())
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}
