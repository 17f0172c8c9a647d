package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewValidation: every invalid configuration is an error from New that
// names the offending field, never a panic, and no Dispatcher. (A callback
// of the wrong type does not get this far: Config is typed by K and T, so
// it does not compile.)
func TestNewValidation(t *testing.T) {
	type cfg = Config[string, int]
	tests := []struct {
		name string
		exec ExecFunc[string, int]
		cfg  cfg
		want string // substring of the error
	}{
		{"nil exec", nil, cfg{}, "ExecFunc"},
		{"Workers -1", nopExec, cfg{Workers: -1}, "Config.Workers"},
		{"Capacity -1", nopExec, cfg{Capacity: -1}, "Config.Capacity"},
		{"MaxWaiters -1", nopExec, cfg{MaxWaiters: -1}, "Config.MaxWaiters"},
		{"Aging -1", nopExec, cfg{Aging: -1}, "Config.Aging"},
		{"unknown Mode", nopExec, cfg{Rollout: RolloutPolicy{Mode: 7}}, "Config.Rollout.Mode"},
		{"Retry.MaxAttempts -1", nopExec, cfg{Retry: RetryPolicy{MaxAttempts: -1}}, "Config.Retry.MaxAttempts"},
		{"Retry.Multiplier 0.5", nopExec, cfg{Retry: RetryPolicy{Multiplier: 0.5}}, "Config.Retry.Multiplier"},
		{"Retry.Jitter unknown", nopExec, cfg{Retry: RetryPolicy{Jitter: 9}}, "Config.Retry.Jitter"},
		{"Retry.BudgetRatio NaN", nopExec, cfg{Retry: RetryPolicy{BudgetRatio: math.NaN()}}, "Config.Retry.BudgetRatio"},
		{"Retry.BudgetRatio -1", nopExec, cfg{Retry: RetryPolicy{BudgetRatio: -1}}, "Config.Retry.BudgetRatio"},
		{"Breaker.Cooldown -1", nopExec, cfg{Breaker: &BreakerPolicy{Cooldown: -1}}, "Config.Breaker.Cooldown"},
		{"Breaker.Probes -1", nopExec, cfg{Breaker: &BreakerPolicy{Probes: -1}}, "Config.Breaker.Probes"},
		{"Breaker.FailureRatio 2", nopExec, cfg{Breaker: &BreakerPolicy{FailureRatio: 2}}, "Config.Breaker.FailureRatio"},
		{"Fallback without threshold", nopExec, cfg{Rollout: RolloutPolicy{Fallback: &FallbackPolicy{}}}, "Config.Rollout.Fallback"},
		{"Fallback.MaxBacklog -1", nopExec, cfg{Rollout: RolloutPolicy{Fallback: &FallbackPolicy{MaxBacklog: -1}}}, "Config.Rollout.Fallback.MaxBacklog"},
		{"Fallback.MaxFailureRatio 2", nopExec, cfg{Rollout: RolloutPolicy{Fallback: &FallbackPolicy{MaxFailureRatio: 2}}}, "Config.Rollout.Fallback.MaxFailureRatio"},
		// More than all of the calls never fail: a threshold that never fires.
		{"Fallback.MaxFailureRatio 1", nopExec, cfg{Rollout: RolloutPolicy{Fallback: &FallbackPolicy{MaxFailureRatio: 1}}}, "Config.Rollout.Fallback.MaxFailureRatio: 1 must be in [0, 1)"},
		{"tenant MaxQueued -1", nopExec, cfg{Tenants: map[string]TenantConfig{"a": {MaxQueued: -1}}}, `Config.Tenants["a"].MaxQueued`},
		{"default tenant Weight -1", nopExec, cfg{DefaultTenant: TenantConfig{Weight: -1}}, "Config.DefaultTenant.Weight"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d *Dispatcher[string, int]
			var err error
			require.NotPanics(t, func() { d, err = New(tc.exec, tc.cfg) })
			require.Error(t, err)
			assert.Nil(t, d)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("valid", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := newD(t, nopExec, Config[string, int]{
				Workers:    1,
				Capacity:   1,
				MaxWaiters: 1,
				AgingBand:  1,
				RateLimit:  nil,
				Merge:      func(p, in int) (int, error) { return in, nil },
				NoOp:       func(string, int) bool { return false },
				OnDone:     func(Result[string, int]) {},
			})
			tk := submit(t, d, "k", 1, SubmitOptions{})
			r, err := tk.Wait(bg)
			require.NoError(t, err)
			assert.Equal(t, StateSucceeded, r.State)
			closeD(t, d)
		})
	})
}

