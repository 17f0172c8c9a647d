package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// TestAbandonedAttemptKeepsItsPlace: a completion hook that ends the
// worker's goroutine (runtime.Goexit) is counted (doc.go, "Callbacks") and
// ends no other call. The worker had taken q1, the next call, and tells
// the earlier outcome before q1's attempt begins: q1 keeps its place
// under its tenant's MaxQueued meanwhile (TenantConfig.MaxQueued), so a
// submission of the tenant is refused rather than taking it, and when the
// hook exits, q1 goes back to the queue and runs — it is not failed for
// want of room, and the tenant never holds more than MaxQueued. It runs
// on the token its worker took for it (RateLimiter), not the limiter's
// next one, an hour away.
func TestAbandonedAttemptKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, q1Runs := newGate(), newGate()
		inHook, leaveHook := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			switch k {
			case "first":
				return g.wait(ctx)
			case "q1":
				return q1Runs.wait(ctx) // running while the test looks
			}
			return nil
		}, Config[string, int]{
			Workers: 1,
			// Two tokens, then none for an hour of virtual time: q1 runs
			// on the one its worker took for it before the hook exited.
			RateLimit: rate.NewLimiter(rate.Every(time.Hour), 2),
			Tenants:   map[string]TenantConfig{"q": {MaxQueued: 1}},
			OnDone: func(r Result[string, int]) {
				if r.Key == "first" && once.CompareAndSwap(false, true) {
					close(inHook)
					<-leaveHook
					runtime.Goexit()
				}
			},
		})
		first := submit(t, d, "first", 0, SubmitOptions{})
		synctest.Wait() // first is in flight
		q1 := submit(t, d, "q1", 1, SubmitOptions{Tenant: "q"})
		g.open()
		// The worker ended first and took q1, and tells first's hook
		// before q1's attempt begins: q1 still holds q's one place.
		<-inHook
		_, err := d.Submit(bg, "q2", 2, SubmitOptions{Tenant: "q"})
		if be := (*BackpressureError)(nil); assert.ErrorAs(t, err, &be, "q1 holds q's place until its attempt begins") {
			assert.Equal(t, BoundQuota, be.Bound)
		}
		close(leaveHook) // the hook exits the worker: q1 goes back, abandoned
		synctest.Wait()
		st := d.Stats().Tenants["q"]
		assert.Equal(t, 1, st.Queued+st.InFlight, "q1 is back in the queue (or running): %+v", st)
		checkConservation(t, d)
		start := time.Now()
		q1Runs.open()
		waitAll(first, q1)
		assert.Less(t, time.Since(start), time.Minute, "q1 waited for the limiter's next token")
		r := outcome(t, q1)
		assert.Equal(t, StateSucceeded, r.State, "q1 ended %v after %d attempt(s): %v", r.State, r.Attempts, r.Err)
		assert.Equal(t, 1, r.Attempts)
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.CallbackPanics, "the hook's Goexit is counted")
	})
}

// The execution context each attempt gets (internal/execctx, made by
// newAttempt): these tests hold it to what a context.WithCancelCause child
// would do.

func TestExecContextCancelCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := errors.New("node deleted")
		type seen struct {
			err, cause, childCause error
			afterRan, stopped      bool
		}
		got := make(chan seen, 1)
		exec := func(ctx context.Context, _ string, _ int) error {
			child, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			var ran atomic.Bool
			context.AfterFunc(ctx, func() { ran.Store(true) })
			never := context.AfterFunc(ctx, func() { t.Error("a stopped AfterFunc ran") })
			stopped := never()
			<-ctx.Done()
			<-child.Done()
			synctest.Wait() // the AfterFunc goroutine
			got <- seen{ctx.Err(), context.Cause(ctx), context.Cause(child), ran.Load(), stopped}
			return ctx.Err()
		}
		d := newD(t, exec, Config[string, int]{Workers: 1})
		tk := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()
		require.True(t, d.Cancel("k", cause))
		s := <-got
		assert.ErrorIs(t, s.err, context.Canceled)
		assert.ErrorIs(t, s.cause, cause, "context.Cause reports the dispatcher's cause")
		assert.ErrorIs(t, s.childCause, cause, "a derived context inherits the cause")
		assert.True(t, s.afterRan, "AfterFunc ran on cancellation")
		assert.True(t, s.stopped, "stop before cancellation reports true")
		assert.Equal(t, StateCanceled, outcome(t, tk).State)
		closeD(t, d)
	})
}

func TestExecContextExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type seen struct {
			dl        time.Time
			ok        bool
			err, caus error
			idem      string
		}
		got := make(chan seen, 1)
		exec := func(ctx context.Context, _ string, _ int) error {
			dl, ok := ctx.Deadline()
			<-ctx.Done()
			got <- seen{dl, ok, ctx.Err(), context.Cause(ctx), IdempotencyKey(ctx)}
			return ctx.Err()
		}
		d := newD(t, exec, Config[string, int]{Workers: 1})
		deadline := time.Now().Add(time.Second)
		require.NoError(t, d.Post("k", 1, SubmitOptions{Deadline: deadline, IdempotencyKey: "op-1"}))
		s := <-got
		assert.True(t, s.ok)
		assert.True(t, s.dl.Equal(deadline), "Deadline is the waiters' deadline: %v, want %v", s.dl, deadline)
		assert.ErrorIs(t, s.err, context.DeadlineExceeded)
		assert.ErrorIs(t, s.caus, ErrExpired)
		assert.Equal(t, "op-1", s.idem)
		assert.True(t, time.Now().Equal(deadline), "cancelled at the deadline, not later")
		closeD(t, d)
	})
}

// TestExecContextClose: Close cancels a running execution with ErrClosed.
func TestExecContextClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := make(chan error, 1)
		exec := func(ctx context.Context, _ string, _ int) error {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return ctx.Err()
		}
		d := newD(t, exec, Config[string, int]{Workers: 1})
		require.NoError(t, d.Post("k", 1, SubmitOptions{}))
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.Error(t, d.Close(ctx))
		assert.ErrorIs(t, <-cause, ErrClosed)
	})
}

// TestExecContextKeptPastExec: every execution has a context of its own,
// done once exec returns with ErrAttemptEnded as its cause, and it stays so
// — never live again, never reporting another call's cause — while later
// calls run under their own, in both modes, with and without AttemptTimeout.
func TestExecContextKeptPastExec(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		for _, timeout := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%v/attempt_timeout=%v", mode, timeout), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { testExecContextKept(t, mode, timeout) })
			})
		}
	}
}

func testExecContextKept(t *testing.T, mode Mode, timeout time.Duration) {
	var mu sync.Mutex
	kept := map[string]context.Context{}
	exec := func(ctx context.Context, key string, wait bool) error {
		mu.Lock()
		kept[key] = ctx // handed on untouched, as to a goroutine
		mu.Unlock()
		if wait {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	d := newD(t, exec, Config[string, bool]{
		Workers: 1,
		Retry:   RetryPolicy{AttemptTimeout: timeout},
		Rollout: RolloutPolicy{Mode: mode},
	})
	post := func(key string, wait bool) <-chan error {
		errc := make(chan error, 1)
		go func() { errc <- d.Post(key, wait, SubmitOptions{}) }()
		synctest.Wait()
		return errc
	}
	require.NoError(t, <-post("first", false))
	cause := errors.New("the second call's own cause")
	second := post("second", true) // running, on the same worker in Async mode
	require.True(t, d.Cancel("second", cause))
	<-second
	require.NoError(t, <-post("third", false))
	synctest.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, kept, 3)
	for key, ctx := range kept {
		select {
		case <-ctx.Done():
		default:
			t.Errorf("%s: the context of a finished execution is not done", key)
		}
		assert.ErrorIs(t, ctx.Err(), context.Canceled, key)
		if key == "second" {
			assert.ErrorIs(t, context.Cause(ctx), cause, "%s: its own cause", key)
			continue
		}
		assert.ErrorIs(t, context.Cause(ctx), ErrAttemptEnded, key)
		assert.NotErrorIs(t, context.Cause(ctx), cause, "%s: another call's cause", key)
	}
	assert.NotSame(t, kept["first"], kept["second"])
	assert.NotSame(t, kept["second"], kept["third"])
	closeD(t, d)
}
