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
	"k8s.io/client-go/kubernetes/fake"
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
				d := newTestDispatcher(t, Options{Workers: workers, Start: dispatch.StartPolicy{ReservedWorkers: tc.reserved}})
				j := &journal{}
				var mu sync.Mutex
				var patchStarts []time.Time
				slow := func(ctx context.Context, c *testCall) error {
					if c.typ == podStatusPatch {
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
					c := newCall(j, fmt.Sprintf("patch%d", i), podStatusPatch, typeUID(fmt.Sprint(i)), "PodScheduled")
					c.exec = slow
					require.NoError(t, d.Add(c, fwk.APICallOptions{}))
				}
				time.Sleep(5 * latency / 2) // the storm is running
				added := time.Now()
				var started time.Time
				var behind int
				bind := newCall(j, "bind", podBinding, "bound-pod", "node")
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

// TestAgingWithinBand: a call ages past calls of a higher priority in its
// own band. A plugin's type at 5 shares status patches' band [0, 10): with a
// steady stream of its calls, a status patch queued behind them still runs
// within about (5−0+1) aging intervals.
func TestAgingWithinBand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const aging = 10 * time.Millisecond
		const plugin fwk.APICallType = "plugin_call"
		d := newTestDispatcher(t, Options{Workers: 1, Aging: aging, Priorities: map[fwk.APICallType]int{plugin: 5}})
		j := &journal{}
		busy := func(ctx context.Context, c *testCall) error {
			time.Sleep(aging / 2)
			return nil
		}
		patch := newCall(j, "patch", podStatusPatch, "p", "PodScheduled")
		patch.exec = busy
		call := func(i int) {
			c := newCall(j, fmt.Sprintf("plugin%d", i), plugin, typeUID(fmt.Sprint(i)), "x")
			c.exec = busy
			require.NoError(t, d.Add(c, fwk.APICallOptions{}))
		}
		call(0)
		ch := make(chan error, 1)
		require.NoError(t, d.Add(patch, fwk.APICallOptions{OnFinish: ch}))
		added := time.Now()
		for i := 1; ; i++ {
			call(i) // two calls per aging interval: always one waiting
			time.Sleep(aging / 2)
			select {
			case err := <-ch:
				require.NoError(t, err)
				waited := time.Since(added)
				assert.LessOrEqual(t, waited, (5-0+2)*aging, "aging bounds the patch's wait")
				assert.Greater(t, waited, aging, "the plugin's calls went first while the patch was young")
				return
			default:
			}
			require.Less(t, i, 1000, "the patch starved")
		}
	})
}

// TestBandsNeverOvertake: by default every call type has a band of its
// own, so no amount of waiting lifts a call past one of a more urgent type:
// while bindings keep coming, a plugin's call and a status patch wait, and
// they run, the plugin's first, as soon as no binding is ready.
func TestBandsNeverOvertake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const aging = 10 * time.Millisecond
		d := newTestDispatcher(t, Options{Workers: 1, Aging: aging})
		j := &journal{}
		busy := func(ctx context.Context, c *testCall) error {
			time.Sleep(aging / 2)
			return nil
		}
		bind := func(i int) {
			c := newCall(j, fmt.Sprintf("bind%d", i), podBinding, typeUID(fmt.Sprint(i)), "node")
			c.exec = busy
			require.NoError(t, d.Add(c, fwk.APICallOptions{}))
		}
		bind(0)
		patch := newCall(j, "patch", podStatusPatch, "p", "PodScheduled")
		plugin := newCall(j, "plugin", "plugin_call", "q", "x")
		require.NoError(t, d.Add(patch, fwk.APICallOptions{}))
		require.NoError(t, d.Add(plugin, fwk.APICallOptions{}))
		const bindings = 200 // 100 aging intervals: far past any band's width
		for i := 1; i < bindings; i++ {
			bind(i)
			time.Sleep(aging / 2)
		}
		synctest.Wait()
		time.Sleep(aging) // the last binding ends
		synctest.Wait()
		order := j.only("execute")
		require.Len(t, order, bindings+2)
		assert.Equal(t, []string{"execute plugin", "execute patch"}, order[bindings:], "after every binding, the plugin's call (band 1) before the patch (band 0)")
	})
}

// TestStrictPriority: with AgingBand 1 every priority is a band of its
// own: a plugin's calls in the status patch's band, at 5, all run before
// the patch, however long it has waited.
func TestStrictPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const plugin fwk.APICallType = "plugin_call"
		d := newIdleDispatcher(t, Options{Workers: 1, AgingBand: 1, Priorities: map[fwk.APICallType]int{plugin: 5}})
		j := &journal{}
		require.NoError(t, d.Add(newCall(j, "patch", podStatusPatch, "p", "x"), fwk.APICallOptions{}))
		for i := range 5 {
			require.NoError(t, d.Add(newCall(j, fmt.Sprintf("plugin%d", i), plugin, typeUID(fmt.Sprint(i)), "x"), fwk.APICallOptions{}))
		}
		time.Sleep(time.Minute) // aging would have lifted the patch long ago
		d.Start(testLogger(t))
		synctest.Wait()
		order := j.only("execute")
		require.Len(t, order, 6)
		assert.Equal(t, "execute patch", order[5])
		assert.Equal(t, dispatch.ModeAsync, d.Mode())
	})
}

// TestPriorityOptions: the default priorities and reservation, and the
// priorities New refuses.
func TestPriorityOptions(t *testing.T) {
	s, err := Options{}.resolve()
	require.NoError(t, err)
	assert.Equal(t, 20, s.priority(podBinding))
	assert.Equal(t, 10, s.priority("plugin_call"))
	assert.Equal(t, 0, s.priority(podStatusPatch))
	assert.Equal(t, 16/4, s.reserved)
	assert.Equal(t, dispatch.StartPolicy{ReservedWorkers: 16 / 4, UrgentPriority: 20}, s.start, "kept for the binding's band")
	assert.Equal(t, 16, s.workers)
	assert.Equal(t, 10, s.band)
	assert.Equal(t, 5*time.Minute, s.deflt)
	assert.False(t, s.options(podBinding).Droppable)
	assert.True(t, s.options("plugin_call").Droppable)

	s, err = Options{Priorities: map[fwk.APICallType]int{podBinding: 25, "above": 31, "below": 19}}.resolve()
	require.NoError(t, err)
	assert.False(t, s.options("above").Droppable, "a band above the binding's is kept")
	assert.True(t, s.options("below").Droppable, "a band below the binding's is droppable")

	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"a patch in the binding's band", Options{Priorities: map[fwk.APICallType]int{podStatusPatch: 21, podBinding: 25}},
			"put pod_status_patch (21) below pod_binding (25) in one priority band (of 10)"},
		{"a wide band", Options{AgingBand: 100},
			"below pod_binding (20) in one priority band (of 100)"},
		{"unknown types in the binding's band", Options{Priorities: map[fwk.APICallType]int{podBinding: 15}},
			"put a plugin's type (by default) (10) below pod_binding (15)"},
		{"every worker reserved", Options{Workers: 4, Start: dispatch.StartPolicy{ReservedWorkers: 4}},
			"scheduler: Options.Start.ReservedWorkers: 4 must be in [0, Workers) = [0, 4)"},
		{"a negative band", Options{AgingBand: -1}, "AgingBand -1 must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(fake.NewClientset(), testRelevances, tc.o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = New(fake.NewClientset(), testRelevances, Options{Priorities: map[fwk.APICallType]int{podStatusPatch: 21, podBinding: 35}})
	assert.NoError(t, err, "a patch below the binding, in a band of its own")
}
