package dispatch

import (
	"math/rand/v2"
	"testing"

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
