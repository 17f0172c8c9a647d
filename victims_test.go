package dispatch

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVictimIndexModel (internal) drives the queue's victims index with
// random insertions and removals — the oldest (a worker takes it), the
// worst (it is shed) or any — and checks it against a sorted list after
// every step: the worst call, the call worst picks for a newcomer, the
// count, that the run is in order with both ends live, and that it holds
// at most about two entries per call in it. Most calls come in order (the
// run), some not (the B-tree): a higher priority, an older enqueue time.
// Some leave and come back with the same order and seq, as a call does
// when a retry is promoted; calls are remade in place after they leave,
// as a lane remakes its call.
func TestVictimIndexModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outOfOrd float64 // share of insertions that are not the newest
		fifo     float64 // share of removals that take the oldest
		shed     float64 // share of removals that take the worst
		limit    int     // the most calls in the run
	}{
		{"in order, FIFO", 0, 0.9, 0.05, maxRun},
		{"in order, shed", 0, 0.3, 0.6, maxRun},
		{"in order, any", 0, 0, 0, maxRun},
		{"in order, run full", 0, 0.5, 0.2, 40},
		{"mixed", 0.2, 0.4, 0.2, maxRun},
		{"mostly out of order", 0.8, 0.3, 0.3, maxRun},
	} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("%s/%d", tc.name, seed), func(t *testing.T) {
				victimIndexModel(t, rand.New(rand.NewPCG(seed, 11)), tc.outOfOrd, tc.fifo, tc.shed, tc.limit)
			})
		}
	}
}

func victimIndexModel(t *testing.T, rng *rand.Rand, outOfOrd, fifo, shed float64, limit int) {
	v := newVictimIndex[int, int]()
	v.limit = limit
	cells := make([]call[int, int], 300) // remade in place, as lanes do
	keyOf := map[*call[int, int]]entry[int, int]{}
	var sorted []entry[int, int] // indexed, in ready order
	var seq uint64
	enq := int64(1000)
	byOrder := func(a, b entry[int, int]) int {
		switch {
		case readyLess(a, b):
			return -1
		case readyLess(b, a):
			return 1
		}
		return 0
	}
	put := func(e entry[int, int]) {
		v.insert(e)
		keyOf[e.c] = e
		i, found := slices.BinarySearchFunc(sorted, e, byOrder)
		require.False(t, found)
		sorted = slices.Insert(sorted, i, e)
	}
	out := func(e entry[int, int]) {
		v.delete(e)
		delete(keyOf, e.c)
		i, found := slices.BinarySearchFunc(sorted, e, byOrder)
		require.True(t, found)
		sorted = slices.Delete(sorted, i, i+1)
	}
	var away []entry[int, int] // left, to come back with the same order
	for step := range 10_000 {
		switch r := rng.Float64(); {
		case r < 0.45 && len(keyOf)+len(away) < len(cells):
			var c *call[int, int]
			for c == nil || c.seq != 0 {
				c = &cells[rng.IntN(len(cells))]
			}
			seq++
			*c = call[int, int]{seq: seq}
			enq += int64(rng.IntN(3)) // equal enqueue times too
			prio, at := 0, enq
			if rng.Float64() < outOfOrd {
				if rng.IntN(2) == 0 {
					prio = 1 + rng.IntN(3)
				} else {
					at -= int64(rng.IntN(50))
				}
			}
			put(entry[int, int]{orderKeyOf(at, int64(prio), 1, 0), seq, c})
		case r < 0.5 && len(away) > 0:
			i := rng.IntN(len(away))
			put(away[i])
			away = slices.Delete(away, i, i+1)
		case len(sorted) > 0:
			e := sorted[rng.IntN(len(sorted))]
			switch r := rng.Float64(); {
			case r < fifo:
				e = sorted[0]
			case r < fifo+shed:
				e = sorted[len(sorted)-1]
			}
			out(e)
			if rng.IntN(8) == 0 {
				away = append(away, e) // a retry, back later
			} else {
				e.c.seq = 0
			}
		}
		if v.Len() != len(sorted) {
			t.Fatalf("step %d: Len %d, want %d", step, v.Len(), len(sorted))
		}
		got, ok := v.max()
		if ok != (len(sorted) > 0) || ok && got != sorted[len(sorted)-1] {
			t.Fatalf("step %d: the worst is %v (%v), want the last of %d", step, got, ok, len(sorted))
		}
		// A newcomer at a random place: the worst goes for it only if it
		// is worse than the newcomer.
		nc := entry[int, int]{orderKeyOf(enq-int64(rng.IntN(60)), int64(rng.IntN(4)), 1, 0), seq + 1, nil}
		var want *call[int, int]
		if len(sorted) > 0 && readyLess(nc, sorted[len(sorted)-1]) {
			want = sorted[len(sorted)-1].c
		}
		if w := v.worst(nc.order, nc.seq); w != want {
			t.Fatalf("step %d: worst for a newcomer is %p, want %p", step, w, want)
		}
		if v.live > 0 {
			run := v.run[v.head:]
			if run[0].c == nil || run[len(run)-1].c == nil {
				t.Fatalf("step %d: an end of the run is dead", step)
			}
			if n := len(run); n > 2*v.live+minRunWaste+1 {
				t.Fatalf("step %d: the run holds %d entries for %d calls", step, n, v.live)
			}
			for i := 1; i < len(run); i++ {
				if !readyLess(run[i-1], run[i]) {
					t.Fatalf("step %d: the run is out of order at %d", step, i)
				}
			}
		}
		if v.live > limit {
			t.Fatalf("step %d: the run holds %d calls, more than %d", step, v.live, limit)
		}
	}
	for len(sorted) > 0 {
		out(sorted[rng.IntN(len(sorted))])
	}
	require.Zero(t, v.Len())
	require.Zero(t, v.head)
	require.Empty(t, v.run)
}

