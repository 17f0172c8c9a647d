package dispatch

import (
	"context"
	"math"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// liveHeapAfterDeriving derives n contexts from parent, cancelling each at
// once (the usual `ctx, cancel := context.WithTimeout(ctx, …); defer
// cancel()` of one request among many), and returns how much the live heap
// grew, after a GC.
func liveHeapAfterDeriving(parent context.Context, n int) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		_, cancel := context.WithCancel(parent)
		cancel()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// TestDerivedContextsLetGo pins that exec's context lets go of a context
// derived from it once that one is cancelled, as a context.WithCancelCause
// parent would (ExecFunc: exec's ctx behaves as such a context, and
// contexts derived from it need no goroutine): a long execution that
// derives one per request does not hold every one until it returns.
func TestDerivedContextsLetGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 50000
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		stdlib := liveHeapAfterDeriving(parent, n)
		grew := make(chan int64, 1)
		d := newD(t, func(ctx context.Context, _ string, _ int) error {
			grew <- liveHeapAfterDeriving(ctx, n)
			return nil
		}, Config[string, int]{Workers: 1})
		tk := submit(t, d, "k", 1, SubmitOptions{})
		g := <-grew
		waitAll(tk)
		assert.Equal(t, StateSucceeded, outcome(t, tk).State)
		// Noise allowance: 16 bytes a context; one held costs over 100.
		assert.LessOrEqual(t, g, stdlib+n*16,
			"live heap after %d contexts derived from exec's and cancelled: %d B (from a context.WithCancelCause: %d B)", n, g, stdlib)
		closeD(t, d)
	})
}

// TestFarDeadlineExecContext: a waiter's deadline past the year 2262 (a
// Timeout of the largest Duration, or a context's deadline that far) gives
// exec a context whose deadline is far off too, never one long past: a
// context exec derives with a timeout of its own, and
// RetryPolicy.AttemptTimeout, still end the attempt on time.
func TestFarDeadlineExecContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		far, cancel := context.WithTimeout(bg, time.Duration(math.MaxInt64))
		defer cancel()
		for name, sub := range map[string]struct {
			ctx context.Context
			o   SubmitOptions
		}{
			"Timeout":  {bg, SubmitOptions{Timeout: time.Duration(math.MaxInt64)}},
			"Deadline": {bg, SubmitOptions{Deadline: time.Now().AddDate(300, 0, 0)}},
			"context":  {far, SubmitOptions{}},
		} {
			start := time.Now()
			var deadline time.Time
			d := newD(t, func(ctx context.Context, _ string, _ int) error {
				deadline, _ = ctx.Deadline()
				req, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				<-req.Done()
				return nil
			}, Config[string, int]{})
			tk, err := d.Submit(sub.ctx, "k", 1, sub.o)
			require.NoError(t, err, name)
			time.Sleep(time.Second)
			synctest.Wait()
			r, ok := tk.Result()
			require.True(t, ok, "%s: the request's one-second timeout did not end it", name)
			assert.Equal(t, StateSucceeded, r.State, name)
			assert.True(t, deadline.After(start.AddDate(200, 0, 0)), "%s: exec's deadline %v", name, deadline)

			// An AttemptTimeout ends the attempt too.
			d2 := newD(t, func(ctx context.Context, _ string, _ int) error {
				<-ctx.Done()
				return ctx.Err()
			}, Config[string, int]{Retry: RetryPolicy{MaxAttempts: 1, AttemptTimeout: time.Second}})
			tk2, err := d2.Submit(sub.ctx, "k", 1, sub.o)
			require.NoError(t, err, name)
			time.Sleep(time.Second)
			synctest.Wait()
			r2, ok := tk2.Result()
			require.True(t, ok, "%s: AttemptTimeout did not end the attempt", name)
			assert.Equal(t, StateFailed, r2.State, name)
			closeD(t, d)
			closeD(t, d2)
		}
	})
}
