package queuebench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// Levels is the number of priority classes the workloads use: priorities
// are drawn from [0, Levels). Queues with priorities order by them; FIFO
// queues ignore them.
const Levels = 10

// Target is one queue under BenchmarkCompare, behind the few operations the
// workload needs. Every queue should be unnamed, or otherwise record no
// metrics, so that the numbers compare data structures and locking.
type Target struct {
	// Add enqueues key at prio, or re-adds it if it is queued. Timed.
	Add func(key string, prio int)
	// Flush makes the adds so far take effect. Timed, once per batch; a
	// no-op for a queue whose Add does.
	Flush func()
	// Drain takes len(keys) items out again: keys if the queue can remove
	// by key, its first items otherwise. Not timed.
	Drain func(keys []string)
	// Depth is the number of items queued.
	Depth func() int
	// Close shuts the queue down and ends its goroutines.
	Close func()
}

// CompareImpl is one implementation under BenchmarkCompare.
type CompareImpl struct {
	// Name is the value of the impl= element of the benchmark's name.
	Name string
	// New builds a queue with room for capacity keys.
	New func(capacity int) Target
	// NoReadd leaves op=readd out, for a queue where every re-add holds
	// something more (one ticket per add, say) until the backlog is full.
	NoReadd bool
}

// KeyName is the workloads' i-th distinct key.
func KeyName(i int) string { return "default/pod-" + strconv.Itoa(i) }

// BatchOf is how many timed adds run between two untimed drains in a
// backlog of queued items: a tenth of it, at most 1000.
func BatchOf(queued int) int { return max(1, min(queued/10, 1000)) }

// Compare runs, for each implementation, sub-benchmarks named
// impl=NAME/op=add/queued=N and impl=NAME/op=readd/queued=N, for N of
// 1 000 and 100 000. op=add is adding a new key to a queue that already
// holds N items; the backlog is held steady, the same number of items
// taken out with the timer stopped after every batch of adds. op=readd is
// re-adding a key already queued, in a random order, each at its own
// priority (a higher one would legitimately cost a re-key).
func Compare(b *testing.B, impls ...CompareImpl) {
	for _, impl := range impls {
		b.Run("impl="+impl.Name, func(b *testing.B) {
			for _, queued := range []int{1_000, 100_000} {
				b.Run(fmt.Sprintf("op=add/queued=%d", queued), func(b *testing.B) {
					benchAdd(b, impl.New, queued)
				})
				if impl.NoReadd {
					continue
				}
				b.Run(fmt.Sprintf("op=readd/queued=%d", queued), func(b *testing.B) {
					benchReadd(b, impl.New, queued)
				})
			}
		})
	}
}

// fill adds keys 0..queued-1 and returns their priorities.
func fill(tb testing.TB, t Target, queued int) []int {
	r := rand.New(rand.NewPCG(1, 2))
	prios := make([]int, queued)
	for i := range prios {
		prios[i] = r.IntN(Levels)
		t.Add(KeyName(i), prios[i])
	}
	t.Flush()
	if n := t.Depth(); n != queued {
		tb.Fatalf("depth after fill = %d, want %d", n, queued)
	}
	runtime.GC() // settle the backlog's heap before anything is timed
	return prios
}

func benchAdd(b *testing.B, newTarget func(int) Target, queued int) {
	batch := BatchOf(queued)
	t := newTarget(queued + batch)
	defer t.Close()
	prios := fill(b, t, queued)
	keys := make([]string, batch)
	next := queued
	nextKeys := func() {
		for j := range keys {
			keys[j] = KeyName(next)
			next++
		}
	}
	nextKeys()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		t.Add(keys[i%batch], prios[i%queued])
		i++
		if i%batch == 0 {
			t.Flush()
			b.StopTimer()
			t.Drain(keys)
			nextKeys()
			b.StartTimer()
		}
	}
	t.Flush()
	t.Drain(keys[:i%batch])
	if n := t.Depth(); n != queued {
		b.Fatalf("depth drifted to %d, want %d", n, queued)
	}
}

func benchReadd(b *testing.B, newTarget func(int) Target, queued int) {
	batch := BatchOf(queued)
	t := newTarget(queued)
	defer t.Close()
	prios := fill(b, t, queued)
	order := rand.New(rand.NewPCG(3, 4)).Perm(queued)
	keys := make([]string, queued)
	for i := range keys {
		keys[i] = KeyName(i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := order[i%queued]
		t.Add(keys[k], prios[k])
		i++
		if i%batch == 0 {
			t.Flush()
		}
	}
	t.Flush()
	if n := t.Depth(); n != queued {
		b.Fatalf("depth changed to %d, want %d", n, queued)
	}
}

// CheckTargets checks, in a subtest per implementation, that each does
// what Compare assumes: adds of new keys grow the queue, re-adds do not
// (unless NoReadd), drains shrink it.
func CheckTargets(t *testing.T, impls ...CompareImpl) {
	for _, impl := range impls {
		t.Run(impl.Name, func(t *testing.T) {
			if err := checkTarget(impl); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func checkTarget(impl CompareImpl) error {
	q := impl.New(20)
	defer q.Close()
	for i := range 10 {
		q.Add(KeyName(i), i%Levels)
	}
	q.Flush()
	if n := q.Depth(); n != 10 {
		return fmt.Errorf("depth after 10 adds = %d", n)
	}
	if !impl.NoReadd {
		for i := range 5 {
			q.Add(KeyName(i), i%Levels)
		}
		q.Flush()
		if n := q.Depth(); n != 10 {
			return fmt.Errorf("depth after 5 re-adds = %d, want 10", n)
		}
	}
	extra := []string{KeyName(10), KeyName(11), KeyName(12)}
	for _, k := range extra {
		q.Add(k, 0)
	}
	q.Flush()
	if n := q.Depth(); n != 13 {
		return fmt.Errorf("depth after 3 new adds = %d, want 13", n)
	}
	q.Drain(extra)
	if n := q.Depth(); n != 10 {
		return fmt.Errorf("depth after draining 3 = %d, want 10", n)
	}
	return nil
}
