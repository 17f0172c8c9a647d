package dispatch

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestLaneTable checks the lane table against a Go map under random
// insertions and deletions, through growth and backward-shift deletion,
// with a deliberately poor hash so that probe sequences collide.
func TestLaneTable(t *testing.T) {
	for _, badHash := range []bool{false, true} {
		r := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
		tab := newLaneTable[int, int]()
		hash := func(k int) uint64 {
			if badHash {
				return uint64(k % 7) // long clusters
			}
			return tab.hash(k)
		}
		ref := map[int]*lane[int, int]{}
		for range 20_000 {
			k := r.IntN(600)
			h := hash(k)
			if l := ref[k]; l != nil {
				require.Same(t, l, tab.get(k, h))
				require.True(t, tab.release(l))
				delete(ref, k)
			} else {
				require.Nil(t, tab.get(k, h))
				ref[k] = tab.add(k, h, 0)
			}
			require.Equal(t, len(ref), tab.Len())
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
