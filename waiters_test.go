package dispatch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --- deadlines ---

// TestWaiterDeadlines: each waiter of one call has its own deadline, from
// its context or SubmitOptions.Deadline, whichever is earlier; it ends
// Expired at that moment while the call goes on and succeeds for the
// others.
func TestWaiterDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{})
		now := time.Now()
		withTimeout := func(dl time.Duration) context.Context {
			ctx, cancel := context.WithTimeout(bg, dl)
			t.Cleanup(cancel)
			return ctx
		}
		type waiter struct {
			name string
			ctx  context.Context
			opts SubmitOptions
			want State
			at   time.Duration // when Done closes
		}
		ws := []waiter{
			{"no deadline", bg, SubmitOptions{}, StateSucceeded, 10 * time.Second},
			{"ctx 1s", withTimeout(time.Second), SubmitOptions{}, StateExpired, time.Second},
			{"opts 2s, ctx 5s", withTimeout(5 * time.Second), SubmitOptions{Deadline: now.Add(2 * time.Second)}, StateExpired, 2 * time.Second},
			{"opts 5s, ctx 1.5s", withTimeout(1500 * time.Millisecond), SubmitOptions{Deadline: now.Add(5 * time.Second)}, StateExpired, 1500 * time.Millisecond},
			{"opts 3s", bg, SubmitOptions{Deadline: now.Add(3 * time.Second)}, StateExpired, 3 * time.Second},
			{"opts 20s", bg, SubmitOptions{Deadline: now.Add(20 * time.Second)}, StateSucceeded, 10 * time.Second},
			{"ctx 30s", withTimeout(30 * time.Second), SubmitOptions{}, StateSucceeded, 10 * time.Second},
		}
		var tks []*Ticket[string, int]
		for _, w := range ws {
			tk, err := d.Submit(w.ctx, "A", 0, SubmitOptions{Deadline: w.opts.Deadline})
			require.NoError(t, err, w.name)
			tks = append(tks, tk)
		}
		times := watchDone(tks...)
		time.Sleep(10 * time.Second)
		s := checkConservation(t, d)
		assert.Equal(t, uint64(4), s.Outcomes[StateExpired], "expired while the call waits")
		assert.Equal(t, 4, s.Live) // hold + three waiters of A
		assert.True(t, d.Busy("A"), "the call goes on for its other waiters")
		release()
		for i, w := range ws {
			r := outcome(t, tks[i])
			assert.Equal(t, w.want, r.State, w.name)
			at, ok := times.of(tks[i])
			assert.True(t, ok, w.name)
			assert.Equal(t, w.at, at, w.name)
		}
		assert.Equal(t, []int{0}, f.calls("A"), "one execution")
		closeD(t, d)
	})
}

// TestExtremeDeadlines: deadlines at the edges of the clock — a nanosecond
// ahead, or centuries ahead — neither overflow nor misfire.
func TestExtremeDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{})
		now := time.Now()
		soon := submit(t, d, "soon", 0, SubmitOptions{Deadline: now.Add(time.Nanosecond)})
		far := []time.Time{
			now.Add(time.Duration(1<<63 - 1)),
			time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
			time.Unix(1<<62, 0),
		}
		var tks []*Ticket[string, int]
		for i, dl := range far {
			key := "far" + itoa(i)
			tks = append(tks, submit(t, d, key, 0, SubmitOptions{Deadline: dl}))
			require.NoError(t, d.Post(key, 0, SubmitOptions{Deadline: dl}))
			ctx, cancel := context.WithDeadline(bg, dl)
			t.Cleanup(cancel)
			tk, err := d.Submit(ctx, key, 0, SubmitOptions{})
			require.NoError(t, err)
			tks = append(tks, tk)
		}
		time.Sleep(time.Millisecond)
		assert.Equal(t, StateExpired, outcome(t, soon).State)
		time.Sleep(24 * time.Hour)
		release()
		assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
		assert.Equal(t, []string{"far0", "far1", "far2"}, f.keys())
		closeD(t, d)
	})
}

