package queuebench

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Workers is the number of workers every implementation runs: 4, or what
// the -queuebench.workers flag says. EndToEnd and CheckEndToEnd set it
// from the flag before they start; read it only within them.
var Workers = 4

var workersFlag = flag.Int("queuebench.workers", 0, "workers each implementation runs in EndToEnd and CheckEndToEnd (0: 4)")

// setWorkers sets Workers from -queuebench.workers.
func setWorkers() {
	if *workersFlag > 0 {
		Workers = *workersFlag
	}
}

const (
	// Adds is the number of adds in one run of EndToEnd.
	Adds = 100_000
	// EndPriority is below every workload priority: a queue with
	// priorities gives it to RunWorkers' sentinels, so that they run last.
	EndPriority = -1

	testAdds     = 5_000
	hotKeys      = 100
	pacedRate    = 100_000 // adds per second
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
			w.keys[i] = KeyName(unique)
			unique++
		}
		w.prios[i] = r.IntN(Levels)
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

// Run is one run of a workload against one implementation: what its
// workers record. Its methods are safe for concurrent use.
type Run struct {
	w         *workload
	gate      chan struct{} // closed when the producers are done, if gated
	producing atomic.Bool
	execs     atomic.Int64
	early     atomic.Int64
	epoch     time.Time
	addAt     []int64 // paced: ns since epoch of add i
	startAt   []int64 // paced: ns since epoch of its execution's start

	// Checks only (nil in benchmarks): ran[keyAt[k]] is set when key k
	// starts an execution.
	keyAt map[string]int
	ran   []atomic.Bool
}

// Adds is the number of adds in the run: each add's index i is in
// [0, Adds()).
func (s *Run) Adds() int { return len(s.w.keys) }

// Started is called by a worker as an execution begins, before it does
// anything else; idx is the index of the add it executes if the
// implementation carries it, else -1. In a gated workload it blocks until
// the producers are done.
func (s *Run) Started(key string, idx int) {
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
	if s.keyAt != nil {
		if i, ok := s.keyAt[key]; ok {
			s.ran[i].Store(true)
		}
	}
}

// E2E is one implementation under EndToEnd, built for one run.
type E2E struct {
	// Add enqueues add i of the run, key at prio. It is called from as
	// many goroutines as the workload has producers.
	Add func(key string, i, prio int)
	// Drain waits until everything added has been executed and every
	// worker has returned.
	Drain func()
}

// E2EImpl is one implementation under EndToEnd.
type E2EImpl struct {
	// Name is the value of the impl= element of the benchmark's name.
	Name string
	// New builds the implementation for run r; its workers call
	// r.Started as each execution begins.
	New func(r *Run) E2E
}

// Queue is what RunWorkers needs of a queue that cannot drain itself.
type Queue interface {
	// Get blocks until an item is available, or reports that the queue
	// is shut down.
	Get() (key string, shutdown bool)
	// Done marks key's processing finished.
	Done(key string)
	// AddLast adds key after every item the workload adds (at
	// EndPriority, in a queue with priorities).
	AddLast(key string)
	// Len is the number of items queued.
	Len() int
}

// RunWorkers starts Workers workers on q for run r and returns Drain.
// Drain adds one sentinel per worker, after every other item in the
// queue's order; a worker that takes one stops if the queue is empty, and
// puts it back otherwise (an item re-queued by Done may follow it). When
// every worker has stopped, nothing is queued or running, and Drain calls
// shutdown.
func RunWorkers(r *Run, q Queue, shutdown func()) (drain func()) {
	var wg sync.WaitGroup
	for range Workers {
		wg.Go(func() {
			for {
				k, shut := q.Get()
				if shut {
					return
				}
				if len(k) > len(sentinelName) && k[:len(sentinelName)] == sentinelName {
					q.Done(k)
					if q.Len() == 0 {
						return
					}
					q.AddLast(k)
					continue
				}
				r.Started(k, -1)
				q.Done(k)
			}
		})
	}
	return func() {
		for i := range Workers {
			q.AddLast(sentinelName + strconv.Itoa(i))
		}
		wg.Wait()
		shutdown()
	}
}

