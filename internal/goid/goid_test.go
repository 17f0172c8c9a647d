package goid

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestID(t *testing.T) {
	me := ID()
	assert.NotZero(t, me)
	assert.Equal(t, me, ID(), "stable within a goroutine")
	other := make(chan uint64)
	go func() { other <- ID() }()
	them := <-other
	assert.NotZero(t, them)
	assert.NotEqual(t, me, them)
}
