package scheduler

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestOnFinishOncePerAdd: whatever happens to a call — run, merged,
// overwritten, skipped, refused, in flight while another arrives — its
// OnFinish gets exactly one value. So one buffered channel with a slot per
// Add never drops a result, where upstream's dispatcher sends twice to a
// call in flight that a call of the same type merges with (Overwritten,
// then its execution's result, which a one-slot channel drops).
func TestOnFinishOncePerAdd(t *testing.T) {
	d := newIdleDispatcher(t, Options{})
	j := &journal{}
	hold := newHolder()
	const n = 7
	ch := make(chan error, n) // one slot per Add, shared
	add := func(c *testCall) error { return d.Add(c, fwk.APICallOptions{OnFinish: ch}) }

	first := newCall(j, "first", typeLow, "1", "x")
	first.exec = hold.exec
	require.NoError(t, add(first))
	d.Start(testLogger(t))
	<-hold.arrived                                                    // first is in flight
	require.NoError(t, add(newCall(j, "second", typeLow, "1", "y")))  // its successor
	require.NoError(t, add(newCall(j, "third", typeLow, "1", "z")))   // merges into second
	require.NoError(t, add(newCall(j, "fourth", typeHigh, "1", "w"))) // overwrites third
	require.Error(t, add(newCall(j, "fifth", typeLow, "1", "v")))     // less relevant: skipped
	require.NoError(t, add(newCall(j, "sixth", typeLow, "2", "x")))   // another object
	noop := newCall(j, "seventh", typeLow, "3")
	noop.noop = ptr(true)
	require.Error(t, add(noop)) // a no-op: skipped
	hold.release <- struct{}{}

	var got []error
	for range n {
		got = append(got, outcome(t, ch))
	}
	requireNoMore(t, ch)
	count := func(target error) (k int) {
		for _, err := range got {
			if errors.Is(err, target) || (target == nil && err == nil) {
				k++
			}
		}
		return k
	}
	assert.Equal(t, 3, count(nil), "first, fourth and sixth ran: %v", got)
	assert.Equal(t, 2, count(fwk.ErrCallOverwritten), "second and third were overwritten: %v", got)
	assert.Equal(t, 2, count(fwk.ErrCallSkipped), "fifth and seventh were skipped: %v", got)
}

// TestOnFinishNonBlocking keeps upstream's send: a channel with no room
// does not hold the dispatcher up, and its result is dropped; Submit's
// Ticket keeps it. This is the lossless path: a caller that reads late
// still gets its result.
func TestOnFinishNonBlocking(t *testing.T) {
	d := newTestDispatcher(t, Options{})
	j := &journal{}
	unbuffered := make(chan error) // nobody reads it
	tk, err := d.Submit(newCall(j, "a", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: unbuffered})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := tk.Wait(ctx)
	require.NoError(t, err)
	assert.NoError(t, res.Err)
	assert.Equal(t, dispatch.StateSucceeded, res.Outcome.State)
	assert.Equal(t, 1, res.Outcome.Attempts)
	select {
	case err := <-unbuffered:
		t.Fatalf("a value was kept for an unbuffered channel: %v", err)
	default:
	}
	again, ok := tk.Result()
	assert.True(t, ok)
	assert.Equal(t, res, again, "the Ticket keeps its result")

	// A second dispatcher run shows the dispatcher went on: a later call
	// completes although the first one's send found no receiver.
	tk2, err := d.Submit(newCall(j, "b", typeLow, "2", "x"), fwk.APICallOptions{})
	require.NoError(t, err)
	_, err = tk2.Wait(ctx)
	require.NoError(t, err)
}

