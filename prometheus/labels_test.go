package dispatchprom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRejectReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&dispatch.BackpressureError{Bound: dispatch.BoundCapacity, Depth: 3}, "capacity"},
		{&dispatch.BackpressureError{Bound: dispatch.BoundWaiters}, "waiters"},
		{fmt.Errorf("wrapped: %w", &dispatch.BackpressureError{Bound: dispatch.BoundQuota}), "quota"},
		{&dispatch.BackpressureError{Bound: "something new 42"}, "backpressure"},
		{dispatch.ErrBackpressure, "backpressure"},
		{dispatch.ErrClosed, "closed"},
		{dispatch.ErrCircuitOpen, "circuit"},
		{fmt.Errorf("%w: generation is older", dispatch.ErrStale), "stale"},
		{dispatch.ErrExpired, "expired"},
		{fmt.Errorf("%w: merge said no: %w", dispatch.ErrMergeRejected, errors.New("key-123 conflicts")), "merge"},
		{fmt.Errorf("%w: %w", dispatch.ErrCanceled, context.Canceled), "canceled"},
		{errors.New("pod default/web-7f9c is gone"), "other"},
		{nil, "other"},
	} {
		t.Run(fmt.Sprint(tc.err), func(t *testing.T) {
			assert.Equal(t, tc.want, rejectReason(tc.err))
		})
	}
}

func TestSwitchReason(t *testing.T) {
	for _, r := range []string{"manual", "cool_down", "backlog", "failure_ratio", "queue_wait", "circuit_open"} {
		assert.Equal(t, r, switchReason(r))
	}
	assert.Equal(t, "other", switchReason("backlog 1200 > 1000"))
	assert.Equal(t, "other", switchReason(""))
}

func TestDropReason(t *testing.T) {
	assert.Equal(t, "capacity", dropReason(dispatch.BoundCapacity))
	assert.Equal(t, "quota", dropReason(dispatch.BoundQuota))
	assert.Equal(t, "other", dropReason("evicted key 42"))
}

func TestResultNames(t *testing.T) {
	want := map[dispatch.State]string{
		dispatch.StateSucceeded: "succeeded", dispatch.StateSkipped: "skipped", dispatch.StateFailed: "failed",
		dispatch.StateCanceled: "canceled", dispatch.StateExpired: "expired", dispatch.StateDropped: "dropped",
		dispatch.StateStale: "stale", dispatch.StateClosed: "closed",
	}
	for s, name := range want {
		assert.Equal(t, name, result(s))
	}
	assert.Equal(t, "unknown", result(0))
	assert.Equal(t, "unknown", result(dispatch.StateClosed+1))
	assert.Equal(t, "unknown", breakerValue(dispatch.CircuitHalfOpen+1))
	assert.Equal(t, "unknown", modeValue(dispatch.ModeSync+1))
}

func TestBoundedConcurrent(t *testing.T) {
	b := &bounded{max: 10}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				v := strconv.Itoa((g*100 + i) % 37)
				got := b.value(v)
				if got != v {
					assert.Equal(t, overflow, got)
				}
			}
		})
	}
	wg.Wait()
	n := 0
	b.each(func(string) { n++ })
	require.Equal(t, 10, n)

	unbounded := &bounded{max: -1}
	for i := range 1000 {
		require.Equal(t, strconv.Itoa(i), unbounded.value(strconv.Itoa(i)))
	}
}
