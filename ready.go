package dispatch

import (
	"unsafe"

	"github.com/google/btree"

	"github.com/coalescer/dispatch/internal/prefetch"
)

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
// A run holds its calls alone, 8 bytes each: within a run their order is
// the order they were appended in, and a call's order key is the run's
// priority's order plus its enqueue time (fifoRun.entryOf), so a head is
// compared without computing its band. The B-tree's entries carry
// the order key, so that its comparisons do not read the calls.
//
// A call taken out of a run anywhere but its head leaves a hole (a nil
// entry) that the head skips when it gets there. When holes
// outnumber the calls — a call that waits long at the head while the ones
// behind it come and go — the run is squeezed, so that its memory stays
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

// fifoRun is the ready calls of one priority that arrived in order, in
// chunks of at most runChunk entries. Every entry has a position, which
// grows by one per append and is never reused within the run, so a call
// finds its entry (c.pos) while the chunks before it are freed. Chunks
// instead of one growing slice make a backlog cost its entries and little
// more: nothing is copied as it grows, and the chunks it drains are freed
// as it drains. A run that empties keeps its first chunk.
type fifoRun[K comparable, T any] struct {
	num  uint8 // its place in readyIndex.runs, from 1 (call.run)
	prio int
	// order makes the order key of a call of priority prio from its
	// enqueue time (orderer.base). Set by the run's first call (holdFor),
	// as the run's priority is.
	order  orderKey
	chunks [][]*call[K, T] // every one full but the last; chunks[0][0] is at position base
	spare  []*call[K, T]   // a drained chunk, kept for the next while the run is not empty
	last   entry[K, T]     // the order of the last call appended, without the call, which may have left since
	base   int
	head   int // the first position not yet consumed
	tail   int // one past the last position appended
	live   int
	holes  int // in [head, tail)
}

// runChunk is how many entries a chunk of a FIFO run holds: 512 calls of
// 8 bytes fill 4 KiB. A run's first chunk starts smaller and grows to it.
const runChunk = 512

// at returns the entry at position p, which the run holds: its call, or
// nil for a hole.
func (f *fifoRun[K, T]) at(p int) **call[K, T] {
	i := p - f.base
	return &f.chunks[i/runChunk][i%runChunk]
}

func newReadyIndex[K comparable, T any]() readyIndex[K, T] {
	return readyIndex[K, T]{tree: btree.NewG(btreeDegree, readyLess[K, T])}
}

// Len returns the number of calls in the index.
func (r *readyIndex[K, T]) Len() int { return r.n }

