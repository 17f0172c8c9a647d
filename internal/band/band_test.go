package band

import (
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/assert"
)

// bigFloor is floor(p / w) and the offset, computed without overflow.
func bigFloor(p, w int64) (*big.Int, int64) {
	q, m := new(big.Int).DivMod(big.NewInt(p), big.NewInt(w), new(big.Int)) // Euclidean: m ≥ 0
	return q, m.Int64()
}

var (
	prios  = []int64{math.MinInt64, math.MinInt64 + 1, math.MinInt64 + 7, math.MinInt64 + 8, math.MinInt64 + 10, -11, -10, -9, -1, 0, 1, 9, 10, 11, math.MaxInt64 - 1, math.MaxInt64}
	widths = []int64{1, 2, 3, 10, 1 << 40, math.MaxInt64}
)

// TestExact checks Of, Start, Same and Below against big-integer
// arithmetic at the extremes, where a band's first priority lies below the
// int64 range (the lowest 8 ints with width 10).
func TestExact(t *testing.T) {
	for _, w := range widths {
		for _, p := range prios {
			b, off := Of(p, w)
			wantB, wantOff := bigFloor(p, w)
			assert.Equal(t, wantB.Int64(), b, "Of(%d, %d) band", p, w)
			assert.Equal(t, wantOff, off, "Of(%d, %d) offset", p, w)

			start := new(big.Int).Mul(wantB, big.NewInt(w))
			want := int64(math.MinInt64)
			if start.IsInt64() {
				want = start.Int64()
			}
			assert.Equal(t, want, Start(p, w), "Start(%d, %d)", p, w)
			for _, q := range prios {
				qb, _ := bigFloor(q, w)
				assert.Equal(t, wantB.Cmp(qb) == 0, Same(p, q, w), "Same(%d, %d, %d)", p, q, w)
				assert.Equal(t, wantB.Cmp(qb) < 0, Below(p, q, w), "Below(%d, %d, %d)", p, q, w)
				// q ≥ Start(p) exactly when q's band is p's or above.
				assert.Equal(t, qb.Cmp(wantB) >= 0, q >= Start(p, w), "%d ≥ Start(%d, %d)", q, p, w)
			}
		}
	}
}
