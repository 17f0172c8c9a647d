// Package benchmarks measures dispatch side by side with the queues a
// Kubernetes controller or scheduler would otherwise use: client-go's
// workqueue (plain and rate-limiting) and controller-runtime's priorityqueue.
// It is a nested module so that Kubernetes code never enters the core
// module's go.mod.
//
//	cd benchmarks
//	GOWORK=off go test -run '^$' -bench Compare -benchmem -count 6 > compare.txt
//	benchstat -col /impl compare.txt
//
// It also holds BenchmarkEndToEnd (e2e_test.go), whole runs from the first
// add until drained, side by side with the same queues; and BenchmarkStorm
// (storm_test.go), a scenario that runs in real time for minutes. -bench
// Compare leaves both out.
package benchmarks

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// levels is the number of priority classes the workload uses. dispatch and
// priorityqueue order by them; the workqueues are FIFO and ignore them.
const levels = 10

// target is one queue under test, behind the few operations the workload
// needs. Every queue is unnamed, so neither workqueue nor priorityqueue
// records Prometheus metrics (dispatch has none in its core): the numbers
// compare data structures and locking, not metrics.
type target struct {
	// add enqueues key at prio, or re-adds it if it is queued. Timed.
	add func(key string, prio int)
	// flush makes the adds so far take effect. Timed, once per batch. Only
	// priorityqueue needs it: its AddWithOpts appends to a buffer that a
	// goroutine of its own applies to the B-tree later.
	flush func()
	// drain takes len(keys) items out again, keys if the queue can remove by
	// key, its first items otherwise. Not timed.
	drain func(keys []string)
	depth func() int
	close func()
}

var prioPtrs = func() (p [levels]*int) {
	for i := range p {
		p[i] = new(i)
	}
	return p
}()

// targets builds every implementation, each with room for capacity keys.
// dispatch-submit has no op=readd: every re-add would hold one more live
// ticket, so the waiter bound would refuse it within a few hundred thousand
// iterations (the core module's BenchmarkSubmitCoalesce measures that path).
var targets = []struct {
	name   string
	new    func(capacity int) target
	noRead bool
}{
	{"dispatch", func(capacity int) target { return newDispatch(capacity, false) }, false},
	{"dispatch-submit", func(capacity int) target { return newDispatch(capacity, true) }, true},
	{"workqueue", newWorkqueue, false},
	{"ratelimiting", newRateLimiting, false},
	{"priorityqueue", func(int) target { return newPriorityQueue(true) }, false},
	{"priorityqueue-async", func(int) target { return newPriorityQueue(false) }, false},
}

// newDispatch returns a dispatcher whose one worker is parked in exec, so
// that everything added stays queued. withTicket uses Submit (one ticket per
// add) instead of the fire-and-forget Post.
func newDispatch(capacity int, withTicket bool) target {
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
	return target{
		add:   add,
		flush: func() {},
		drain: func(keys []string) {
			for _, k := range keys {
				d.Cancel(k, nil)
			}
		},
		depth: func() int { return d.Stats().Ready },
		close: func() {
			close(release)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = d.Close(ctx)
		},
	}
}

func newWorkqueue(int) target {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{})
	return target{
		add:   func(key string, _ int) { q.Add(key) },
		flush: func() {},
		drain: func(keys []string) {
			for range keys {
				k, _ := q.Get()
				q.Done(k)
			}
		},
		depth: q.Len,
		close: q.ShutDown,
	}
}

func newRateLimiting(int) target {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{})
	return target{
		add:   func(key string, _ int) { q.Add(key) },
		flush: func() {},
		drain: func(keys []string) {
			for range keys {
				k, _ := q.Get()
				q.Forget(k)
				q.Done(k)
			}
		},
		depth: q.Len,
		close: q.ShutDown,
	}
}

// newPriorityQueue returns controller-runtime's priorityqueue. With
// timedFlush the buffered adds are applied (Len flushes the buffer) inside
// the timer, so the time covers getting the items into the queue; without
// it only the caller's AddWithOpts is timed and the queue's own goroutine
// does the insertion on the other core, partly outside the measurement.
func newPriorityQueue(timedFlush bool) target {
	q := priorityqueue.New[string]("")
	flush := func() { q.Len() }
	if !timedFlush {
		flush = func() {}
	}
	return target{
		add: func(key string, prio int) {
			q.AddWithOpts(priorityqueue.AddOpts{Priority: prioPtrs[prio]}, key)
		},
		flush: flush,
		drain: func(keys []string) {
			q.Len() // apply what is still buffered before taking items out
			for range keys {
				k, _, _ := q.GetWithPriority()
				q.Done(k)
			}
		},
		depth: q.Len,
		close: q.ShutDown,
	}
}

