package dispatch

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLaneReuse (internal): released lanes are kept for new keys up to
// maxFreeLanes, hold nothing of the key that left (no key, value or waiter
// is kept alive), and a key in a reused lane behaves as in a new one; as
// the keys leave, the key table shrinks a second later and the free list
// keeps its lanes.
// It reads the dispatcher's lane table and free list under its lock.
func TestLaneReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, *int]()
		const stay = 600 // keeps the table large: 4 706 keys take 8 192 slots, and 600 are more than a sixteenth
		d, _, release := holdWorker(t, f.exec, Config[string, *int]{Capacity: 2 * maxFreeLanes})
		n := maxFreeLanes + 10
		for i := range n + stay {
			v := i
			submit(t, d, fmt.Sprint(i), &v, SubmitOptions{Generation: 5})
		}
		for i := range n {
			require.True(t, d.Cancel(fmt.Sprint(i), nil))
		}
		d.mu.Lock()
		require.Len(t, d.lanes.slots, 8192)
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

		// The rest leave: a second later the table has shrunk to
		// shrunkSlots, and the free list keeps a lane for every
		// keptPerSlot of its slots, cleared.
		for i := n; i < n+stay; i++ {
			require.True(t, d.Cancel(fmt.Sprint(i), nil))
		}
		d.mu.Lock()
		grown := len(d.lanes.slots)
		d.mu.Unlock()
		assert.Greater(t, grown, shrunkSlots, "not at once")
		time.Sleep(time.Duration(shrinkAfter))
		synctest.Wait()
		d.mu.Lock()
		assert.Equal(t, 2, d.lanes.Len(), "the held key and the new one")
		assert.Equal(t, shrunkSlots, len(d.lanes.slots))
		assert.Len(t, d.lanes.pool.free, shrunkSlots/keptPerSlot)
		for _, s := range d.lanes.pool.free {
			require.Equal(t, lane[string, *int]{}, *s, "a released lane keeps state")
		}
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
	want := slabBytes(size)
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

// slabBytes is what the runtime allocates for a slab of lanes of size
// bytes.
func slabBytes(size uintptr) uintptr { return allocSize(uintptr(slabLanes(size))*size + 8) }

// TestBurstDrainedFreesMemory: what a burst of keys leaves behind once it
// has drained does not grow with the burst: a second after the drain the
// key table has shrunk back to shrunkSlots (16 KiB), and what else stays
// is the lanes kept for reuse (shrunkSlots/keptPerSlot of them) with the
// slabs that hold them and the first chunk of each priority's FIFO run
// (ten here), within drainedBytes of what it held before the burst.
func TestBurstDrainedFreesMemory(t *testing.T) {
	docSays(t, "", fmt.Sprintf("what stays is at most %d lanes kept for reuse, with the memory that holds them", shrunkSlots/keptPerSlot))
	docSays(t, "README.md", fmt.Sprintf("a second after the keys have left, the key table has shrunk, and at most %d lanes are kept for reuse", shrunkSlots/keptPerSlot))
	slab := int64(slabBytes(unsafe.Sizeof(lane[int, int]{})))
	for _, n := range []int{10_000, 100_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				d := newD(t, func(_ context.Context, k, _ int) error {
					if k == -1 {
						<-release
					}
					return nil
				}, Config[int, int]{Workers: 1, Capacity: n + 1})
				require.NoError(t, d.Post(-1, 0, SubmitOptions{})) // holds the worker while the burst arrives
				synctest.Wait()
				settle()
				before := heapAlloc()
				s := newScaleOpts(n, false)
				for k := range n {
					require.NoError(t, d.Post(k, k, s.of(k)))
				}
				full := heapAlloc()
				close(release)
				synctest.Wait()
				st := d.Stats()
				require.Zero(t, st.Ready+st.InFlight, "drained")
				time.Sleep(time.Duration(shrinkAfter)) // the table shrinks a second after it turned sparse
				synctest.Wait()
				held := int64(heapAlloc()) - int64(before)
				d.mu.Lock()
				slabs := int64(len(d.lanes.pool.free)) * slab // at most: each kept lane in a slab of its own
				assert.Equal(t, shrunkSlots, len(d.lanes.slots))
				assert.LessOrEqual(t, len(d.lanes.pool.free), shrunkSlots/keptPerSlot)
				d.mu.Unlock()
				t.Logf("%d keys: %.1f bytes a queued call; drained, %d bytes held", n, float64(full-before)/float64(n), held)
				assert.Less(t, held, slabs+drainedBytes, "held after %d keys drained", n)
				if n == 100_000 {
					mb := fmt.Sprintf("%.1f MB stays after 10⁵ int keys", float64(held)/1e6)
					docSays(t, "README.md", mb)
				}
				closeD(t, d)
			})
		})
	}
}

const drainedBytes = 128 << 10

// TestReleasedValuesCollected: a key that has left keeps nothing alive
// through the dispatcher, whether its lane was kept for reuse or let go
// beyond the free list's bound while other lanes of its slab stay in use,
// and whether its call was cancelled or ran: every value is collected
// while the dispatcher lives on.
func TestReleasedValuesCollected(t *testing.T) {
	type payload [64]byte
	// stay: keys that stay queued meanwhile, as a live dispatcher's do.
	const n, stay = 3 * maxFreeLanes, 2100
	release, started := make(chan struct{}), make(chan struct{})
	var done sync.WaitGroup
	d := newD(t, func(_ context.Context, k string, _ *payload) error {
		if k == "hold" {
			close(started)
			<-release
		}
		return nil
	}, Config[string, *payload]{Workers: 1, Capacity: n + stay + 1, OnDone: func(r Result[string, *payload]) {
		if strings.HasPrefix(r.Key, "ran") {
			done.Done()
		}
	}})
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open) // before Close, if the test stops early
	require.NoError(t, d.Post("hold", nil, SubmitOptions{}))
	<-started
	var collected atomic.Int64
	watched := func(key string) {
		v := new(payload)
		runtime.AddCleanup(v, func(*atomic.Int64) { collected.Add(1) }, &collected)
		require.NoError(t, d.Post(key, v, SubmitOptions{}))
	}
	for i := range n {
		watched(fmt.Sprint(i))
	}
	for i := range stay {
		require.NoError(t, d.Post(fmt.Sprint("stay", i), new(payload), SubmitOptions{}))
	}
	// Every third key leaves first and fills the free list; the others'
	// lanes, let go, share their slabs with those kept.
	for _, first := range []bool{true, false} {
		for i := range n {
			if (i%3 == 0) == first {
				require.True(t, d.Cancel(fmt.Sprint(i), nil))
			}
		}
	}
	d.mu.Lock()
	require.Len(t, d.lanes.pool.free, maxFreeLanes, "the free list is full, so most lanes were let go")
	d.mu.Unlock()
	// Then as many run, and end.
	done.Add(n)
	open()
	for i := range n {
		watched(fmt.Sprint("ran", i))
	}
	done.Wait()
	for range 100 {
		if collected.Load() == 2*n {
			break
		}
		runtime.GC()
		runtime.Gosched()
	}
	assert.Equal(t, int64(2*n), collected.Load(), "values of released keys collected")
	runtime.KeepAlive(d)
}
