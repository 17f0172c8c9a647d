package dispatch

import (
	"hash/maphash"
	"iter"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/coalescer/dispatch/internal/prefetch"
)

// laneTable maps keys to their lanes. It is a hash table of its own, not a
// Go map, for one reason: the key's hash is computed by the submitter
// before it takes the lock (hash), and kept in the lane, so that neither
// the lookup and insertion of a submission nor the deletion of a release
// hashes a key under the dispatcher's lock. It uses linear probing with
// backward-shift deletion (no tombstones), at most 3/4 full. It shrinks
// too, so that a burst of keys that has drained does not keep its table:
// once fewer than a sixteenth of its slots have been taken for
// shrinkAfter, a table larger than shrunkSlots is rebuilt, by the clock,
// at the size it would have grown to for the keys left, but no smaller
// than shrunkSlots. A size is left only after the key count has moved by
// a factor of two (growing) or three (shrinking), so the rebuilds cost a
// constant per key however the count swings. Guarded by the dispatcher's
// lock, except hash, which needs none.
type laneTable[K comparable, T any] struct {
	seed  maphash.Seed
	salt  uint64           // from seed, for integer keys
	slots []laneSlot[K, T] // a power of two of them
	n     int
	pool  lanePool[K, T] // released lanes, for the next keys
	// sparse is set, at sparseSince, when a release first finds the table
	// sparse enough to shrink; it is cleared when a release finds it not,
	// or when the table is rebuilt.
	sparse      bool
	sparseSince int64
	// view is where slots is, for prefetch, which reads it without the
	// lock; set when the table is rebuilt (a table too small to have grown
	// is in the caches anyway).
	view atomic.Pointer[slotsView]
}

// slotsView is the address of a table's first slot and its mask, read
// together without the lock.
type slotsView struct {
	base uintptr
	mask uint64
}

// laneSlot is one slot: a lane and its key's hash, kept here too so that a
// probe compares hashes without reading the lanes it passes.
type laneSlot[K comparable, T any] struct {
	h uint64
	l *lane[K, T] // nil: empty
}

const minLaneSlots = 16

// shrunkSlots is the fewest slots a table shrinks to (16 KiB of them): a
// dispatcher that has had a thousand keys at once keeps room for as many.
const shrunkSlots = 1024

// keptPerSlot sets how many released lanes the free list keeps once the
// clock has shrunk the table: one for every keptPerSlot slots of its new
// size (256 at shrunkSlots), where a dispatcher whose keys swing faster
// keeps up to maxFreeLanes. The trade: bursts more than shrinkAfter apart
// each make their lanes (an eighth of an allocation a key) and grow the
// table anew, as the first burst did.
const keptPerSlot = 4

// shrinkAfter is how long a table stays sparse before the clock shrinks
// it (shrinkDue). A dispatcher whose key count swings between tens of
// thousands and a few, as its workers fall behind and catch up, would
// otherwise rebuild its table down and up again on every swing, under the
// lock its submitters take (BenchmarkEndToEnd's live-unique: its
// producer's time per add 8.7 % more); a burst that has drained gives its
// table back a second later.
const shrinkAfter = int64(time.Second)

func newLaneTable[K comparable, T any]() laneTable[K, T] {
	seed := maphash.MakeSeed()
	return laneTable[K, T]{seed: seed, salt: maphash.String(seed, "salt"), slots: make([]laneSlot[K, T], minLaneSlots)}
}

// hash returns key's hash. It needs no lock. Strings and integers, the
// usual keys, are hashed directly; other types through maphash.Comparable,
// which reaches the runtime's hasher for K through an indirect call.
func (t *laneTable[K, T]) hash(key K) uint64 {
	switch k := any(key).(type) {
	case string:
		return maphash.String(t.seed, k)
	case int:
		return t.mix(uint64(k))
	case int64:
		return t.mix(uint64(k))
	case uint64:
		return t.mix(k)
	case int32:
		return t.mix(uint64(k))
	case uint32:
		return t.mix(uint64(k))
	}
	return maphash.Comparable(t.seed, key)
}

// mix is SplitMix64's finalizer over v and the table's salt: every bit of
// v reaches every bit of the hash, as linear probing needs.
func (t *laneTable[K, T]) mix(v uint64) uint64 {
	v ^= t.salt
	v = (v ^ v>>30) * 0xbf58476d1ce4e5b9
	v = (v ^ v>>27) * 0x94d049bb133111eb
	return v ^ v>>31
}

// Len returns the number of keys.
func (t *laneTable[K, T]) Len() int { return t.n }

// get returns key's lane, or nil; h is hash(key).
func (t *laneTable[K, T]) get(key K, h uint64) *lane[K, T] {
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.l == nil {
			return nil
		}
		if s.h == h && s.l.key == key {
			return s.l
		}
	}
}

// line reads the slot where a lane of hash h sits or would sit, and
// returns its stored hash: a load made only to fetch the slot's cache
// line, with the lock held (settleAttemptLock), whose result the caller
// keeps (Dispatcher.warmed) so that the compiler keeps the load.
func (t *laneTable[K, T]) line(h uint64) uint64 { return t.home(h).h }

// home returns the slot a lane of hash h is looked for from.
func (t *laneTable[K, T]) home(h uint64) *laneSlot[K, T] {
	return &t.slots[h&uint64(len(t.slots)-1)]
}