// TestDeadlineWhileInFlight: a waiter whose deadline passes while the call
// runs ends Expired at its deadline without disturbing the execution; when
// every waiter has expired, the execution context ends (it carries the
// latest deadline) and the late result is reported Stale.
func TestDeadlineWhileInFlight(t *testing.T) {
	t.Run("one of two expires", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ctxEnded atomic.Bool
			d, _, release := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
				time.Sleep(5 * time.Second)
				ctxEnded.Store(ctx.Err() != nil)
				return nil
			}, Config[string, int]{})
			short := submit(t, d, "A", 0, SubmitOptions{Deadline: time.Now().Add(2 * time.Second)})
			long := submit(t, d, "A", 0, SubmitOptions{})
			times := watchDone(short, long)
			release()
			waitAll(short, long)
			synctest.Wait() // let the watchers record
			assert.Equal(t, StateExpired, outcome(t, short).State)
			assert.Equal(t, StateSucceeded, outcome(t, long).State)
			at, _ := times.of(short)
			assert.Equal(t, 2*time.Second, at, "expired at its own deadline")
			at, _ = times.of(long)
			assert.Equal(t, 5*time.Second, at)
			assert.False(t, ctxEnded.Load(), "execution context ended although a waiter had no deadline")
			s := closeD(t, d)
			assert.Zero(t, s.StaleExecutions)
		})
	})
	t.Run("all expire", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			hooks := &hookLog[string, int]{}
			var sawDone atomic.Bool
			d, _, release := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
				select {
				case <-ctx.Done():
					sawDone.Store(true)
					return nil // a late success
				case <-time.After(time.Minute):
					return nil
				}
			}, Config[string, int]{OnDone: hooks.add})
			start := time.Now()
			a := submit(t, d, "A", 0, SubmitOptions{Deadline: start.Add(2 * time.Second)})
			b := submit(t, d, "A", 0, SubmitOptions{Deadline: start.Add(3 * time.Second)})
			release()
			waitAll(a, b)
			synctest.Wait()
			assert.Equal(t, map[State]int{StateExpired: 2}, tally(t, a, b))
			assert.True(t, sawDone.Load(), "execution context not ended when the last waiter expired")
			assert.Equal(t, 3*time.Second, time.Since(start))
			assert.Equal(t, []State{StateStale}, hooks.states("A"), "a result after every waiter expired must be Stale")
			s := closeD(t, d)
			assert.Equal(t, uint64(1), s.StaleExecutions)
			assert.Equal(t, uint64(1), s.Outcomes[StateSucceeded]) // hold
		})
	})
}

// --- the last waiter leaving ---

// TestLastWaiterLeaves: when the last waiter of an in-flight call leaves,
// the execution context is cancelled and the execution is reported Stale
// (also when exec ignores that and returns success); when the last waiter
// of a pending call leaves, the call is removed and never runs.
func TestLastWaiterLeaves(t *testing.T) {
	for _, late := range []bool{false, true} {
		name := "in flight, exec honours ctx"
		if late {
			name = "in flight, exec returns success late"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hooks := &hookLog[string, int]{}
				lateReturn := newGate()
				var cause atomic.Value
				d, _, releaseHold := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
					<-ctx.Done()
					cause.Store(context.Cause(ctx))
					if late {
						_ = lateReturn.wait(context.Background())
						return nil
					}
					return ctx.Err()
				}, Config[string, int]{OnDone: hooks.add})
				ctx, cancel := context.WithCancel(bg)
				t1, err := d.Submit(ctx, "A", 0, prio(0))
				require.NoError(t, err)
				t2 := submit(t, d, "A", 0, prio(0)) // joins t1's pending call
				releaseHold()
				s := checkConservation(t, d)
				require.Equal(t, 1, s.InFlight)
				require.Zero(t, s.Successors)

				t2.Cancel()
				synctest.Wait()
				assert.Nil(t, cause.Load(), "exec context cancelled while a waiter remained")
				assert.Equal(t, StateCanceled, outcome(t, t2).State)

				cancel() // the last waiter leaves
				synctest.Wait()
				require.NotNil(t, cause.Load(), "exec context not cancelled when the last waiter left")
				assert.ErrorIs(t, cause.Load().(error), ErrCanceled)
				r := outcome(t, t1)
				assert.Equal(t, StateCanceled, r.State)
				assert.ErrorIs(t, r.Err, context.Canceled)
				if late {
					assert.True(t, d.Busy("A"), "an orphaned execution that has not returned may still take effect")
					lateReturn.open()
					synctest.Wait()
				}
				assert.False(t, d.Busy("A"))
				assert.Equal(t, []State{StateStale}, hooks.states("A"))
				s = closeD(t, d)
				assert.Equal(t, uint64(1), s.StaleExecutions)
				assert.Equal(t, map[State]int{StateStale: 1, StateSucceeded: 1}, counts(s.Calls))
				assert.Equal(t, map[State]int{StateCanceled: 2, StateSucceeded: 1}, counts(s.Outcomes))
			})
		})
	}
	t.Run("pending", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			hooks := &hookLog[string, int]{}
			d, _, release := holdWorker(t, f.exec, Config[string, int]{OnDone: hooks.add})
			ctx, cancel := context.WithCancel(bg)
			a1, err := d.Submit(ctx, "A", 0, prio(0))
			require.NoError(t, err)
			a2 := submit(t, d, "A", 0, SubmitOptions{Deadline: time.Now().Add(time.Second)})
			a3 := submit(t, d, "A", 0, prio(0))
			a3.Cancel()
			cancel()
			assert.True(t, d.Busy("A"))
			time.Sleep(2 * time.Second) // a2 expires: the last one
			assert.False(t, d.Busy("A"), "a pending call without waiters was not removed")
			s := checkConservation(t, d)
			assert.Equal(t, 1, s.Keys)
			assert.Zero(t, s.Ready)
			assert.Equal(t, []State{StateExpired}, hooks.states("A"))
			release()
			assert.Empty(t, f.keys(), "a call without waiters ran")
			assert.Equal(t, map[State]int{StateCanceled: 2, StateExpired: 1}, tally(t, a1, a2, a3))
			closeD(t, d)
		})
	})
}

