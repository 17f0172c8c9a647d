package dispatch

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/coalescer/dispatch/internal/due"
)

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

// TestCloseWaitsForContextCallbacks: Close returns after every goroutine
// the dispatcher started has exited. That holds for the completion hook and
// the observer event of a call whose last waiter left as its Submit context
// ended: they run on the notifier, which Close waits for, not on the
// goroutine context.AfterFunc starts, which it cannot — and only once that
// waiter was told.
func TestCloseWaitsForContextCallbacks(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  func(f func()) Config[string, int]
	}{
		{"OnDone", func(f func()) Config[string, int] {
			return Config[string, int]{OnDone: func(Result[string, int]) { f() }}
		}},
		{"Observer", func(f func()) Config[string, int] {
			return Config[string, int]{Observer: &funcObserver{finish: func(Event, Outcome) { f() }}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var tk atomic.Pointer[Ticket[string, int]]
				told, unblock := make(chan bool, 1), make(chan struct{})
				unblockOnce := sync.OnceFunc(func() { close(unblock) })
				// On failure too: the callback must end.
				defer unblockOnce()
				var ran atomic.Bool
				d, _, release := holdWorker(t, nopExec, c.cfg(func() {
					if ran.CompareAndSwap(false, true) { // the call of "k": the held call ends later
						_, ok := tk.Load().Result()
						told <- ok
						<-unblock
					}
				}))
				ctx, cancel := context.WithCancel(bg)
				k, err := d.Submit(ctx, "k", 1, SubmitOptions{}) // queued behind the held call
				require.NoError(t, err)
				tk.Store(k)
				cancel() // its only waiter leaves: the call ends
				assert.True(t, <-told, "the callback ran before the waiter was told")
				assert.Equal(t, StateCanceled, outcome(t, k).State)
				release()
				closed := make(chan error, 1)
				go func() { closed <- d.Close(bg) }()
				synctest.Wait()
				select {
				case <-closed:
					t.Fatal("Close returned while the callback was still running")
				default:
				}
				unblockOnce()
				require.NoError(t, <-closed)
			})
		})
	}
}

// TestCloseRunsLastHooks: a call the clock ends just as Close stops the
// dispatcher still gets its completion hook, after its ticket was told and
// before Close returns, though the notifier that runs the clock's hooks has
// exited by the time the clock hands it over: Close runs it.
func TestCloseRunsLastHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooks := make(chan bool, 2)
		d, k, unstall, release := stalledExpiry(t, hooks)
		release()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(bg) }()
		synctest.Wait() // Close has stopped the notifier, and waits for the clock
		unstall()
		require.NoError(t, <-closed)
		select {
		case ok := <-hooks:
			assert.True(t, ok, "OnDone ran before its call's ticket was told")
		default:
			t.Fatal("Close returned without running the hook of the call the clock ended")
		}
		assert.Empty(t, hooks, "OnDone ran twice")
		assert.Equal(t, StateExpired, outcome(t, k).State)
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

// TestCloseEndsDeadlines: Close ending at once a backlog whose waiters have
// deadlines — tickets with their own and with their context's, posts with
// and without, coalesced on shared keys, and the running call's ticket and
// its successor's — gives every submission one outcome, Closed, fires the
// completion hook once per call, and leaves nothing to expire later.
func TestCloseEndsDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooks := &hookLog[string, int]{}
		d, hold, _ := holdWorker(t, nopExec, Config[string, int]{OnDone: hooks.add})
		now := time.Now()
		tks := []*Ticket[string, int]{hold, submit(t, d, holdKey, 1, SubmitOptions{Deadline: now.Add(time.Minute)})}
		posts := 0
		for i := range 60 {
			key := strconv.Itoa(i % 25)
			dl := now.Add(time.Duration(60-i) * time.Second)
			switch i % 5 {
			case 0:
				tks = append(tks, submit(t, d, key, i, SubmitOptions{Priority: i % 3, Deadline: dl}))
			case 1:
				ctx, cancel := context.WithDeadline(bg, dl)
				defer cancel()
				tk, err := d.Submit(ctx, key, i, SubmitOptions{Priority: i % 4})
				require.NoError(t, err)
				tks = append(tks, tk)
			case 2:
				require.NoError(t, d.Post(key, i, SubmitOptions{Priority: i % 3, Deadline: dl}))
				posts++
			case 3:
				require.NoError(t, d.Post(key, i, SubmitOptions{Priority: i % 2}))
				posts++
			default:
				tks = append(tks, submit(t, d, key, i, prio(i%3)))
			}
		}
		before := d.Stats()
		require.Equal(t, len(tks)+posts, before.Live)

		ctx, cancel := context.WithCancel(bg)
		cancel()
		assert.ErrorIs(t, d.Close(ctx), context.Canceled)
		assert.Equal(t, map[State]int{StateClosed: len(tks)}, tally(t, tks...))
		s := checkConservation(t, d)
		assert.Zero(t, s.Live)
		assert.Zero(t, s.Tickets)
		assert.Zero(t, s.Keys)
		assert.Equal(t, map[State]int{StateClosed: len(tks) + posts}, counts(s.Outcomes))
		perKey := map[string]int{}
		for _, r := range hooks.all() {
			perKey[r.Key]++
		}
		assert.Len(t, perKey, 26, "a completion for every key")
		assert.Equal(t, 2, perKey[holdKey], "the running call and its successor")
		for key, n := range perKey {
			if key != holdKey {
				assert.Equal(t, 1, n, "completions of key %s", key)
			}
		}

		time.Sleep(2 * time.Minute) // past every deadline
		later := checkConservation(t, d)
		assert.Equal(t, s.Outcomes, later.Outcomes, "nothing expires after Close")
		assert.Equal(t, s.Submitted, later.Submitted)
	})
}

