// Package sat is saturating arithmetic on int64 nanosecond times and
// durations: a sum or product past the int64 range sticks at its bound
// instead of wrapping around, so that a huge configured duration (a
// Retry-After of years, a backoff of math.MaxInt64) means "very late",
// never "in the past".
package sat

import (
	"math"
	"time"
)

// Add returns a + b, or the bound it crossed.
func Add(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// Mul returns a × b, or the bound it crossed.
func Mul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	p := a * b
	if p/b != a || (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) {
		if (a < 0) != (b < 0) {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	return p
}

// Duration converts f nanoseconds to a Duration, clamped to
// [0, math.MaxInt64]; NaN is 0. A float64 holds math.MaxInt64 only
// rounded up to 2⁶³, whose conversion to int64 is undefined in Go: every
// float-to-duration conversion goes through here.
func Duration(f float64) time.Duration {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= math.MaxInt64: // 2⁶³ as a float64
		return math.MaxInt64
	}
	return time.Duration(f)
}