// insert adds c, whose entry at its current order is e.
func (r *readyIndex[K, T]) insert(c *call[K, T], e entry[K, T]) {
	r.n++
	r.bestOK = false
	var free *fifoRun[K, T]
	for _, f := range r.runs {
		if f.prio == c.prio {
			if f.live == 0 || readyLess(f.last, e) {
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
		free.holdFor(c, e)
		free.append(c, e)
	case len(r.runs) < maxRuns:
		f := &fifoRun[K, T]{num: uint8(len(r.runs) + 1)}
		f.holdFor(c, e)
		r.runs = append(r.runs, f)
		f.append(c, e)
	default:
		r.tree.ReplaceOrInsert(e)
	}
}

// delete takes c out of the index; c is in it, at its current order,
// which o computes.
func (r *readyIndex[K, T]) delete(c *call[K, T], o orderer) {
	r.n--
	r.bestOK = false
	if n := c.run; n != 0 {
		r.runs[n-1].drop(c)
		return
	}
	r.tree.Delete(entryOf(o, c))
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
			if h := f.entryOf(*f.at(f.head)); b.c == nil || readyLess(h, b) {
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
	return f.entryOf(*f.at(f.head))
}

// popMin removes and returns the best call; the index must not be empty.
func (r *readyIndex[K, T]) popMin() *call[K, T] {
	e := r.min()
	r.n--
	r.bestOK = false
	if r.best < 0 {
		r.tree.DeleteMin()
	} else {
		f := r.runs[r.best]
		f.drop(e.c)
		if f.live > 0 { // the next worker to take from f reads its new head
			prefetchCall(*f.at(f.head))
		}
	}
	return e.c
}

// holdFor makes the empty run f hold the calls of c's priority; e is c's
// entry.
func (f *fifoRun[K, T]) holdFor(c *call[K, T], e entry[K, T]) {
	f.prio, f.order = c.prio, e.order.minus(sinceMinEnq(c.enq))
}

// entryOf returns the entry of c, a call in the run.
func (f *fifoRun[K, T]) entryOf(c *call[K, T]) entry[K, T] {
	return entry[K, T]{f.order.plus(sinceMinEnq(c.enq)), c.seq, c}
}

func (f *fifoRun[K, T]) append(c *call[K, T], e entry[K, T]) {
	n := len(f.chunks)
	if n == 0 || len(f.chunks[n-1]) == runChunk {
		var ch []*call[K, T]
		switch {
		case f.spare != nil:
			ch, f.spare = f.spare[:0], nil
		case n == 0:
			ch = make([]*call[K, T], 0, 8)
		default:
			ch = make([]*call[K, T], 0, runChunk)
		}
		f.chunks = append(f.chunks, ch)
		n++
	}
	c.run, c.pos = f.num, int64(f.tail)
	f.chunks[n-1] = append(f.chunks[n-1], c)
	e.c = nil // nothing to keep alive
	f.last = e
	f.tail++
	f.live++
}

// squeeze moves the run's calls to the front, in order, dropping the holes;
// their positions change, so each call is told its new one. The chunks left
// empty behind the last call are freed.
func (f *fifoRun[K, T]) squeeze() {
	w := f.head
	for p := f.head; p < f.tail; p++ {
		if c := *f.at(p); c != nil {
			*f.at(w) = c
			c.pos = int64(w)
			w++
		}
	}
	for p := w; p < f.tail; p++ {
		*f.at(p) = nil
	}
	f.tail, f.holes = w, 0
	keep := (f.tail - f.base + runChunk - 1) / runChunk // ≥ 1: the head is a call
	for i := keep; i < len(f.chunks); i++ {
		f.free(f.chunks[i])
		f.chunks[i] = nil
	}
	f.chunks = f.chunks[:keep]
	f.chunks[keep-1] = f.chunks[keep-1][:f.tail-f.base-(keep-1)*runChunk]
}

// drop takes c out of the run: at the head, the head moves past it and any
// holes after it, freeing the chunks it leaves; elsewhere, it leaves a hole.
func (f *fifoRun[K, T]) drop(c *call[K, T]) {
	i := int(c.pos)
	*f.at(i) = nil
	c.run = 0
	f.live--
	if i != f.head {
		if f.holes++; f.holes >= 64 && f.holes > f.live {
			f.squeeze()
		}
		return
	}
	if f.live == 0 {
		// Empty (every entry left is a hole): start over at the next
		// position in the first chunk.
		clear(f.chunks[1:])
		f.chunks = f.chunks[:1]
		f.chunks[0] = f.chunks[0][:0]
		f.spare = nil
		f.head, f.base, f.holes = f.tail, f.tail, 0
		return
	}
	f.head++
	for *f.at(f.head) == nil {
		f.head++
		f.holes--
	}
	for f.head-f.base >= runChunk {
		// The front chunk is consumed: none of its entries holds a call.
		f.free(f.chunks[0])
		f.chunks[0] = nil
		f.chunks = f.chunks[1:]
		f.base += runChunk
	}
}

// prefetchCall asks the processor for the cache lines of c, a run's new
// head, and of its lane, which the next worker to take a call from the run
// reads: in a backlog they are cold, and that worker would otherwise wait
// for them with the lock held (next, begin). The hint costs no wait here.
func prefetchCall[K comparable, T any](c *call[K, T]) {
	for _, a := range callLines(c) {
		prefetch.Line(a)
	}
}

// callLines returns an address in each line prefetchCall asks for: every
// line of c's lane, which a worker's critical section reads from one end
// to the other (the key, the hash, the running and pending calls, and c
// itself, whose words it reads from its first to its execution and rare
// part), if the lane spans four lines or fewer; of a larger lane (a large
// K or T), its first three lines and its last. The lane is read as c's
// own: if c is not its lane's own cell, the addresses before c and after
// it are a neighbour's memory, and only those hints are lost.
func callLines[K comparable, T any](c *call[K, T]) [4]uintptr {
	var l lane[K, T]
	lo := uintptr(unsafe.Pointer(c)) - unsafe.Offsetof(l.first)
	hi := lo + unsafe.Sizeof(l) - 1
	return [4]uintptr{lo, min(lo+prefetch.LineSize, hi), min(lo+2*prefetch.LineSize, hi), hi}
}

// free keeps ch, a chunk none of whose entries holds a call, as the run's
// spare if it has none.
func (f *fifoRun[K, T]) free(ch []*call[K, T]) {
	if f.spare == nil && cap(ch) >= runChunk {
		f.spare = ch
	}
}
