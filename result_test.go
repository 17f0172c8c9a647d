package dispatch

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestStateCountsTotal: StateCounts.Total sums every state.
func TestStateCountsTotal(t *testing.T) {
	var c StateCounts
	c[StateSucceeded], c[StateFailed], c[StateClosed] = 3, 2, 1
	assert.Equal(t, uint64(6), c.Total())
}
