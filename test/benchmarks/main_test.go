package benchmarks

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: the queues under
// comparison are shut down, and every storm dispatcher is closed and its
// binders waited for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
