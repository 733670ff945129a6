// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
)

// series is one row of a scenario, as -plot draws it.
type series struct {
	name   string
	failed int
	perSec []int
}

// panel is one scenario's chart: failed connections per second over the
// load, one line per system.
type panel struct {
	title string
	lines []series
}

// The chart's geometry, in SVG user units.
const (
	plotWidth   = 960
	plotLeft    = 70 // room for the y axis labels
	plotRight   = 20
	panelHeight = 220
	legendLine  = 18
	panelGap    = 30
)

// Warm colours for the iptables rows, cool ones for l4lb's, picked in
// order within a panel.
var (
	iptablesColors = []string{"#d62728", "#ff7f0e", "#8c564b"}
	l4lbColors     = []string{"#1f77b4", "#2ca02c", "#9467bd"}
)

// panels are the scenarios of a report that have a timeline: the rolling
// update and the conntrack exhaustion.
func (r *Report) panels() []panel {
	var ps []panel
	if ro := r.Rollout; ro != nil {
		p := panel{title: fmt.Sprintf("Rolling update: %d services, every backend of one replaced one by one, %d new connections/s", ro.Services, ro.Rate)}
		for _, x := range ro.Rows {
			p.lines = append(p.lines, series{x.System, x.Failed, x.FailedPerSecond})
		}
		ps = append(ps, p)
	}
	if ct := r.Conntrack; ct != nil {
		p := panel{title: fmt.Sprintf("Conntrack exhaustion: short connections at %d/s with %d entries of room", ct.Rate, ct.Free)}
		for _, x := range ct.Rows {
			p.lines = append(p.lines, series{x.System, x.Failed, x.FailedPerSecond})
		}
		ps = append(ps, p)
	}
	return ps
}

// writePlot draws the failed connections of every second of the rolling
// update and the conntrack exhaustion as an SVG file (-plot); an error when
// the report has neither.
func (r *Report) writePlot(w io.Writer) error {
	ps := r.panels()
	if len(ps) == 0 {
		return fmt.Errorf("nothing to plot: the run had neither the rollout nor the conntrack scenario")
	}
	// The panels first: their legends decide the height.
	var body strings.Builder
	top := 40
	for _, p := range ps {
		top = p.draw(&body, top)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotWidth, top, plotWidth, top)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s</text>`+"\n", plotLeft, esc("Failed connections per second, "+r.Command+", "+r.Started.UTC().Format("2006-01-02 15:04 MST")))
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// draw writes one panel with its top edge at top and returns where the
// next one starts.
func (p panel) draw(b *strings.Builder, top int) int {
	seconds := 1
	most := 0
	for _, s := range p.lines {
		seconds = max(seconds, len(s.perSec))
		for _, v := range s.perSec {
			most = max(most, v)
		}
	}
	yMax := niceCeil(most)
	// A square-root scale: a few failures a second stay visible next to
	// hundreds.
	scale := func(v int) float64 { return math.Sqrt(float64(v)) / math.Sqrt(float64(yMax)) }
	x0, x1 := plotLeft, plotWidth-plotRight
	y0, y1 := top+30+panelHeight, top+30 // y0 is the axis, y1 the top
	x := func(sec int) float64 { return float64(x0) + float64(sec)*float64(x1-x0)/float64(seconds) }
	y := func(v int) float64 { return float64(y0) - scale(v)*float64(y0-y1) }

	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", x0, top+15, esc(p.title))
	// Grid and y labels at 0, the powers of ten and the top of the scale.
	ticks := []int{0}
	for v := 1; v < yMax; v *= 10 {
		ticks = append(ticks, v)
	}
	last := math.Inf(1)
	for _, v := range append(ticks, yMax) {
		if last-y(v) < 14 && v != yMax {
			continue // its label would run into the one below
		}
		last = y(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y(v), x1, y(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", x0-6, y(v)+4, v)
	}
	fmt.Fprintf(b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">failed / s, square-root scale</text>`+"\n", (y0+y1)/2, (y0+y1)/2)
	step := max(1, niceCeil(seconds/10))
	for s := 0; s <= seconds; s += step {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", x(s), y0, x(s), y0+4)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%d s</text>`+"\n", x(s), y0+18, s)
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x0, y0, x1, y0)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x0, y0, x0, y1)

	legend := y0 + 40
	warm, cool := 0, 0
	for i, s := range p.lines {
		var color string
		if strings.HasPrefix(s.name, "iptables") {
			color = iptablesColors[warm%len(iptablesColors)]
			warm++
		} else {
			color = l4lbColors[cool%len(l4lbColors)]
			cool++
		}
		// A step line: each second's count held over that second.
		var pts []string
		for sec, v := range s.perSec {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(sec), y(v), x(sec+1), y(v)))
		}
		fmt.Fprintf(b, `<polyline data-system="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", esc(s.name), color, strings.Join(pts, " "))
		ly := legend + i*legendLine
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", x0, ly-4, x0+24, ly-4, color)
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", x0+32, ly, esc(fmt.Sprintf("%s: %d failed", s.name, s.failed)))
	}
	return legend + legendLine*(len(p.lines)-1) + panelGap
}

// niceCeil is the smallest of 1, 2, 5 times a power of ten that is at
// least v (and at least 1), so that axis labels are round.
func niceCeil(v int) int {
	if v <= 1 {
		return 1
	}
	p := int(math.Pow10(int(math.Floor(math.Log10(float64(v))))))
	for _, m := range []int{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func esc(s string) string { return html.EscapeString(s) }

// writePlotFile writes the plot to path, whole or not at all.
func writePlotFile(r *Report, path string) error {
	var b strings.Builder
	if err := r.writePlot(&b); err != nil {
		return err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
