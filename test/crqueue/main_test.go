package crqueue

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every queue's goroutines end with it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
