package crqueue

import (
	"testing"

	"github.com/coalescer/dispatch/test/queuebench"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// prioPtrs holds one pointer per priority level, made once: AddOpts takes
// the priority by pointer, and a fresh one per add would time an
// allocation of the harness's, not of the queue.
var prioPtrs = func() (p [queuebench.Levels]*int) {
	for i := range p {
		p[i] = new(i)
	}
	return p
}()

// targets are controller-runtime's priorityqueue under test/benchmarks'
// BenchmarkCompare, with the same names: priorityqueue times the flush
// that applies the buffered adds, priorityqueue-async the caller's
// AddWithOpts alone.
var targets = []queuebench.CompareImpl{
	{Name: "priorityqueue", New: func(int) queuebench.Target { return newPriorityQueue(true) }},
	{Name: "priorityqueue-async", New: func(int) queuebench.Target { return newPriorityQueue(false) }},
}

// newPriorityQueue returns controller-runtime's priorityqueue, unnamed so
// that it records no metrics. Its AddWithOpts appends to a buffer that a
// goroutine of its own applies to its B-tree later. With timedFlush the
// buffered adds are applied (Len flushes the buffer) inside the timer, so
// the time covers getting the items into the queue; without it only the
// caller's AddWithOpts is timed and the queue's own goroutine does the
// insertion on the other core, partly outside the measurement.
func newPriorityQueue(timedFlush bool) queuebench.Target {
	q := priorityqueue.New[string]("")
	flush := func() { q.Len() }
	if !timedFlush {
		flush = func() {}
	}
	return queuebench.Target{
		Add: func(key string, prio int) {
			q.AddWithOpts(priorityqueue.AddOpts{Priority: prioPtrs[prio]}, key)
		},
		Flush: flush,
		Drain: func(keys []string) {
			q.Len() // apply what is still buffered before taking items out
			for range keys {
				k, _, _ := q.GetWithPriority()
				q.Done(k)
			}
		},
		Depth: q.Len,
		Close: q.ShutDown,
	}
}

// BenchmarkCompare is test/benchmarks' BenchmarkCompare (queuebench.Compare
// describes it) for controller-runtime's priorityqueue:
//
//	(cd test/benchmarks && go test -run '^$' -bench Compare -benchmem -count 6 .) > compare.txt
//	(cd test/crqueue && go test -run '^$' -bench Compare -benchmem -count 6 .) >> compare.txt
//	benchstat -ignore pkg -col /impl compare.txt
func BenchmarkCompare(b *testing.B) {
	queuebench.Compare(b, targets...)
}

// TestTargets checks that the priorityqueue does what BenchmarkCompare
// assumes: adds of new keys grow it, re-adds do not, drains shrink it.
func TestTargets(t *testing.T) {
	queuebench.CheckTargets(t, targets...)
}
