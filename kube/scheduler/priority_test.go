package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestBindingBeforeStorm: a binding added while a storm of status patches
// is queued runs before every patch queued ahead of it — at once on a
// reserved worker, or on the next free worker without one — where
// upstream's FIFO runs it after all of them (kubernetes#135900). Under
// synctest's clock, with a 10ms API.
func TestBindingBeforeStorm(t *testing.T) {
	const (
		patches = 200
		latency = 10 * time.Millisecond
		workers = 4
	)
	for _, tc := range []struct {
		name     string
		reserved int
		maxWait  time.Duration // the binding's wait for a worker
	}{
		{"reserved workers", 0, 0},
		{"no reserved workers", -1, latency},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newTestDispatcher(t, Options{Workers: workers, ReservedWorkers: tc.reserved})
				j := &journal{}
				var mu sync.Mutex
				var patchStarts []time.Time
				slow := func(ctx context.Context, c *testCall) error {
					if c.typ == PodStatusPatch {
						mu.Lock()
						patchStarts = append(patchStarts, time.Now())
						mu.Unlock()
					}
					select {
					case <-time.After(latency):
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				for i := range patches {
					c := newCall(j, fmt.Sprintf("patch%d", i), PodStatusPatch, typeUID(fmt.Sprint(i)), "PodScheduled")
					c.exec = slow
					require.NoError(t, d.Add(c, fwk.APICallOptions{}))
				}
				time.Sleep(5 * latency / 2) // the storm is running
				added := time.Now()
				var started time.Time
				var behind int
				bind := newCall(j, "bind", PodBinding, "bound-pod", "node")
				bind.exec = func(ctx context.Context, c *testCall) error {
					started, behind = time.Now(), d.Stats().Ready
					return slow(ctx, c)
				}
				tk, err := d.Submit(bind, fwk.APICallOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				require.NoError(t, res.Err)

				assert.LessOrEqual(t, started.Sub(added), tc.maxWait, "the binding waited for a worker, not for the storm")
				mu.Lock()
				overtook := 0
				for _, at := range patchStarts {
					if at.After(added) && at.Before(started) {
						overtook++
					}
				}
				mu.Unlock()
				assert.Zero(t, overtook, "no patch started between the binding's Add and its start")
				assert.Greater(t, behind, patches-4*workers, "the storm was still queued when the binding ran")
			})
		})
	}
}

// TestAgingLetsPatchesThrough: with a steady stream of bindings, a status
// patch queued behind them still runs within about (10−0+1) aging
// intervals, because it gains one priority level per interval.
func TestAgingLetsPatchesThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const aging = 10 * time.Millisecond
		d := newTestDispatcher(t, Options{Workers: 1, Aging: aging})
		j := &journal{}
		busy := func(ctx context.Context, c *testCall) error {
			time.Sleep(aging / 2)
			return nil
		}
		patch := newCall(j, "patch", PodStatusPatch, "p", "PodScheduled")
		patch.exec = busy
		bind := func(i int) {
			c := newCall(j, fmt.Sprintf("bind%d", i), PodBinding, typeUID(fmt.Sprint(i)), "node")
			c.exec = busy
			require.NoError(t, d.Add(c, fwk.APICallOptions{}))
		}
		bind(0)
		ch := make(chan error, 1)
		require.NoError(t, d.Add(patch, fwk.APICallOptions{OnFinish: ch}))
		added := time.Now()
		for i := 1; ; i++ {
			bind(i) // two bindings per aging interval: always one waiting
			time.Sleep(aging / 2)
			select {
			case err := <-ch:
				require.NoError(t, err)
				waited := time.Since(added)
				assert.LessOrEqual(t, waited, (DefaultBindingPriority-DefaultPriority+2)*aging, "aging bounds the patch's wait")
				assert.Greater(t, waited, aging, "bindings went first while the patch was young")
				return
			default:
			}
			require.Less(t, i, 1000, "the patch starved")
		}
	})
}

// TestStrictPriority: StrictPriority runs every binding before the patch.
func TestStrictPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newIdleDispatcher(t, Options{Workers: 1, StrictPriority: true})
		j := &journal{}
		require.NoError(t, d.Add(newCall(j, "patch", PodStatusPatch, "p", "x"), fwk.APICallOptions{}))
		for i := range 5 {
			require.NoError(t, d.Add(newCall(j, fmt.Sprintf("bind%d", i), PodBinding, typeUID(fmt.Sprint(i)), "x"), fwk.APICallOptions{}))
		}
		time.Sleep(time.Minute) // aging would have lifted the patch long ago
		d.Start(testLogger(t))
		synctest.Wait()
		order := j.only("execute")
		require.Len(t, order, 6)
		assert.Equal(t, "execute patch", order[5])
		assert.Equal(t, dispatch.Async, d.Mode())
	})
}
