package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

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

// TestAmendRace: the no-op test of an Amend runs outside the lock, so the
// call may change before the Amend acts on the test's verdict. A call
// changed meanwhile is no longer the call the Amend judged, and runs: a
// submission merged into it, another Amend rewrote it, or it started,
// failed and waits to be retried as the key's pending call (its attempt
// may have changed what it would do; the retry is judged by the no-op
// test before it starts, as any attempt).
func TestAmendRace(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config[string, int]
		// failFirst makes "a"'s first attempt fail, retryably.
		failFirst bool
		// meanwhile changes the call while the Amend's no-op test runs,
		// and returns any tickets it submitted.
		meanwhile func(t *testing.T, d *Dispatcher[string, int], release func()) []*Ticket[string, int]
		runs      []int // the values "a" ran with
	}{
		{
			name: "merge",
			cfg:  Config[string, int]{Merge: func(p, in int) (int, error) { return p + in, nil }},
			meanwhile: func(t *testing.T, d *Dispatcher[string, int], _ func()) []*Ticket[string, int] {
				return []*Ticket[string, int]{submit(t, d, "a", 5, prio(0))} // the value is now 5
			},
			runs: []int{5},
		},
		{
			name: "amend",
			meanwhile: func(t *testing.T, d *Dispatcher[string, int], _ func()) []*Ticket[string, int] {
				found, err := d.Amend("a", func(int) (int, error) { return 7, nil })
				require.True(t, found)
				require.NoError(t, err)
				return nil
			},
			runs: []int{7},
		},
		{
			name: "retry",
			cfg: Config[string, int]{
				Retry:    RetryPolicy{InitialBackoff: time.Second, Jitter: JitterNone},
				Classify: func(error) Class { return ClassRetry },
			},
			failFirst: true,
			meanwhile: func(t *testing.T, d *Dispatcher[string, int], release func()) []*Ticket[string, int] {
				release() // "a" starts, fails, and waits out its backoff as the key's pending call
				return nil
			},
			runs: []int{0, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				inNoOp, resume := make(chan struct{}), make(chan struct{})
				var noOps atomic.Int32
				cfg := tc.cfg
				cfg.NoOp = func(string, int) bool {
					if noOps.Add(1) == 1 { // the Amend's: the rewritten value changes nothing
						close(inNoOp)
						<-resume
						return true
					}
					return false // what runs changes something
				}
				var failed atomic.Bool
				d, _, release := holdWorker(t, func(ctx context.Context, k string, v int) error {
					if err := f.exec(ctx, k, v); err != nil {
						return err
					}
					if tc.failFirst && failed.CompareAndSwap(false, true) {
						return errors.New("the first attempt fails")
					}
					return nil
				}, cfg)
				released := false
				once := func() {
					if !released {
						released = true
						release()
					}
				}
				a := submit(t, d, "a", 1, prio(0))
				done := make(chan struct{})
				go func() {
					defer close(done)
					found, err := d.Amend("a", func(int) (int, error) { return 0, nil })
					assert.True(t, found)
					assert.NoError(t, err)
				}()
				<-inNoOp
				tks := append([]*Ticket[string, int]{a}, tc.meanwhile(t, d, once)...)
				close(resume)
				<-done
				once()
				waitAll(tks...) // a retry's backoff, on the bubble's clock
				assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
				assert.Equal(t, tc.runs, f.calls("a"))
				assert.Equal(t, len(tc.runs), outcome(t, a).Attempts)
				closeD(t, d)
			})
		})
	}
}

// TestAmendCount: an Amend counts itself in the call's rare part only
// when a no-op test may ask whether the call changed — then even while
// the key's call is in flight, so that an Amend testing the pending call
// sees the rewrite — and without Config.NoOp makes no rare part at all.
func TestAmendCount(t *testing.T) {
	for _, noop := range []bool{false, true} {
		t.Run(fmt.Sprintf("noop=%v", noop), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				g := f.block("a")
				cfg := Config[string, int]{Workers: 1}
				if noop {
					cfg.NoOp = func(string, int) bool { return false }
				}
				d := newD(t, f.exec, cfg)
				running := submit(t, d, "a", 1, prio(0))
				synctest.Wait() // "a" is in flight
				pending := submit(t, d, "a", 2, prio(0))
				found, err := d.Amend("a", func(v int) (int, error) { return v + 10, nil })
				require.NoError(t, err)
				require.True(t, found)
				d.mu.Lock()
				rare := d.lanes.lookup("a").pending.rare
				var amends uint64
				if rare != nil {
					amends = rare.amends
				}
				d.mu.Unlock()
				if noop {
					assert.NotNil(t, rare)
					assert.EqualValues(t, 1, amends)
				} else {
					assert.Nil(t, rare, "nothing asks whether the call changed")
				}
				g.open()
				waitAll(running, pending)
				assert.Equal(t, []int{1, 12}, f.calls("a"))
				closeD(t, d)
			})
		})
	}
}

