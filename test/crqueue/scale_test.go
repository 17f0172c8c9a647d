package crqueue

import (
	"testing"

	"github.com/coalescer/dispatch/test/queuebench"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// BenchmarkScale runs the core's BenchmarkScale against controller-runtime's
// priorityqueue, on queuebench.Scale: the same names, sizes and operations,
// each key at the priority the core's benchmark gives it.
// The queue buffers its adds and applies them in Len, so op=post's timed
// Post is an add and a Len; Take is GetWithPriority, the best item.
// priorityqueue-named is the queue as a controller makes it: named, so
// with controller-runtime's own metrics (Prometheus), for which it also
// keeps each queued key's add time.
func BenchmarkScale(b *testing.B) {
	queuebench.Scale(b, queuebench.ScaleImpl{Name: "priorityqueue", New: func(prios []int) queuebench.ScaleQueue {
		return scalePriorityQueue(priorityqueue.New[int](""), prios)
	}})
	queuebench.Scale(b, queuebench.ScaleImpl{Name: "priorityqueue-named", New: func(prios []int) queuebench.ScaleQueue {
		return scalePriorityQueue(priorityqueue.New[int]("scale"), prios)
	}})
}

// scalePriorityQueue is q as queuebench.Scale drives it.
func scalePriorityQueue(q priorityqueue.PriorityQueue[int], prios []int) queuebench.ScaleQueue {
	add := func(k int) { q.AddWithOpts(priorityqueue.AddOpts{Priority: &prios[k%len(prios)]}, k) }
	return queuebench.ScaleQueue{
		Add:   add,
		Post:  func(k int) { add(k); q.Len() },
		Take:  func() int { k, _, _ := q.GetWithPriority(); return k },
		Done:  q.Done,
		Len:   q.Len,
		Close: q.ShutDown,
	}
}
