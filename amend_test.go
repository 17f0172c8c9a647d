package dispatch

import (
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAmend: Amend rewrites the pending call of a key — queued, or waiting
// behind the key's in-flight call — and never the in-flight one; a rewrite
// that the no-op test finds has nothing left to do ends the call Skipped
// for every waiter, and fires the hook once.
func TestAmend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		hooks := &hookLog[string, int]{}
		d, hold, release := holdWorker(t, f.exec, Config[string, int]{
			NoOp:   func(_ string, v int) bool { return v == 0 },
			OnDone: hooks.add,
		})

		// Nothing pending: f is not called.
		found, err := d.Amend("none", func(int) (int, error) { panic("not called") })
		require.NoError(t, err)
		assert.False(t, found)
		// In flight only: not rewritten.
		found, err = d.Amend(holdKey, func(int) (int, error) { panic("not called") })
		require.NoError(t, err)
		assert.False(t, found)

		// A queued call is rewritten and runs as rewritten.
		a := submit(t, d, "a", 1, prio(0))
		found, err = d.Amend("a", func(v int) (int, error) { return v + 10, nil })
		require.NoError(t, err)
		assert.True(t, found)

		// f's error leaves the call as it was, and comes back.
		errNo := errors.New("no")
		found, err = d.Amend("a", func(v int) (int, error) { return 99, errNo })
		assert.True(t, found)
		assert.ErrorIs(t, err, errNo)

		// A panic in f is contained, and the call is untouched.
		found, err = d.Amend("a", func(v int) (int, error) { panic("boom") })
		assert.True(t, found)
		var pe *PanicError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "boom", pe.Value)

		// A rewrite to a no-op ends the call Skipped for every waiter.
		b1 := submit(t, d, "b", 5, prio(0))
		b2 := submit(t, d, "b", 6, prio(0))
		require.NoError(t, d.Post("b", 7, SubmitOptions{}))
		found, err = d.Amend("b", func(v int) (int, error) { return 0, nil })
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, map[State]int{StateSkipped: 2}, tally(t, b1, b2))
		assert.False(t, d.Busy("b"))

		// The successor of an in-flight call is pending too.
		succ := submit(t, d, holdKey, 2, prio(0))
		found, err = d.Amend(holdKey, func(v int) (int, error) { return v * 100, nil })
		require.NoError(t, err)
		assert.True(t, found)

		release()
		waitAll(a, succ)
		assert.Zero(t, outcome(t, hold).Call, "the in-flight call was rewritten")
		assert.Equal(t, []int{11}, f.calls("a"))
		assert.Equal(t, []int{200}, f.calls(holdKey), "the successor runs as rewritten")
		assert.Empty(t, f.calls("b"))
		s := closeD(t, d)
		assert.Equal(t, uint64(3), s.Outcomes[StateSkipped], "two tickets and one post")
		assert.Equal(t, uint64(1), s.Calls[StateSkipped], "one call, one hook")
		var skipped int
		for _, r := range hooks.all() {
			if r.State == StateSkipped {
				skipped++
				assert.Equal(t, "b", r.Key)
				assert.Equal(t, 3, r.Waiters)
			}
		}
		assert.Equal(t, 1, skipped)
	})
}

// TestAmendRaceWithMerge: the no-op test runs outside the lock; a
// submission that coalesces into the call meanwhile keeps it alive, because
// the call Amend judged is no longer the call that would run.
func TestAmendRaceWithMerge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		inNoOp, resume := make(chan struct{}), make(chan struct{})
		d, _, release := holdWorker(t, f.exec, Config[string, int]{
			Merge: func(p, in int) (int, error) { return p + in, nil },
			NoOp: func(k string, v int) bool {
				if k == "a" && v == 0 {
					close(inNoOp)
					<-resume
					return true
				}
				return false
			},
		})
		a := submit(t, d, "a", 1, prio(0))
		done := make(chan struct{})
		go func() {
			defer close(done)
			found, err := d.Amend("a", func(int) (int, error) { return 0, nil })
			assert.True(t, found)
			assert.NoError(t, err)
		}()
		<-inNoOp
		a2 := submit(t, d, "a", 5, prio(0)) // merges: the value is now 5
		close(resume)
		<-done
		release()
		waitAll(a, a2)
		assert.Equal(t, map[State]int{StateSucceeded: 2}, tally(t, a, a2))
		assert.Equal(t, []int{5}, f.calls("a"))
		closeD(t, d)
	})
}
