package benchmarks

// BenchmarkEndToEnd measures whole runs, end to end: keys are added, 4
// workers execute a no-op for each, and the clock stops when the queue is
// drained and its workers have returned. Where BenchmarkCompare times the
// caller's side of an add, this times what an add costs the process: the
// caller, the queue's bookkeeping, the workers and the garbage collector.
//
//	cd benchmarks
//	go test -run '^$' -bench EndToEnd -count 6 . > e2e.txt
//	benchstat -col /impl e2e.txt
//
// Every implementation gets the same pre-built keys and priorities (10
// levels). One iteration is one run of runAdds adds; the runMetrics are per
// add, or per run:
//
//	ns/add          wall time from the first add until drained, per add
//	allocs/add      heap allocations in that time (every goroutine), per add
//	execs/add       executions per add: below 1 when adds were coalesced
//	                or deduplicated
//	started-early   the fraction of executions that started while
//	                producers were still adding: a queue whose workers
//	                starve under a fast producer shows it here
//	p50-us, p99-us  (paced only) add → start of its execution
//
// The workloads:
//
//	seq-unique     1 producer adds every key, then the workers start
//	seq-dup90      the same, but 90 % of adds hit 100 hot keys
//	live-unique    1 producer adds while the 4 workers run
//	live4-dup90    4 producers add while the 4 workers run, 90 % on hot keys
//	paced-unique   1 producer at 100 000 adds/s; add → start latency
//
// "Then the workers start" is a gate: the first execution each worker
// begins waits until the producer is done, so a queue that hands work out
// at once and one that does not are measured alike.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

const (
	runAdds      = 100_000
	testAdds     = 5_000
	runWorkers   = 4
	hotKeys      = 100
	pacedRate    = 100_000 // adds per second
	endPriority  = -1      // below every workload priority: sentinels run last
	sentinelName = "~end-"
)

// workload is one run's adds, pre-built and shared by every
// implementation.
type workload struct {
	name      string
	keys      []string // the key of add i
	prios     []int    // its priority
	idx       map[string]int
	producers int
	gated     bool // workers wait for the producers to finish
	paced     bool // one add every 1/pacedRate s, with latencies
}

func newWorkload(name string, adds int, dupFrac float64, producers int, gated, paced bool) *workload {
	r := rand.New(rand.NewPCG(5, 6))
	w := &workload{name: name, producers: producers, gated: gated, paced: paced,
		keys: make([]string, adds), prios: make([]int, adds)}
	unique := 0
	for i := range adds {
		if r.Float64() < dupFrac {
			w.keys[i] = "default/hot-" + strconv.Itoa(r.IntN(hotKeys))
		} else {
			w.keys[i] = keyName(unique)
			unique++
		}
		w.prios[i] = r.IntN(levels)
	}
	if paced {
		w.idx = make(map[string]int, adds)
		for i, k := range w.keys {
			w.idx[k] = i
		}
	}
	return w
}

// workloadSpec is a workload before its adds are built.
type workloadSpec struct {
	name      string
	dupFrac   float64
	producers int
	gated     bool
	paced     bool
}

var workloadSpecs = []workloadSpec{
	{"seq-unique", 0, 1, true, false},
	{"seq-dup90", 0.9, 1, true, false},
	{"live-unique", 0, 1, false, false},
	{"live4-dup90", 0.9, 4, false, false},
	{"paced-unique", 0, 1, false, true},
}

// build makes the workload's adds.
func (w workloadSpec) build(adds int) *workload {
	return newWorkload(w.name, adds, w.dupFrac, w.producers, w.gated, w.paced)
}

// runState is what the workers record during one run.
type runState struct {
	w         *workload
	gate      chan struct{} // closed when the producers are done, if gated
	producing atomic.Bool
	execs     atomic.Int64
	early     atomic.Int64
	epoch     time.Time
	addAt     []int64 // paced: ns since epoch of add i
	startAt   []int64 // paced: ns since epoch of its execution's start
}

// started is called by a worker as an execution begins; idx is the add's
// index if the implementation carries it, else -1.
func (s *runState) started(key string, idx int) {
	if s.gate != nil {
		<-s.gate
	}
	s.execs.Add(1)
	if s.producing.Load() {
		s.early.Add(1)
	}
	if s.startAt != nil {
		if idx < 0 {
			idx = s.w.idx[key]
		}
		s.startAt[idx] = int64(time.Since(s.epoch))
	}
}

// e2e is one implementation under test.
type e2e struct {
	// add enqueues add i of the workload.
	add func(key string, i, prio int)
	// drain waits until everything added has been executed and every
	// worker has returned.
	drain func()
}

