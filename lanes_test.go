package dispatch

import (
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/coalescer/dispatch/internal/due"
	"github.com/stretchr/testify/require"
)

// TestLaneTable checks the lane table against a Go map under random
// insertions and deletions, through growth and backward-shift deletion,
// with a deliberately poor hash so that probe sequences collide, and its
// shrinking on the clock's duty (shrinkDue, run here as the clock would,
// on a clock that advances by step per operation).
func TestLaneTable(t *testing.T) {
	const step = int64(100 * time.Microsecond)
	for _, badHash := range []bool{false, true} {
		r := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
		tab := newLaneTable[int, int]()
		hash := func(k int) uint64 {
			if badHash {
				return uint64(k % 7) // long clusters
			}
			return tab.hash(k)
		}
		var now int64
		dueAt := int64(due.Never) // the clock's entry for the duty
		clock := func() {
			if now >= dueAt {
				at, ok := tab.shrinkDue(now)
				dueAt = due.Never
				if !ok {
					dueAt = at
				}
			}
		}
		ref := map[int]*lane[int, int]{}
		toggle := func(k int) {
			now += step
			size, sparseSince := len(tab.slots), tab.sparseSince
			h := hash(k)
			if l := ref[k]; l != nil {
				require.Same(t, l, tab.get(k, h))
				released, sparse := tab.release(l, now)
				require.True(t, released)
				if sparse {
					dueAt = min(dueAt, now+shrinkAfter)
				}
				delete(ref, k)
			} else {
				require.Nil(t, tab.get(k, h))
				ref[k] = tab.add(k, h, 0)
			}
			clock()
			require.Equal(t, len(ref), tab.Len())
			// At most 3/4 full; no sparser than a sixteenth once grown for
			// longer than shrinkAfter; and shrunk only after that long.
			require.LessOrEqual(t, tab.Len()*4, len(tab.slots)*3)
			if len(tab.slots) > shrunkSlots && tab.Len()*16 < len(tab.slots) {
				require.True(t, tab.sparse, "%d keys in %d slots, not marked sparse", tab.Len(), len(tab.slots))
				require.Less(t, now-tab.sparseSince, shrinkAfter, "%d keys in %d slots", tab.Len(), len(tab.slots))
			}
			if len(tab.slots) < size {
				require.GreaterOrEqual(t, now-sparseSince, shrinkAfter, "shrunk %d → %d slots before it stayed sparse", size, len(tab.slots))
			}
			if v := tab.view.Load(); v != nil {
				require.Equal(t, uintptr(unsafe.Pointer(&tab.slots[0])), v.base)
				require.Equal(t, uint64(len(tab.slots)-1), v.mask)
			}
		}
		// Keys coming and going at random around a steady count, then
		// swings: a burst up to 3 000 keys (4 096 slots) and a drain down
		// to 2, as the table grows and shrinks through its sizes. The
		// first swings are fast: the table stays grown through them. The
		// last drains slowly: it shrinks as it goes.
		for range 20_000 {
			toggle(r.IntN(600))
		}
		for swing := range 4 {
			for len(ref) < 3000 {
				toggle(r.IntN(8000))
			}
			grown, least := len(tab.slots), len(tab.slots)
			for len(ref) > 2 {
				released := 0
				for k := range ref { // two present keys: releases
					toggle(k)
					if released++; released == 2 {
						break
					}
				}
				toggle(r.IntN(8000)) // and one at random: a release or an add
				if swing == 3 {
					now += shrinkAfter / 50 // slowly
				}
				least = min(least, len(tab.slots))
			}
			if swing < 3 {
				require.Len(t, tab.slots, grown, "a fast swing: not shrunk yet")
			} else {
				require.Less(t, least, grown, "a slow drain: shrunk on the way")
			}
			now += shrinkAfter // then nothing for a while, but the clock
			clock()
			require.Len(t, tab.slots, shrunkSlots, "drained to %d keys", len(ref))
		}
		for k, l := range ref {
			require.Same(t, l, tab.get(k, hash(k)))
		}
		n := 0
		for range tab.all() {
			n++
		}
		require.Equal(t, len(ref), n)
	}
}

// TestLaneTablePrefetchView checks what prefetch reads without the lock:
// nothing before the table first grows, then the current slots' address
// and mask after each growth. A hint from a view the table has outgrown
// is harmless.
func TestLaneTablePrefetchView(t *testing.T) {
	tab := newLaneTable[int, int]()
	require.Nil(t, tab.view.Load())
	tab.prefetch(tab.hash(1)) // no view yet: nothing asked
	var old *slotsView
	for k := range 5_000 {
		h := tab.hash(k)
		tab.prefetch(h)
		tab.add(k, h, 0)
		if v := tab.view.Load(); v != nil {
			require.Equal(t, uintptr(unsafe.Pointer(&tab.slots[0])), v.base)
			require.Equal(t, uint64(len(tab.slots)-1), v.mask)
			if old != nil && old != v {
				// The view a submitter read before a growth: a hint into
				// the old slots, which changes nothing.
				tab.view.Store(old)
				tab.prefetch(h)
				tab.view.Store(v)
			}
			old = v
		}
	}
	for k := range 5_000 {
		require.NotNil(t, tab.get(k, tab.hash(k)))
	}
}