// --- Cancel(key, cause) ---

// TestCancelKey: Cancel ends every submission for a key — in flight,
// successor, fire-and-forget — as Canceled wrapping the cause, cancels the
// execution context with it, reports whether there was anything to cancel,
// and a late success of the cancelled execution is Stale.
func TestCancelKey(t *testing.T) {
	cause := errors.New("pod deleted")
	synctest.Test(t, func(t *testing.T) {
		hooks := &hookLog[string, int]{}
		release := newGate()
		var execCause atomic.Value
		var runs atomic.Int32
		d := newD(t, func(ctx context.Context, key string, call int) error {
			runs.Add(1)
			if key != "A" || call != 1 {
				return nil
			}
			<-ctx.Done()
			execCause.Store(context.Cause(ctx))
			_ = release.wait(context.Background())
			return nil // succeeds after it was cancelled
		}, Config[string, int]{Workers: 4, OnDone: hooks.add})
		inflight := submit(t, d, "A", 1, prio(0))
		synctest.Wait()
		succ1 := submit(t, d, "A", 2, prio(0))
		succ2 := submit(t, d, "A", 3, prio(5))
		require.NoError(t, d.Post("A", 4, SubmitOptions{}))
		other := submit(t, d, "B", 1, prio(0))

		assert.False(t, d.Cancel("nobody", cause), "nothing to cancel")
		assert.True(t, d.Cancel("A", cause))
		synctest.Wait()
		for _, tk := range []*Ticket[string, int]{inflight, succ1, succ2} {
			r := outcome(t, tk)
			assert.Equal(t, StateCanceled, r.State)
			assert.ErrorIs(t, r.Err, ErrCanceled)
			assert.ErrorIs(t, r.Err, cause)
		}
		require.NotNil(t, execCause.Load())
		assert.ErrorIs(t, execCause.Load().(error), cause)
		assert.False(t, d.Cancel("A", cause), "the orphaned execution has no waiter left to cancel")
		assert.True(t, d.Busy("A"), "the cancelled execution has not returned yet")

		// A new submission waits for the cancelled execution to return.
		again := submit(t, d, "A", 5, prio(0))
		synctest.Wait()
		assert.Equal(t, int32(2), runs.Load(), "a new call for the key ran beside the cancelled execution")
		release.open()
		r, err := again.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, 5, r.Call)
		assert.Equal(t, StateSucceeded, outcome(t, other).State)

		assert.False(t, d.Cancel("A", nil), "nothing left to cancel")
		synctest.Wait()
		assert.ElementsMatch(t, []State{StateCanceled, StateStale, StateSucceeded}, hooks.states("A"))
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.StaleExecutions)
		assert.Equal(t, map[State]int{StateCanceled: 4, StateSucceeded: 2}, counts(s.Outcomes))
	})
	t.Run("nil cause", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			d, _, release := holdWorker(t, f.exec, Config[string, int]{})
			a := submit(t, d, "A", 0, prio(0))
			assert.True(t, d.Cancel("A", nil))
			r := outcome(t, a)
			assert.Equal(t, StateCanceled, r.State)
			assert.ErrorIs(t, r.Err, ErrCanceled)
			assert.False(t, d.Busy("A"))
			release()
			assert.Empty(t, f.keys(), "a cancelled call ran")
			closeD(t, d)
		})
	})
}