// EndToEnd measures whole runs, end to end: keys are added, Workers
// workers (-queuebench.workers) execute a no-op for each, and the clock
// stops when the queue is drained and its workers have returned. Where
// Compare times the caller's side of an add, this times what an add costs
// the process: the caller, the queue's bookkeeping, the workers and the
// garbage collector.
//
// Sub-benchmarks are named workload=WORKLOAD/impl=NAME. Every
// implementation gets the same pre-built keys and priorities (Levels
// levels). One iteration is one run of Adds adds; the metrics are per
// add, or per run:
//
//	ns/add          wall time from the first add until drained, per add
//	produce-ns/add  wall time from the first add until the producers are
//	                done, per add: in a gated workload, the adds alone
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
//	live-unique    1 producer adds while the workers run
//	live4-dup90    4 producers add while the workers run, 90 % on hot keys
//	paced-unique   1 producer at 100 000 adds/s; add → start latency
//
// "Then the workers start" is a gate: the first execution each worker
// begins waits until the producer is done, so a queue that hands work out
// at once and one that does not are measured alike.
func EndToEnd(b *testing.B, impls ...E2EImpl) {
	setWorkers()
	for _, spec := range workloadSpecs {
		b.Run("workload="+spec.name, func(b *testing.B) {
			// Built here, so that only one workload's keys are on the heap
			// while it runs: the garbage collector's work is the queues'.
			w := spec.build(Adds)
			for _, impl := range impls {
				b.Run("impl="+impl.Name, func(b *testing.B) {
					var m runMetrics
					for b.Loop() {
						m.add(runOnce(w, impl.New))
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
	ns, produceNs       float64
	allocs, execs       float64
	early, p50us, p99us float64
}

type runResult struct {
	adds         int
	elapsed      time.Duration
	produced     time.Duration // until the producers were done
	mallocs      uint64
	execs, early int64
	p50us, p99us float64
}

func (m *runMetrics) add(r runResult) {
	adds := float64(r.adds)
	m.runs++
	m.ns += float64(r.elapsed.Nanoseconds()) / adds
	m.produceNs += float64(r.produced.Nanoseconds()) / adds
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
	b.ReportMetric(m.produceNs/n, "produce-ns/add")
	b.ReportMetric(m.allocs/n, "allocs/add")
	b.ReportMetric(m.execs/n, "execs/add")
	b.ReportMetric(m.early/n, "started-early")
	if paced {
		b.ReportMetric(m.p50us/n, "p50-us")
		b.ReportMetric(m.p99us/n, "p99-us")
	}
}

// runOnce runs workload w once against a fresh implementation.
func runOnce(w *workload, newImpl func(*Run) E2E) runResult {
	return runWith(&Run{w: w}, newImpl)
}

// runWith runs s's workload once against a fresh implementation.
func runWith(s *Run, newImpl func(*Run) E2E) runResult {
	w := s.w
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
	produced := time.Since(s.epoch)
	s.producing.Store(false)
	if s.gate != nil {
		close(s.gate)
	}
	q.Drain()
	elapsed := time.Since(s.epoch)
	runtime.ReadMemStats(&after)
	r := runResult{adds: n, elapsed: elapsed, produced: produced, mallocs: after.Mallocs - before.Mallocs,
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
func produce(s *Run, q E2E) {
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
			q.Add(w.keys[i], i, w.prios[i])
		}
		return
	}
	if w.producers == 1 {
		for i := range n {
			q.Add(w.keys[i], i, w.prios[i])
		}
		return
	}
	var wg sync.WaitGroup
	share := n / w.producers
	for p := range w.producers {
		wg.Go(func() {
			for i := p * share; i < (p+1)*share; i++ {
				q.Add(w.keys[i], i, w.prios[i])
			}
		})
	}
	wg.Wait()
}

// CheckEndToEnd checks the harness's accounting for each implementation
// on small runs of every workload but the paced one (a second of real
// time; the benchmark exercises it): every unique add executes exactly
// once, every key at least once and at most once per add, no execution
// starts before a gated workload's producers are done, and every run
// drains.
func CheckEndToEnd(t *testing.T, impls ...E2EImpl) {
	setWorkers()
	for _, spec := range workloadSpecs {
		w := spec.build(testAdds)
		if w.paced {
			continue
		}
		for _, impl := range impls {
			t.Run(fmt.Sprintf("%s/%s", w.name, impl.Name), func(t *testing.T) {
				if err := checkRun(w, impl); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// checkRun runs w once against impl and checks its accounting, and that
// every distinct key started an execution.
func checkRun(w *workload, impl E2EImpl) error {
	s := &Run{w: w, keyAt: map[string]int{}}
	for _, k := range w.keys {
		if _, ok := s.keyAt[k]; !ok {
			s.keyAt[k] = len(s.keyAt)
		}
	}
	s.ran = make([]atomic.Bool, len(s.keyAt))
	r := runWith(s, impl.New)
	adds := int64(len(w.keys))
	switch {
	case w.name == "seq-unique" || w.name == "live-unique":
		if r.execs != adds {
			return fmt.Errorf("executions = %d, want %d", r.execs, adds)
		}
	case r.execs < distinct(w) || r.execs > adds:
		return fmt.Errorf("executions = %d, want %d..%d", r.execs, distinct(w), adds)
	}
	for k, i := range s.keyAt {
		if !s.ran[i].Load() {
			return fmt.Errorf("key %s was added but never executed", k)
		}
	}
	if w.gated && r.early > int64(Workers) {
		return fmt.Errorf("%d executions started before the gate opened", r.early)
	}
	return nil
}

// distinct counts w's keys: each must execute at least once.
func distinct(w *workload) int64 {
	seen := map[string]bool{}
	for _, k := range w.keys {
		seen[k] = true
	}
	return int64(len(seen))
}