// prefetch asks the processor for the slot where a key of hash h sits or
// would go, without the lock: a submitter asks before it takes the lock,
// so that the slot's miss overlaps what it does before admission instead
// of being taken with the lock held. The table may have grown since view
// was read; then the hint names a slot of the old table, and only the
// hint is lost. (A worker asking here for the slot of the key it releases,
// just before it takes the lock, made the workers quicker to take hot keys,
// so they coalesced less and ran more: BENCHMARKS.md, "Scale". A worker
// asks with hint instead, as the execution starts.)
func (t *laneTable[K, T]) prefetch(h uint64) {
	if v := t.view.Load(); v != nil {
		prefetch.Line(v.base + uintptr(h&v.mask)*unsafe.Sizeof(laneSlot[K, T]{}))
	}
}

// hint asks the processor for the slot where a lane of hash h sits, with
// the lock held: a worker asks for its call's slot as the execution
// starts (begin), so that the miss overlaps the execution rather than
// the end's critical section, which releases the slot.
func (t *laneTable[K, T]) hint(h uint64) {
	prefetch.Line(uintptr(unsafe.Pointer(t.home(h))))
}

// lookup is get for a caller that has not hashed the key.
func (t *laneTable[K, T]) lookup(key K) *lane[K, T] { return t.get(key, t.hash(key)) }

// add returns a lane for key, whose hash is h and newest generation gen,
// tracked under it: a released lane if one is kept (pool.go).
func (t *laneTable[K, T]) add(key K, h uint64, gen uint64) *lane[K, T] {
	l := t.pool.get()
	l.key, l.hash, l.gen = key, h, gen
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	t.insert(laneSlot[K, T]{h, l})
	t.n++
	return l
}

// release forgets l's key if l has no call left, keeps l for reuse, and
// reports whether it did. Nothing refers to a released lane or its calls
// by then: every waiter has been settled, every index has let go of its
// calls, and no execution runs one. A lane is tracked from add until its
// release: a lane without a call is released at once (finish), so a lane
// found in the table has one, except under the lock between add and the
// call it was added for. It also reports whether the release left the
// table sparse for the first time since it last was not (sparse): the
// caller then asks the clock to see to it shrinkAfter later (shrinkDue).
func (t *laneTable[K, T]) release(l *lane[K, T], now int64) (released, sparse bool) {
	if l.running != nil || l.pending != nil || !t.del(l) {
		return false, false
	}
	t.pool.put(l)
	switch {
	case !t.sparseNow():
		t.sparse = false
	case !t.sparse:
		t.sparse, t.sparseSince = true, now
		return true, true
	}
	return true, false
}

// sparseNow reports whether the table is sparse enough to shrink: larger
// than shrunkSlots, and less than a sixteenth full.
func (t *laneTable[K, T]) sparseNow() bool {
	return len(t.slots) > shrunkSlots && t.n*16 < len(t.slots)
}

// shrinkDue is the clock's duty for a table that turned sparse: it shrinks
// the table if it has stayed sparse for shrinkAfter, and otherwise returns
// when to look again (ok false). A table no longer sparse is left as it
// is.
func (t *laneTable[K, T]) shrinkDue(now int64) (at int64, ok bool) {
	if !t.sparse || !t.sparseNow() {
		t.sparse = false
		return 0, true
	}
	if at := t.sparseSince + shrinkAfter; now < at {
		return at, false
	}
	t.shrink()
	t.pool.trim(len(t.slots) / keptPerSlot)
	return 0, true
}

// insert puts s in its slot: the first free one from its home slot.
func (t *laneTable[K, T]) insert(s laneSlot[K, T]) {
	mask := uint64(len(t.slots) - 1)
	i := s.h & mask
	for t.slots[i].l != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

// shrink rebuilds the table at the size it would have grown to for the
// keys it holds (3/8 full at most), but no smaller than shrunkSlots.
func (t *laneTable[K, T]) shrink() {
	size := shrunkSlots
	for size*3 < t.n*8 {
		size *= 2
	}
	t.resize(size)
}

// grow doubles the table. With the mask one bit wider, the slots of an
// old home i go to i or i+len(old), so the writes follow the reads in two
// runs.
func (t *laneTable[K, T]) grow() { t.resize(2 * len(t.slots)) }

// resize moves every slot to a new table of size slots, a power of two
// that holds them. It reads only slots: a lane is not touched, so that a
// table of cold lanes is rebuilt without a cache miss per lane.
func (t *laneTable[K, T]) resize(size int) {
	t.sparse = false
	old := t.slots
	t.slots = make([]laneSlot[K, T], size)
	for _, s := range old {
		if s.l != nil {
			t.insert(s)
		}
	}
	t.view.Store(&slotsView{uintptr(unsafe.Pointer(&t.slots[0])), uint64(len(t.slots) - 1)})
}

// del removes l and reports whether the table held it. The entries after
// it in its probe sequence move back, so that every entry stays reachable
// from its home slot without passing an empty one.
func (t *laneTable[K, T]) del(l *lane[K, T]) bool {
	mask := uint64(len(t.slots) - 1)
	i := l.hash & mask
	for t.slots[i].l != l {
		if t.slots[i].l == nil {
			return false // not tracked: released already
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		m := t.slots[j]
		if m.l == nil {
			break
		}
		// m may fill the hole at i if its home slot is not in (i, j].
		if home := m.h & mask; (j-home)&mask >= (j-i)&mask {
			t.slots[i] = m
			i = j
		}
	}
	t.slots[i] = laneSlot[K, T]{}
	t.n--
	return true
}

// all yields every lane. The table must not change during the iteration.
func (t *laneTable[K, T]) all() iter.Seq[*lane[K, T]] {
	return func(yield func(*lane[K, T]) bool) {
		for _, s := range t.slots {
			if s.l != nil && !yield(s.l) {
				return
			}
		}
	}
}
