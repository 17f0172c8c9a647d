package writer_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// Priority sizes: a storm of routine status writes to stormObjects
// objects, each re-desired every stormRound, far beyond what the client's
// stormQPS lets through, so that hundreds of routine writes always wait;
// and flips Ready flips, one at a time, while it blows.
const (
	stormObjects = 300
	stormRound   = 100 * time.Millisecond
	stormQPS     = 20
	stormWorkers = 4
	flips        = 10
)

// testPriority: during a storm of routine writes at the client's QPS, a
// Ready flip lands within one token's wait. The writer takes each token
// before it chooses the write, so the flip takes the next token: the
// routine writes that reach the server after the flip was desired and
// before it are at most those already holding a token — one per worker
// at the most — where a queue in order would send the hundreds ahead of it
// first.
func testPriority(t *testing.T, st *stack) {
	ns := st.namespace(t, "priority")
	cfg := st.controller(t, ns)
	storm := st.createWidgets(t, ns, "routine", stormObjects)
	ready := st.createWidgets(t, ns, "ready", flips)
	w := newWriter(t, cfg, writer.Options[*U]{
		QPS: stormQPS, Burst: 1, Workers: stormWorkers,
		Classes: map[string]int{"ready": 10, "routine": 0},
	})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(stormRound)
		defer tick.Stop()
		for k := int64(0); ; k++ {
			for _, obj := range storm {
				if err := w.Set(obj, writer.Desire[*U]{Status: setStatus(map[string]any{"count": k})},
					writer.SetOptions{Class: "routine"}); err != nil {
					t.Errorf("routine desire: %v", err)
					return
				}
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	require.Eventually(t, func() bool { return w.Stats().Written >= 2*stormWorkers }, callTimeout, 10*time.Millisecond,
		"the storm did not start")

	isRoutine := func(r apiserver.Request) bool {
		return isStatusWrite(ns)(r) && r.Name != "" && r.Name[:len("routine")] == "routine"
	}
	overtook := make([]int, flips)
	latency := make([]time.Duration, flips)
	for f, obj := range ready {
		began := time.Now()
		tk, err := w.Submit(t.Context(), obj, writer.Desire[*U]{Status: setStatus(map[string]any{"ready": "True"})},
			writer.SetOptions{Class: "ready"})
		require.NoError(t, err)
		res := wait(t, tk)
		latency[f] = time.Since(began)
		require.Equal(t, dispatch.StateSucceeded, res.State, "%s: %v", obj.GetName(), res.Err)
		flip := st.Proxy.Filter(func(r apiserver.Request) bool { return isStatusWrite(ns)(r) && r.Name == obj.GetName() })
		require.Len(t, flip, 1, obj.GetName())
		for _, r := range st.Proxy.Filter(isRoutine) {
			if r.Received.After(began) && r.Received.Before(flip[0].Received) {
				overtook[f]++
			}
		}
		assert.LessOrEqual(t, overtook[f], stormWorkers,
			"%s: routine writes reached the server after the flip was desired and before it", obj.GetName())
	}
	queued := w.Stats().Dispatch.Ready
	assert.Greater(t, queued, 10*stormWorkers, "the storm left few routine writes waiting: it proves nothing")
	sorted := slices.Clone(latency)
	slices.Sort(sorted)
	t.Logf("%d Ready flips during a storm at %d QPS (a token each %v) with %d routine writes waiting: "+
		"routine writes overtaking each flip %v; desire to landed median %v, max %v",
		flips, stormQPS, time.Second/stormQPS, queued, overtook,
		sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
}
