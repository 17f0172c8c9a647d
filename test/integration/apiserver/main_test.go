package apiserver

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a goroutine outlives its tests. The tests
// here start no apiserver, so nothing is exempt.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
