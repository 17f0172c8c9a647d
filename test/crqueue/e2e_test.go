package crqueue

import (
	"testing"

	"github.com/coalescer/dispatch/test/queuebench"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// pq is controller-runtime's priorityqueue as queuebench.RunWorkers runs
// it: it cannot drain itself (it ignores ShutDownWithDrain).
type pq struct {
	q priorityqueue.PriorityQueue[string]
}

var endPrio = new(queuebench.EndPriority)

func (p pq) Get() (string, bool) { k, _, shut := p.q.GetWithPriority(); return k, shut }
func (p pq) Done(k string)       { p.q.Done(k) }
func (p pq) AddLast(k string)    { p.q.AddWithOpts(priorityqueue.AddOpts{Priority: endPrio}, k) }
func (p pq) Len() int            { return p.q.Len() }

// newE2EPriorityQueue is the queue unnamed (priorityqueue), so without
// metrics; named (priorityqueue-named), as a controller makes it, so with
// controller-runtime's own metrics, which time every item.
func newE2EPriorityQueue(name string) func(*queuebench.Run) queuebench.E2E {
	return func(r *queuebench.Run) queuebench.E2E {
		q := priorityqueue.New[string](name)
		return queuebench.E2E{
			Add: func(key string, _, prio int) {
				q.AddWithOpts(priorityqueue.AddOpts{Priority: prioPtrs[prio]}, key)
			},
			Drain: queuebench.RunWorkers(r, pq{q}, q.ShutDown),
		}
	}
}

var e2eImpls = []queuebench.E2EImpl{
	{Name: "priorityqueue", New: newE2EPriorityQueue("")},
	{Name: "priorityqueue-named", New: newE2EPriorityQueue("e2e")},
}

// BenchmarkEndToEnd is test/benchmarks' BenchmarkEndToEnd
// (queuebench.EndToEnd describes it) for controller-runtime's
// priorityqueue, under the same names:
//
//	(cd test/benchmarks && go test -run '^$' -bench EndToEnd -count 6 .) > e2e.txt
//	(cd test/crqueue && go test -run '^$' -bench EndToEnd -count 6 .) >> e2e.txt
//	benchstat -ignore pkg -col /impl e2e.txt
func BenchmarkEndToEnd(b *testing.B) {
	queuebench.EndToEnd(b, e2eImpls...)
}

// TestEndToEndHarness checks the harness's accounting on small runs of the
// priorityqueue: every unique add executes exactly once, duplicates at
// most once per add, and every run drains.
func TestEndToEndHarness(t *testing.T) {
	queuebench.CheckEndToEnd(t, e2eImpls...)
}