// --- generations ---

// TestGenerationSupersedes: a newer generation ends the key's older calls —
// pending waiters get Stale at once, the in-flight execution's context is
// cancelled and its late success is reported Stale — then runs after the
// old execution returns. Older generations are then refused with ErrStale.
func TestGenerationSupersedes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooks := &hookLog[string, int]{}
		gen2 := newGate()
		var (
			mu         sync.Mutex
			order      []int
			inflight   atomic.Int32
			overlap    atomic.Bool
			execCause1 error
		)
		d := newD(t, func(ctx context.Context, _ string, call int) error {
			if inflight.Add(1) > 1 {
				overlap.Store(true)
			}
			defer inflight.Add(-1)
			mu.Lock()
			order = append(order, call)
			mu.Unlock()
			switch call {
			case 1:
				<-ctx.Done()
				mu.Lock()
				execCause1 = context.Cause(ctx)
				mu.Unlock()
				return nil // late success
			case 3:
				return gen2.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 4, OnDone: hooks.add})

		run1 := submit(t, d, "A", 1, SubmitOptions{Generation: 1})
		synctest.Wait()
		pend1 := submit(t, d, "A", 2, SubmitOptions{Generation: 1})
		require.NoError(t, d.Post("A", 2, SubmitOptions{Generation: 1}))
		new2 := submit(t, d, "A", 3, SubmitOptions{Generation: 2})
		synctest.Wait()

		for _, tk := range []*Ticket[string, int]{run1, pend1} {
			r := outcome(t, tk)
			assert.Equal(t, StateStale, r.State)
			assert.ErrorIs(t, r.Err, ErrStale)
		}
		mu.Lock()
		assert.ErrorIs(t, execCause1, ErrStale, "superseded execution's context not cancelled")
		assert.Equal(t, []int{1, 3}, order, "generation 2 runs after generation 1 returned; the superseded pending call never runs")
		mu.Unlock()

		// While generation 2 is tracked, older generations are refused.
		tk, err := d.Submit(bg, "A", 9, SubmitOptions{Generation: 1})
		assert.ErrorIs(t, err, ErrStale)
		assert.Nil(t, tk)
		assert.ErrorIs(t, d.Post("A", 9, SubmitOptions{Generation: 0}), ErrStale)
		same := submit(t, d, "A", 4, SubmitOptions{Generation: 2}) // same generation: accepted

		gen2.open()
		r, err := new2.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, 3, r.Call)
		r, err = same.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, 4, r.Call)
		synctest.Wait()
		assert.False(t, overlap.Load(), "two generations of one key ran at once")

		assert.ElementsMatch(t, []State{StateStale, StateStale, StateSucceeded, StateSucceeded}, hooks.states("A"),
			"superseded in-flight (ran, late success) and pending (never ran) calls are Stale")
		for _, hr := range hooks.of("A") {
			if hr.State == StateStale {
				assert.ErrorIs(t, hr.Err, ErrStale)
			}
		}
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.StaleExecutions)
		assert.Equal(t, uint64(2), s.Rejected)
		assert.Equal(t, map[State]int{StateStale: 3, StateSucceeded: 2}, counts(s.Outcomes))
	})
}

// TestGenerationNeverMerges: submissions of different generations are never
// merged — the merge function is not consulted across generations.
func TestGenerationNeverMerges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, string]()
		var merges []string
		d, _, release := holdWorker(t, f.exec, Config[string, string]{
			Merge: func(p, in string) (string, error) {
				merges = append(merges, p+"+"+in)
				return p + "+" + in, nil
			},
		})
		g1 := submit(t, d, "A", "a1", SubmitOptions{Generation: 1})
		g1b := submit(t, d, "A", "b1", SubmitOptions{Generation: 1})
		g2 := submit(t, d, "A", "a2", SubmitOptions{Generation: 2})
		_, err := d.Submit(bg, "A", "c1", SubmitOptions{Generation: 1})
		assert.ErrorIs(t, err, ErrStale)
		g2b := submit(t, d, "A", "b2", SubmitOptions{Generation: 2})
		assert.Equal(t, []string{"a1+b1", "a2+b2"}, merges, "merged across generations")
		release()
		assert.Equal(t, []string{"a2+b2"}, f.calls("A"))
		assert.Equal(t, map[State]int{StateStale: 2, StateSucceeded: 2}, tally(t, g1, g1b, g2, g2b))
		closeD(t, d)
	})
}

