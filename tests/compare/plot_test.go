// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/xml"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPerSecond(t *testing.T) {
	conns := []connStat{
		{At: 100 * time.Millisecond, Result: resOK},
		{At: 900 * time.Millisecond, Result: "refused"},
		{At: 2500 * time.Millisecond, Result: "refused"},
		{At: 2600 * time.Millisecond, Result: "timeout"},
		{At: 3100 * time.Millisecond, Result: resOK},
	}
	if got, want := perSecond(conns), []int{1, 0, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("perSecond = %v, want %v", got, want)
	}
	if got := perSecond(nil); len(got) != 0 {
		t.Errorf("perSecond(nil) = %v, want nothing", got)
	}
}

func TestNiceCeil(t *testing.T) {
	for _, c := range []struct{ in, want int }{
		{0, 1}, {1, 1}, {2, 2}, {3, 5}, {7, 10}, {10, 10}, {11, 20}, {250, 500}, {501, 1000},
	} {
		if got := niceCeil(c.in); got != c.want {
			t.Errorf("niceCeil(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

// svgLine is a polyline of the plot, as parsed back.
type svgLine struct {
	system string
	points [][2]float64
}

// parsePlot reads the plot back as XML (so it must be well formed) and
// returns its polylines and texts.
func parsePlot(t *testing.T, r io.Reader) (lines []svgLine, texts []string) {
	t.Helper()
	dec := xml.NewDecoder(r)
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return lines, texts
		}
		if err != nil {
			t.Fatalf("plot is not well-formed XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			inText = e.Name.Local == "text"
			if e.Name.Local != "polyline" {
				continue
			}
			var l svgLine
			for _, a := range e.Attr {
				switch a.Name.Local {
				case "data-system":
					l.system = a.Value
				case "points":
					for _, p := range strings.Fields(a.Value) {
						xs, ys, _ := strings.Cut(p, ",")
						x, err1 := strconv.ParseFloat(xs, 64)
						y, err2 := strconv.ParseFloat(ys, 64)
						if err1 != nil || err2 != nil {
							t.Fatalf("polyline %q: bad point %q", l.system, p)
						}
						l.points = append(l.points, [2]float64{x, y})
					}
				}
			}
			lines = append(lines, l)
		case xml.CharData:
			if inText {
				texts = append(texts, string(e))
			}
		case xml.EndElement:
			inText = false
		}
	}
}

func TestPlot(t *testing.T) {
	rep := &Report{
		Command: "make compare", Started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
		Rollout: &RolloutResult{Services: 1000, Rate: 500, Rows: []RolloutRow{
			{System: "iptables, kube-proxy full syncs (before 1.28)", Outcome: Outcome{Failed: 600, FailedPerSecond: []int{0, 250, 250, 100}}},
			{System: "l4lb, drain, remove, stop", Outcome: Outcome{FailedPerSecond: []int{0, 0, 0, 0}}},
		}},
		Conntrack: &ExhaustionResult{Rate: 1000, Free: 4096, Rows: []ExhaustionRow{
			{System: "iptables", Outcome: Outcome{Failed: 7, FailedPerSecond: []int{0, 3, 4}}},
			{System: "l4lb & <co>", Outcome: Outcome{FailedPerSecond: []int{0, 0, 0}}},
		}},
	}
	var b strings.Builder
	if err := rep.writePlot(&b); err != nil {
		t.Fatal(err)
	}
	lines, texts := parsePlot(t, strings.NewReader(b.String()))
	var names []string
	for _, l := range lines {
		names = append(names, l.system)
	}
	want := []string{"iptables, kube-proxy full syncs (before 1.28)", "l4lb, drain, remove, stop", "iptables", "l4lb & <co>"}
	if !slices.Equal(names, want) {
		t.Fatalf("polylines %q, want %q", names, want)
	}
	// Two points per second (a step line); the busiest second of a panel
	// at its top, a system without failures flat on the axis below it.
	full, none := lines[0], lines[1]
	if len(full.points) != 8 || len(none.points) != 8 {
		t.Fatalf("rollout lines have %d and %d points, want 8 each", len(full.points), len(none.points))
	}
	axis := none.points[0][1]
	for _, p := range none.points {
		if p[1] != axis {
			t.Errorf("a system with no failure leaves the axis: %v", none.points)
			break
		}
	}
	// A square-root scale: 250 is sqrt(2.5) times as high as 100.
	zero, half, fifth := full.points[0][1], full.points[2][1], full.points[6][1]
	if zero != axis || !(half < fifth && fifth < zero) {
		t.Errorf("full-sync line at y %v (0), %v (250), %v (100) with the axis at %v", zero, half, fifth, axis)
	}
	if h := (axis - half) / (axis - fifth); math.Abs(h-math.Sqrt(2.5)) > 0.01 {
		t.Errorf("250 drawn %.3f times as high as 100, want %.3f", h, math.Sqrt(2.5))
	}
	// The x axis spans the load: the last point of each line at the same x.
	if full.points[7][0] != none.points[7][0] || full.points[7][0] <= full.points[0][0] {
		t.Errorf("lines end at x %v and %v", full.points[7][0], none.points[7][0])
	}
	all := strings.Join(texts, "\n")
	for _, s := range []string{"iptables, kube-proxy full syncs (before 1.28): 600 failed", "l4lb & <co>: 0 failed", "500 new connections/s", "at 1000/s", "square-root scale", "Rolling update", "Conntrack exhaustion"} {
		if !strings.Contains(all, s) {
			t.Errorf("plot has no text %q; its texts:\n%s", s, all)
		}
	}

	if err := (&Report{}).writePlot(io.Discard); err == nil {
		t.Error("a report without rollout and conntrack plotted without an error")
	}
}
