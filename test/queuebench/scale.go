package queuebench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"testing"
)

// ScaleQueue is one queue under BenchmarkScale, holding distinct int keys.
type ScaleQueue struct {
	// Add enqueues k: how the backlog is filled, and op=cycle's add.
	Add func(k int)
	// Post is op=post's timed add of k: Add, and whatever a queue that
	// buffers its adds needs to apply it.
	Post func(k int)
	// Take removes the next key and returns it; Done ends its processing.
	Take func() int
	Done func(k int)
	// Len is the number of keys queued (applying buffered adds).
	Len func() int
	// Close shuts the queue down and ends its goroutines.
	Close func()
}

// ScaleImpl is one implementation under BenchmarkScale.
type ScaleImpl struct {
	// Name is the value of the impl= element of the benchmark's name.
	Name string
	// New builds an empty queue. Key k's priority is prios[k%len(prios)],
	// for a queue that takes one.
	New func(prios []int) ScaleQueue
}

// Scale runs the core's BenchmarkScale (the root module's scale_test.go)
// against impl, under the same names: queued distinct int keys, at sizes
// 1 000, 100 000 and 1 000 000, each key at the priority the core's
// benchmark gives it (drawn from Levels with its seed), deadline=none only
// (neither queue compared has deadlines). op=post is a new key's Post into
// the backlog, and reports B/queued, the heap the backlog holds per key
// after a GC; a batch of adds (BatchOf) is taken out again with the timer
// stopped, so the backlog stays steady. op=cycle is one worker's Take, the
// Add of a new key that keeps the backlog at its size (as the dispatcher's
// exec does while its key is processed), and Done.
func Scale(b *testing.B, impl ScaleImpl) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		prios := scalePrios(2 * n) // made before any heap is measured
		name := fmt.Sprintf("impl=%s/queued=%d/deadline=none", impl.Name, n)
		b.Run(name+"/op=post", func(b *testing.B) { scalePost(b, impl.New(prios), n) })
		b.Run(name+"/op=cycle", func(b *testing.B) { scaleCycle(b, impl.New(prios), n) })
		debug.FreeOSMemory()
	}
}

func scalePost(b *testing.B, q ScaleQueue, n int) {
	defer q.Close()
	debug.FreeOSMemory()
	before := heapAlloc()
	for k := range n {
		q.Add(k)
	}
	q.Len()
	held := heapAlloc() - before
	b.ReportAllocs()
	i, lo := 0, 0
	for b.Loop() {
		q.Post(n + i)
		i++
		if i-lo == BatchOf(n) {
			b.StopTimer()
			for ; lo < i; lo++ {
				q.Done(q.Take())
			}
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(held)/float64(n), "B/queued")
	if l := q.Len(); l < n {
		b.Fatalf("backlog drifted: %d, want at least %d", l, n)
	}
}

func scaleCycle(b *testing.B, q ScaleQueue, n int) {
	for k := range n {
		q.Add(k)
	}
	q.Len()
	debug.FreeOSMemory()
	done := make(chan struct{})
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		defer close(done)
		for i := range b.N {
			k := q.Take()
			q.Add(n + i)
			q.Done(k)
		}
	}()
	<-done
	b.StopTimer()
	q.Close()
}

// scalePrios returns n priorities drawn uniformly from [0, Levels), from
// the fixed seed the core's BenchmarkScale draws them with.
func scalePrios(n int) []int {
	r := rand.New(rand.NewPCG(1, 10))
	p := make([]int, n)
	for i := range p {
		p[i] = r.IntN(Levels)
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
