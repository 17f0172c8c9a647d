package hist

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHistBuckets(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 2, 3, 5, 999, time.Microsecond, 1500 * time.Microsecond, time.Second, time.Hour, 1<<63 - 1} {
		i := Index(d)
		require.Less(t, i, 128)
		if d < 1<<62 {
			assert.Less(t, max(d, 1), Upper(i), "%v in bucket %d", d, i)
		}
		if i > 1 {
			assert.GreaterOrEqual(t, max(d, 1), Upper(i-1), "%v above bucket %d", d, i-1)
		}
	}
}

func TestHistQuantilesAgainstSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Hist
	var all []time.Duration
	for range 10000 {
		d := time.Duration(r.ExpFloat64() * float64(20*time.Millisecond))
		h.Observe(d)
		all = append(all, d)
	}
	slices.Sort(all)
	assert.Equal(t, uint64(10000), h.Count())
	for _, q := range []float64{0.1, 0.5, 0.9, 0.99} {
		exact := all[int(q*float64(len(all)-1))]
		got := h.Quantile(q)
		assert.GreaterOrEqual(t, got, exact, "q%v", q)
		assert.LessOrEqual(t, float64(got), 1.5*float64(exact)+1, "q%v within a bucket", q)
		low := h.QuantileAtLeast(q)
		assert.LessOrEqual(t, low, exact, "q%v lower bound", q)
		assert.GreaterOrEqual(t, float64(low)*1.5+1, float64(exact), "q%v lower bound within a bucket", q)
	}
}

func TestHistObserveAllocatesNothing(t *testing.T) {
	var h Hist
	allocs := testing.AllocsPerRun(1000, func() {
		h.Observe(time.Millisecond)
	})
	assert.Zero(t, allocs)
}

// TestRecent: a Recent covers its span only, so a regression shows at once
// and an old one stops showing.
func TestRecent(t *testing.T) {
	r := NewRecent(time.Minute)
	base := int64(time.Hour)
	for i := range 100 {
		r.Observe(base+int64(i)*int64(time.Millisecond), 10*time.Millisecond)
	}
	h := r.Sum(base + int64(time.Second))
	assert.Equal(t, uint64(100), h.Count())
	assert.Equal(t, Upper(Index(10*time.Millisecond)), h.Quantile(0.99))

	// A regression a minute later replaces the old samples entirely.
	later := base + int64(time.Minute) + int64(10*time.Second)
	for i := range 10 {
		r.Observe(later+int64(i), time.Second)
	}
	h = r.Sum(later + 10)
	assert.Equal(t, uint64(10), h.Count(), "samples older than the window are gone")
	assert.GreaterOrEqual(t, h.Quantile(0.5), time.Second)

	// Nothing observed for a whole window: empty.
	empty := r.Sum(later + 2*int64(time.Minute))
	assert.Zero(t, empty.Count())
	assert.Zero(t, empty.Quantile(0.5))
}

func TestLower(t *testing.T) {
	for i := 2; i < 2*63; i++ { // 2^63 ns is past every time.Duration
		assert.Equal(t, Upper(i-1), Lower(i))
		assert.Equal(t, i, Index(Lower(i)), "bucket %d", i)
	}
}
