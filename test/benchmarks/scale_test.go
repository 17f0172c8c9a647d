package benchmarks

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/coalescer/dispatch/test/queuebench"
	"k8s.io/client-go/util/workqueue"
)

// BenchmarkScale runs the core's BenchmarkScale (the root module's
// scale_test.go) against client-go's workqueue, under the same names:
// queued distinct int keys, at sizes 1 000, 100 000 and 1 000 000.
// op=post adds a new key into the backlog (and reports B/queued, the heap
// the backlog holds per item after a GC); op=cycle is one worker's Get,
// Done and the Add of a new key that keeps the backlog at its size. The
// workqueue is a FIFO: it takes no priority and no deadline, so only
// deadline=none applies. A batch of adds is taken out again (Get and Done,
// from the front) with the timer stopped, so the backlog stays steady.
func BenchmarkScale(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		name := fmt.Sprintf("impl=workqueue/queued=%d/deadline=none", n)
		b.Run(name+"/op=post", func(b *testing.B) {
			debug.FreeOSMemory()
			before := heapAlloc()
			q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[int]{})
			defer q.ShutDown()
			for k := range n {
				q.Add(k)
			}
			held := heapAlloc() - before
			b.ReportAllocs()
			i, lo := 0, 0
			for b.Loop() {
				q.Add(n + i)
				i++
				if i-lo == queuebench.BatchOf(n) {
					b.StopTimer()
					for ; lo < i; lo++ {
						k, _ := q.Get()
						q.Done(k)
					}
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(held)/float64(n), "B/queued")
			if q.Len() < n {
				b.Fatalf("backlog drifted: %d, want at least %d", q.Len(), n)
			}
		})
		b.Run(name+"/op=cycle", func(b *testing.B) {
			q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[int]{})
			for k := range n {
				q.Add(k)
			}
			debug.FreeOSMemory()
			done := make(chan struct{})
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				defer close(done)
				for i := range b.N {
					k, _ := q.Get()
					q.Add(n + i) // a new key, added while k is processed, as the dispatcher's exec does
					q.Done(k)
				}
			}()
			<-done
			b.StopTimer()
			q.ShutDown()
		})
		debug.FreeOSMemory()
	}
}

// heapAlloc is the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