var e2eImpls = []struct {
	name string
	new  func(*runState) e2e
}{
	{"dispatch-post", func(s *runState) e2e { return newE2EDispatch(s, false) }},
	{"dispatch-submit", func(s *runState) e2e { return newE2EDispatch(s, true) }},
	{"floor-post+ticket", func(s *runState) e2e { return newE2EFloor(s, true) }},
	{"floor-post+keep", func(s *runState) e2e { return newE2EFloor(s, false) }},
	{"workqueue", newE2EWorkqueue},
	{"priorityqueue", newE2EPriorityQueue},
	{"apidispatcher", newE2EAPIDispatcher}, // apidispatcher_test.go
}

func newE2EDispatch(s *runState, withTicket bool) e2e {
	exec := func(_ context.Context, key string, i int) error {
		s.started(key, i)
		return nil
	}
	d, err := dispatch.New(exec, dispatch.Config[string, int]{Workers: runWorkers, Capacity: runAdds + 1})
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
	return e2e{add: add, drain: func() {
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
func newE2EFloor(s *runState, alloc bool) e2e {
	post := newE2EDispatch(s, false)
	keep := make([]*dispatch.Ticket[string, int], len(s.w.keys))
	one := new(dispatch.Ticket[string, int])
	return e2e{add: func(key string, i, prio int) {
		if alloc {
			keep[i] = new(dispatch.Ticket[string, int])
		} else {
			keep[i] = one
		}
		post.add(key, i, prio)
	}, drain: func() {
		post.drain()
		clear(keep)
	}}
}

// queueLike is what the workqueue and priorityqueue workers need.
type queueLike interface {
	get() (string, bool)
	done(string)
	addLast(string)
	len() int
}

// runQueueWorkers starts the workers of a queue that cannot drain itself
// (priorityqueue ignores ShutDownWithDrain; workqueue's would not tell a
// gated worker apart), and returns drain. drain adds one sentinel per
// worker, after every other item in the queue's order; a worker that takes
// one stops if the queue is empty, and puts it back otherwise (an item
// re-queued by Done may follow it). When every worker has stopped, nothing
// is queued or running.
func runQueueWorkers(s *runState, q queueLike, shutdown func()) func() {
	var wg sync.WaitGroup
	for range runWorkers {
		wg.Go(func() {
			for {
				k, shut := q.get()
				if shut {
					return
				}
				if len(k) > len(sentinelName) && k[:len(sentinelName)] == sentinelName {
					q.done(k)
					if q.len() == 0 {
						return
					}
					q.addLast(k)
					continue
				}
				s.started(k, -1)
				q.done(k)
			}
		})
	}
	return func() {
		for i := range runWorkers {
			q.addLast(sentinelName + strconv.Itoa(i))
		}
		wg.Wait()
		shutdown()
	}
}

type wq struct {
	q workqueue.TypedInterface[string]
}

func (w wq) get() (string, bool) { return w.q.Get() }
func (w wq) done(k string)       { w.q.Done(k) }
func (w wq) addLast(k string)    { w.q.Add(k) }
func (w wq) len() int            { return w.q.Len() }

func newE2EWorkqueue(s *runState) e2e {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{})
	return e2e{
		add:   func(key string, _, _ int) { q.Add(key) },
		drain: runQueueWorkers(s, wq{q}, q.ShutDown),
	}
}

type pq struct {
	q priorityqueue.PriorityQueue[string]
}

var endPrio = new(endPriority)

func (p pq) get() (string, bool) { k, _, shut := p.q.GetWithPriority(); return k, shut }
func (p pq) done(k string)       { p.q.Done(k) }
func (p pq) addLast(k string)    { p.q.AddWithOpts(priorityqueue.AddOpts{Priority: endPrio}, k) }
func (p pq) len() int            { return p.q.Len() }

func newE2EPriorityQueue(s *runState) e2e {
	q := priorityqueue.New[string]("")
	return e2e{
		add: func(key string, _, prio int) {
			q.AddWithOpts(priorityqueue.AddOpts{Priority: prioPtrs[prio]}, key)
		},
		drain: runQueueWorkers(s, pq{q}, q.ShutDown),
	}
}

// BenchmarkEndToEnd runs each workload against each implementation; see
// the top of this file.
func BenchmarkEndToEnd(b *testing.B) {
	for _, spec := range workloadSpecs {
		b.Run("workload="+spec.name, func(b *testing.B) {
			// Built here, so that only one workload's keys are on the heap
			// while it runs: the garbage collector's work is the queues'.
			w := spec.build(runAdds)
			for _, impl := range e2eImpls {
				b.Run("impl="+impl.name, func(b *testing.B) {
					var m runMetrics
					for b.Loop() {
						m.add(runOnce(w, impl.new))
					}
					m.report(b, w.paced)
				})
			}
		})
	}
}

// runMetrics sums the runs of one sub-benchmark.
type runMetrics struct {
	runs                int
	ns, allocs, execs   float64
	early, p50us, p99us float64
}

type runResult struct {
	adds         int
	elapsed      time.Duration
	mallocs      uint64
	execs, early int64
	p50us, p99us float64
}

func (m *runMetrics) add(r runResult) {
	adds := float64(r.adds)
	m.runs++
	m.ns += float64(r.elapsed.Nanoseconds()) / adds
	m.allocs += float64(r.mallocs) / adds
	m.execs += float64(r.execs) / adds
	m.early += float64(r.early) / float64(max(r.execs, 1))
	m.p50us += r.p50us
	m.p99us += r.p99us
}

func (m *runMetrics) report(b *testing.B, paced bool) {
	n := float64(m.runs)
	b.ReportMetric(0, "ns/op") // a run's wall time says little; ns/add does
	b.ReportMetric(m.ns/n, "ns/add")
	b.ReportMetric(m.allocs/n, "allocs/add")
	b.ReportMetric(m.execs/n, "execs/add")
	b.ReportMetric(m.early/n, "started-early")
	if paced {
		b.ReportMetric(m.p50us/n, "p50-us")
		b.ReportMetric(m.p99us/n, "p99-us")
	}
}

// runOnce runs workload w once against a fresh implementation.
func runOnce(w *workload, newImpl func(*runState) e2e) runResult {
	s := &runState{w: w}
	if w.gated {
		s.gate = make(chan struct{})
	}
	n := len(w.keys)
	if w.paced {
		s.addAt = make([]int64, n)
		s.startAt = make([]int64, n)
	}
	q := newImpl(s)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s.epoch = time.Now()
	s.producing.Store(true)
	produce(s, q)
	s.producing.Store(false)
	if s.gate != nil {
		close(s.gate)
	}
	q.drain()
	elapsed := time.Since(s.epoch)
	runtime.ReadMemStats(&after)
	r := runResult{adds: n, elapsed: elapsed, mallocs: after.Mallocs - before.Mallocs,
		execs: s.execs.Load(), early: s.early.Load()}
	if w.paced {
		lat := make([]float64, n)
		for i := range lat {
			lat[i] = float64(s.startAt[i]-s.addAt[i]) / 1e3
		}
		slices.Sort(lat)
		r.p50us, r.p99us = lat[n/2], lat[n*99/100]
	}
	return r
}

// produce makes every add of the workload, from w.producers goroutines
// (each a contiguous share), paced if the workload says so.
func produce(s *runState, q e2e) {
	w := s.w
	n := len(w.keys)
	if w.paced {
		step := int64(time.Second / pacedRate)
		for i := range n {
			due := int64(i) * step
			for int64(time.Since(s.epoch)) < due {
				runtime.Gosched()
			}
			s.addAt[i] = int64(time.Since(s.epoch))
			q.add(w.keys[i], i, w.prios[i])
		}
		return
	}
	if w.producers == 1 {
		for i := range n {
			q.add(w.keys[i], i, w.prios[i])
		}
		return
	}
	var wg sync.WaitGroup
	share := n / w.producers
	for p := range w.producers {
		wg.Go(func() {
			for i := p * share; i < (p+1)*share; i++ {
				q.add(w.keys[i], i, w.prios[i])
			}
		})
	}
	wg.Wait()
}

// TestEndToEndHarness checks the harness's accounting on a small run:
// every unique add executes exactly once, duplicates execute at most once
// per add, and every run drains.
func TestEndToEndHarness(t *testing.T) {
	for _, spec := range workloadSpecs {
		w := spec.build(testAdds)
		if w.paced {
			continue // a second of real time; the benchmark exercises it
		}
		for _, impl := range e2eImpls {
			t.Run(fmt.Sprintf("%s/%s", w.name, impl.name), func(t *testing.T) {
				r := runOnce(w, impl.new)
				switch {
				case w.name == "seq-unique" || w.name == "live-unique":
					if r.execs != testAdds {
						t.Fatalf("executions = %d, want %d", r.execs, testAdds)
					}
				case r.execs < distinct(w) || r.execs > testAdds:
					t.Fatalf("executions = %d, want %d..%d", r.execs, distinct(w), testAdds)
				}
				if w.gated && r.early > runWorkers {
					t.Fatalf("%d executions started before the gate opened", r.early)
				}
			})
		}
	}
}

// distinct counts w's keys: each must execute at least once.
func distinct(w *workload) int64 {
	seen := map[string]bool{}
	for _, k := range w.keys {
		seen[k] = true
	}
	return int64(len(seen))
}
