package main

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coalescer/dispatch"
)

// This file draws the -svg picture: for each run, every bind as a point
// (x: when it was submitted, y: its latency) in the upper panel, and the
// queue depth over time as a line in the lower one, on a shared time axis.
// It is plain SVG written by hand, so the example needs no plotting library.

// bindPoint is one bind, for the picture.
type bindPoint struct {
	at, latency time.Duration // submitted, since the run started; Submit → outcome
	ok          bool          // the bind succeeded
}

// depthSample is the queue depth at one moment: calls waiting for a worker,
// for a retry's backoff, or behind their key's running call.
type depthSample struct {
	at    time.Duration // since the run started
	depth int
}

// queueDepth is what the picture calls the queue depth.
func queueDepth(s dispatch.Stats) int { return s.Ready + s.Delayed + s.Successors }

// The picture's geometry, in SVG user units (pixels at 100%).
const (
	svgWidth, svgHeight = 900, 500
	plotLeft, plotRight = 70, 880 // the panels' x extent
	latTop, latBottom   = 56, 236 // the bind-latency panel
	depTop, depBottom   = 276, 456
)

// seriesColors are the runs' colours, in the order of the reports.
var seriesColors = []string{"#1f77b4", "#d95f02", "#7570b3", "#1b9e77"}

// writeSVG draws the runs' bind latencies and queue depths. loop is how
// long the hot loop ran: a dashed line marks its end, after which the
// backlog drains (while the last binds are waited for, then in Close).
// apiLatency, if positive, is drawn as a reference line among the bind
// latencies: one API round trip.
func writeSVG(w io.Writer, rs []*report, loop, apiLatency time.Duration) error {
	c := newCanvas(w, rs, loop, apiLatency)
	c.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight)
	c.p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	c.p(`<text x="%d" y="20" font-size="15" font-weight="bold">dispatch quickstart: bind latency and queue depth over time</text>`+"\n", plotLeft)
	c.legend(rs)
	c.panel(latTop, latBottom, "bind latency, ms (log)", c.latTicks,
		func(v float64) float64 { return c.yLat(time.Duration(v * float64(time.Millisecond))) })
	c.panel(depTop, depBottom, "queue depth", c.depTicks,
		func(v float64) float64 { return c.yDep(int(v)) })
	c.p(`<text x="%d" y="%d" text-anchor="middle">time since the hot loop started, ms (a bind is drawn at its Submit)</text>`+"\n",
		(plotLeft+plotRight)/2, svgHeight-16)
	c.marks(loop, apiLatency)
	// The data: depth lines first, so that no line hides a bind.
	c.depthLines(rs)
	c.binds(rs)
	c.p(`</svg>` + "\n")
	return c.w.Flush()
}

// canvas is the picture being written, with the scales both runs share so
// that they compare at a glance.
type canvas struct {
	w        *bufio.Writer
	xTicks   []float64 // ms
	xMax     float64
	latTicks []float64 // ms, logarithmic
	lo, hi   float64   // log10 of the latency axis' ends
	depTicks []float64
	depMax   float64
}

// newCanvas sizes the axes to fit rs, the hot loop's end and apiLatency.
func newCanvas(w io.Writer, rs []*report, loop, apiLatency time.Duration) *canvas {
	end := loop
	minLat, maxLat := time.Duration(math.MaxInt64), time.Duration(0)
	maxDepth := 1
	for _, r := range rs {
		for _, b := range r.bindPoints {
			end = max(end, b.at+b.latency)
			minLat, maxLat = min(minLat, b.latency), max(maxLat, b.latency)
		}
		for _, s := range r.depthSamples {
			end = max(end, s.at)
			maxDepth = max(maxDepth, s.depth)
		}
	}
	if maxLat == 0 {
		minLat, maxLat = time.Millisecond, time.Second
	}
	if apiLatency > 0 {
		minLat, maxLat = min(minLat, apiLatency), max(maxLat, apiLatency)
	}
	c := &canvas{w: bufio.NewWriter(w)}
	c.xTicks = linearTicks(float64(end.Milliseconds()))
	c.xMax = c.xTicks[len(c.xTicks)-1]
	c.latTicks = logTicks(msf(minLat), msf(maxLat))
	c.lo, c.hi = math.Log10(c.latTicks[0]), math.Log10(c.latTicks[len(c.latTicks)-1])
	c.depTicks = linearTicks(float64(maxDepth))
	c.depMax = c.depTicks[len(c.depTicks)-1]
	return c
}

func (c *canvas) p(format string, args ...any) { fmt.Fprintf(c.w, format, args...) }

func (c *canvas) x(d time.Duration) float64 {
	return plotLeft + (plotRight-plotLeft)*float64(d)/float64(time.Millisecond)/c.xMax
}

func (c *canvas) yLat(d time.Duration) float64 {
	v := math.Log10(max(msf(d), c.latTicks[0]))
	return latBottom - (latBottom-latTop)*(v-c.lo)/(c.hi-c.lo)
}

func (c *canvas) yDep(n int) float64 { return depBottom - (depBottom-depTop)*float64(n)/c.depMax }

// legend draws one entry per run, then the bind markers.
func (c *canvas) legend(rs []*report) {
	lx := float64(plotLeft)
	for i, r := range rs {
		col := seriesColors[i%len(seriesColors)]
		c.p(`<line x1="%.1f" y1="38" x2="%.1f" y2="38" stroke="%s" stroke-width="2"/>`, lx, lx+18, col)
		c.p(`<circle cx="%.1f" cy="38" r="3.5" fill="%s"/>`, lx+9, col)
		label := r.name + " run"
		c.p(`<text x="%.1f" y="42">%s</text>`+"\n", lx+24, esc(label))
		lx += 24 + 7.5*float64(len(label)) + 24
	}
	c.p(`<text x="%.1f" y="42" fill="#444">● bind succeeded   × bind failed or expired</text>`+"\n", lx)
}

