package dispatch

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPostsDueModel (internal) drives the deadline index of posts with
// random additions, removals anywhere and removals of the earliest, and
// checks it against a sorted list after every step: the earliest call, the
// count, and that the run holds at most about two entries per call in it.
// Most deadlines come in order (the run), some not (the B-tree); some are
// extended (taken out and indexed again, at a later time, with the same
// seq); calls are remade in place after they leave, as a lane remakes its
// call, so that a dead entry pointing at a call indexed again is exercised.
func TestPostsDueModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outOfOrd float64 // share of additions whose deadline goes back
		fifo     float64 // share of removals that take the oldest
		limit    int     // the most calls in the run
	}{
		{"in order, FIFO", 0, 0.9, maxRun},
		{"in order, any", 0, 0, maxRun},
		{"in order, run full", 0, 0.5, 40},
		{"mixed", 0.2, 0.5, maxRun},
		{"mostly out of order", 0.8, 0.3, maxRun},
	} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("%s/%d", tc.name, seed), func(t *testing.T) {
				postsDueModel(t, rand.New(rand.NewPCG(seed, 7)), tc.outOfOrd, tc.fifo, tc.limit)
			})
		}
	}
}

func postsDueModel(t *testing.T, rng *rand.Rand, outOfOrd, fifo float64, limit int) {
	p := newPostsDue[int, int]()
	p.limit = limit
	cells := make([]call[int, int], 300) // remade in place, as lanes do
	var in []*call[int, int]             // indexed, in arrival order
	var sorted []*call[int, int]         // indexed, by (posts.at, seq)
	var seq uint64
	at := int64(1000) // above any deadline's step back, so 0 stays "not indexed"
	byDue := func(a, b *call[int, int]) int {
		return cmp.Or(cmp.Compare(a.posts.at, b.posts.at), cmp.Compare(a.seq, b.seq))
	}
	drop := func(s []*call[int, int], c *call[int, int]) []*call[int, int] {
		return slices.DeleteFunc(s, func(x *call[int, int]) bool { return x == c })
	}
	put := func(c *call[int, int]) {
		p.add(c)
		i, _ := slices.BinarySearchFunc(sorted, c, byDue)
		sorted = slices.Insert(sorted, i, c)
	}
	out := func(c *call[int, int]) {
		p.remove(c)
		sorted = drop(sorted, c)
	}
	for step := range 10_000 {
		switch r := rng.Float64(); {
		case r < 0.5 && len(in) < len(cells):
			var c *call[int, int]
			for c == nil || c.posts.at != 0 {
				c = &cells[rng.IntN(len(cells))]
			}
			seq++
			*c = call[int, int]{seq: seq}
			at += int64(rng.IntN(3)) // equal deadlines too
			c.posts.at = at
			if rng.Float64() < outOfOrd {
				c.posts.at = at - int64(rng.IntN(50))
			}
			put(c)
			in = append(in, c)
		case r < 0.55 && len(in) > 0:
			// A deadline extended: the clock takes the call out and
			// indexes it again at the new time, with its own seq.
			c := in[rng.IntN(len(in))]
			out(c)
			at += int64(rng.IntN(3))
			c.posts.at = at
			put(c)
		case r < 0.75 && len(in) > 0:
			c := in[0]
			if rng.Float64() >= fifo {
				c = in[rng.IntN(len(in))]
			}
			out(c)
			c.posts.at = 0
			in = drop(in, c)
		case len(in) > 0:
			got, ok := p.min()
			if !ok || got != sorted[0] {
				t.Fatalf("step %d: the earliest is %p (%v), want %p", step, got, ok, sorted[0])
			}
			p.removeMin(got)
			sorted = sorted[1:]
			got.posts.at = 0
			in = drop(in, got)
		}
		if p.Len() != len(in) {
			t.Fatalf("step %d: Len %d, want %d", step, p.Len(), len(in))
		}
		if got, ok := p.min(); len(sorted) > 0 && got != sorted[0] || ok != (len(sorted) > 0) {
			t.Fatalf("step %d: the earliest is %p (%v), want the first of %d", step, got, ok, len(sorted))
		}
		if n := len(p.run) - p.head; n > 2*p.live+minRunWaste+1 {
			t.Fatalf("step %d: the run holds %d entries for %d calls", step, n, p.live)
		}
		if p.live > limit {
			t.Fatalf("step %d: the run holds %d calls, more than %d", step, p.live, limit)
		}
		if p.live > 0 && !p.run[p.head].isLive() {
			t.Fatalf("step %d: the head is dead", step)
		}
	}
	for len(in) > 0 {
		c := in[rng.IntN(len(in))]
		out(c)
		c.posts.at = 0
		in = drop(in, c)
	}
	require.Zero(t, p.Len())
	require.Zero(t, p.head)
	require.Empty(t, p.run)
}

// TestPostsDueRunLetsGo (internal): the run holds at most maxRun calls of
// a burst, the rest going to the B-tree, and once they have left, leaves
// no large array behind, and neither does a squeeze that keeps few of
// them.
func TestPostsDueRunLetsGo(t *testing.T) {
	const n = 100_000
	p := newPostsDue[int, int]()
	p.limit = n // to let a squeeze meet a large array
	cs := make([]call[int, int], n)
	for i := range cs {
		cs[i].seq, cs[i].posts.at = uint64(i+1), int64(i+1)
		p.add(&cs[i])
	}
	require.Equal(t, n, p.live, "in order: all in the run")
	require.Zero(t, p.tree.Len())
	for i := 1; i < n; i++ { // all but the first: the head stays
		p.remove(&cs[i])
	}
	require.Equal(t, 1, p.Len())
	require.LessOrEqual(t, cap(p.run), maxKeptRun, "squeezed to a small array")
	p.remove(&cs[0])

	p = newPostsDue[int, int]()
	for i := range cs {
		cs[i] = call[int, int]{seq: uint64(i + 1)}
		cs[i].posts.at = int64(i + 1)
		p.add(&cs[i])
	}
	require.Equal(t, maxRun, p.live, "a full run")
	require.Equal(t, n-maxRun, p.tree.Len(), "the rest in the B-tree")
	for i := range cs {
		got, ok := p.min()
		require.True(t, ok)
		require.Same(t, &cs[i], got, "in order across both")
		p.removeMin(got)
	}
	require.Zero(t, p.Len())
	require.LessOrEqual(t, cap(p.run), maxKeptRun)
	_, ok := p.min()
	require.False(t, ok)
}