// TestVictimIndexRunLetsGo (internal): a squeeze that keeps few of a
// burst's calls leaves no large array behind; the run holds at most maxRun
// calls of a burst, the rest going to the B-tree, the worst found across
// both; and once they have left, no large array stays.
func TestVictimIndexRunLetsGo(t *testing.T) {
	const n = 100_000
	cs := make([]call[int, int], n)
	es := make([]entry[int, int], n)
	fill := func(v *victimIndex[int, int]) {
		for i := range cs {
			cs[i] = call[int, int]{seq: uint64(i + 1)}
			es[i] = entry[int, int]{orderKeyOf(int64(i), 0, 1, 0), cs[i].seq, &cs[i]}
			v.insert(es[i])
		}
	}
	v := newVictimIndex[int, int]()
	v.limit = n // to let a squeeze meet a large array
	fill(&v)
	require.Equal(t, n, v.live, "in order: all in the run")
	require.Zero(t, v.tree.Len())
	for i := 1; i < n-1; i++ { // all but the ends, from the middle
		v.delete(es[i])
	}
	require.Equal(t, 2, v.Len())
	require.LessOrEqual(t, cap(v.run), maxKeptRun, "squeezed to a small array")
	w, ok := v.max()
	require.True(t, ok)
	require.Same(t, &cs[n-1], w.c)
	v.delete(es[0])
	v.delete(es[n-1])

	v = newVictimIndex[int, int]()
	fill(&v)
	require.Equal(t, maxRun, v.live, "a full run")
	require.Equal(t, n-maxRun, v.tree.Len(), "the rest in the B-tree")
	for i := n - 1; i >= 0; i-- { // the worst first, as shedding takes them
		w, ok := v.max()
		require.True(t, ok)
		require.Same(t, &cs[i], w.c, "in order across both")
		v.delete(w)
	}
	require.Zero(t, v.Len())
	require.LessOrEqual(t, cap(v.run), maxKeptRun)
	_, ok = v.max()
	require.False(t, ok)
}
