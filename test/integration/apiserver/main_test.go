package apiserver

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a goroutine outlives its tests. The
// servers run in processes of their own, so nothing is exempt.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
