package scheduler

import (
	"errors"
	"fmt"
	"math"
	"testing"

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