// TestTicketResults: a Ticket reports what OnFinish gets, for every way an
// Add ends, and the dispatcher's Outcome where a call ran or was ended by
// the dispatcher.
func TestTicketResults(t *testing.T) {
	d := newIdleDispatcher(t, Options{Timeout: time.Hour})
	j := &journal{}
	submit := func(c *testCall) (*Ticket, chan error, error) {
		ch := make(chan error, 1)
		tk, err := d.Submit(c, fwk.APICallOptions{OnFinish: ch})
		return tk, ch, err
	}
	overwritten, ch1, err := submit(newCall(j, "a", typeLow, "1", "x"))
	require.NoError(t, err)
	ran, ch2, err := submit(newCall(j, "b", typeHigh, "1", "y"))
	require.NoError(t, err)
	skipped, ch3, err := submit(newCall(j, "c", typeLow, "1", "z"))
	require.ErrorIs(t, err, fwk.ErrCallSkipped)
	failing := newCall(j, "d", typeLow, "2", "x")
	failing.exec = func(context.Context, *testCall) error { return errTest }
	failed, ch4, err := submit(failing)
	require.NoError(t, err)
	d.Start(testLogger(t))

	for _, tc := range []struct {
		name  string
		tk    *Ticket
		ch    chan error
		is    error
		state dispatch.State
	}{
		{"overwritten", overwritten, ch1, fwk.ErrCallOverwritten, 0},
		{"ran", ran, ch2, nil, dispatch.StateSucceeded},
		{"skipped", skipped, ch3, fwk.ErrCallSkipped, dispatch.StateSkipped},
		{"failed", failed, ch4, errTest, dispatch.StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := outcome(t, tc.ch)
			<-tc.tk.Done()
			res, ok := tc.tk.Result()
			require.True(t, ok)
			assert.Equal(t, fmt.Sprint(sent), fmt.Sprint(res.Err), "the Ticket holds what OnFinish got")
			if tc.is == nil {
				assert.NoError(t, res.Err)
			} else {
				assert.ErrorIs(t, res.Err, tc.is)
			}
			assert.Equal(t, tc.state, res.Outcome.State)
		})
	}
}

// TestCloseBeforeStart pins that Close before Start returns at once,
// whatever its context: nothing can run before Start, so what is queued
// ends at once, each OnFinish getting an error matching dispatch.ErrClosed,
// and a later Start runs nothing.
func TestCloseBeforeStart(t *testing.T) {
	for _, queued := range []bool{false, true} {
		t.Run(fmt.Sprintf("queued=%t", queued), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newIdleDispatcher(t, Options{Timeout: -1}) // no deadline
				j := &journal{}
				ch := make(chan error, 1)
				if queued {
					require.NoError(t, d.Add(newCall(j, "a", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: ch}))
				}
				done := make(chan error, 1)
				go func() { done <- d.Close(context.Background()) }()
				synctest.Wait()
				select {
				case err := <-done:
					if !queued {
						assert.NoError(t, err, "nothing to end")
					}
				default:
					require.NoError(t, d.Close(canceled()))
					<-done
					t.Fatal("Close(context.Background()) before Start did not return")
				}
				if queued {
					assert.ErrorIs(t, outcome(t, ch), dispatch.ErrClosed)
				}
				d.Start(testLogger(t))
				synctest.Wait()
				assert.Empty(t, j.only("execute "), "nothing runs after Close")
			})
		})
	}
}

// TestClosedOnFinishTellsTheOthers: a send on an OnFinish channel its
// caller closed panics. That panic is recovered and reported as an
// internal error, and every other call is still told its outcome: the
// call that overwrote the one with the closed channel (told in its Add),
// or ran after it (told as its execution began) is not held up by it.
func TestClosedOnFinishTellsTheOthers(t *testing.T) {
	cases := []struct {
		name     string
		inFlight bool // the second call arrives during the first's execution, not its backoff
		want     error
	}{
		{"a call behind it in flight", true, errRetryable},
		{"a call replacing its retry", false, fwk.ErrCallOverwritten},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newIdleDispatcher(t, Options{Retry: dispatch.RetryPolicy{InitialBackoff: 10 * time.Second, Jitter: dispatch.JitterNone, BudgetRatio: 1}})
				logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
				d.Start(logger)
				j := &journal{}
				first := failsOnce(j, "first")
				closed := make(chan error, 1)
				close(closed)
				tkFirst, err := d.Submit(first, fwk.APICallOptions{OnFinish: closed})
				require.NoError(t, err)
				if c.inFlight {
					time.Sleep(50 * time.Millisecond)
				} else {
					time.Sleep(time.Second) // its retry waits out the backoff
				}
				chNext := make(chan error, 1)
				assert.NotPanics(t, func() {
					require.NoError(t, d.Add(newCall(j, "next", typeLow, "1", "y"), fwk.APICallOptions{OnFinish: chNext}))
				})
				time.Sleep(time.Minute)
				synctest.Wait()

				// Received without outcome's 10 s: the report's
				// utilruntime.HandleError waits out its backoff, which,
				// from the bubble's clock behind the real one, is years.
				require.NoError(t, <-chNext, "the other call is told, and ran")
				assert.Contains(t, j.only("execute "), "execute next")
				res, ok := tkFirst.Result()
				require.True(t, ok, "the call with the closed channel is told on its Ticket")
				assert.ErrorIs(t, res.Err, c.want)
				logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
				assert.Contains(t, logs, "send on closed channel", "the panic is reported")
			})
		})
	}
}

