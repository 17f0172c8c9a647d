// Package band is the arithmetic of priority bands (dispatch's
// Config.AgingBand): a band of width w holds the priorities
// b·w … b·w + w − 1. It is exact for every int64 priority and every width
// ≥ 1 — floor division never overflows, and a band's first priority,
// which for the lowest priorities lies below the int64 range, saturates —
// so that no caller multiplies a band by its width itself.
//
// The core and its presets (kube, kube/scheduler) share it.
package band

import "math"

// Of splits p into its band, floor(p / width), and its offset in the band,
// 0 ≤ off < width. width must be at least 1.
func Of(p, width int64) (band, off int64) {
	band, off = p/width, p%width
	if off < 0 {
		band--
		off += width
	}
	return band, off
}

// Start returns the first priority of p's band, or math.MinInt64 if that
// lies below the int64 range: every p' ≥ Start(p, width) is in p's band
// or above it.
func Start(p, width int64) int64 {
	_, off := Of(p, width)
	if p < math.MinInt64+off {
		return math.MinInt64
	}
	return p - off
}

// Same reports whether p and q are in one band.
func Same(p, q, width int64) bool {
	bp, _ := Of(p, width)
	bq, _ := Of(q, width)
	return bp == bq
}

// Below reports whether p is in a lower band than q.
func Below(p, q, width int64) bool {
	bp, _ := Of(p, width)
	bq, _ := Of(q, width)
	return bp < bq
}
