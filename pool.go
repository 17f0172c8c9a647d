package dispatch

// This file is memory pooling: the lanes of released keys and the ticket
// lists of ended calls are kept for reuse, so that a dispatcher whose keys
// come and go allocates nothing per key in the steady state. Pools are
// bounded, so a burst leaves little behind. The Dispatcher's lock guards
// them.

// maxFreeLanes bounds the free list of released lanes. Reusing a lane
// spares a new key its one allocation (and the garbage collector the work
// of freeing it). The bound caps what a burst of finished keys leaves
// behind at 4096 lanes: about 1.5 MB with small keys and values (on a
// 64-bit platform a lane is 360 bytes with string keys and int values,
// more for a large K or T; TestLaneSizeDoc keeps the figure true). With
// its key table slot and its ready-index entry, a queued call holds about
// 460 bytes (the package doc; BenchmarkScale's B/queued).
const maxFreeLanes = 4096

// laneSlab is how many lanes one allocation makes when the free list is
// empty: new keys then cost an eighth of an allocation each. A slab's
// memory is freed when none of its lanes is in use or on the free list,
// so a few long-lived keys can hold up to 8× their own lanes' memory.
const laneSlab = 8

// lanePool holds released lanes, and the rest of the last slab.
type lanePool[K comparable, T any] struct {
	free []*lane[K, T] // released lanes, at most maxFreeLanes
	slab []lane[K, T]  // lanes not yet used, from the last slab
}

// get returns a zeroed lane: a released one if there is one, else one
// carved from the current slab.
func (p *lanePool[K, T]) get() *lane[K, T] {
	if l := popFree(&p.free); l != nil {
		return l
	}
	if len(p.slab) == 0 {
		p.slab = make([]lane[K, T], laneSlab)
	}
	l := &p.slab[0]
	p.slab = p.slab[1:]
	return l
}

// put keeps released lane l for reuse, unless enough are kept already.
// Nothing may refer to l or its calls any more.
func (p *lanePool[K, T]) put(l *lane[K, T]) {
	if len(p.free) < maxFreeLanes {
		*l = lane[K, T]{} // let go of the key, the value and the tenant
		p.free = append(p.free, l)
	}
}

// maxFreeLists and maxFreeListCap bound the ticket lists kept for reuse:
// a call that gathers many tickets grows its lists by doubling, and a key
// that is hot again and again would allocate that growth each time.
const (
	maxFreeLists   = 64
	maxFreeListCap = 4096
)

// listPool holds the ticket lists of ended calls.
type listPool[K comparable, T any] struct {
	free []*ticketLists[K, T]
}

// get returns empty ticket lists, kept or new.
func (p *listPool[K, T]) get() *ticketLists[K, T] {
	if tl := popFree(&p.free); tl != nil {
		return tl
	}
	return new(ticketLists[K, T])
}

// keep takes c's ticket lists, if any, cleared, and keeps them for a later
// call unless enough are kept already; a list grown beyond maxFreeListCap
// is dropped.
func (p *listPool[K, T]) keep(c *call[K, T]) {
	tl := c.more
	if tl == nil {
		return
	}
	c.more = nil
	if len(p.free) >= maxFreeLists {
		return
	}
	tl.riders = reuse(tl.riders)
	tl.visit = reuse(tl.visit)
	tl.plain = 0
	p.free = append(p.free, tl)
}

// reuse clears l for reuse, or drops it if it is too large to keep.
func reuse[K comparable, T any](l []*Ticket[K, T]) []*Ticket[K, T] {
	if cap(l) > maxFreeListCap {
		return nil
	}
	clear(l)
	return l[:0]
}

// popFree takes the last entry off a free list, or returns nil if it is
// empty.
func popFree[E any](free *[]*E) *E {
	n := len(*free)
	if n == 0 {
		return nil
	}
	e := (*free)[n-1]
	(*free)[n-1] = nil
	*free = (*free)[:n-1]
	return e
}
