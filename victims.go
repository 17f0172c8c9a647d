package dispatch

import (
	"sort"

	"github.com/google/btree"
)

// victimIndex is the queue's victims index (queue.victims): the calls that
// may be shed when the dispatcher is at Capacity, in ready order. Its
// maximum is the worst call, the one to shed: lowest effective priority,
// then newest.
//
// Most calls come to it in that order: a new call's enqueue time is the
// clock, so among the calls of its priority it is the newest, and with one
// priority for every droppable call (the usual way to mark the calls that
// may go) it is after every call indexed before it. Such a call is
// appended to a run, a slice in that order; the rest (a retry keeps its
// old place, a call of a higher priority than the run's last, a successor
// keeps the enqueue time it arrived with) go to a B-tree. The worst call is
// the greater of the run's last entry and the B-tree's maximum. Calls
// leave the run mostly at its ends: the oldest when a worker takes it, the
// newest when it is shed. Each of those is an append or a step of an end
// instead of a B-tree insertion and deletion.
//
// An entry carries its call's order and seq, so the run stays sorted
// whatever its calls do, and a call is found in it by a binary search when
// it is at neither end. A call leaving from the middle leaves its entry
// behind, dead (its call nil), until an end passes it or the run is
// squeezed. Both ends are always live; dead entries are squeezed out once
// they outnumber the live ones by more than minRunWaste, so the run holds
// at most about two entries of 32 bytes per call in it, and a squeeze
// moves entries without reading a call. The run holds at most maxRun
// calls, so that no squeeze or growth of its array moves more than about
// 2×maxRun entries under the dispatcher's lock: beyond them a backlog's
// victims go to the B-tree.
//
// A call knows neither its place in the run nor which of the two holds it
// (a call has no spare word or flag): delete looks in the run when the
// entry's order falls within the run's, and the run holds a live entry of
// the call exactly when the call is in the run, for a dead entry's call is
// nil and seq is unique to a call.
type victimIndex[K comparable, T any] struct {
	tree  *btree.BTreeG[entry[K, T]]
	run   []entry[K, T] // run[head:] by (order, seq); c is nil in a dead entry
	head  int
	live  int // the run's live entries
	limit int // the most live entries: maxRun, less in tests
}

func newVictimIndex[K comparable, T any]() victimIndex[K, T] {
	return victimIndex[K, T]{tree: btree.NewG(btreeDegree, readyLess[K, T]), limit: maxRun}
}

// Len returns the number of calls indexed.
func (v *victimIndex[K, T]) Len() int { return v.live + v.tree.Len() }

// insert indexes e's call at e's order; it is not indexed.
func (v *victimIndex[K, T]) insert(e entry[K, T]) {
	if v.live >= v.limit || v.live > 0 && !readyLess(v.run[len(v.run)-1], e) {
		v.tree.ReplaceOrInsert(e)
		return
	}
	v.run = append(v.run, e)
	v.live++
}

// delete takes e's call out of the index if it is indexed, at e's order.
func (v *victimIndex[K, T]) delete(e entry[K, T]) {
	if i, ok := v.find(e); ok {
		v.run[i].c = nil
		v.live--
		v.tidy()
		return
	}
	v.tree.Delete(e)
}

// find returns where e's call is live in the run, if it is: at the head or
// the tail (the usual places) without a search.
func (v *victimIndex[K, T]) find(e entry[K, T]) (int, bool) {
	if v.live == 0 {
		return 0, false
	}
	last := len(v.run) - 1
	switch {
	case v.run[v.head].c == e.c:
		return v.head, true
	case v.run[last].c == e.c:
		return last, true
	case readyLess(e, v.run[v.head]) || readyLess(v.run[last], e):
		return 0, false
	}
	i := v.head + sort.Search(last-v.head, func(j int) bool { return !readyLess(v.run[v.head+j], e) })
	return i, v.run[i].c == e.c
}

// tidy restores the run's invariants after a removal: emptied, it starts
// over; else its ends are moved past the dead entries, and it is squeezed
// if the dead ones outnumber the live ones by more than minRunWaste, or
// moved to the front of its array once the head has passed half of it.
func (v *victimIndex[K, T]) tidy() {
	if v.live == 0 {
		v.run, v.head = emptyRun(v.run), 0
		return
	}
	for v.run[v.head].c == nil {
		v.head++
	}
	n := len(v.run)
	for v.run[n-1].c == nil {
		n--
	}
	clear(v.run[n:])
	v.run = v.run[:n]
	switch k := n - v.head; {
	case k-v.live > v.live+minRunWaste:
		v.squeeze()
	case v.head >= minRunWaste && v.head > n/2:
		v.run, v.head = runToFront(v.run, v.head), 0
	}
}

// squeeze moves the run's live entries to the front of its array, in
// order, and lets a mostly empty array go for one of their size.
func (v *victimIndex[K, T]) squeeze() {
	v.run, v.head = squeezeRun(v.run, v.head, v.live, func(e entry[K, T]) bool { return e.c != nil }), 0
}

// max returns the entry of the worst call indexed, if any.
func (v *victimIndex[K, T]) max() (entry[K, T], bool) {
	t, ok := v.tree.Max()
	if v.live == 0 {
		return t, ok
	}
	if r := v.run[len(v.run)-1]; !ok || readyLess(t, r) {
		return r, true
	}
	return t, true
}

// worst returns the call to shed for a newcomer that would sit at (order,
// seq): the worst call indexed, if it is worse than the newcomer.
func (v *victimIndex[K, T]) worst(order orderKey, seq uint64) *call[K, T] {
	w, ok := v.max()
	if !ok || !readyLess(entry[K, T]{order, seq, nil}, w) {
		return nil
	}
	return w.c
}
