package queuebench

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that RunWorkers' workers and the producers end with
// each run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fifo is the simplest queue the harness can run: a deduplicating FIFO
// under one mutex, with a condition variable for Get. It stands in for the
// implementations, which live in the modules that may import them.
type fifo struct {
	mu       sync.Mutex
	cond     *sync.Cond
	items    []string
	queued   map[string]bool
	shutdown bool
}

func newFIFO() *fifo {
	q := &fifo{queued: map[string]bool{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *fifo) add(k string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued[k] {
		return
	}
	q.queued[k] = true
	q.items = append(q.items, k)
	q.cond.Signal()
}

func (q *fifo) Get() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.shutdown {
		q.cond.Wait()
	}
	if len(q.items) == 0 {
		return "", true
	}
	k := q.items[0]
	q.items = q.items[1:]
	delete(q.queued, k)
	return k, false
}

func (q *fifo) Done(string)        {}
func (q *fifo) AddLast(k string)   { q.add(k) }
func (q *fifo) Len() int           { q.mu.Lock(); defer q.mu.Unlock(); return len(q.items) }
func (q *fifo) drop(keys []string) { q.mu.Lock(); defer q.mu.Unlock(); q.dropLocked(keys) }

func (q *fifo) dropLocked(keys []string) {
	for _, k := range keys {
		if i := slices.Index(q.items, k); i >= 0 {
			q.items = slices.Delete(q.items, i, i+1)
			delete(q.queued, k)
		}
	}
}

func (q *fifo) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
	q.cond.Broadcast()
}

var fifoCompare = CompareImpl{Name: "fifo", New: func(int) Target {
	q := newFIFO()
	return Target{
		Add:   func(k string, _ int) { q.add(k) },
		Flush: func() {},
		Drain: q.drop,
		Depth: q.Len,
		Close: q.ShutDown,
	}
}}

var fifoE2E = E2EImpl{Name: "fifo", New: func(r *Run) E2E {
	q := newFIFO()
	return E2E{
		Add:   func(k string, _, _ int) { q.add(k) },
		Drain: RunWorkers(r, q, q.ShutDown),
	}
}}

func TestCheckTargets(t *testing.T) {
	CheckTargets(t, fifoCompare)
}

func TestCheckEndToEnd(t *testing.T) {
	CheckEndToEnd(t, fifoE2E)
}

// TestCheckTargetsCatchesLoss checks a queue that loses every third add:
// the check must fail, or it would pass anything.
func TestCheckTargetsCatchesLoss(t *testing.T) {
	lossy := fifoCompare
	lossy.New = func(capacity int) Target {
		tg := fifoCompare.New(capacity)
		n := 0
		add := tg.Add
		tg.Add = func(k string, prio int) {
			if n++; n%3 != 0 {
				add(k, prio)
			}
		}
		return tg
	}
	if err := checkTarget(lossy); err == nil {
		t.Fatal("checkTarget passed a queue that drops adds")
	}
}

// TestCheckEndToEndCatchesLoss checks, on every workload CheckEndToEnd
// runs but the paced one, an implementation that never executes every
// tenth add: the check must fail on each (TestCheckEndToEndCatchesEarlyStart
// checks the gate).
func TestCheckEndToEndCatchesLoss(t *testing.T) {
	lossy := E2EImpl{Name: "lossy", New: func(r *Run) E2E {
		e := fifoE2E.New(r)
		add := e.Add
		e.Add = func(k string, i, prio int) {
			if i%10 != 9 {
				add(k, i, prio)
			}
		}
		return e
	}}
	for _, spec := range workloadSpecs {
		if spec.paced {
			continue
		}
		t.Run(spec.name, func(t *testing.T) {
			if err := checkRun(spec.build(testAdds), lossy); err == nil {
				t.Fatal("checkRun passed an implementation that loses adds")
			}
		})
	}
}

// TestCheckEndToEndCatchesEarlyStart checks an implementation whose
// executions count as started while a gated workload's producer still
// adds, without waiting at the gate: the check must fail.
func TestCheckEndToEndCatchesEarlyStart(t *testing.T) {
	early := E2EImpl{Name: "early", New: func(r *Run) E2E {
		e := fifoE2E.New(r)
		add := e.Add
		e.Add = func(k string, i, prio int) {
			if i < 2*Workers {
				r.early.Add(1) // as Started would count an execution ahead of the gate
			}
			add(k, i, prio)
		}
		return e
	}}
	w := workloadSpecs[0].build(testAdds)
	if !w.gated {
		t.Fatalf("workload %s is not gated", w.name)
	}
	if err := checkRun(w, early); err == nil || !strings.Contains(err.Error(), "gate") {
		t.Fatalf("checkRun = %v, want executions started before the gate opened", err)
	}
}
