package dispatch

import (
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLaneReuse (internal): released lanes are kept for new keys up to
// maxFreeLanes, hold nothing of the key that left (no key, value or waiter
// is kept alive), and a key in a reused lane behaves as in a new one. It
// reads the dispatcher's lane map and free list under its lock.
func TestLaneReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, *int]()
		d, _, release := holdWorker(t, f.exec, Config[string, *int]{Capacity: 2 * maxFreeLanes})
		n := maxFreeLanes + 10
		for i := range n {
			v := i
			submit(t, d, fmt.Sprint(i), &v, SubmitOptions{Generation: 5})
		}
		for i := range n {
			require.True(t, d.Cancel(fmt.Sprint(i), nil))
		}
		d.mu.Lock()
		require.Len(t, d.lanes.pool.free, maxFreeLanes, "free list not bounded")
		for _, s := range d.lanes.pool.free {
			require.Equal(t, lane[string, *int]{}, *s, "a released lane keeps state")
		}
		reused := d.lanes.pool.free[len(d.lanes.pool.free)-1]
		d.mu.Unlock()

		// The next key takes a released slot, with a fresh generation and
		// call: gen 5 of the key that left does not fence it.
		v := 42
		tk := submit(t, d, "new", &v, SubmitOptions{Generation: 1})
		d.mu.Lock()
		assert.Same(t, reused, d.lanes.lookup("new"))
		assert.Len(t, d.lanes.pool.free, maxFreeLanes-1)
		d.mu.Unlock()
		release()
		r := outcome(t, tk)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, "new", r.Key)
		assert.Equal(t, 42, *r.Call)
		checkConservation(t, d)
		closeD(t, d)
	})
}

// TestLaneSlab: a slab of lanes fills its allocation as slabLanes says,
// by the runtime's own accounting (MemStats.TotalAlloc over many slabs),
// and slabLanes' doc states the figures of string keys and int values.
func TestLaneSlab(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the figures are a 64-bit platform's")
	}
	size := unsafe.Sizeof(lane[int, int]{})
	n := slabLanes(size)
	docSays(t, "slabLanes", fmt.Sprintf("8 lanes of %d bytes (int keys and values) would take %d bytes for %d, where %d take %d for %d",
		size, allocSize(8*size+8), 8*size, n, allocSize(uintptr(n)*size+8), uintptr(n)*size))
	t.Run("string-int", func(t *testing.T) { checkSlab[string, int](t) })
	t.Run("int-int", func(t *testing.T) { checkSlab[int, int](t) })
	t.Run("large-value", func(t *testing.T) { checkSlab[string, [100]int](t) })
	t.Run("empty", func(t *testing.T) { checkSlab[struct{}, struct{}](t) }) // the smallest lane
}

// checkSlab checks that a slab of lane[K, T] allocates what slabLanes
// expects, and that no other count from minSlab to maxSlab wastes less.
func checkSlab[K comparable, T any](t *testing.T) {
	size := unsafe.Sizeof(lane[K, T]{})
	n := slabLanes(size)
	want := allocSize(uintptr(n)*size + 8)
	for m := minSlab; m <= maxSlab; m++ {
		require.LessOrEqual(t, want*uintptr(m), allocSize(uintptr(m)*size+8)*uintptr(n), "%d lanes of %d bytes waste less than %d", m, size, n)
	}
	const slabs = 200
	var p lanePool[K, T]
	keep := make([]*lane[K, T], 0, slabs*n)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range slabs * n {
		keep = append(keep, p.get())
	}
	runtime.ReadMemStats(&after)
	got := (after.TotalAlloc - before.TotalAlloc) / slabs
	require.Equal(t, n, p.slabN)
	// A few bytes of the runtime's own may be counted besides the slabs.
	require.GreaterOrEqual(t, got, uint64(want), "a slab of %d lanes of %d bytes", n, size)
	require.Less(t, got, uint64(want)+64, "a slab of %d lanes of %d bytes", n, size)
	t.Logf("lanes of %d bytes: %d per slab, %d bytes a slab, %.1f a lane", size, n, got, float64(got)/float64(n))
	runtime.KeepAlive(keep)
}
