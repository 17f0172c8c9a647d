package dispatch

import "github.com/google/btree"

// postsDue is the deadline index of posts aggregates: the calls whose
// fire-and-forget submissions have a deadline, by posts.at, then arrival
// (seq). The clock expires them, the earliest first.
//
// Most calls come to it in that order: with one timeout for every call
// (the usual way to give calls a deadline, and kube/scheduler's default),
// a new call's deadline is after every one indexed before it. Such a call
// is appended to a run, a slice in that order; the rest (a deadline read
// before another submitter's took the lock, a shorter timeout, a deadline
// extended since the call was indexed) go to a B-tree. The earliest is
// the lesser of the run's head and the B-tree's minimum. Most calls leave
// long before their deadline, when they start: for those in the run, an
// append and a flag instead of a B-tree's insertion and deletion, each a
// search that reads the calls it compares.
//
// A call does not know its place in the run, and none is spent on it (a
// call has no spare word): it leaves the run by clearing its fPostsRun
// flag, and its entry stays behind, dead, until the head passes it or
// the run is squeezed. An entry carries its call's seq, which no other
// call has, so an entry of a call that has since left, or of a lane's
// call since remade for a new submission, is never taken for a live one.
// A call joins the run only with a seq above every entry's, so it has at
// most one live entry. The head is always live: a removal moves it past
// the dead ones; dead entries behind it are squeezed out once they
// outnumber the live ones (by more than minRunWaste), so the run holds
// at most about two entries of 16 bytes per call in it. A squeeze reads
// every call it keeps, under the dispatcher's lock, so the run holds at
// most maxRun calls: beyond them a backlog's deadlines go to the B-tree,
// and no squeeze reads more than about 2×maxRun calls.
type postsDue[K comparable, T any] struct {
	tree  *btree.BTreeG[*call[K, T]]
	run   []runEntry[K, T] // run[head:] by (posts.at, seq)
	head  int
	live  int // the run's live entries
	limit int // the most live entries: maxRun, less in tests
	// lastAt and lastSeq are the order of the run's last entry, live or
	// dead; a call may join the run only after it.
	lastAt  int64
	lastSeq uint64
}

// runEntry is a call's entry in the run: live while the call has fPostsRun
// and seq is still its seq.
type runEntry[K comparable, T any] struct {
	c   *call[K, T]
	seq uint64
}

func (e runEntry[K, T]) isLive() bool { return e.c.is(fPostsRun) && e.c.seq == e.seq }

// minRunWaste is how many dead entries the run may hold beyond as many as
// its live ones before it is squeezed, so that a small run is not squeezed
// at every removal.
const minRunWaste = 64

// maxRun is the most calls the run holds (postsDue.limit).
const maxRun = 4096

// maxKeptRun is the largest array an emptied run keeps for reuse: a
// larger one, a burst's, is let go.
const maxKeptRun = 1024

func newPostsDue[K comparable, T any]() postsDue[K, T] {
	return postsDue[K, T]{tree: btree.NewG(btreeDegree, postsDueLess[K, T]), limit: maxRun}
}

func postsDueLess[K comparable, T any](a, b *call[K, T]) bool {
	if a.posts.at != b.posts.at {
		return a.posts.at < b.posts.at
	}
	return a.seq < b.seq
}

// Len returns the number of calls indexed.
func (p *postsDue[K, T]) Len() int { return p.live + p.tree.Len() }

// add indexes c at its posts.at, which is set; c is not indexed.
func (p *postsDue[K, T]) add(c *call[K, T]) {
	at := c.posts.at
	if p.live >= p.limit || p.live > 0 && (at < p.lastAt || c.seq <= p.lastSeq) {
		p.tree.ReplaceOrInsert(c)
		return
	}
	p.run = append(p.run, runEntry[K, T]{c, c.seq})
	p.live++
	p.lastAt, p.lastSeq = at, c.seq
	c.mark(fPostsRun, true)
}

// remove takes c, which is indexed at its posts.at, out of the index.
func (p *postsDue[K, T]) remove(c *call[K, T]) {
	if !c.is(fPostsRun) {
		p.tree.Delete(c)
		return
	}
	c.mark(fPostsRun, false)
	p.live--
	p.tidy()
}

// tidy restores the run's invariants after a removal: emptied, it starts
// over; else its head is moved past the dead entries, and it is squeezed
// if the dead ones behind the head outnumber the live ones by more than
// minRunWaste, or moved to the front of its array once the head has passed
// half of it.
func (p *postsDue[K, T]) tidy() {
	if p.live == 0 {
		p.run, p.head = emptyRun(p.run), 0
		return
	}
	for !p.run[p.head].isLive() {
		p.run[p.head] = runEntry[K, T]{}
		p.head++
	}
	switch n := len(p.run) - p.head; {
	case n-p.live > p.live+minRunWaste:
		p.squeeze()
	case p.head >= minRunWaste && p.head > len(p.run)/2:
		p.run, p.head = runToFront(p.run, p.head), 0
	}
}

// squeeze moves the run's live entries to the front of its array, in
// order, and lets a mostly empty array go for one of their size.
func (p *postsDue[K, T]) squeeze() {
	p.run, p.head = squeezeRun(p.run, p.head, p.live, runEntry[K, T].isLive), 0
}

// The helpers below keep a run: a slice in order, read from run[head:],
// whose dead entries wait to be passed or squeezed out (postsDue, and the
// victims index in victims.go).

// emptyRun returns run emptied for reuse, or nil if its array is larger
// than an emptied run keeps (maxKeptRun).
func emptyRun[E any](run []E) []E {
	if cap(run) > maxKeptRun {
		return nil
	}
	clear(run)
	return run[:0]
}

// runToFront moves run[head:] to the front of its array.
func runToFront[E any](run []E, head int) []E {
	m := copy(run, run[head:])
	clear(run[m:])
	return run[:m]
}

// squeezeRun returns the live entries of run[head:], in order, at the
// front of an array: run's own, cleared behind them, or, if run's array
// is large and the live entries fill less than a quarter of it, a new one
// twice their number.
func squeezeRun[E any](run []E, head, live int, isLive func(E) bool) []E {
	kept, reuse := run[:0], !(cap(run) > maxKeptRun && live < cap(run)/4)
	if !reuse {
		kept = make([]E, 0, 2*live)
	}
	for _, e := range run[head:] { // in place, writes trail the reads
		if isLive(e) {
			kept = append(kept, e)
		}
	}
	if reuse {
		clear(run[len(kept):])
	}
	return kept
}

// min returns the earliest call indexed, if any.
func (p *postsDue[K, T]) min() (*call[K, T], bool) {
	t, ok := p.tree.Min()
	if p.live == 0 {
		return t, ok
	}
	if h := p.run[p.head].c; !ok || postsDueLess(h, t) {
		return h, true
	}
	return t, true
}

// removeMin takes c, the earliest call indexed (min's), out of the index:
// from the run's head, or the B-tree's minimum without a search.
func (p *postsDue[K, T]) removeMin(c *call[K, T]) {
	if c.is(fPostsRun) {
		p.remove(c)
		return
	}
	p.tree.DeleteMin()
}
