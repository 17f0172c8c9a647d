package dispatch

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/coalescer/dispatch/internal/prefetch"
	"github.com/stretchr/testify/require"
)

// cmpReady orders calls as a ready index of o does.
func cmpReady(o orderer) func(a, b *call[int, int]) int {
	return func(a, b *call[int, int]) int {
		switch {
		case readyLess(entryOf(o, a), entryOf(o, b)):
			return -1
		case readyLess(entryOf(o, b), entryOf(o, a)):
			return 1
		}
		return 0
	}
}

// TestReadyIndex checks the ready index — FIFO runs and the B-tree behind
// them — against a sorted slice: calls inserted in and out of order, more
// priorities than it has runs, removed from the middle and from the front.
func TestReadyIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	ri := newReadyIndex[int, int]()
	var ref []*call[int, int]
	var seq uint64
	now := int64(0)
	o := orderer{band: 10, aging: 10}
	sorted := func() { slices.SortFunc(ref, cmpReady(o)) }
	for i := range 50_000 {
		switch op := r.IntN(10); {
		case op < 5 || len(ref) == 0: // insert
			now += int64(r.IntN(3))
			prio := r.IntN(3 * maxRuns)
			enq := now
			if r.IntN(5) == 0 {
				enq -= int64(r.IntN(1000)) // a retry or a successor: out of order
			}
			seq++
			c := &call[int, int]{prio: prio, enq: enq, seq: seq}
			ri.insert(c, entryOf(o, c))
			ref = append(ref, c)
		case op < 8: // pop the best
			sorted()
			require.Same(t, ref[0], ri.min().c, "op %d", i)
			require.Same(t, ref[0], ri.popMin(), "op %d", i)
			ref = ref[1:]
		default: // remove one anywhere
			j := r.IntN(len(ref))
			ri.delete(ref[j], o)
			ref = slices.Delete(ref, j, j+1)
		}
		require.Equal(t, len(ref), ri.Len())
		if i%500 == 0 {
			checkRuns(t, &ri)
		}
	}
	sorted()
	for _, c := range ref {
		require.Same(t, c, ri.popMin())
	}
	require.Zero(t, ri.Len())
}

// TestReadyIndexHoles: a call that stays at the head of its run while the
// calls behind it come and go must not let the run's memory grow with
// them: the holes they leave are squeezed out.
func TestReadyIndexHoles(t *testing.T) {
	ri := newReadyIndex[int, int]()
	o := orderer{band: 10, aging: 10}
	var seq uint64
	mk := func(enq int64) *call[int, int] {
		seq++
		c := &call[int, int]{prio: 1, enq: enq, seq: seq}
		ri.insert(c, entryOf(o, c))
		return c
	}
	head := mk(0)
	var behind []*call[int, int]
	for i := range 100_000 {
		behind = append(behind, mk(int64(i+1)))
		if len(behind) == 10 {
			for _, c := range behind {
				ri.delete(c, o)
			}
			behind = behind[:0]
		}
	}
	require.NotZero(t, head.run)
	f := ri.runs[head.run-1]
	require.LessOrEqual(t, len(f.chunks), 2, "the run holds %d chunks for %d calls", len(f.chunks), f.live)
	require.Less(t, f.tail-f.head, 200, "the run holds %d entries for %d calls", f.tail-f.head, f.live)
	require.Same(t, head, ri.popMin())
	for _, c := range behind {
		require.Same(t, c, ri.popMin())
	}
	require.Zero(t, ri.Len())
}