// TestSubmitRejectedUpFront: a submission with a done context or a
// deadline already past is refused at once; nothing is enqueued, merged or
// executed, and Stats count it as submitted and rejected.
func TestSubmitRejectedUpFront(t *testing.T) {
	cause := errors.New("caller gave up")
	tests := []struct {
		name   string
		submit func(d *Dispatcher[string, int]) error
		is     []error
	}{
		{"canceled ctx", func(d *Dispatcher[string, int]) error {
			ctx, cancel := context.WithCancel(bg)
			cancel()
			tk, err := d.Submit(ctx, "k", 2, SubmitOptions{})
			if tk != nil {
				return errors.New("got a ticket")
			}
			return err
		}, []error{ErrCanceled, context.Canceled}},
		{"canceled ctx with cause", func(d *Dispatcher[string, int]) error {
			ctx, cancel := context.WithCancelCause(bg)
			cancel(cause)
			_, err := d.Submit(ctx, "k", 2, SubmitOptions{})
			return err
		}, []error{ErrCanceled, cause}},
		{"ctx deadline passed", func(d *Dispatcher[string, int]) error {
			ctx, cancel := context.WithDeadline(bg, time.Now().Add(-time.Second))
			defer cancel()
			_, err := d.Submit(ctx, "k", 2, SubmitOptions{})
			return err
		}, []error{ErrExpired}},
		{"opts deadline passed", func(d *Dispatcher[string, int]) error {
			_, err := d.Submit(bg, "k", 2, SubmitOptions{Deadline: time.Now().Add(-time.Nanosecond)})
			return err
		}, []error{ErrExpired}},
		{"opts deadline before the dispatcher existed", func(d *Dispatcher[string, int]) error {
			_, err := d.Submit(bg, "k", 2, SubmitOptions{Deadline: time.Now().Add(-time.Hour)})
			return err
		}, []error{ErrExpired}},
		{"opts deadline passed, later ctx deadline", func(d *Dispatcher[string, int]) error {
			ctx, cancel := context.WithTimeout(bg, time.Hour)
			defer cancel()
			_, err := d.Submit(ctx, "k", 2, SubmitOptions{Deadline: time.Now().Add(-time.Second)})
			return err
		}, []error{ErrExpired}},
		{"Post deadline passed", func(d *Dispatcher[string, int]) error {
			return d.Post("k", 2, SubmitOptions{Deadline: time.Now().Add(-time.Second)})
		}, []error{ErrExpired}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, later := range []time.Duration{0, time.Minute} {
				t.Run("new key/"+later.String()+" after New", func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						f := newFixture[string, int]()
						d := newD(t, f.exec, Config[string, int]{})
						time.Sleep(later)
						err := tc.submit(d)
						require.Error(t, err)
						for _, target := range tc.is {
							assert.ErrorIs(t, err, target)
						}
						s := checkConservation(t, d)
						assert.Zero(t, s.Keys)
						assert.Zero(t, s.Live)
						assert.Equal(t, uint64(1), s.Submitted)
						assert.Equal(t, uint64(1), s.Rejected)
						assert.False(t, d.Busy("k"))
						synctest.Wait()
						assert.Empty(t, f.keys())
						closeD(t, d)
					})
				})
			}
			t.Run("pending key", func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					f := newFixture[string, int]()
					var merges int
					d, _, release := holdWorker(t, f.exec, Config[string, int]{
						Merge: func(p, in int) (int, error) {
							merges++
							return p + in, nil
						},
					})
					time.Sleep(time.Minute)
					k := submit(t, d, "k", 1, prio(0))
					before := checkConservation(t, d)
					err := tc.submit(d)
					require.Error(t, err)
					for _, target := range tc.is {
						assert.ErrorIs(t, err, target)
					}
					s := checkConservation(t, d)
					assert.Equal(t, 2, s.Keys)
					assert.Equal(t, before.Live, s.Live)
					assert.Equal(t, before.Coalesced, s.Coalesced)
					assert.Equal(t, before.Rejected+1, s.Rejected)
					release()
					assert.Zero(t, merges, "a refused submission was merged")
					assert.Equal(t, []int{1}, f.calls("k"))
					assert.Equal(t, StateSucceeded, outcome(t, k).State)
					closeD(t, d)
				})
			})
		})
	}
}

