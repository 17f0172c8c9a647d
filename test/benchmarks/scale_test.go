package benchmarks

import (
	"testing"

	"github.com/coalescer/dispatch/test/queuebench"
	"k8s.io/client-go/util/workqueue"
)

// BenchmarkScale runs the core's BenchmarkScale against client-go's
// workqueue, on queuebench.Scale: the same names, sizes and operations.
// The workqueue is a FIFO: it takes no priority and no deadline; Take is
// its Get, from the front.
func BenchmarkScale(b *testing.B) {
	queuebench.Scale(b, queuebench.ScaleImpl{Name: "workqueue", New: func([]int) queuebench.ScaleQueue {
		q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[int]{})
		return queuebench.ScaleQueue{
			Add:   q.Add,
			Post:  q.Add,
			Take:  func() int { k, _ := q.Get(); return k },
			Done:  q.Done,
			Len:   q.Len,
			Close: q.ShutDown,
		}
	}})
}
