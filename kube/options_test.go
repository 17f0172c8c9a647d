package kube

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLowestPriorities: priorities at the bottom of the int range, where a
// band's first priority lies below it, are accepted as any others. The
// preset used to compute the reservation's band start as band × width,
// which wraps for the lowest eight ints, and NewDispatcher failed naming
// Config.Start.UrgentPriority — a field the caller cannot set, with a
// value it never gave.
func TestLowestPriorities(t *testing.T) {
	for off := range 12 {
		p := math.MinInt + off
		t.Run(fmt.Sprintf("MinInt+%d", off), func(t *testing.T) {
			d, err := NewDispatcher(newFakeAPI().client(), Options{Priorities: map[CallType]int{PodBinding: p, PodDeletion: p, PodStatusPatch: p}})
			require.NoError(t, err)
			s := d.Stats()
			assert.Equal(t, 16/4, s.Reserved)
			require.NoError(t, d.Close(t.Context()))
		})
	}
	_, err := NewDispatcher(newFakeAPI().client(), Options{Priorities: map[CallType]int{PodBinding: math.MinInt + 5, PodStatusPatch: math.MinInt}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.Priorities", "a status patch below the binding in the lowest band is named as the caller set it")
}
