package dispatch

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShedding: at capacity, a new key evicts the worst droppable queued
// call — lowest priority, then newest; never a non-droppable one — if it
// would run before it, and is refused otherwise; the evicted call's waiters
// end Dropped with the bound that forced it, and the hook sees it once. A
// non-droppable submission merged into a droppable call protects it.
func TestShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hooks []Result[string, int]
		d, _, release := holdWorker(t, nopExec, Config[string, int]{ // the held call takes one key
			Capacity:  5,
			AgingBand: 1,
			OnDone: func(r Result[string, int]) {
				if r.State == StateDropped {
					hooks = append(hooks, r)
				}
			},
		})
		ctx := context.Background()
		low1 := submit(t, d, "low1", 0, SubmitOptions{Priority: 1, Droppable: true})
		time.Sleep(time.Millisecond)
		low2 := submit(t, d, "low2", 0, SubmitOptions{Priority: 1, Droppable: true})
		require.NoError(t, d.Post("low2", 0, SubmitOptions{Priority: 1, Droppable: true}))
		keep := submit(t, d, "keep", 0, SubmitOptions{Priority: 0}) // not droppable
		submit(t, d, "mid", 0, SubmitOptions{Priority: 5, Droppable: true})

		// Full. An equal-priority newcomer is not better than the worst
		// droppable call: refused, nothing shed.
		_, err := d.Submit(ctx, "peer", 0, SubmitOptions{Priority: 1})
		var be *BackpressureError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, BoundCapacity, be.Bound)

		// A better newcomer evicts the worst droppable call: lowest priority,
		// then newest — low2, not low1, and never the non-droppable "keep"
		// though its priority is lower.
		_, err = d.Submit(ctx, "bind", 0, SubmitOptions{Priority: 10})
		require.NoError(t, err)
		res, err := low2.Wait(ctx)
		assert.Equal(t, StateDropped, res.State)
		assert.ErrorIs(t, err, ErrDropped)
		assert.Contains(t, err.Error(), "capacity")
		assert.Equal(t, 2, res.Waiters)
		require.Len(t, hooks, 1)
		assert.Equal(t, "low2", hooks[0].Key)
		assert.False(t, d.Busy("low2"))

		// Next eviction takes low1; after that only "mid" is droppable and it
		// outranks a priority-3 newcomer.
		_, err = d.Submit(ctx, "bind2", 0, SubmitOptions{Priority: 10})
		require.NoError(t, err)
		res, _ = low1.Wait(ctx)
		assert.Equal(t, StateDropped, res.State)
		_, err = d.Submit(ctx, "p3", 0, SubmitOptions{Priority: 3})
		assert.ErrorIs(t, err, ErrBackpressure)

		// A merge into a pending droppable call by a non-droppable submission
		// protects it.
		submit(t, d, "mid", 0, SubmitOptions{Priority: 5})
		_, err = d.Submit(ctx, "bind3", 0, SubmitOptions{Priority: 10})
		assert.ErrorIs(t, err, ErrBackpressure, "nothing droppable is left")

		release()
		assert.Equal(t, StateSucceeded, outcome(t, keep).State)
		st := closeD(t, d)
		assert.Equal(t, uint64(3), st.Outcomes[StateDropped]) // low2 (ticket + post), low1
	})
}
