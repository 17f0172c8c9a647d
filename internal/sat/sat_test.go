package sat

import (
	"math"
	"math/big"
	"testing"
	"time"
)

var extremes = []int64{math.MinInt64, math.MinInt64 + 1, -1 << 40, -2, -1, 0, 1, 2, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}

// clamp is x clamped to the int64 range.
func clamp(x *big.Int) int64 {
	switch {
	case x.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case x.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return x.Int64()
}

func TestAddMul(t *testing.T) {
	for _, a := range extremes {
		for _, b := range extremes {
			want := clamp(new(big.Int).Add(big.NewInt(a), big.NewInt(b)))
			if got := Add(a, b); got != want {
				t.Errorf("Add(%d, %d) = %d, want %d", a, b, got, want)
			}
			want = clamp(new(big.Int).Mul(big.NewInt(a), big.NewInt(b)))
			if got := Mul(a, b); got != want {
				t.Errorf("Mul(%d, %d) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		want time.Duration
	}{
		{math.NaN(), 0},
		{math.Inf(-1), 0},
		{-1, 0},
		{0, 0},
		{1.5, 1},
		{1e9, time.Second},
		{float64(math.MaxInt64), math.MaxInt64},
		{math.Inf(1), math.MaxInt64},
		{math.MaxFloat64, math.MaxInt64},
	} {
		if got := Duration(tc.f); got != tc.want {
			t.Errorf("Duration(%v) = %d, want %d", tc.f, got, tc.want)
		}
	}
}
