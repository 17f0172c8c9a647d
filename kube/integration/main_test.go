package integration

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a goroutine outlives the tests, as in every
// package of this repository, with one exception the apiserver forces.
//
// Every server a test starts is torn down on t.Cleanup (apiserver.Start),
// and after that the only goroutine kube-apiserver leaves is its klog health
// check: k8s.io/apiserver/pkg/server/healthz starts it once per process, on
// the first /healthz, as a wait.Forever loop that nothing can stop. It is
// ignored by that function, which by its contract never returns. Everything
// else — this module's, client-go's, etcd client's, the apiserver's own —
// must have ended. Keeping it so is why apiserver.Start turns off the test
// server's client-certificate authentication: with it on, client-go starts a
// certificate-reloading loop per server that never stops either.
//
// If a Kubernetes upgrade leaves more behind, add the function that marks it
// here with a word on why, rather than loosening the check to our own
// goroutines only.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.Forever"))
}
