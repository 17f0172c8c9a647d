package apidispatcher

import (
	"fmt"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestLargeParallelism: kube-scheduler validates only parallelism > 0, and
// upstream's New accepts any such value; so does the drop-in's (the adapter
// clamps what the core cannot run). It used to panic above 65 536.
func TestLargeParallelism(t *testing.T) {
	for _, p := range []int{1, 1 << 16, 1<<16 + 1, 100_000} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			ad := New(fake.NewClientset(), p, fwk.APICallRelevances{})
			ad.Close()
		})
	}
}
