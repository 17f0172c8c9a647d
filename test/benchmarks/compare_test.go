// Package benchmarks measures dispatch side by side with the queues a
// Kubernetes controller or scheduler would otherwise use: client-go's
// workqueue (plain and rate-limiting) and kube-scheduler's APIDispatcher.
// It is a nested module so that Kubernetes code never enters the core
// module's go.mod. controller-runtime's priorityqueue runs the same
// benchmarks, under the same names, in test/crqueue, a module of its own
// (controller-runtime never shares a module with k8s.io/kubernetes); the
// harness both run is test/queuebench.
//
//	(cd test/benchmarks && go test -run '^$' -bench Compare -benchmem -count 6 .) > compare.txt
//	(cd test/crqueue && go test -run '^$' -bench Compare -benchmem -count 6 .) >> compare.txt
//	benchstat -ignore pkg -col /impl compare.txt
//
// It also holds BenchmarkEndToEnd (e2e_test.go), whole runs from the first
// add until drained, side by side with the same queues; and BenchmarkStorm
// (storm_test.go), a scenario that runs in real time for minutes. -bench
// Compare leaves both out.
package benchmarks

import (
	"context"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/test/queuebench"
	"k8s.io/client-go/util/workqueue"
)

// targets are the implementations in this module; queuebench.Compare
// describes the workload. dispatch-submit has no op=readd: every re-add
// would hold one more live ticket, so the waiter bound would refuse it
// within a few hundred thousand iterations (the core module's
// BenchmarkSubmitCoalesce measures that path). Every queue is unnamed, so
// the workqueues record no Prometheus metrics (dispatch has none in its
// core).
var targets = []queuebench.CompareImpl{
	{Name: "dispatch", New: func(capacity int) queuebench.Target { return newDispatch(capacity, false) }},
	{Name: "dispatch-submit", New: func(capacity int) queuebench.Target { return newDispatch(capacity, true) }, NoReadd: true},
	{Name: "workqueue", New: newWorkqueue},
	{Name: "ratelimiting", New: newRateLimiting},
}

// newDispatch returns a dispatcher whose one worker is parked in exec, so
// that everything added stays queued. withTicket uses Submit (one ticket per
// add) instead of the fire-and-forget Post.
func newDispatch(capacity int, withTicket bool) queuebench.Target {
	release := make(chan struct{})
	exec := func(ctx context.Context, _ string, _ int) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	d, err := dispatch.New(exec, dispatch.Config[string, int]{Workers: 1, Capacity: capacity + 1})
	if err != nil {
		panic(err)
	}
	if err := d.Post("", 0, dispatch.SubmitOptions{}); err != nil {
		panic(err)
	}
	for d.Stats().InFlight != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	add := func(key string, prio int) {
		if err := d.Post(key, prio, dispatch.SubmitOptions{Priority: prio}); err != nil {
			panic(err)
		}
	}
	if withTicket {
		ctx := context.Background()
		add = func(key string, prio int) {
			if _, err := d.Submit(ctx, key, prio, dispatch.SubmitOptions{Priority: prio}); err != nil {
				panic(err)
			}
		}
	}
	return queuebench.Target{
		Add:   add,
		Flush: func() {},
		Drain: func(keys []string) {
			for _, k := range keys {
				d.Cancel(k, nil)
			}
		},
		Depth: func() int { return d.Stats().Ready },
		Close: func() {
			close(release)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = d.Close(ctx)
		},
	}
}

func newWorkqueue(int) queuebench.Target {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{})
	return queuebench.Target{
		Add:   func(key string, _ int) { q.Add(key) },
		Flush: func() {},
		Drain: func(keys []string) {
			for range keys {
				k, _ := q.Get()
				q.Done(k)
			}
		},
		Depth: q.Len,
		Close: q.ShutDown,
	}
}

func newRateLimiting(int) queuebench.Target {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{})
	return queuebench.Target{
		Add:   func(key string, _ int) { q.Add(key) },
		Flush: func() {},
		Drain: func(keys []string) {
			for range keys {
				k, _ := q.Get()
				q.Forget(k)
				q.Done(k)
			}
		},
		Depth: q.Len,
		Close: q.ShutDown,
	}
}

// BenchmarkCompare measures, for each implementation, adding a new key to a
// queue that already holds queued items (op=add), and re-adding a key that
// is already queued (op=readd: dispatch coalesces, the others deduplicate).
func BenchmarkCompare(b *testing.B) {
	queuebench.Compare(b, targets...)
}

// TestTargets checks that every implementation does what the benchmark
// assumes: adds of new keys grow the queue, re-adds do not, drains shrink it.
func TestTargets(t *testing.T) {
	queuebench.CheckTargets(t, targets...)
}
