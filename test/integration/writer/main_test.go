package writer_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a goroutine outlives the tests, with
// nothing exempt: kube-apiserver and etcd run in processes of their own
// (apiserver.Start), so every goroutine left in this one is the tests',
// the writer's or client-go's, and each must have ended once the writers,
// informers, watches and servers are stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
