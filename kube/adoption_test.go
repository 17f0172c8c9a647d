package kube

import (
	"context"
	"os"
	"regexp"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
)

// TestAdoptionFencesEveryWrite: the adoption snippets (the package doc, its
// README and the repository's) give every write of a scheduling attempt its
// number, the status patch as the binding. The reason, shown here: a
// status patch without it, reporting the failure of a binding still in
// flight (its Wait's context ended first), is older than that binding, and
// refused (dispatch.ErrStale); with the attempt's number it is queued
// behind it, and judged once the binding's outcome is known.
func TestAdoptionFencesEveryWrite(t *testing.T) {
	call := regexp.MustCompile(`d\.(Post|Submit)\([^\n]*kube\.(PatchStatus|Bind)\([^\n]*`)
	for _, f := range []string{"doc.go", "README.md", "../README.md"} {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		calls := call.FindAllString(string(src), -1)
		require.Len(t, calls, 2, "%s: the adoption snippet's status patch and binding", f)
		for _, c := range calls {
			assert.Contains(t, c, "kube.SubmitOptions{Generation: attempt}", "%s: %s", f, c)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		d := newTestDispatcher(t, api, Options{})
		release := api.hold("create/binding", "p")
		const attempt = 3
		ctx, cancel := context.WithCancel(context.Background())
		tk, err := d.Submit(ctx, Bind(api.pod("p"), "n1"), SubmitOptions{Generation: attempt})
		require.NoError(t, err)
		synctest.Wait() // the binding is in flight
		cancel()
		_, err = tk.Wait(ctx)
		require.Error(t, err, "the binding cycle gave up waiting")

		failed := PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("binding timed out")}})
		assert.ErrorIs(t, d.Post(failed, SubmitOptions{}), dispatch.ErrStale, "a patch without the attempt's number")
		report, err := d.Submit(context.Background(), failed, SubmitOptions{Generation: attempt})
		require.NoError(t, err, "the attempt's report, queued behind its binding")
		release()
		// The binding landed after all, so the report has nothing left to
		// say: a bound pod's PodScheduled=False is not sent.
		assert.Equal(t, dispatch.StateSkipped, outcome(t, report).State)
		assert.Equal(t, "n1", api.pod("p").Spec.NodeName)
		assert.Equal(t, 1, api.count("create/binding"))
	})
}
