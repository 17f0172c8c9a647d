package storm

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// This file draws one priority variant's runs side by side, one column per
// scheduler, on shared scales: above, the scheduler's status patches and
// bindings per second at the server over time (the storm, and the bindings
// inside it or not), and the requests it refused with 429; below, each schedulable pod as a point at its
// creation, as high as its creation → bound (log scale). A dashed line
// marks when the storm's last condition landed. Plain SVG written by hand:
// no plotting library.

// The picture's geometry, in SVG user units.
const (
	svgColWidth           = 300 // one scheduler's column
	svgLeft, svgRight     = 70, 20
	svgGap                = 30 // between columns
	rateTop, rateBottom   = 86, 236
	bindTop, bindBottom   = 270, 470
	svgHeight             = 520
	patchColor, bindColor = "#d95f02", "#1f77b4"
	rejectColor           = "#d62728"
)

// writeSVG draws runs, all of one priority variant, in their order.
func writeSVG(w io.Writer, runs []*Result) error {
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	width := svgLeft + svgRight + len(runs)*svgColWidth + (len(runs)-1)*svgGap

	// Shared scales.
	end, maxRate := 1.0, 1.0
	minLat, maxLat := math.Inf(1), 0.0
	for _, r := range runs {
		end = max(end, r.StormDrained, r.LastBound)
		for _, s := range r.Rates {
			maxRate = max(maxRate, s.StatusPatches, s.Bindings, s.Rejected)
		}
		for _, pt := range r.Pods {
			lat := pt.Bound - pt.Created
			minLat, maxLat = min(minLat, lat), max(maxLat, lat)
		}
	}
	if maxLat == 0 {
		minLat, maxLat = 1, 1000
	}
	xTicks := steps(end)
	xEnd := xTicks[len(xTicks)-1]
	rTicks := steps(maxRate)
	rEnd := rTicks[len(rTicks)-1]
	lTicks := decades(max(minLat, 1), maxLat)
	lLo, lHi := math.Log10(lTicks[0]), math.Log10(lTicks[len(lTicks)-1])
	yRate := func(v float64) float64 { return rateBottom - (rateBottom-rateTop)*v/rEnd }
	yLat := func(v float64) float64 {
		return bindBottom - (bindBottom-bindTop)*(math.Log10(max(v, lTicks[0]))-lLo)/(lHi-lLo)
	}

	w0 := runs[0].Workload
	prio := "the same priority as the storm"
	if runs[0].Priority == "high" {
		prio = fmt.Sprintf("priority %d, above the storm", w0.HighPriority)
	}
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		width, svgHeight, width, svgHeight)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	title, arriving := "kube-scheduler in a status-patch storm", "schedulable ones"
	if w0.Shape == shapePreempt {
		title, arriving = "kube-scheduler in a storm of preemptions", "preemptors (each evicting a victim)"
	}
	p(`<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", svgLeft, esc(title))
	p(`<text x="%d" y="38" fill="#444">%d unschedulable pods, then %d %s at %s; %d nodes; client 50 qps / burst 100</text>`+"\n",
		svgLeft, w0.Unschedulable, w0.Schedulable, esc(arriving), esc(prio), w0.Nodes)
	legend := []struct {
		color, label string
		dot          bool
	}{
		{patchColor, "status patches/s", false},
		{bindColor, "bindings/s", false},
		{rejectColor, "429s/s", false},
		{bindColor, "a schedulable pod: creation → bound (informer)", true},
	}
	lx := svgLeft
	for _, l := range legend {
		if l.dot {
			p(`<circle cx="%d" cy="54" r="3" fill="%s"/>`, lx+9, l.color)
		} else {
			p(`<line x1="%d" y1="54" x2="%d" y2="54" stroke="%s" stroke-width="2"/>`, lx, lx+18, l.color)
		}
		p(`<text x="%d" y="58">%s</text>`+"\n", lx+24, esc(l.label))
		lx += 24 + 7*len([]rune(l.label)) + 18
	}
	p(`<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">requests/s</text>`+"\n", (rateTop+rateBottom)/2)
	p(`<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">creation → bound, ms (log)</text>`+"\n", (bindTop+bindBottom)/2)

	for c, r := range runs {
		left := float64(svgLeft + c*(svgColWidth+svgGap))
		right := left + svgColWidth
		x := func(s float64) float64 { return left + (right-left)*s/xEnd }
		p(`<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>`+"\n", (left+right)/2, rateTop-6, esc(schedulerTitle(r)))
		frame := func(top, bottom float64, yTicks []float64, y func(float64) float64, label func(float64) string) {
			for _, t := range xTicks {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x(t), top, x(t), bottom)
				p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">%s</text>`+"\n", x(t), bottom+14, num(t))
			}
			for _, t := range yTicks {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, y(t), right, y(t))
				if c == 0 {
					p(`<text x="%.1f" y="%.1f" text-anchor="end" fill="#444">%s</text>`+"\n", left-6, y(t)+4, label(t))
				}
			}
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>`+"\n", left, top, right-left, bottom-top)
			xd := x(r.StormDrained)
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="4 3"/>`+"\n", xd, top, xd, bottom)
		}
		frame(rateTop, rateBottom, rTicks, yRate, num)
		frame(bindTop, bindBottom, lTicks, yLat, num)
		p(`<text x="%.1f" y="%d" fill="#555" text-anchor="end">storm drained</text>`+"\n", x(r.StormDrained)-3, rateTop+12)
		p(`<text x="%.1f" y="%d" text-anchor="middle">s since the scheduler started</text>`+"\n", (left+right)/2, svgHeight-16)

		line := func(color string, v func(RateSample) float64) {
			var pts strings.Builder
			for _, s := range r.Rates {
				fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(s.At), yRate(v(s)), x(s.At+r.Bucket), yRate(v(s)))
			}
			p(`<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.TrimSpace(pts.String()))
		}
		line(patchColor, func(s RateSample) float64 { return s.StatusPatches })
		line(bindColor, func(s RateSample) float64 { return s.Bindings })
		line(rejectColor, func(s RateSample) float64 { return s.Rejected })

		p(`<g fill="%s" fill-opacity="0.7">`+"\n", bindColor)
		for _, pt := range r.Pods {
			p(`<circle cx="%.1f" cy="%.1f" r="2.5"/>`+"\n", x(pt.Created/1000), yLat(pt.Bound-pt.Created))
		}
		p("</g>\n")
		p(`<text x="%.1f" y="%d" fill="#444">bind p99 %s</text>`+"\n", left+4, bindTop+12, fmtMs(r.BindP99))
	}
	p("</svg>\n")
	return bw.Flush()
}

// schedulerTitle names a run's scheduler in the picture.
func schedulerTitle(r *Result) string {
	switch r.Scheduler {
	case "sync":
		return "gate off: synchronous"
	case "upstream":
		return "upstream's APIDispatcher"
	case "limiter":
		return "upstream's with a limiter (a model of kubernetes#142123)"
	case "dispatch":
		return "dispatch inside (the drop-in)"
	}
	return r.Scheduler
}

// steps returns round ticks from 0 to at least top, about five: a step of
// 1, 2 or 5 times a power of ten.
func steps(top float64) []float64 {
	step := math.Pow(10, math.Floor(math.Log10(max(top, 1e-9))))
	for top/step < 3 {
		step /= 2
	}
	for top/step > 7 {
		step *= 2
	}
	var ts []float64
	for v := 0.0; ; v += step {
		ts = append(ts, v)
		if v >= top {
			return ts
		}
	}
}

// decades returns log-axis ticks from the power of ten at or below lo to
// the one at or above hi, every power of ten, with 2 and 5 times each when
// the axis spans at most two decades.
func decades(lo, hi float64) []float64 {
	a, b := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(max(hi, lo*10)))
	var ts []float64
	for e := a; e <= b; e++ {
		ts = append(ts, math.Pow(10, e))
		if b-a <= 2 && e < b {
			ts = append(ts, 2*math.Pow(10, e), 5*math.Pow(10, e))
		}
	}
	return ts
}

// num formats a tick value without trailing zeros.
func num(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// esc escapes s for SVG text.
func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")
	return r.Replace(s)
}