func keyName(i int) string { return "default/pod-" + strconv.Itoa(i) }

// batchOf is how many timed adds run between two untimed drains: a tenth of
// the backlog, at most 1000.
func batchOf(queued int) int { return max(1, min(queued/10, 1000)) }

// BenchmarkCompare measures, for each implementation, adding a new key to a
// queue that already holds queued items (op=add), and re-adding a key that
// is already queued (op=readd: dispatch coalesces, the others deduplicate).
// For op=add the backlog is held steady: after every batch of timed adds the
// same number of items is taken out with the timer stopped.
func BenchmarkCompare(b *testing.B) {
	for _, tg := range targets {
		b.Run("impl="+tg.name, func(b *testing.B) {
			for _, queued := range []int{1_000, 100_000} {
				b.Run(fmt.Sprintf("op=add/queued=%d", queued), func(b *testing.B) {
					benchAdd(b, tg.new, queued)
				})
				if tg.noRead {
					continue
				}
				b.Run(fmt.Sprintf("op=readd/queued=%d", queued), func(b *testing.B) {
					benchReadd(b, tg.new, queued)
				})
			}
		})
	}
}

// fill adds keys 0..queued-1 and returns their priorities.
func fill(b *testing.B, t target, queued int) []int {
	r := rand.New(rand.NewPCG(1, 2))
	prios := make([]int, queued)
	for i := range prios {
		prios[i] = r.IntN(levels)
		t.add(keyName(i), prios[i])
	}
	t.flush()
	if n := t.depth(); n != queued {
		b.Fatalf("depth after fill = %d, want %d", n, queued)
	}
	runtime.GC() // settle the backlog's heap before anything is timed
	return prios
}

func benchAdd(b *testing.B, newTarget func(int) target, queued int) {
	batch := batchOf(queued)
	t := newTarget(queued + batch)
	defer t.close()
	prios := fill(b, t, queued)
	keys := make([]string, batch)
	next := queued
	nextKeys := func() {
		for j := range keys {
			keys[j] = keyName(next)
			next++
		}
	}
	nextKeys()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		t.add(keys[i%batch], prios[i%queued])
		i++
		if i%batch == 0 {
			t.flush()
			b.StopTimer()
			t.drain(keys)
			nextKeys()
			b.StartTimer()
		}
	}
	t.flush()
	t.drain(keys[:i%batch])
	if n := t.depth(); n != queued {
		b.Fatalf("depth drifted to %d, want %d", n, queued)
	}
}

func benchReadd(b *testing.B, newTarget func(int) target, queued int) {
	batch := batchOf(queued)
	t := newTarget(queued)
	defer t.close()
	prios := fill(b, t, queued)
	// Re-add queued keys in a random order, each at its own priority (a
	// higher one would legitimately cost a re-key).
	order := rand.New(rand.NewPCG(3, 4)).Perm(queued)
	keys := make([]string, queued)
	for i := range keys {
		keys[i] = keyName(i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := order[i%queued]
		t.add(keys[k], prios[k])
		i++
		if i%batch == 0 {
			t.flush()
		}
	}
	t.flush()
	if n := t.depth(); n != queued {
		b.Fatalf("depth changed to %d, want %d", n, queued)
	}
}

// TestTargets checks that every implementation does what the benchmark
// assumes: adds of new keys grow the queue, re-adds do not, drains shrink it.
func TestTargets(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			q := tg.new(20)
			defer q.close()
			for i := range 10 {
				q.add(keyName(i), i%levels)
			}
			q.flush()
			if n := q.depth(); n != 10 {
				t.Fatalf("depth after 10 adds = %d", n)
			}
			if !tg.noRead {
				for i := range 5 {
					q.add(keyName(i), i%levels)
				}
				q.flush()
				if n := q.depth(); n != 10 {
					t.Fatalf("depth after 5 re-adds = %d, want 10", n)
				}
			}
			extra := []string{keyName(10), keyName(11), keyName(12)}
			for _, k := range extra {
				q.add(k, 0)
			}
			q.flush()
			if n := q.depth(); n != 13 {
				t.Fatalf("depth after 3 new adds = %d, want 13", n)
			}
			q.drain(extra)
			if n := q.depth(); n != 10 {
				t.Fatalf("depth after draining 3 = %d, want 10", n)
			}
		})
	}
}