// TestGenerationForgotten: generations are remembered only while the key is
// tracked, so memory stays bounded; once the key is released, any
// generation is accepted again.
func TestGenerationForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d := newD(t, f.exec, Config[string, int]{Workers: 1})
		tk := submit(t, d, "A", 1, SubmitOptions{Generation: 5})
		_, err := tk.Wait(bg)
		require.NoError(t, err)
		synctest.Wait()
		require.False(t, d.Busy("A"))
		tk = submit(t, d, "A", 2, SubmitOptions{Generation: 1})
		_, err = tk.Wait(bg)
		require.NoError(t, err)
		closeD(t, d)
	})
}

// --- Close ---

// TestCloseDrainsByPriority: Close stops admission at once but runs what is
// queued — successors included — by priority, and returns nil when all of
// it has drained.
func TestCloseDrainsByPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{})
		var tks []*Ticket[string, int]
		tks = append(tks, submit(t, d, holdKey, 2, prio(0))) // successor
		tks = append(tks, submit(t, d, "A", 0, prio(1)))
		tks = append(tks, submit(t, d, "B", 0, prio(5)))
		tks = append(tks, submit(t, d, "C", 0, prio(3)))
		tks = append(tks, submit(t, d, "D", 0, prio(3)))
		require.NoError(t, d.Post("E", 0, prio(4)))

		closed := make(chan error, 1)
		go func() { closed <- d.Close(bg) }()
		synctest.Wait()
		select {
		case err := <-closed:
			t.Fatalf("Close returned %v before the queue drained", err)
		default:
		}
		for _, key := range []string{"A", "X"} {
			tk, err := d.Submit(bg, key, 0, prio(9))
			assert.ErrorIs(t, err, ErrClosed, key)
			assert.Nil(t, tk)
			assert.ErrorIs(t, d.Post(key, 0, prio(9)), ErrClosed, key)
		}
		release()
		require.NoError(t, <-closed)
		assert.Equal(t, []string{"B", "E", "C", "D", "A", holdKey}, f.keys())
		assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
		s := closeD(t, d)
		assert.Equal(t, uint64(4), s.Rejected)
	})
}

// TestCloseEndsRest: when Close's context ends before the queue drains,
// what is left ends Closed — queued calls are removed, the in-flight call's
// context is cancelled (its execution then reported Stale) — and Close
// returns the context's error.
func TestCloseEndsRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooks := &hookLog[string, int]{}
		var (
			mu     sync.Mutex
			ran    []string
			causes = map[string]error{}
		)
		d := newD(t, func(ctx context.Context, key string, _ int) error {
			mu.Lock()
			ran = append(ran, key)
			mu.Unlock()
			select {
			case <-ctx.Done():
				mu.Lock()
				causes[key] = context.Cause(ctx)
				mu.Unlock()
				return ctx.Err()
			case <-time.After(time.Second):
				return nil
			}
		}, Config[string, int]{Workers: 1, OnDone: hooks.add})
		a := submit(t, d, "A", 0, prio(3))
		b := submit(t, d, "B", 0, prio(2))
		c := submit(t, d, "C", 0, prio(1))
		require.NoError(t, d.Post("C", 0, prio(1)))
		synctest.Wait()
		a2 := submit(t, d, "A", 0, prio(0)) // A's successor

		start := time.Now()
		ctx, cancel := context.WithTimeout(bg, 1500*time.Millisecond)
		defer cancel()
		err := d.Close(ctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 1500*time.Millisecond, time.Since(start), "Close returns when its context ends")

		assert.Equal(t, StateSucceeded, outcome(t, a).State)
		assert.Equal(t, StateClosed, outcome(t, b).State, "in flight when Close gave up")
		assert.Equal(t, StateClosed, outcome(t, c).State, "never ran")
		assert.Equal(t, StateClosed, outcome(t, a2).State, "successor never ran")
		mu.Lock()
		assert.Equal(t, []string{"A", "B"}, ran)
		assert.ErrorIs(t, causes["B"], ErrClosed)
		mu.Unlock()
		assert.Equal(t, []State{StateSucceeded, StateClosed}, hooks.states("A"))
		assert.Equal(t, []State{StateStale}, hooks.states("B"), "an execution ended by Close is reported Stale")
		assert.Equal(t, []State{StateClosed}, hooks.states("C"))

		s := checkConservation(t, d)
		assert.Zero(t, s.Live)
		assert.Zero(t, s.Keys)
		assert.Zero(t, s.InFlight)
		assert.Equal(t, uint64(1), s.StaleExecutions)
		assert.Equal(t, map[State]int{StateSucceeded: 1, StateClosed: 4}, counts(s.Outcomes))

		// Idempotent: nothing left, nothing changes.
		require.NoError(t, d.Close(bg))
		assert.Equal(t, s, d.Stats())
	})
}