// TestDeadlineSweep (internal): a sweep takes the waiters its function
// removed out of the deadline indexes in one step — emptying an index if
// that was every waiter in it — and leaves the others, and those added
// meanwhile, in deadline order, and the indexes work as before afterwards.
// Half the waiters are tickets and half calls' posts aggregates, so both
// indexes are swept together, and popped in one order: by time, the posts
// first among equals.
func TestDeadlineSweep(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep func(i int) bool
	}{
		{"every waiter removed", func(int) bool { return false }},
		{"some kept", func(i int) bool { return i%3 == 0 }},
		{"only tickets kept", func(i int) bool { return i%2 == 1 }},
		{"every waiter removed, two back in", func(int) bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dl := due.New(func(int64) bool { return false })
			w := newWaiters[int, int](&dl)
			var seq uint64
			mk := func(i int) sweepWaiter {
				if i%2 == 1 {
					return sweepWaiter{x: newTicket[int, int](nil, 1, false).x}
				}
				seq++
				return sweepWaiter{c: &call[int, int]{seq: seq}}
			}
			ws := make([]sweepWaiter, 300)
			for i := range ws {
				ws[i] = mk(i)
				ws[i].add(&w, int64(1000-i%50)) // many share a deadline
			}
			var want []sweepWaiter
			w.sweep(func() {
				for i, wt := range ws {
					if !tc.keep(i) {
						wt.remove(&w)
					}
				}
				// A ticket and a posts aggregate out, whether kept or not:
				// taking one out a second time does nothing.
				ws[1].remove(&w)
				ws[4].remove(&w)
				for i := range 2 {
					gone := mk(i)
					gone.add(&w, 400)
					gone.remove(&w)
				}
				if strings.HasSuffix(tc.name, "back in") {
					ws[6].add(&w, 700) // marked out, and back in
					ws[7].add(&w, 700)
					want = append(want, ws[6], ws[7])
				}
				if tc.keep(0) {
					for i := range 2 {
						added := mk(i)
						added.add(&w, 500)
						want = append(want, added)
					}
					ws[2].add(&w, 600) // marked out, and back in
					ws[5].add(&w, 600)
					want = append(want, ws[2], ws[5])
				}
			})
			for i, wt := range ws {
				switch {
				case (i == 2 || i == 5) && tc.keep(0):
				case (i == 6 || i == 7) && strings.HasSuffix(tc.name, "back in"):
				case tc.keep(i) && i != 1 && i != 4:
					want = append(want, wt)
				default:
					assert.Zero(t, wt.at(), "waiter %d marked out", i)
				}
			}
			slices.SortFunc(want, func(a, b sweepWaiter) int {
				return cmp.Or(cmp.Compare(a.at(), b.at()), cmp.Compare(a.kind(), b.kind()), cmp.Compare(a.seq(), b.seq()))
			})
			require.Equal(t, len(want), w.postsDue.Len()+w.ticketsDue.Len())
			for i := range 2 {
				late := mk(i)
				late.add(&w, 2000)
				want = append(want, late)
			}
			var got []sweepWaiter
			for {
				c, tk := w.popDue(math.MaxInt64)
				if c == nil && tk == nil {
					break
				}
				if tk != nil {
					got = append(got, sweepWaiter{x: tk.x})
				} else {
					got = append(got, sweepWaiter{c: c})
				}
			}
			assert.Equal(t, want, got)
			assert.Zero(t, w.postsDue.Len()+w.ticketsDue.Len())
		})
	}
}

