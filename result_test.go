package dispatch

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestStatsByState: Stats reports every terminal state, counted or not,
// so that its maps do not freeze the number of states into the API.
func TestStatsByState(t *testing.T) {
	var c stateCounts
	c[StateSucceeded], c[StateFailed], c[StateClosed] = 3, 2, 1
	m := c.byState()
	assert.Len(t, m, numStates-1)
	assert.Equal(t, uint64(3), m[StateSucceeded])
	assert.Equal(t, uint64(0), m[StateStale])
	assert.Equal(t, uint64(6), total(m))
}