// TestCloseIdempotentConcurrent: many concurrent Close calls, while work is
// in flight, all return once everything drained; later ones return at
// once; submissions after Close are refused with ErrClosed and counted.
func TestCloseIdempotentConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(context.Context, string, int) error {
			time.Sleep(time.Second)
			return nil
		}, Config[string, int]{Workers: 2})
		var tks []*Ticket[string, int]
		for _, k := range []string{"a", "b", "c", "d"} {
			tks = append(tks, submit(t, d, k, 0, prio(0)))
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = d.Close(bg) })
		}
		wg.Wait()
		for _, err := range errs {
			assert.NoError(t, err)
		}
		assert.Equal(t, 2*time.Second, time.Since(start))
		assert.Equal(t, map[State]int{StateSucceeded: 4}, tally(t, tks...))
		for range 3 {
			require.NoError(t, d.Close(bg))
		}
		_, err := d.Submit(bg, "a", 0, prio(0))
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, d.Post("a", 0, prio(0)), ErrClosed)
		s := closeD(t, d)
		assert.Equal(t, uint64(2), s.Rejected)
		assert.Equal(t, uint64(6), s.Submitted)
	})
}

// TestCloseConcurrentContexts: while one Close gives up (its context ends)
// another Close without a deadline is waiting; both return once everything
// is ended, and the one whose context never ended reports no error.
func TestCloseConcurrentContexts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(ctx context.Context, _ string, _ int) error {
			select {
			case <-ctx.Done():
				time.Sleep(time.Second) // takes a while to notice
				return ctx.Err()
			case <-time.After(time.Hour):
				return nil
			}
		}, Config[string, int]{Workers: 1})
		a := submit(t, d, "A", 0, prio(0))
		b := submit(t, d, "B", 0, prio(0))
		synctest.Wait()
		start := time.Now()
		patient := make(chan error, 1)
		go func() { patient <- d.Close(bg) }()
		ctx, cancel := context.WithTimeout(bg, time.Minute)
		defer cancel()
		assert.ErrorIs(t, d.Close(ctx), context.DeadlineExceeded)
		assert.Equal(t, time.Minute+time.Second, time.Since(start), "Close waits for the cancelled execution to return")
		require.NoError(t, <-patient)
		assert.Equal(t, map[State]int{StateClosed: 2}, tally(t, a, b))
		closeD(t, d)
	})
}

// TestCloseDoneContext: Close with a context that is already done ends
// everything at once and returns the context's error — unless nothing was
// left, in which case it returns nil.
func TestCloseDoneContext(t *testing.T) {
	t.Run("work left", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			f.block("A")
			hooks := &hookLog[string, int]{}
			d := newD(t, f.exec, Config[string, int]{Workers: 1, OnDone: hooks.add})
			a := submit(t, d, "A", 0, prio(0))
			synctest.Wait()
			b := submit(t, d, "B", 0, prio(0))
			ctx, cancel := context.WithCancel(bg)
			cancel()
			assert.ErrorIs(t, d.Close(ctx), context.Canceled)
			assert.Equal(t, map[State]int{StateClosed: 2}, tally(t, a, b))
			assert.Equal(t, []string{"A"}, f.keys())
			assert.Equal(t, []State{StateStale}, hooks.states("A"))
			assert.Equal(t, []State{StateClosed}, hooks.states("B"))
			closeD(t, d)
		})
	})
	t.Run("nothing left", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			d := newD(t, f.exec, Config[string, int]{Workers: 1})
			_, err := submit(t, d, "A", 0, prio(0)).Wait(bg)
			require.NoError(t, err)
			synctest.Wait()
			ctx, cancel := context.WithCancel(bg)
			cancel()
			assert.NoError(t, d.Close(ctx))
			closeD(t, d)
		})
	})
}

