package dispatch

import (
	"context"
	"runtime"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
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