// TestCapacity: a new key beyond Config.Capacity is refused with a
// *BackpressureError (Bound BoundCapacity), while submissions for tracked
// keys — merges into a pending call, successors of an in-flight one — are
// still accepted.
func TestCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{ // holdKey in flight
			Capacity: 2,
			Merge:    func(p, in int) (int, error) { return p + in, nil },
		})
		var tks []*Ticket[string, int]
		tks = append(tks, submit(t, d, "B", 1, prio(0))) // pending
		require.Equal(t, 2, d.Stats().Keys)

		tk, err := d.Submit(bg, "C", 1, prio(0))
		require.Error(t, err)
		assert.Nil(t, tk)
		assert.ErrorIs(t, err, ErrBackpressure)
		var bp *BackpressureError
		require.ErrorAs(t, err, &bp)
		assert.Equal(t, BoundCapacity, bp.Bound)
		assert.Equal(t, 2, bp.Depth)
		err = d.Post("C", 1, SubmitOptions{})
		require.ErrorAs(t, err, &bp)
		assert.Equal(t, BoundCapacity, bp.Bound)
		assert.False(t, d.Busy("C"))

		// Tracked keys need no capacity.
		tks = append(tks, submit(t, d, "B", 10, prio(0))) // merge
		require.NoError(t, d.Post("B", 100, SubmitOptions{}))
		tks = append(tks, submit(t, d, holdKey, 2, prio(0))) // successor
		require.NoError(t, d.Post(holdKey, 20, SubmitOptions{}))
		s := checkConservation(t, d)
		assert.Equal(t, 2, s.Keys)
		assert.Equal(t, uint64(2), s.Rejected)

		release()
		assert.Equal(t, []int{22}, f.calls(holdKey))
		assert.Equal(t, []int{111}, f.calls("B"))
		assert.Equal(t, map[State]int{StateSucceeded: 3}, tally(t, tks...))
		// Room again.
		tk = submit(t, d, "C", 1, prio(0))
		_, err = tk.Wait(bg)
		require.NoError(t, err)
		closeD(t, d)
	})
}

// TestMaxWaiters: live tickets are bounded by Config.MaxWaiters (Bound
// "waiters"), for a new key and for a merge alike, while fire-and-forget
// submissions hold no ticket and are still accepted; a ticket that ends
// frees its slot.
func TestMaxWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{MaxWaiters: 2}) // one ticket in flight
		b1 := submit(t, d, "B", 1, prio(0))
		require.Equal(t, 2, d.Stats().Tickets)

		for _, key := range []string{"B", holdKey, "C"} { // merge, successor, new key
			tk, err := d.Submit(bg, key, 2, prio(0))
			require.Error(t, err, key)
			assert.Nil(t, tk)
			assert.ErrorIs(t, err, ErrBackpressure)
			var bp *BackpressureError
			require.ErrorAs(t, err, &bp)
			assert.Equal(t, BoundWaiters, bp.Bound)
		}
		require.NoError(t, d.Post("B", 3, SubmitOptions{}), "a fire-and-forget merge needs no waiter slot")
		require.NoError(t, d.Post(holdKey, 3, SubmitOptions{}), "a fire-and-forget successor needs no waiter slot")
		require.NoError(t, d.Post("C", 3, SubmitOptions{}), "a fire-and-forget new key needs no waiter slot")
		s := checkConservation(t, d)
		assert.Equal(t, 2, s.Tickets)
		assert.Equal(t, 5, s.Live)
		assert.Equal(t, uint64(3), s.Rejected)

		b1.Cancel() // frees a slot
		b2 := submit(t, d, "B", 4, prio(0))
		release()
		assert.Equal(t, map[State]int{StateSucceeded: 1, StateCanceled: 1}, tally(t, b1, b2))
		assert.Equal(t, []int{4}, f.calls("B"))
		closeD(t, d)
	})
}

