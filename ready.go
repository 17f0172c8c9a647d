package dispatch

import "github.com/google/btree"

// This file is a tenant's ready index: its ready calls in ready order.
//
// Most calls arrive in order within their priority: a new call's enqueue
// time is the clock, so its place (its virtual time, or its priority and
// enqueue time) is after every call of the same priority that arrived
// before it. Such a call is appended to its priority's FIFO run, which
// costs a slice append instead of a B-tree insertion. The calls that
// arrive out of order — a retry keeps its old place, a successor keeps the
// enqueue time it had when it arrived, a merged call moves to a higher
// priority — go to a B-tree, as do the calls of priorities beyond the
// first maxRuns a tenant has. The best call is the least of the B-tree's
// minimum and the runs' heads.
//
// A call taken out of a run anywhere but its head leaves a hole (an entry
// without its call) that the head skips when it gets there. When holes
// outnumber the calls — a call that waits long at the head while the ones
// behind it come and go — the run is compacted, so that its memory stays
// proportional to its calls.

// maxRuns bounds a tenant's FIFO runs: one per priority, for the first
// maxRuns priorities its ready calls have at once. The best call is found
// among maxRuns+1 candidates.
const maxRuns = 16

type readyIndex[K comparable, T any] struct {
	tree *btree.BTreeG[entry[K, T]]
	runs []*fifoRun[K, T]
	n    int // calls in the index
	// best caches where the best call is, while nothing changes: -1 the
	// B-tree, i ≥ 0 runs[i]; valid only if bestOK.
	best   int
	bestOK bool
}

// fifoRun is the ready calls of one priority that arrived in order.
type fifoRun[K comparable, T any] struct {
	prio  int
	items []entry[K, T] // items[head:], in ready order; holes have c == nil
	head  int
	base  int // the position of items[0]: positions survive compaction
	live  int
	holes int // in items[head:]
}

func newReadyIndex[K comparable, T any]() readyIndex[K, T] {
	return readyIndex[K, T]{tree: btree.NewG(btreeDegree, readyLess[K, T])}
}

// Len returns the number of calls in the index.
func (r *readyIndex[K, T]) Len() int { return r.n }

// insert adds c, at its current order.
func (r *readyIndex[K, T]) insert(c *call[K, T]) {
	r.n++
	r.bestOK = false
	e := c.entry()
	var free *fifoRun[K, T]
	for _, f := range r.runs {
		if f.prio == c.prio {
			if f.live == 0 || readyLess(f.items[len(f.items)-1], e) {
				f.append(c, e)
				return
			}
			r.tree.ReplaceOrInsert(e)
			return
		}
		if free == nil && f.live == 0 {
			free = f
		}
	}
	switch {
	case free != nil:
		free.prio = c.prio
		free.append(c, e)
	case len(r.runs) < maxRuns:
		f := &fifoRun[K, T]{prio: c.prio}
		r.runs = append(r.runs, f)
		f.append(c, e)
	default:
		r.tree.ReplaceOrInsert(e)
	}
}

// delete takes c out of the index; c is in it, at its current order.
func (r *readyIndex[K, T]) delete(c *call[K, T]) {
	r.n--
	r.bestOK = false
	if f := c.run; f != nil {
		f.drop(c)
		return
	}
	r.tree.Delete(c.entry())
}

// min returns the best call's entry; the index must not be empty.
func (r *readyIndex[K, T]) min() entry[K, T] {
	if !r.bestOK {
		r.best = -1
		var b entry[K, T]
		if e, ok := r.tree.Min(); ok {
			b = e
		}
		for i, f := range r.runs {
			if f.live == 0 {
				continue
			}
			if h := f.items[f.head]; b.c == nil || readyLess(h, b) {
				b, r.best = h, i
			}
		}
		r.bestOK = true
		return b
	}
	if r.best < 0 {
		e, _ := r.tree.Min()
		return e
	}
	f := r.runs[r.best]
	return f.items[f.head]
}

// popMin removes and returns the best call; the index must not be empty.
func (r *readyIndex[K, T]) popMin() *call[K, T] {
	e := r.min()
	r.n--
	r.bestOK = false
	if r.best < 0 {
		r.tree.DeleteMin()
	} else {
		r.runs[r.best].drop(e.c)
	}
	return e.c
}

func (f *fifoRun[K, T]) append(c *call[K, T], e entry[K, T]) {
	if f.live == 0 && f.head > 0 {
		// Empty: start over at the front, keeping the memory.
		f.base += len(f.items)
		f.items, f.head, f.holes = f.items[:0], 0, 0
	}
	c.run, c.runPos = f, f.base+len(f.items)
	f.items = append(f.items, e)
	f.live++
}

// squeeze moves the run's calls to the front of items, in order, dropping
// the holes; their positions change, so each call is told its new one.
func (f *fifoRun[K, T]) squeeze() {
	n := 0
	for _, e := range f.items[f.head:] {
		if e.c != nil {
			f.items[n] = e
			e.c.runPos = f.base + n
			n++
		}
	}
	clear(f.items[n:])
	f.items, f.head, f.holes = f.items[:n], 0, 0
}

// remove takes c out of the run: at the head, the head moves past it and
// any holes after it; elsewhere, it leaves a hole.
func (f *fifoRun[K, T]) drop(c *call[K, T]) {
	i := c.runPos - f.base
	f.items[i].c = nil
	c.run = nil
	f.live--
	if i != f.head {
		if f.holes++; f.holes >= 64 && f.holes > f.live {
			f.squeeze()
		}
		return
	}
	for f.head < len(f.items) && f.items[f.head].c == nil {
		f.head++
		f.holes--
	}
	f.holes++ // the loop counted the removed call's own entry too
	switch {
	case f.live == 0:
		f.base += len(f.items)
		f.items, f.head, f.holes = f.items[:0], 0, 0
		if cap(f.items) > 4096 {
			f.items = nil // a burst's backlog is not kept
		}
	case f.head >= 1024 && f.head*2 >= len(f.items):
		// Compact: the consumed front is half the slice.
		n := copy(f.items, f.items[f.head:])
		clear(f.items[n:])
		f.items = f.items[:n]
		f.base += f.head
		f.head = 0
	}
}