// TestClosedOnFinishInCloseTellsTheOthers: the call with the closed
// channel failed in flight, and its retry absorbed the call added behind
// it; Close ends that retry, telling both in one step. The call behind it
// is told it was closed, on its channel and its Ticket.
func TestClosedOnFinishInCloseTellsTheOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newIdleDispatcher(t, Options{Retry: dispatch.RetryPolicy{InitialBackoff: 10 * time.Second, Jitter: dispatch.JitterNone, BudgetRatio: 1}})
		d.Start(testLogger(t))
		j := &journal{}
		closed := make(chan error, 1)
		close(closed)
		tkFirst, err := d.Submit(failsOnce(j, "first"), fwk.APICallOptions{OnFinish: closed})
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond) // first is in flight
		chNext := make(chan error, 1)
		tkNext, err := d.Submit(newCall(j, "next", typeLow, "1", "y"), fwk.APICallOptions{OnFinish: chNext})
		require.NoError(t, err)
		time.Sleep(time.Second) // first failed; its retry, with next, waits out the backoff
		synctest.Wait()

		assert.NotPanics(t, func() { _ = d.Close(canceled()) })
		synctest.Wait()
		res, ok := tkNext.Result()
		require.True(t, ok, "the call behind it is told")
		assert.ErrorIs(t, res.Err, dispatch.ErrClosed)
		assert.ErrorIs(t, <-chNext, dispatch.ErrClosed)
		res, ok = tkFirst.Result()
		require.True(t, ok)
		assert.ErrorIs(t, res.Err, errRetryable, "its own execution's error")
		assert.NotContains(t, j.only("execute "), "execute next")
	})
}

// TestTicketOutcomeOffTheQueue: a call that never reached a worker's queue
// has at most its State in its Ticket's Outcome, as Result says: Skipped
// for one skipped at Add, nothing for one overwritten or refused.
func TestTicketOutcomeOffTheQueue(t *testing.T) {
	d := newIdleDispatcher(t, Options{})
	j := &journal{}
	noop := newCall(j, "noop", typeLow, "1")
	noop.noop = ptr(true)
	skipped, err := d.Submit(noop, fwk.APICallOptions{})
	require.ErrorIs(t, err, fwk.ErrCallSkipped)
	overwritten, err := d.Submit(newCall(j, "a", typeLow, "2", "x"), fwk.APICallOptions{})
	require.NoError(t, err)
	_, err = d.Submit(newCall(j, "b", typeHigh, "2", "y"), fwk.APICallOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, d.Close(canceled()), context.Canceled, "b ended Closed")
	refused, err := d.Submit(newCall(j, "c", typeLow, "3", "x"), fwk.APICallOptions{})
	require.ErrorIs(t, err, dispatch.ErrClosed)

	for _, tc := range []struct {
		name string
		tk   *Ticket
		want dispatch.Outcome
	}{
		{"skipped", skipped, dispatch.Outcome{State: dispatch.StateSkipped}},
		{"overwritten", overwritten, dispatch.Outcome{}},
		{"refused", refused, dispatch.Outcome{}},
	} {
		res, ok := tc.tk.Result()
		require.True(t, ok, tc.name)
		assert.Equal(t, tc.want, res.Outcome, tc.name)
	}
}