// TestMaxWaitersDefault: without Config.MaxWaiters, live tickets are bounded
// by defaultWaitersPerKey × capacity.
func TestMaxWaitersDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, hold, release := holdWorker(t, f.exec, Config[string, int]{Capacity: 2})
		tks := []*Ticket[string, int]{hold}
		for len(tks) < 2*defaultWaitersPerKey {
			tks = append(tks, submit(t, d, "B", 0, prio(0)))
		}
		_, err := d.Submit(bg, "B", 0, prio(0))
		var bp *BackpressureError
		require.ErrorAs(t, err, &bp)
		assert.Equal(t, BoundWaiters, bp.Bound)
		release()
		assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
		closeD(t, d)
	})
}

// TestOutcomeAfterBookkeeping: when a waiter is told its outcome, the
// dispatcher's own state already reflects it — Stats, Pending — with no
// further synchronisation.
func TestOutcomeAfterBookkeeping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(_ context.Context, key string, _ int) error {
			if key == "fail" {
				return errUser
			}
			return nil
		}, Config[string, int]{Workers: 2})
		for i, key := range []string{"ok", "fail", "ok"} {
			tk := submit(t, d, key, 0, prio(0))
			r, _ := tk.Wait(bg)
			s := checkConservation(t, d)
			assert.False(t, d.Busy(key), "key still tracked when its outcome was delivered")
			assert.Zero(t, s.Live)
			assert.Zero(t, s.Keys)
			assert.Zero(t, s.InFlight)
			var told uint64
			for _, n := range s.Outcomes {
				told += n
			}
			assert.Equal(t, uint64(i+1), told)
			assert.NotZero(t, s.Outcomes[r.State])
		}
		closeD(t, d)
	})
}

// TestExecPanic: a panic in exec becomes a Failed outcome carrying a
// *PanicError with the value and the stack, and the (only) worker lives on.
func TestExecPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errVal := errors.New("panic with an error")
		hooks := &hookLog[string, int]{}
		d := newD(t, func(_ context.Context, key string, call int) error {
			switch key {
			case "panic":
				panic("boom")
			case "panic-err":
				panic(errVal)
			}
			return nil
		}, Config[string, int]{Workers: 1, OnDone: hooks.add})

		p := submit(t, d, "panic", 0, prio(0))
		r, err := p.Wait(bg)
		require.Error(t, err)
		assert.Equal(t, StateFailed, r.State)
		var pe *PanicError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "boom", pe.Value)
		assert.NotEmpty(t, pe.Stack)
		assert.Contains(t, string(pe.Stack), "goroutine")
		assert.Contains(t, err.Error(), "boom")
		assert.Equal(t, 1, r.Attempts)

		pe2 := submit(t, d, "panic-err", 0, prio(0))
		_, err = pe2.Wait(bg)
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, errVal, pe.Value)
		assert.ErrorIs(t, err, errVal, "a panic with an error value unwraps to it")

		// The pool still works, and it is the same single worker.
		for i := range 3 {
			tk := submit(t, d, "ok", i, prio(0))
			r, err := tk.Wait(bg)
			require.NoError(t, err)
			assert.Equal(t, StateSucceeded, r.State)
		}
		assert.Equal(t, []State{StateFailed}, hooks.states("panic"))
		synctest.Wait()
		s := closeD(t, d)
		assert.Equal(t, map[State]int{StateFailed: 2, StateSucceeded: 3}, counts(s.Outcomes))
		assert.Equal(t, uint64(5), s.Executions)
	})
}

// TestNoOpPanic: a panic in the no-op test fails the call instead of
// killing the worker.
func TestNoOpPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d := newD(t, f.exec, Config[string, int]{
			Workers: 1,
			NoOp: func(key string, _ int) bool {
				if key == "bad" {
					panic("no-op exploded")
				}
				return false
			},
		})
		bad := submit(t, d, "bad", 0, prio(0))
		r, err := bad.Wait(bg)
		assert.Equal(t, StateFailed, r.State)
		var pe *PanicError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "no-op exploded", pe.Value)
		ok := submit(t, d, "ok", 0, prio(0))
		r, err = ok.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, []string{"ok"}, f.keys())
		closeD(t, d)
	})
}

