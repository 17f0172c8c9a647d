package benchmarks

// BenchmarkEndToEnd measures whole runs, end to end: keys are added, 4
// workers execute a no-op for each, and the clock stops when the queue is
// drained and its workers have returned (queuebench.EndToEnd describes the
// workloads and the metrics). controller-runtime's priorityqueue runs it
// under the same names in test/crqueue:
//
//	(cd test/benchmarks && go test -run '^$' -bench EndToEnd -count 6 .) > e2e.txt
//	(cd test/crqueue && go test -run '^$' -bench EndToEnd -count 6 .) >> e2e.txt
//	benchstat -ignore pkg -col /impl e2e.txt

import (
	"context"
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/test/queuebench"
	"k8s.io/client-go/util/workqueue"
)

var e2eImpls = []queuebench.E2EImpl{
	{Name: "dispatch-post", New: func(r *queuebench.Run) queuebench.E2E { return newE2EDispatch(r, false) }},
	{Name: "dispatch-submit", New: func(r *queuebench.Run) queuebench.E2E { return newE2EDispatch(r, true) }},
	{Name: "floor-post+ticket", New: func(r *queuebench.Run) queuebench.E2E { return newE2EFloor(r, true) }},
	{Name: "floor-post+keep", New: func(r *queuebench.Run) queuebench.E2E { return newE2EFloor(r, false) }},
	{Name: "workqueue", New: newE2EWorkqueue},
	{Name: "apidispatcher", New: newE2EAPIDispatcher}, // apidispatcher_test.go
}

func newE2EDispatch(r *queuebench.Run, withTicket bool) queuebench.E2E {
	exec := func(_ context.Context, key string, i int) error {
		r.Started(key, i)
		return nil
	}
	d, err := dispatch.New(exec, dispatch.Config[string, int]{Workers: queuebench.Workers, Capacity: queuebench.Adds + 1})
	if err != nil {
		panic(err)
	}
	add := func(key string, i, prio int) {
		if err := d.Post(key, i, dispatch.SubmitOptions{Priority: prio}); err != nil {
			panic(err)
		}
	}
	if withTicket {
		ctx := context.Background()
		add = func(key string, i, prio int) {
			if _, err := d.Submit(ctx, key, i, dispatch.SubmitOptions{Priority: prio}); err != nil {
				panic(err)
			}
		}
	}
	return queuebench.E2E{Add: add, Drain: func() {
		if err := d.Close(context.Background()); err != nil {
			panic(err)
		}
	}}
}

// newE2EFloor is not a queue but a floor under dispatch-submit: each add
// is a Post plus the allocation of the Ticket that Submit would return,
// kept until the run ends (floor-post+ticket). Submit does at least that
// much; what it costs beyond this row is its own bookkeeping. The ticket
// lives as long as a gated workload's (seq-*) tickets do; in a live
// workload a submitted ticket dies with its call, sooner, so there the
// floor is set high. With alloc false (floor-post+keep) every add keeps
// the same ticket, allocated once: what the harness's keeping costs
// without the allocation, so that the two rows' difference is the
// ticket's own.
func newE2EFloor(r *queuebench.Run, alloc bool) queuebench.E2E {
	post := newE2EDispatch(r, false)
	keep := make([]*dispatch.Ticket[string, int], r.Adds())
	one := new(dispatch.Ticket[string, int])
	return queuebench.E2E{Add: func(key string, i, prio int) {
		if alloc {
			keep[i] = new(dispatch.Ticket[string, int])
		} else {
			keep[i] = one
		}
		post.Add(key, i, prio)
	}, Drain: func() {
		post.Drain()
		clear(keep)
	}}
}

// wq is client-go's workqueue as queuebench.RunWorkers runs it (its
// ShutDownWithDrain would not tell a gated worker apart).
type wq struct {
	q workqueue.TypedInterface[string]
}

func (w wq) Get() (string, bool) { return w.q.Get() }
func (w wq) Done(k string)       { w.q.Done(k) }
func (w wq) AddLast(k string)    { w.q.Add(k) }
func (w wq) Len() int            { return w.q.Len() }

func newE2EWorkqueue(r *queuebench.Run) queuebench.E2E {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{})
	return queuebench.E2E{
		Add:   func(key string, _, _ int) { q.Add(key) },
		Drain: queuebench.RunWorkers(r, wq{q}, q.ShutDown),
	}
}

// BenchmarkEndToEnd runs each workload against each implementation; see
// the top of this file.
func BenchmarkEndToEnd(b *testing.B) {
	queuebench.EndToEnd(b, e2eImpls...)
}

// TestEndToEndHarness checks the harness's accounting on a small run of
// each implementation: every unique add executes exactly once, duplicates
// execute at most once per add, and every run drains.
func TestEndToEndHarness(t *testing.T) {
	queuebench.CheckEndToEnd(t, e2eImpls...)
}