// TestCloseUnused: a Dispatcher that never ran anything closes at once, and
// refuses submissions afterwards.
func TestCloseUnused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d := newD(t, f.exec, Config[string, int]{})
		require.NoError(t, d.Close(bg))
		tk, err := d.Submit(bg, "k", 0, SubmitOptions{})
		assert.ErrorIs(t, err, ErrClosed)
		assert.Nil(t, tk)
		assert.ErrorIs(t, d.Post("k", 0, SubmitOptions{}), ErrClosed)
		assert.False(t, d.Cancel("k", nil))
		assert.False(t, d.Busy("k"))
		s := closeD(t, d)
		assert.Equal(t, uint64(2), s.Rejected)
		synctest.Wait()
		assert.Empty(t, f.keys())
	})
}

// TestCloseUnderLoad closes a busy dispatcher — submissions still arriving,
// waiters cancelling and expiring, executions that ignore their context —
// with a context that ends before the queue drains. Every accepted
// submission ends exactly once, later ones are refused with ErrClosed,
// nothing is left, and the hook fired once per call.
func TestCloseUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const keys, submitters, perSub = 10, 16, 100
		var hooks atomic.Uint64
		d := newD(t, func(ctx context.Context, _ int, call int) error {
			if call%2 == 0 {
				time.Sleep(time.Duration(call%7) * time.Millisecond) // ignores ctx
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(call%5) * time.Millisecond):
				return nil
			}
		}, Config[int, int]{
			Workers: 4,
			OnDone:  func(Result[int, int]) { hooks.Add(1) },
		})

		var (
			mu         sync.Mutex
			all        []*Ticket[int, int]
			unexpected []error
			closedSeen atomic.Int32
		)
		var wg sync.WaitGroup
		for s := range submitters {
			wg.Go(func() {
				var mine []*Ticket[int, int]
				var errs []error
				for i := range perSub {
					key, call := (s*7+i)%keys, s*perSub+i
					var err error
					switch i % 4 {
					case 0:
						err = d.Post(key, call, SubmitOptions{Priority: i % 3})
					case 1:
						ctx, cancel := context.WithTimeout(bg, time.Duration(i%6)*time.Millisecond+time.Microsecond)
						var tk *Ticket[int, int]
						tk, err = d.Submit(ctx, key, call, SubmitOptions{Priority: i % 3})
						if err == nil {
							mine = append(mine, tk)
						}
						defer cancel()
					default:
						var tk *Ticket[int, int]
						tk, err = d.Submit(bg, key, call, SubmitOptions{Priority: i % 3})
						if err == nil {
							mine = append(mine, tk)
							if i%8 == 2 {
								tk.Cancel()
							}
						}
					}
					switch {
					case err == nil:
					case errors.Is(err, ErrClosed):
						closedSeen.Add(1)
					default:
						errs = append(errs, err)
					}
					time.Sleep(time.Millisecond)
				}
				mu.Lock()
				all = append(all, mine...)
				unexpected = append(unexpected, errs...)
				mu.Unlock()
			})
		}
		time.Sleep(50 * time.Millisecond)
		ctx, cancel := context.WithTimeout(bg, 5*time.Millisecond)
		defer cancel()
		err := d.Close(ctx)
		closedAt := time.Now()
		wg.Wait()
		require.Empty(t, unexpected)
		assert.NotZero(t, closedSeen.Load(), "no submission after Close")

		s := checkConservation(t, d)
		if err != nil {
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.NotZero(t, s.Outcomes[StateClosed])
		}
		assert.LessOrEqual(t, time.Since(closedAt), time.Duration(perSub)*time.Millisecond)
		told := tally(t, all...)
		assert.Zero(t, s.Live)
		assert.Zero(t, s.Keys)
		assert.Zero(t, s.InFlight)
		assert.Equal(t, hooks.Load(), total(s.Calls))
		for st, n := range told {
			assert.LessOrEqual(t, uint64(n), s.Outcomes[st], "tickets with state %v", st)
		}
		t.Logf("Close: %v; outcomes %v; calls %v; rejected %d", err, counts(s.Outcomes), counts(s.Calls), s.Rejected)
		closeD(t, d)
	})
}