// TestExecContextDeadline: the execution context carries the latest
// deadline among the call's live waiters, and none if any waiter has none.
func TestExecContextDeadline(t *testing.T) {
	tests := []struct {
		name    string
		waiters func(t *testing.T, d *Dispatcher[string, int], now time.Time) []*Ticket[string, int]
		want    time.Duration // 0: no deadline
	}{
		{"latest of the waiters", func(t *testing.T, d *Dispatcher[string, int], now time.Time) []*Ticket[string, int] {
			a, _ := d.Submit(bg, "k", 0, SubmitOptions{Deadline: now.Add(3 * time.Second)})
			b, _ := d.Submit(bg, "k", 0, SubmitOptions{Deadline: now.Add(7 * time.Second)})
			return []*Ticket[string, int]{a, b}
		}, 7 * time.Second},
		{"from the context", func(t *testing.T, d *Dispatcher[string, int], now time.Time) []*Ticket[string, int] {
			ctx, cancel := context.WithTimeout(bg, 4*time.Second)
			t.Cleanup(cancel)
			a, _ := d.Submit(ctx, "k", 0, SubmitOptions{Deadline: now.Add(9 * time.Second)})
			return []*Ticket[string, int]{a}
		}, 4 * time.Second},
		{"fire-and-forget counts", func(t *testing.T, d *Dispatcher[string, int], now time.Time) []*Ticket[string, int] {
			a, _ := d.Submit(bg, "k", 0, SubmitOptions{Deadline: now.Add(3 * time.Second)})
			_ = d.Post("k", 0, SubmitOptions{Deadline: now.Add(5 * time.Second)})
			return []*Ticket[string, int]{a}
		}, 5 * time.Second},
		{"one waiter without deadline", func(t *testing.T, d *Dispatcher[string, int], now time.Time) []*Ticket[string, int] {
			a, _ := d.Submit(bg, "k", 0, SubmitOptions{Deadline: now.Add(3 * time.Second)})
			b, _ := d.Submit(bg, "k", 0, SubmitOptions{})
			return []*Ticket[string, int]{a, b}
		}, 0},
		{"a fire-and-forget without deadline", func(t *testing.T, d *Dispatcher[string, int], now time.Time) []*Ticket[string, int] {
			a, _ := d.Submit(bg, "k", 0, SubmitOptions{Deadline: now.Add(3 * time.Second)})
			_ = d.Post("k", 0, SubmitOptions{})
			return []*Ticket[string, int]{a}
		}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu      sync.Mutex
					got     time.Duration
					has     bool
					started time.Time
				)
				exec := func(ctx context.Context, key string, _ int) error {
					mu.Lock()
					defer mu.Unlock()
					started = time.Now()
					var dl time.Time
					dl, has = ctx.Deadline()
					got = dl.Sub(started)
					return nil
				}
				d, _, release := holdWorker(t, exec, Config[string, int]{})
				tks := tc.waiters(t, d, time.Now())
				for _, tk := range tks {
					require.NotNil(t, tk)
				}
				release()
				mu.Lock()
				defer mu.Unlock()
				require.False(t, started.IsZero())
				if tc.want == 0 {
					assert.False(t, has, "deadline %v", got)
				} else {
					assert.True(t, has)
					assert.Equal(t, tc.want, got)
				}
				assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
}

// TestPostClockGuess: Post reads the clock before taking the lock once
// recent Posts needed it (new keys), and stops once they did not (a hot
// key re-posted). The guess only moves the clock read: a call keeps its
// earliest submission's enqueue time whether or not a coalescing Post read
// the clock.
func TestPostClockGuess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log hookLog[string, int]
		d, _, release := holdWorker(t, nopExec, Config[string, int]{OnDone: log.add})
		post := func(key string) { require.NoError(t, d.Post(key, 0, SubmitOptions{})) }
		for i := range 3 { // a deadline is read before the lock anyway
			require.NoError(t, d.Post(fmt.Sprint("dl", i), 0, SubmitOptions{Deadline: time.Now().Add(time.Hour)}))
		}
		assert.False(t, d.guess.pre.Load(), "Posts with a deadline say nothing about the guess")
		post("a")
		post("b")
		assert.False(t, d.guess.pre.Load(), "two new keys are not a pattern yet")
		post("c")
		assert.True(t, d.guess.pre.Load(), "after three new keys Post reads the clock before the lock")
		post("e") // a new call, on the time read before the lock
		time.Sleep(time.Second)
		post("a") // read before the lock, and not needed
		post("a")
		assert.True(t, d.guess.pre.Load(), "two coalescing Posts do not flip the guess")
		post("a")
		assert.False(t, d.guess.pre.Load(), "a hot key re-posted needs no clock")
		time.Sleep(time.Second)
		post("a") // no clock at all
		post("d")
		release()
		waits := map[string]time.Duration{}
		for _, r := range log.all() {
			if r.Key != holdKey && !strings.HasPrefix(r.Key, "dl") {
				require.Equal(t, StateSucceeded, r.State, r.Key)
				waits[r.Key] = r.QueueWait
			}
		}
		assert.Equal(t, map[string]time.Duration{"a": 2 * time.Second, "b": 2 * time.Second, "c": 2 * time.Second, "e": 2 * time.Second, "d": 0}, waits,
			"queue wait from each call's first submission")
		closeD(t, d)
	})
}

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

