package scheduler

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestLowestPriorities: priorities at the bottom of the int range, where a
// band's first priority lies below it, work as any others. The adapter used
// to compute the binding band's start as band × width, which wraps for the
// lowest eight ints: New failed naming Config.Start.UrgentPriority, and with
// no reserved workers the wrapped value marked every call droppable, so a
// queued binding was shed for another object's call.
func TestLowestPriorities(t *testing.T) {
	for off := range 12 {
		p := math.MinInt + off
		t.Run(fmt.Sprintf("MinInt+%d", off), func(t *testing.T) {
			prios := map[fwk.APICallType]int{podBinding: p, podStatusPatch: math.MaxInt}
			d := newIdleDispatcher(t, Options{Priorities: prios, Start: dispatch.StartPolicy{ReservedWorkers: -1}, Capacity: 1})
			j := &journal{}
			require.NoError(t, d.Add(newCall(j, "bind", podBinding, typeUID("1"), "x"), fwk.APICallOptions{}))
			err := d.Add(newCall(j, "patch", podStatusPatch, typeUID("2"), "x"), fwk.APICallOptions{})
			assert.True(t, errors.Is(err, dispatch.ErrBackpressure), "a full dispatcher sheds no binding: %v", err)
			assert.Zero(t, d.Stats().Shed[dispatch.BoundCapacity], "calls shed")

			_, err = New(fake.NewClientset(), testRelevances, Options{Priorities: prios})
			require.NoError(t, err, "with reserved workers")
		})
	}
}

// TestLargeParallelism: kube-scheduler accepts any positive parallelism and
// hands it over as Workers; beyond the most the core runs, it is clamped.
func TestLargeParallelism(t *testing.T) {
	for _, w := range []int{1 << 16, 1<<16 + 1, 100_000, math.MaxInt} {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			d := newIdleDispatcher(t, Options{Workers: w})
			assert.Equal(t, 1<<16, d.Stats().Concurrency)
		})
	}
}

// TestBadOptionsNameTheirField: a setting New passes to the core as it is
// is refused naming the Options field the caller set, not the
// dispatch.Config field it went to.
func TestBadOptionsNameTheirField(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Aging: -time.Second}, "scheduler: Options.Aging: -1s must not be negative"},
		{Options{Retry: dispatch.RetryPolicy{MaxAttempts: -1}}, "scheduler: Options.Retry.MaxAttempts: -1 must be at least 1"},
		{Options{Retry: dispatch.RetryPolicy{Jitter: 7}}, "scheduler: Options.Retry.Jitter: 7 is not a Jitter"},
		{Options{Breaker: &dispatch.BreakerPolicy{FailureRatio: 2}}, "scheduler: Options.Breaker.FailureRatio: 2 must be in (0, 1] or +Inf"},
		{Options{Rollout: dispatch.RolloutPolicy{Mode: 9}}, "scheduler: Options.Rollout.Mode: mode_9 is not a Mode"},
		{Options{Start: dispatch.StartPolicy{ReservedWorkers: 100}}, "scheduler: Options.Start.ReservedWorkers: 100 must be in [0, Workers) = [0, 16)"},
		{Options{Start: dispatch.StartPolicy{DeadlineQuantile: 2}}, "scheduler: Options.Start.DeadlineQuantile: 2 must be in [0, 1]"},
		{Options{Tenants: map[fwk.APICallType]dispatch.TenantConfig{"plugin_call": {Weight: -1}}}, `scheduler: Options.Tenants["plugin_call"].Weight: -1 must not be negative`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := New(fake.NewClientset(), testRelevances, tc.o)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tc.want), "%q names the field set", err)
			assert.NotContains(t, err.Error(), "Config.")
		})
	}
}
