package crqueue

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// BenchmarkScale runs the core's BenchmarkScale (the root module's
// scale_test.go) against controller-runtime's priorityqueue, under the
// same names: queued distinct int keys, priorities drawn from 10 levels,
// at sizes 1 000, 100 000 and 1 000 000. op=post adds a new key into the
// backlog, and its buffered insertion (Len applies it) is timed with it;
// it reports B/queued, the heap the backlog holds per item after a GC.
// op=cycle is one worker's GetWithPriority, Done and the add of a new key
// that keeps the backlog at its size. The queue has no deadlines: only
// deadline=none applies. A batch of adds is taken out again (the best
// items, Get and Done) with the timer stopped, so the backlog stays steady.
func BenchmarkScale(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		prios := benchPrios(2 * n)
		add := func(q priorityqueue.PriorityQueue[int], k int) {
			q.AddWithOpts(priorityqueue.AddOpts{Priority: &prios[k%len(prios)]}, k)
		}
		name := fmt.Sprintf("impl=priorityqueue/queued=%d/deadline=none", n)
		b.Run(name+"/op=post", func(b *testing.B) {
			debug.FreeOSMemory()
			before := heapAlloc()
			q := priorityqueue.New[int]("")
			defer q.ShutDown()
			for k := range n {
				add(q, k)
			}
			q.Len() // applies the buffered adds
			held := heapAlloc() - before
			batch := max(1, min(n/10, 1000))
			b.ReportAllocs()
			i, lo := 0, 0
			for b.Loop() {
				add(q, n+i)
				q.Len()
				i++
				if i-lo == batch {
					b.StopTimer()
					for ; lo < i; lo++ {
						k, _, _ := q.GetWithPriority()
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
			q := priorityqueue.New[int]("")
			for k := range n {
				add(q, k)
			}
			q.Len()
			debug.FreeOSMemory()
			done := make(chan struct{})
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				defer close(done)
				for i := range b.N {
					k, _, _ := q.GetWithPriority()
					add(q, n+i) // a new key, added while k is processed, as the dispatcher's exec does
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

// benchPrios returns n priorities drawn uniformly from [0, 10), from a
// fixed seed, as the core's benchmarks draw them.
func benchPrios(n int) []int {
	r := rand.New(rand.NewPCG(1, 10))
	p := make([]int, n)
	for i := range p {
		p[i] = r.IntN(10)
	}
	return p
}

// heapAlloc is the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
