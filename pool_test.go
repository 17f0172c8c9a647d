package dispatch

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLaneReuse (internal): released lanes are kept for new keys up to
// maxFreeLanes, hold nothing of the key that left (no key, value or waiter
// is kept alive), and a key in a reused lane behaves as in a new one. It
// reads the dispatcher's lane map and free list under its lock.
func TestLaneReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, *int]()
		d, _, release := holdWorker(t, f.exec, Config[string, *int]{Capacity: 2 * maxFreeLanes})
		n := maxFreeLanes + 10
		for i := range n {
			v := i
			submit(t, d, fmt.Sprint(i), &v, SubmitOptions{Generation: 5})
		}
		for i := range n {
			require.True(t, d.Cancel(fmt.Sprint(i), nil))
		}
		d.mu.Lock()
		require.Len(t, d.lanes.pool.free, maxFreeLanes, "free list not bounded")
		for _, s := range d.lanes.pool.free {
			require.Equal(t, lane[string, *int]{}, *s, "a released lane keeps state")
		}
		reused := d.lanes.pool.free[len(d.lanes.pool.free)-1]
		d.mu.Unlock()

		// The next key takes a released slot, with a fresh generation and
		// call: gen 5 of the key that left does not fence it.
		v := 42
		tk := submit(t, d, "new", &v, SubmitOptions{Generation: 1})
		d.mu.Lock()
		assert.Same(t, reused, d.lanes.lookup("new"))
		assert.Len(t, d.lanes.pool.free, maxFreeLanes-1)
		d.mu.Unlock()
		release()
		r := outcome(t, tk)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, "new", r.Key)
		assert.Equal(t, 42, *r.Call)
		checkConservation(t, d)
		closeD(t, d)
	})
}
