package benchmarks

import (
	"testing"

	"github.com/coalescer/dispatch/test/queuebench"
	"k8s.io/client-go/util/workqueue"
)

// BenchmarkScale runs the core's BenchmarkScale against client-go's
// workqueue, on queuebench.Scale: the same names, sizes and operations.
// The workqueue is a FIFO: it takes no priority and no deadline; Take is
// its Get, from the front. workqueue-timed is the same queue with its
// timings on, as a controller runs it (timed): each queued
// key also holds its add time in the queue's metrics.
func BenchmarkScale(b *testing.B) {
	queuebench.Scale(b, queuebench.ScaleImpl{Name: "workqueue", New: func([]int) queuebench.ScaleQueue {
		return scaleWorkqueue(workqueue.TypedQueueConfig[int]{})
	}})
	queuebench.Scale(b, queuebench.ScaleImpl{Name: "workqueue-timed", New: func([]int) queuebench.ScaleQueue {
		return scaleWorkqueue(timed[int](silentMetrics{}))
	}})
}

// scaleWorkqueue is a workqueue of cfg as queuebench.Scale drives it.
func scaleWorkqueue(cfg workqueue.TypedQueueConfig[int]) queuebench.ScaleQueue {
	q := workqueue.NewTypedWithConfig(cfg)
	return queuebench.ScaleQueue{
		Add:   q.Add,
		Post:  q.Add,
		Take:  func() int { k, _ := q.Get(); return k },
		Done:  q.Done,
		Len:   q.Len,
		Close: q.ShutDown,
	}
}
