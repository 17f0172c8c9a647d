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
	"sync/atomic"
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
	{Name: "workqueue", New: newE2EWorkqueue(workqueue.TypedQueueConfig[string]{})},
	{Name: "workqueue-timed", New: newE2EWorkqueue(timed[string](silentMetrics{}))},
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

// newE2EWorkqueue is client-go's workqueue of cfg, as queuebench.RunWorkers
// drives it.
func newE2EWorkqueue(cfg workqueue.TypedQueueConfig[string]) func(*queuebench.Run) queuebench.E2E {
	return func(r *queuebench.Run) queuebench.E2E {
		q := workqueue.NewTypedWithConfig(cfg)
		return queuebench.E2E{
			Add:   func(key string, _, _ int) { q.Add(key) },
			Drain: queuebench.RunWorkers(r, wq{q}, q.ShutDown),
		}
	}
}

// timed is a workqueue's configuration with its metrics on, as a
// controller runs it (controller-runtime sets a metrics provider for every
// controller's queue, and names it), recorded through mp. With
// silentMetrics (the workqueue-timed rows) they record nothing, but the
// queue still takes its own timings — the clock read when a new item is
// added, when a worker gets it and when it is done, each kept in a map
// until used — and nothing else is added. dispatch takes the same kind of
// timings (an enqueue time, an execution's start and end) on every call;
// the plain workqueue rows take none.
func timed[T comparable](mp workqueue.MetricsProvider) workqueue.TypedQueueConfig[T] {
	return workqueue.TypedQueueConfig[T]{Name: "bench", MetricsProvider: mp}
}

// silentMetrics is a workqueue.MetricsProvider whose metrics record
// nothing. It is not the package's own no-op provider, which the queue
// recognises and then takes no timings at all.
type silentMetrics struct{}

// silent is every kind of workqueue metric, recording nothing.
type silent struct{}

func (silent) Inc()            {}
func (silent) Dec()            {}
func (silent) Set(float64)     {}
func (silent) Observe(float64) {}

func (silentMetrics) NewDepthMetric(string) workqueue.GaugeMetric       { return silent{} }
func (silentMetrics) NewAddsMetric(string) workqueue.CounterMetric      { return silent{} }
func (silentMetrics) NewLatencyMetric(string) workqueue.HistogramMetric { return silent{} }
func (silentMetrics) NewWorkDurationMetric(string) workqueue.HistogramMetric {
	return silent{}
}
func (silentMetrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return silent{}
}
func (silentMetrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return silent{}
}
func (silentMetrics) NewRetriesMetric(string) workqueue.CounterMetric { return silent{} }

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

// TestTimedWorkqueueTimes checks that the workqueue-timed row's queue takes
// its timings: the same queue with metrics that count observes a queue
// wait and a work duration for each item it hands out.
func TestTimedWorkqueueTimes(t *testing.T) {
	var observed atomic.Int64
	q := workqueue.NewTypedWithConfig(timed[string](countingMetrics{n: &observed}))
	defer q.ShutDown()
	for _, k := range []string{"a", "b", "a", "c"} {
		q.Add(k)
	}
	for range 3 {
		k, _ := q.Get()
		q.Done(k)
	}
	if got := observed.Load(); got != 6 {
		t.Fatalf("observed %d timings for 3 items, want 6 (a queue wait and a work duration each)", got)
	}
}

// countingMetrics is silentMetrics whose histograms count what they
// observe.
type countingMetrics struct {
	silentMetrics
	n *atomic.Int64
}

// counting is a histogram that counts what it observes.
type counting struct {
	silent
	n *atomic.Int64
}

func (c counting) Observe(float64) { c.n.Add(1) }

func (m countingMetrics) NewLatencyMetric(string) workqueue.HistogramMetric {
	return counting{n: m.n}
}

func (m countingMetrics) NewWorkDurationMetric(string) workqueue.HistogramMetric {
	return counting{n: m.n}
}
