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
