package writer

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The versions of ended writes are kept per object, up to the capacity,
// oldest object first out; an object whose writes end again and again
// holds one version and the ring that orders them stays within twice the
// capacity, however many times it ends.
func TestKnownVersionsBounded(t *testing.T) {
	var k known[*corev1.ConfigMap]
	k.init(3)
	end := func(uid types.UID, rv int) {
		k.remember(uid, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{UID: uid, ResourceVersion: fmt.Sprint(rv)}})
		k.end(uid, k.now())
	}
	older := func(uid types.UID, rv int) bool {
		return k.stale(uid, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: fmt.Sprint(rv)}})
	}
	for i := range 10_000 {
		end("hot", 100+i)
		require.LessOrEqual(t, len(k.ring), 2*k.capacity, "after %d ends", i+1)
	}
	end("a", 5)
	end("b", 5)
	assert.True(t, older("hot", 10_000), "the hot object's newest version is kept")
	end("c", 5) // a fourth object: the oldest, "hot", goes
	assert.Len(t, k.versions, 3)
	assert.False(t, older("hot", 10_000), "forgotten")
	for _, uid := range []types.UID{"a", "b", "c"} {
		assert.True(t, older(uid, 4), uid)
	}
	k.forget("a")
	end("d", 5)
	assert.Len(t, k.versions, 3, "a forgotten object frees its place")
	assert.True(t, older("b", 4))
}

// With the largest Capacity (every ended object's version kept), ending an
// object appends its version to the ring: the ring is never copied for
// compaction, which the doubled capacity, overflowed, would do on every
// end, each a copy of every version kept.
func TestKnownVersionsUnboundedCapacityNeverCompacts(t *testing.T) {
	var k known[*corev1.ConfigMap]
	k.init(math.MaxInt)
	end := func(uid types.UID) {
		k.remember(uid, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{UID: uid, ResourceVersion: "5"}})
		k.end(uid, k.now())
	}
	for i := range 100 {
		end(types.UID(fmt.Sprint(i)))
	}
	k.ring = append(make([]ringEntry, 0, 1000), k.ring...) // room to append in place
	first := &k.ring[0]
	end("next")
	require.Len(t, k.ring, 101)
	assert.Same(t, first, &k.ring[0], "the ring was copied")
	assert.Len(t, k.versions, 101)
}