// TestDeadlineSweepBackIn (internal): a waiter that a sweep's function
// takes out and puts back in stays indexed, even when it was the only one
// in its index, where putting it back finds its own node and replaces it.
func TestDeadlineSweepBackIn(t *testing.T) {
	dl := due.New(func(int64) bool { return false })
	w := newWaiters[int, int](&dl)
	c := sweepWaiter{c: &call[int, int]{seq: 1}}
	x := sweepWaiter{x: newTicket[int, int](nil, 1, false).x}
	c.add(&w, 100)
	x.add(&w, 100)
	w.sweep(func() {
		c.remove(&w)
		x.remove(&w)
		c.add(&w, 200)
		x.add(&w, 300)
	})
	require.Equal(t, 1, w.postsDue.Len())
	require.Equal(t, 1, w.ticketsDue.Len())
	at, ok := w.nextDue()
	require.True(t, ok)
	require.EqualValues(t, 200, at)
	pc, _ := w.popDue(250)
	require.Same(t, c.c, pc)
	_, tk := w.popDue(300)
	require.Same(t, x.x.t, tk)
}

// sweepWaiter is a waiter of TestDeadlineSweep: a call's posts aggregate
// (c) or a ticket (x).
type sweepWaiter struct {
	c *call[int, int]
	x *ticketWatch[int, int]
}

func (s sweepWaiter) add(w *waiters[int, int], at int64) {
	if s.c != nil {
		w.addPostsDue(s.c, at)
		return
	}
	s.x.deadline = at
	w.addTicketDue(s.x)
}

func (s sweepWaiter) remove(w *waiters[int, int]) {
	if s.c != nil {
		w.removePostsDue(s.c)
		return
	}
	w.unindex(s.x.t)
}

func (s sweepWaiter) at() int64 {
	if s.c != nil {
		return s.c.posts.at
	}
	return s.x.at
}

// kind orders the posts before the tickets at equal times.
func (s sweepWaiter) kind() int {
	if s.c != nil {
		return 0
	}
	return 1
}

func (s sweepWaiter) seq() uint64 {
	if s.c != nil {
		return s.c.seq
	}
	return s.x.seq
}

// TestCloseWaitsForSyncCallbacks: after Close returns, no callback of the
// dispatcher runs. A Sync-mode caller tells its own call's completion hook
// and observer events, on its own goroutine, after the execution has
// returned: Close waits for those too, as it waits for a worker's. One
// that calls Close from there is on a goroutine Close would wait for: it
// gets ErrReentrant, as from a worker's hook, rather than waiting for
// itself.
func TestCloseWaitsForSyncCallbacks(t *testing.T) {
	docSays(t, "Dispatcher.Close", "every Sync-mode caller has told, on its own goroutine, what its submission caused: its observer events, its call's outcome")
	docSays(t, "Dispatcher.Close", "So once Close has returned, no completion hook or observer event of a call runs any more")
	for _, by := range []string{"OnDone", "OnFinish"} {
		t.Run(by, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release, inHook, unblock := newGate(), make(chan struct{}), newGate()
				defer unblock.open()
				var once sync.Once
				hook := func() { once.Do(func() { close(inHook); _ = unblock.wait(bg) }) }
				cfg := Config[string, int]{Rollout: RolloutPolicy{Mode: ModeSync}}
				if by == "OnDone" {
					cfg.OnDone = func(Result[string, int]) { hook() }
				} else {
					cfg.Observer = &funcObserver{finish: func(Event, Outcome) { hook() }}
				}
				d := newD(t, func(ctx context.Context, _ string, _ int) error { return release.wait(ctx) }, cfg)
				submitted := make(chan *Ticket[string, int], 1)
				submitAside(t, d, "k", 1, submitted)
				synctest.Wait()
				closed := make(chan error, 1)
				go func() { closed <- d.Close(bg) }()
				synctest.Wait()
				release.open()
				<-inHook
				synctest.Wait()
				select {
				case err := <-closed:
					t.Fatalf("Close returned (%v) while the Sync-mode caller's %s ran", err, by)
				default:
				}
				unblock.open()
				require.NoError(t, <-closed)
				assert.Equal(t, StateSucceeded, outcome(t, <-submitted).State)
			})
		})
	}
	t.Run("Close from OnDone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var d *Dispatcher[string, int]
			fromHook := make(chan error, 1)
			d = newD(t, nopExec, Config[string, int]{
				Rollout: RolloutPolicy{Mode: ModeSync},
				OnDone:  func(Result[string, int]) { fromHook <- d.Close(bg) },
			})
			assert.Equal(t, StateSucceeded, outcome(t, submit(t, d, "k", 1, SubmitOptions{})).State)
			assert.ErrorIs(t, <-fromHook, ErrReentrant)
			require.NoError(t, d.Close(bg))
		})
	})
}
