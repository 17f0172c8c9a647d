package dispatch

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
		i := histIndex(d)
		require.Less(t, i, 128)
		if d < 1<<62 {
			assert.Less(t, max(d, 1), histUpper(i), "%v in bucket %d", d, i)
		}
		if i > 1 {
			assert.GreaterOrEqual(t, max(d, 1), histUpper(i-1), "%v above bucket %d", d, i-1)
		}
	}
}

func TestHistQuantilesAgainstSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h hist
	var all []time.Duration
	for range 10000 {
		d := time.Duration(r.ExpFloat64() * float64(20*time.Millisecond))
		h.observe(d)
		all = append(all, d)
	}
	slices.Sort(all)
	q := h.quantiles()
	assert.Equal(t, uint64(10000), q.Count)
	for _, c := range []struct {
		got time.Duration
		q   float64
	}{{q.P50, 0.5}, {q.P90, 0.9}, {q.P99, 0.99}} {
		exact := all[int(c.q*float64(len(all)-1))]
		assert.GreaterOrEqual(t, c.got, exact, "q%v", c.q)
		assert.LessOrEqual(t, float64(c.got), 1.5*float64(exact)+1, "q%v within a bucket", c.q)
	}
}

func TestHistObserveAllocatesNothing(t *testing.T) {
	var h hist
	allocs := testing.AllocsPerRun(1000, func() {
		h.observe(time.Millisecond)
	})
	assert.Zero(t, allocs)
}

// TestRecentHist: the latency quantiles cover the last LatencyWindow only,
// so a regression shows at once and an old one stops showing.
func TestRecentHist(t *testing.T) {
	var r recentHist
	base := int64(time.Hour) // the dispatcher's clock starts an hour in
	for i := range 100 {
		r.observe(base+int64(i)*int64(time.Millisecond), 10*time.Millisecond)
	}
	q := r.quantiles(base + int64(time.Second))
	assert.Equal(t, uint64(100), q.Count)
	assert.Equal(t, histUpper(histIndex(10*time.Millisecond)), q.P99)
	assert.GreaterOrEqual(t, q.P99, 10*time.Millisecond)
	assert.LessOrEqual(t, q.P99, 15*time.Millisecond, "at most 50% over")

	// A regression a minute later replaces the old samples entirely.
	later := base + int64(LatencyWindow) + int64(10*time.Second)
	for i := range 10 {
		r.observe(later+int64(i), time.Second)
	}
	q = r.quantiles(later + 10)
	assert.Equal(t, uint64(10), q.Count, "samples older than the window are gone")
	assert.GreaterOrEqual(t, q.P50, time.Second)

	// Nothing observed for a whole window: empty.
	assert.Zero(t, r.quantiles(later+2*int64(LatencyWindow)).Count)
}

func TestStateCountsTotal(t *testing.T) {
	var c StateCounts
	c[Succeeded], c[Failed], c[Closed] = 3, 2, 1
	assert.Equal(t, uint64(6), c.Total())
}