// TestReadyIndexChunks drives long runs — thousands of calls of two
// priorities in bursts, taken from the head, from the middle and all at
// once — so that chunks fill, are freed from the front, are squeezed and
// start over empty, checking the order against a sorted slice and each
// run's bookkeeping as it goes. A drained backlog leaves one chunk behind.
func TestReadyIndexChunks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ri := newReadyIndex[int, int]()
	o := orderer{band: 1}
	var ref []*call[int, int]
	var seq uint64
	for round := range 40 {
		for range r.IntN(3 * runChunk) { // a burst, in order within its priority
			seq++
			prio := r.IntN(2)
			c := &call[int, int]{prio: prio, enq: int64(seq), seq: seq}
			ri.insert(c, entryOf(o, c))
			ref = append(ref, c)
		}
		slices.SortFunc(ref, cmpReady(o))
		for i := 0; len(ref) > 0 && i < len(ref)/2+1; i++ {
			switch op := r.IntN(4); {
			case op < 2:
				require.Same(t, ref[0], ri.popMin(), "round %d", round)
				ref = ref[1:]
			default: // from the middle: a hole, and squeezes
				j := r.IntN(len(ref))
				ri.delete(ref[j], o)
				ref = slices.Delete(ref, j, j+1)
			}
			if i%97 == 0 {
				checkRuns(t, &ri)
			}
		}
		require.Equal(t, len(ref), ri.Len())
		checkRuns(t, &ri)
		if round%5 == 4 { // drain all
			for len(ref) > 0 {
				require.Same(t, ref[0], ri.popMin())
				ref = ref[1:]
			}
			checkRuns(t, &ri)
			for _, f := range ri.runs {
				require.Zero(t, f.live)
				require.LessOrEqual(t, len(f.chunks), 1, "an empty run keeps %d chunks", len(f.chunks))
				require.Nil(t, f.spare, "an empty run keeps a spare chunk")
			}
		}
	}
}

// checkRuns checks each run's bookkeeping: its head is a call (or the end),
// and it counts its calls and holes right.
func checkRuns(t *testing.T, ri *readyIndex[int, int]) {
	t.Helper()
	for _, f := range ri.runs {
		live, holes := 0, 0
		n := 0
		for i, ch := range f.chunks {
			if i < len(f.chunks)-1 {
				require.Len(t, ch, runChunk, "chunk %d of %d is not full", i, len(f.chunks))
			}
			n += len(ch)
		}
		require.Equal(t, f.tail-f.base, n, "the chunks hold every position from base to tail")
		require.Less(t, f.head-f.base, runChunk, "a consumed chunk is kept")
		for p := f.base; p < f.head; p++ {
			require.Nil(t, *f.at(p), "position %d, before the head, holds a call", p)
		}
		for p := f.head; p < f.tail; p++ {
			c := *f.at(p)
			if c == nil {
				holes++
				continue
			}
			live++
			require.Same(t, f, ri.runs[c.run-1])
			require.Equal(t, p, int(c.pos))
		}
		require.Equal(t, f.live, live)
		require.Equal(t, f.holes, holes)
		if f.head < f.tail {
			require.NotNil(t, *f.at(f.head), "the head is a call")
		}
	}
}

// TestCallLines checks the addresses a run's new head is prefetched at
// (prefetchCall): every cache line of its lane, whatever the key and value
// types make of the lane's size and wherever a lane starts in its line (a
// slab's lanes start at every offset their size steps through), and of a
// lane of more than four lines, its first three and its last.
func TestCallLines(t *testing.T) {
	checkCallLines[string, int](t)
	checkCallLines[int, int](t)
	checkCallLines[string, [5]string](t)
	checkCallLines[string, [40]string](t)
}

func checkCallLines[K comparable, T any](t *testing.T) {
	t.Helper()
	const line = prefetch.LineSize
	check := func(l *lane[K, T], where string) {
		t.Helper()
		lo := uintptr(unsafe.Pointer(l))
		hi := lo + unsafe.Sizeof(*l) - 1
		got := map[uintptr]bool{}
		for _, a := range callLines(&l.first) {
			require.True(t, a >= lo && a <= hi, "lane[%T, %T] %s: %#x is outside the lane [%#x, %#x]", *new(K), *new(T), where, a, lo, hi)
			got[a/line] = true
		}
		first, last := lo/line, hi/line
		want := map[uintptr]bool{}
		for n := first; n <= last; n++ {
			if last-first < 4 || n < first+3 || n == last {
				want[n] = true
			}
		}
		require.Equal(t, want, got, "lane[%T, %T] %s (at %d in its line, %d bytes): the lines asked for", *new(K), *new(T), where, lo%line, unsafe.Sizeof(*l))
	}
	slab := make([]lane[K, T], 16)
	for i := range slab {
		check(&slab[i], fmt.Sprintf("%d of a slab", i))
	}
	// A lane at every offset a word can start at in a line. callLines
	// only computes addresses, so a lane's place in a byte buffer will do.
	buf := make([]byte, unsafe.Sizeof(lane[K, T]{})+2*line)
	start := int(line - uintptr(unsafe.Pointer(&buf[0]))%line)
	for off := 0; off < line; off += 8 {
		check((*lane[K, T])(unsafe.Pointer(&buf[start+off])), fmt.Sprintf("at offset %d", off))
	}
}