// TestMaxWaitersSkipsMakeNoTicket: Config.MaxWaiters bounds live tickets,
// and a submission that Merge or Follow skips (SkipIncoming) ends Skipped
// at once, as one that Moot skips does: it holds no live ticket, so at the
// bound it is accepted and told Skipped, whichever of the three skips it.
// A merge the bound refuses leaves the pending call as it was.
func TestMaxWaitersSkipsMakeNoTicket(t *testing.T) {
	docSays(t, "Config.MaxWaiters", "A Submit that Merge, Follow or Moot skips ends at once and holds none: it is accepted at the bound.")
	synctest.Test(t, func(t *testing.T) {
		skip := errors.Join(SkipIncoming)
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{
			MaxWaiters: 2, // the held call's ticket and b1
			Merge: func(p, in int) (int, error) {
				if in < 0 {
					return 0, skip
				}
				return in, nil
			},
			Follow: func(_, in int, _ bool) (int, error) {
				if in < 0 {
					return 0, skip
				}
				return in, nil
			},
			Moot: func(_ string, v int) bool { return v < 0 },
		})
		b1 := submit(t, d, "B", 1, prio(0))
		for _, key := range []string{"B", holdKey, "new"} { // Merge, Follow, Moot skip it
			tk, err := d.Submit(bg, key, -1, prio(0))
			require.NoError(t, err, key)
			assert.Equal(t, StateSkipped, outcome(t, tk).State, key)
		}
		_, err := d.Submit(bg, "B", 2, prio(0)) // merged: a live ticket, refused
		var bp *BackpressureError
		require.ErrorAs(t, err, &bp)
		assert.Equal(t, BoundWaiters, bp.Bound)
		s := checkConservation(t, d)
		assert.Equal(t, 2, s.Tickets)
		assert.Equal(t, uint64(1), s.Rejected)
		release()
		assert.Equal(t, StateSucceeded, outcome(t, b1).State)
		assert.Equal(t, []int{1}, f.calls("B"), "the refused merge left the pending call as it was")
		closeD(t, d)
	})
}

// TestMaxWaitersSupersedeFreesTickets: a newer generation ends its key's
// calls and tells their tickets Stale, so at Config.MaxWaiters it needs no
// room beyond the tickets it ends: it is accepted, and live tickets stay
// within the bound. One that ends no ticket is still refused.
func TestMaxWaitersSupersedeFreesTickets(t *testing.T) {
	docSays(t, "Config.MaxWaiters", "One of a newer generation has the room of the tickets it ends Stale.")
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{MaxWaiters: 2}) // the held call's ticket
		old := submit(t, d, "k", 1, SubmitOptions{Generation: 1})
		require.NoError(t, d.Post("p", 1, SubmitOptions{Generation: 1}))
		_, err := d.Submit(bg, "p", 2, SubmitOptions{Generation: 2}) // ends no ticket
		var bp *BackpressureError
		require.ErrorAs(t, err, &bp)
		assert.Equal(t, BoundWaiters, bp.Bound)
		newer, err := d.Submit(bg, "k", 2, SubmitOptions{Generation: 2})
		require.NoError(t, err)
		assert.Equal(t, StateStale, outcome(t, old).State)
		s := checkConservation(t, d)
		assert.Equal(t, 2, s.Tickets)
		release()
		assert.Equal(t, StateSucceeded, outcome(t, newer).State)
		assert.Equal(t, []int{2}, f.calls("k"))
		closeD(t, d)
	})
}