// panel draws a panel's frame, grid, tick labels and axis title.
func (c *canvas) panel(top, bottom float64, title string, ticks []float64, y func(float64) float64) {
	c.p(`<g>` + "\n")
	for _, t := range c.xTicks {
		xx := plotLeft + (plotRight-plotLeft)*t/c.xMax
		c.p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", xx, top, xx, bottom)
		c.p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">%s</text>`+"\n", xx, bottom+14, fmtTick(t))
	}
	for _, t := range ticks {
		yy := y(t)
		c.p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>`+"\n", plotLeft, yy, plotRight, yy)
		c.p(`<text x="%d" y="%.1f" text-anchor="end" fill="#444">%s</text>`+"\n", plotLeft-6, yy+4, fmtTick(t))
	}
	c.p(`<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="none" stroke="#888"/>`+"\n", plotLeft, top, plotRight-plotLeft, bottom-top)
	c.p(`<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (top+bottom)/2, esc(title))
	c.p(`</g>` + "\n")
}

// marks draws the end of the hot loop (from there on Close drains the
// backlog) and, if positive, the API's mean latency.
func (c *canvas) marks(loop, apiLatency time.Duration) {
	lxEnd := c.x(loop)
	for _, span := range [][2]float64{{latTop, latBottom}, {depTop, depBottom}} {
		c.p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="4 3"/>`+"\n", lxEnd, span[0], lxEnd, span[1])
	}
	c.p(`<text x="%.1f" y="%d" fill="#555">hot loop ends; the backlog drains</text>`+"\n", lxEnd+4, depTop+12)
	if apiLatency > 0 {
		y := c.yLat(apiLatency)
		c.p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555" stroke-dasharray="2 3"/>`+"\n", plotLeft, y, plotRight, y)
		c.p(`<text x="%d" y="%.1f" text-anchor="end" fill="#555">mean API call (%v)</text>`+"\n", plotRight-4, y-4, apiLatency)
	}
}

// depthLines draws each run's queue depth over time.
func (c *canvas) depthLines(rs []*report) {
	for i, r := range rs {
		if len(r.depthSamples) == 0 {
			continue
		}
		col := seriesColors[i%len(seriesColors)]
		var pts strings.Builder
		for _, s := range r.depthSamples {
			fmt.Fprintf(&pts, "%.1f,%.1f ", c.x(s.at), c.yDep(s.depth))
		}
		c.p(`<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round" points="%s"/>`+"\n",
			col, strings.TrimSpace(pts.String()))
	}
}

// binds draws each run's binds: a dot for a success, a cross otherwise.
func (c *canvas) binds(rs []*report) {
	for i, r := range rs {
		col := seriesColors[i%len(seriesColors)]
		c.p(`<g fill="%s" stroke="%s" fill-opacity="0.75">`+"\n", col, col)
		for _, b := range r.bindPoints {
			bx, by := c.x(b.at), c.yLat(b.latency)
			if b.ok {
				c.p(`<circle cx="%.1f" cy="%.1f" r="3"/>`+"\n", bx, by)
				continue
			}
			c.p(`<path d="M%.1f %.1fl7 7m0 -7l-7 7" stroke-width="1.5"/>`+"\n", bx-3.5, by-3.5)
		}
		c.p(`</g>` + "\n")
	}
}

// linearTicks returns evenly spaced round ticks from 0 to at least max: 1, 2
// or 5 times a power of ten apart, about five of them.
func linearTicks(max float64) []float64 {
	if max <= 0 {
		max = 1
	}
	step := math.Pow(10, math.Floor(math.Log10(max/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if max/(m*step) <= 6 {
			step *= m
			break
		}
	}
	var ts []float64
	for i := 0; ; i++ {
		t := float64(i) * step
		ts = append(ts, t)
		if t >= max {
			return ts
		}
	}
}

// logTicks returns ticks for a log axis covering [lo, hi] (both > 0). The
// axis runs between round values (1, 2 or 5 times a power of ten) just
// outside them, with a tick at each end and at every power of ten between;
// when the axis spans no more than two decades, at 2 and 5 times each too,
// so that it always has a few labels.
func logTicks(lo, hi float64) []float64 {
	lo, hi = max(lo, 0.1), max(hi, lo, 0.1)
	round := func(e float64) []float64 {
		p := math.Pow(10, e)
		return []float64{p, 2 * p, 5 * p}
	}
	bottom, top := math.Pow(10, math.Floor(math.Log10(lo))), math.Inf(1)
	for _, t := range round(math.Floor(math.Log10(lo))) {
		if t <= lo {
			bottom = t
		}
	}
	for _, t := range slices.Concat(round(math.Floor(math.Log10(hi))), round(math.Floor(math.Log10(hi))+1)) {
		if t >= hi && t > bottom {
			top = min(top, t)
		}
	}
	mults := []float64{1}
	if top/bottom <= 100 {
		mults = []float64{1, 2, 5}
	}
	ts := []float64{bottom}
	for e := math.Floor(math.Log10(bottom)); e <= math.Log10(top); e++ {
		for _, m := range mults {
			if t := m * math.Pow(10, e); t > bottom*1.0001 && t < top*0.9999 {
				ts = append(ts, t)
			}
		}
	}
	return append(ts, top)
}

// fmtTick writes a tick value without trailing zeros: 0.5, 20, 1000.
func fmtTick(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

// msf is d in milliseconds.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// esc escapes s for SVG text.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