// TestAmendNewest: AmendNewest shows the pending call, or, when none is
// pending, the call in flight (never rewritten), and whether a call is in
// flight; a no-op found while a call is in flight is not dropped (that
// call may change what it was judged against), neither through Amend.
func TestAmendNewest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHoldOne()
		d := newD(t, h.exec, Config[string, int]{
			Workers: 1,
			NoOp:    func(_ string, v int) bool { return v == 0 },
		})
		found, err := d.AmendNewest("none", func(int, bool) (int, error) { panic("not called") })
		require.NoError(t, err)
		assert.False(t, found)

		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait() // in flight, nothing pending
		var seen []followCall
		found, err = d.AmendNewest("k", func(v int, inFlight bool) (int, error) {
			seen = append(seen, followCall{running: v, pending: inFlight})
			return 99, nil // dropped: a call in flight is never rewritten
		})
		require.NoError(t, err)
		assert.True(t, found)

		behind := submit(t, d, "k", 2, SubmitOptions{})
		found, err = d.AmendNewest("k", func(v int, inFlight bool) (int, error) {
			seen = append(seen, followCall{running: v, pending: inFlight})
			return 0, nil // a no-op, judged while 1 is in flight: kept
		})
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, []followCall{{running: 1, pending: true}, {running: 2, pending: true}}, seen)
		found, err = d.Amend("k", func(int) (int, error) { return 0, nil })
		require.NoError(t, err)
		assert.True(t, found)
		_, done := behind.Result()
		assert.False(t, done, "a no-op judged while a call is in flight is not dropped")

		h.gate.open()
		<-first.Done()
		<-behind.Done()
		assert.Equal(t, StateSucceeded, outcome(t, first).State)
		assert.Equal(t, StateSkipped, outcome(t, behind).State, "its own test, before it starts, decides")
		assert.Equal(t, []int{1}, h.values(), "1 ran as submitted")

		// Nothing in flight: a no-op rewrite drops the pending call at once.
		hold := newGate()
		d2 := newD(t, func(ctx context.Context, k string, _ int) error {
			if k == "hold" {
				return hold.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 1, NoOp: func(_ string, v int) bool { return v == 0 }})
		submit(t, d2, "hold", 1, SubmitOptions{})
		synctest.Wait()
		queued := submit(t, d2, "q", 5, SubmitOptions{})
		found, err = d2.AmendNewest("q", func(v int, inFlight bool) (int, error) {
			assert.False(t, inFlight)
			return 0, nil
		})
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, StateSkipped, outcome(t, queued).State)
		hold.open()
		closeD(t, d)
		closeD(t, d2)
	})
}

// TestAmendNoOpPanics: the no-op test that Amend runs on the call it
// rewrote is the call's, as the worker's is before it starts: a panic or a
// runtime.Goexit in it ends the call Failed with a *PanicError, never run,
// as the package doc promises, and Amend returns the panic.
func TestAmendNoOpPanics(t *testing.T) {
	for _, exit := range []bool{false, true} {
		t.Run(fmt.Sprintf("goexit=%v", exit), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				var tests atomic.Int32
				d, _, release := holdWorker(t, f.exec, Config[string, int]{
					NoOp: func(_ string, v int) bool {
						if v == 0 && tests.Add(1) == 1 { // the first test only
							if exit {
								runtime.Goexit()
							}
							panic("boom")
						}
						return false
					},
				})
				a := submit(t, d, "a", 1, prio(0))
				done := make(chan error, 1)
				go func() {
					defer close(done)
					_, err := d.Amend("a", func(int) (int, error) { return 0, nil })
					done <- err
				}()
				err := <-done
				if exit {
					assert.NoError(t, err, "the goroutine ended, Amend did not return")
				} else {
					var pe *PanicError
					require.ErrorAs(t, err, &pe)
					assert.Equal(t, callbackNoOp, pe.Callback)
				}
				_, ended := a.Result()
				require.True(t, ended, "the call whose no-op test panicked is still pending")
				r := outcome(t, a)
				assert.Equal(t, StateFailed, r.State)
				var pe *PanicError
				require.ErrorAs(t, r.Err, &pe)
				assert.Equal(t, callbackNoOp, pe.Callback)
				if exit {
					assert.ErrorIs(t, pe, ErrGoexit)
				}
				assert.Zero(t, r.Attempts)
				assert.False(t, d.Busy("a"), "the key is not wedged")
				release()
				assert.Empty(t, f.calls("a"), "the call ran")
				s := closeD(t, d)
				assert.Equal(t, uint64(1), s.Outcomes[StateFailed])
			})
		})
	}
}
