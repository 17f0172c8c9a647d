package dispatch

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadyIndex checks the ready index — FIFO runs and the B-tree behind
// them — against a sorted slice: calls inserted in and out of order, more
// priorities than it has runs, removed from the middle and from the front.
func TestReadyIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	ri := newReadyIndex[int, int]()
	var ref []*call[int, int]
	var seq uint64
	now := int64(0)
	sorted := func() {
		slices.SortFunc(ref, func(a, b *call[int, int]) int {
			switch {
			case readyLess(a.entry(), b.entry()):
				return -1
			case readyLess(b.entry(), a.entry()):
				return 1
			}
			return 0
		})
	}
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
			c := &call[int, int]{prio: prio, enq: enq, seq: seq, order: orderKeyOf(enq, int64(prio), 10, 10)}
			ri.insert(c)
			ref = append(ref, c)
		case op < 8: // pop the best
			sorted()
			require.Same(t, ref[0], ri.min().c, "op %d", i)
			require.Same(t, ref[0], ri.popMin(), "op %d", i)
			ref = ref[1:]
		default: // remove one anywhere
			j := r.IntN(len(ref))
			ri.delete(ref[j])
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
	var seq uint64
	mk := func(enq int64) *call[int, int] {
		seq++
		c := &call[int, int]{prio: 1, enq: enq, seq: seq, order: orderKeyOf(enq, 1, 10, 10)}
		ri.insert(c)
		return c
	}
	head := mk(0)
	var behind []*call[int, int]
	for i := range 100_000 {
		behind = append(behind, mk(int64(i+1)))
		if len(behind) == 10 {
			for _, c := range behind {
				ri.delete(c)
			}
			behind = behind[:0]
		}
	}
	f := head.run
	require.NotNil(t, f)
	require.Less(t, len(f.items), 200, "the run holds %d entries for %d calls", len(f.items), f.live)
	require.Same(t, head, ri.popMin())
	for _, c := range behind {
		require.Same(t, c, ri.popMin())
	}
	require.Zero(t, ri.Len())
}

// checkRuns checks each run's bookkeeping: its head is a call (or the end),
// and it counts its calls and holes right.
func checkRuns(t *testing.T, ri *readyIndex[int, int]) {
	t.Helper()
	for _, f := range ri.runs {
		live, holes := 0, 0
		for j, e := range f.items[f.head:] {
			if e.c == nil {
				holes++
				continue
			}
			live++
			require.Same(t, f, e.c.run)
			require.Equal(t, f.base+f.head+j, e.c.runPos)
		}
		require.Equal(t, f.live, live)
		require.Equal(t, f.holes, holes)
		if f.head < len(f.items) {
			require.NotNil(t, f.items[f.head].c, "the head is a call")
		}
	}
}
