package dispatch

import "unsafe"

// This file is memory pooling: the lanes of released keys and the ticket
// lists of ended calls are kept for reuse, so that a dispatcher whose keys
// come and go allocates nothing per key in the steady state. Pools are
// bounded, so a burst leaves little behind. The Dispatcher's lock guards
// them.

// maxFreeLanes bounds the free list of released lanes. Reusing a lane
// spares a new key its one allocation (and the garbage collector the work
// of freeing it). The list keeps up to 4096 lanes: about 0.7 MB with small
// keys and values (on a 64-bit platform a lane is 160 bytes with string
// keys and int values, more for a large K or T; TestLaneSizeDoc keeps the
// figure true), and a kept lane keeps its slab in memory too: after keys
// have come and gone in a mixed order, up to the slabs of 4096 lanes. A
// second after the keys have left, the clock shrinks the key table and
// trims the list to a lane for every keptPerSlot slots of the table
// (laneTable.shrinkDue): at most 256 lanes and their slabs are what a
// burst of keys leaves behind once it has drained, however large it was
// (TestBurstDrainedFreesMemory). With its key table slot and its place in
// the ready index, a queued call holds 190–230 bytes (the package doc;
// BenchmarkScale's B/queued).
const maxFreeLanes = 4096

// A slab is the allocation that makes lanes when the free list is empty:
// from minSlab to maxSlab of them (slabLanes), so that new keys cost at
// most an eighth of an allocation each. A slab's memory is freed when none
// of its lanes is in use or on the free list, so a few long-lived keys can
// hold up to maxSlab× their own lanes' memory.
const (
	minSlab = 8
	maxSlab = 16
)

// lanePool holds released lanes, and the rest of the last slab.
type lanePool[K comparable, T any] struct {
	free  []*lane[K, T] // released lanes, at most maxFreeLanes
	slab  []lane[K, T]  // lanes not yet used, from the last slab
	slabN int           // lanes per slab: slabLanes of the lane's size
}

// get returns a zeroed lane: a released one if there is one, else one
// carved from the current slab.
func (p *lanePool[K, T]) get() *lane[K, T] {
	if l := popFree(&p.free); l != nil {
		return l
	}
	if len(p.slab) == 0 {
		if p.slabN == 0 {
			p.slabN = slabLanes(unsafe.Sizeof(lane[K, T]{}))
		}
		p.slab = make([]lane[K, T], p.slabN)
	}
	l := &p.slab[0]
	p.slab = p.slab[1:]
	return l
}

// put keeps released lane l for reuse, unless enough are kept already.
// Nothing may refer to l or its calls any more. l is cleared either way:
// a lane not kept stays in memory as long as its slab does, and must not
// keep its key, its value, its execution or its tenant alive with it.
func (p *lanePool[K, T]) put(l *lane[K, T]) {
	*l = lane[K, T]{}
	if len(p.free) < maxFreeLanes {
		p.free = append(p.free, l)
	}
}

// trim keeps at most n lanes on the free list and lets the rest go, with
// the list's array: what the clock's shrink of the key table does once the
// keys have stayed few for shrinkAfter (laneTable.shrinkDue), so that the
// slabs of a burst's lanes are freed as soon as none of their lanes is in
// use.
func (p *lanePool[K, T]) trim(n int) {
	if len(p.free) <= n {
		return
	}
	p.free = append([]*lane[K, T](nil), p.free[:n]...)
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
	tl := c.lists()
	if tl == nil {
		return
	}
	c.rare.lists = nil
	if len(p.free) >= maxFreeLists {
		return
	}
	tl.riders = reuse(tl.riders)
	tl.visit = reuse(tl.visit)
	tl.plain, tl.share = 0, nil
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

// slabLanes returns how many lanes of size bytes a slab holds: the count
// from minSlab to maxSlab that leaves the least of the slab's allocation
// unused per lane (the fewest lanes among equals). The runtime rounds an
// allocation up to its size class, after adding a header of 8 bytes to an
// object of more than 512 bytes that holds pointers, as a slab does: 8
// lanes of 152 bytes (int keys and values) would take 1280 bytes for
// 1216, where 10 take 1536 for 1520 (TestLaneSlab checks the figures
// against the runtime's own accounting).
func slabLanes(size uintptr) int {
	best, bestPer := minSlab, ^uintptr(0)
	for n := minSlab; n <= maxSlab; n++ {
		if per := allocSize(uintptr(n)*size+8) / uintptr(n); per < bestPer {
			best, bestPer = n, per
		}
	}
	return best
}

// allocSize is what the runtime allocates for an object of size bytes:
// its size class, or beyond the largest a whole number of 8 KiB pages.
func allocSize(size uintptr) uintptr {
	for _, c := range sizeClasses {
		if size <= c {
			return c
		}
	}
	return (size + 8191) &^ 8191
}

// sizeClasses are the runtime's size classes from 1 KiB (a slab's
// smallest: 8 lanes of at least 128 bytes) to 32 KiB.
var sizeClasses = [...]uintptr{1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}