// TestClosedOnFinishIsCounted: the panic of a send on a closed OnFinish
// channel is a callback's panic, recovered, so it is counted where the
// dispatcher's other callback panics are: Stats.CallbackPanics, with
// LastCallbackPanic the latest of them. Whether the call is told at its
// Add (skipped), by the core's completion hook (it ran), or in another
// call's Add (overwritten), each send that panicked counts once.
func TestClosedOnFinishIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newIdleDispatcher(t, Options{})
		j := &journal{}
		closed := make(chan error, 1)
		close(closed)
		on := fwk.APICallOptions{OnFinish: closed}

		noop := newCall(j, "noop", typeLow, "1")
		noop.noop = ptr(true)
		require.ErrorIs(t, d.Add(noop, on), fwk.ErrCallSkipped) // told at its Add
		require.NoError(t, d.Add(newCall(j, "over", typeLow, "2", "x"), on))
		require.NoError(t, d.Add(newCall(j, "high", typeHigh, "2", "y"), fwk.APICallOptions{})) // tells "over" in its Add
		s := d.Stats()
		assert.Equal(t, uint64(2), s.CallbackPanics, "the sends at Add")
		pe := s.LastCallbackPanic
		require.NotNil(t, pe)
		assert.Equal(t, "on_finish", pe.Callback)

		require.NoError(t, d.Add(newCall(j, "ran", typeLow, "3", "x"), on))
		d.Start(testLogger(t))
		synctest.Wait() // it ran; the completion hook told it
		s = d.Stats()
		assert.Equal(t, uint64(3), s.CallbackPanics, "and the one the completion hook made: %v", s.LastCallbackPanic)
		pe = s.LastCallbackPanic
		require.NotNil(t, pe)
		assert.Equal(t, "on_finish", pe.Callback)
		assert.Equal(t, "send on closed channel", fmt.Sprint(pe.Value))
	})
}

// exitingCall is a testCall whose Merge or IsNoOp, once armed, ends its
// goroutine (runtime.Goexit): the goroutine of the Add that asks it.
type exitingCall struct {
	*testCall
	inMerge, inNoOp bool
}

func (c *exitingCall) Merge(old fwk.APICall) error {
	if c.inMerge {
		runtime.Goexit()
	}
	if o, ok := old.(*exitingCall); ok {
		old = o.testCall
	}
	return c.testCall.Merge(old)
}

func (c *exitingCall) IsNoOp() bool {
	if c.inNoOp {
		runtime.Goexit()
	}
	return c.testCall.IsNoOp()
}

// TestOnFinishWhenAddExits: a call's Merge or IsNoOp that ends its
// goroutine (runtime.Goexit) ends the Add that asked it, which never
// returns; the core refuses the call. Its OnFinish still gets its one
// value, an error holding dispatch.ErrGoexit; the call it would have
// merged with stays pending, untold, and runs.
func TestOnFinishWhenAddExits(t *testing.T) {
	for _, c := range []struct {
		name            string
		pending         bool // a call is pending for the object: Merge, then IsNoOp, are asked
		inMerge, inNoOp bool
	}{
		{"IsNoOp of a call for an idle object", false, false, true},
		{"Merge", true, true, false},
		{"IsNoOp after the merge", true, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newIdleDispatcher(t, Options{})
				j := &journal{}
				chFirst := make(chan error, 1)
				if c.pending {
					require.NoError(t, d.Add(newCall(j, "first", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: chFirst}))
				}
				ch := make(chan error, 1)
				returned := false
				go func() {
					_ = d.Add(&exitingCall{testCall: newCall(j, "exits", typeLow, "1", "y"), inMerge: c.inMerge, inNoOp: c.inNoOp}, fwk.APICallOptions{OnFinish: ch})
					returned = true
				}()
				synctest.Wait()
				assert.False(t, returned, "the Add's goroutine ended")
				require.Len(t, ch, 1, "its OnFinish was told")
				err := <-ch
				assert.ErrorIs(t, err, dispatch.ErrGoexit)
				var pe *dispatch.PanicError
				assert.ErrorAs(t, err, &pe)
				if c.pending {
					assert.Empty(t, chFirst, "the pending call is not told it was overwritten")
					d.Start(testLogger(t))
					synctest.Wait()
					require.Len(t, chFirst, 1)
					assert.NoError(t, <-chFirst, "it ran")
					assert.Equal(t, []string{"execute first"}, j.only("execute "))
				}
			})
		})
	}
}
