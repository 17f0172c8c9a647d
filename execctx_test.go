package dispatch

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The execution context is the dispatcher's own type (execctx.go). These
// tests hold it to what a context.WithCancelCause child would do.

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

// TestExecContextReuse: a worker reuses the context of an execution that
// never looked at it, and only that: a context exec looked at, or one that
// carries a deadline or an idempotency key, stays cancelled for whoever
// kept it.
func TestExecContextReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type call struct {
			look bool
		}
		var ctxs []context.Context
		exec := func(ctx context.Context, _ string, c call) error {
			ctxs = append(ctxs, ctx) // one worker: no race
			if c.look {
				_ = ctx.Err()
			}
			return nil
		}
		d := newD(t, exec, Config[string, call]{Workers: 1})
		run := func(c call, o SubmitOptions) {
			require.NoError(t, d.Post("k", c, o))
			synctest.Wait()
		}
		run(call{}, SubmitOptions{})
		run(call{}, SubmitOptions{})
		assert.Same(t, ctxs[0], ctxs[1], "an untouched context is reused")
		run(call{look: true}, SubmitOptions{})
		assert.Same(t, ctxs[1], ctxs[2], "reused once more; this time exec looks")
		run(call{}, SubmitOptions{})
		assert.NotSame(t, ctxs[2], ctxs[3], "a context exec looked at is never reused")
		assert.ErrorIs(t, ctxs[2].Err(), context.Canceled, "and stays cancelled after its attempt")
		run(call{}, SubmitOptions{IdempotencyKey: "a"})
		run(call{}, SubmitOptions{Deadline: time.Now().Add(time.Hour)})
		assert.NotSame(t, ctxs[3], ctxs[4], "a call with an idempotency key gets its own")
		assert.NotSame(t, ctxs[3], ctxs[5], "a call with a deadline gets its own")
		assert.NotSame(t, ctxs[4], ctxs[5])
		run(call{}, SubmitOptions{})
		assert.Same(t, ctxs[3], ctxs[6], "the spare stays the worker's last reusable one")
		for _, i := range []int{4, 5} {
			assert.Error(t, ctxs[i].Err(), "ctx %d: ended with its attempt", i)
		}
		assert.Equal(t, "a", IdempotencyKey(ctxs[4]), "what it carries stays with it")
		closeD(t, d)
	})
}
