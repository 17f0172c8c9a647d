package dispatch

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var hooks []Result[string, int]
		d, err := New(func(ctx context.Context, k string, _ int) error {
			if k == "hold" {
				<-release
			}
			return nil
		}, Config[string, int]{Workers: 1, Capacity: 5, StrictPriority: true, OnDone: func(r Result[string, int]) {
			if r.State == Dropped {
				hooks = append(hooks, r)
			}
		}})
		require.NoError(t, err)
		ctx := context.Background()
		_, err = d.Submit(ctx, "hold", 0, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait() // "hold" occupies the worker and one key
		low1, err := d.Submit(ctx, "low1", 0, SubmitOptions{Priority: 1, Droppable: true})
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		low2, err := d.Submit(ctx, "low2", 0, SubmitOptions{Priority: 1, Droppable: true})
		require.NoError(t, err)
		require.NoError(t, d.Post("low2", 0, SubmitOptions{Priority: 1, Droppable: true}))
		keep, err := d.Submit(ctx, "keep", 0, SubmitOptions{Priority: 0}) // not droppable
		require.NoError(t, err)
		_, err = d.Submit(ctx, "mid", 0, SubmitOptions{Priority: 5, Droppable: true})
		require.NoError(t, err)

		// Full. An equal-priority newcomer is not better than the worst
		// droppable call: refused, nothing shed.
		_, err = d.Submit(ctx, "peer", 0, SubmitOptions{Priority: 1})
		var be *BackpressureError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, BoundCapacity, be.Bound)

		// A better newcomer evicts the worst droppable call: lowest priority,
		// then newest — low2, not low1, and never the non-droppable "keep"
		// though its priority is lower.
		_, err = d.Submit(ctx, "bind", 0, SubmitOptions{Priority: 10})
		require.NoError(t, err)
		res, err := low2.Wait(ctx)
		assert.Equal(t, Dropped, res.State)
		assert.ErrorIs(t, err, ErrDropped)
		assert.Contains(t, err.Error(), "capacity")
		assert.Equal(t, 2, res.Waiters)
		require.Len(t, hooks, 1)
		assert.Equal(t, "low2", hooks[0].Key)
		assert.False(t, d.Pending("low2"))

		// Next eviction takes low1; after that only "mid" is droppable and it
		// outranks a priority-3 newcomer.
		_, err = d.Submit(ctx, "bind2", 0, SubmitOptions{Priority: 10})
		require.NoError(t, err)
		res, _ = low1.Wait(ctx)
		assert.Equal(t, Dropped, res.State)
		_, err = d.Submit(ctx, "p3", 0, SubmitOptions{Priority: 3})
		assert.ErrorIs(t, err, ErrBackpressure)

		// A merge into a pending droppable call by a non-droppable submission
		// protects it.
		_, err = d.Submit(ctx, "mid", 0, SubmitOptions{Priority: 5})
		require.NoError(t, err)
		_, err = d.Submit(ctx, "bind3", 0, SubmitOptions{Priority: 10})
		assert.ErrorIs(t, err, ErrBackpressure, "nothing droppable is left")

		close(release)
		res, err = keep.Wait(ctx)
		require.NoError(t, err)
		assert.Equal(t, Succeeded, res.State)
		require.NoError(t, d.Close(ctx))
		st := d.Stats()
		assert.Equal(t, uint64(3), st.Outcomes[Dropped]) // low2 (ticket + post), low1
		checkConservation(t, d)
	})
}
