package writer_test

import (
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Another writer unsets a field the desire sets, after the object the
// writer holds was read: ModeUpdate's write is refused as stale and the
// change, applied again to the object read, restores it; ModePatch sends
// only what the change changed on the object it holds, which left that
// field as it was, so the patch lands without restoring it — as the
// documentation of ModePatch says.
func TestPatchDoesNotRestoreAFieldUnsetSinceTheBaseline(t *testing.T) {
	require.Contains(t, fileDoc(t, "options.go"), "A field the change sets to the value it already has on that object is not sent: if another writer changed it since, the patch does not restore it (their change's watch event brings the reconcile that does), where ModeUpdate's conflict would.")
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := deployment("a")
				setCondition(d, "Ready", corev1.ConditionTrue, "")
				e := newEnv(t, d)
				held := e.get(t, "a") // Ready, as the writer's own earlier write left it
				require.NoError(t, e.api.Change(deploymentsGVR, "default", "a", func(o runtime.Object) {
					setCondition(o.(deploy), "Ready", corev1.ConditionFalse, "other writer")
				}))
				w := newWriter(t, e, writer.Options[deploy]{Mode: mode})
				tk, err := w.Submit(t.Context(), held, status(writer.Chain(condition("Ready", corev1.ConditionTrue), replicas(3))), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, dispatch.StateSucceeded, res.State)
				got := e.get(t, "a")
				assert.Equal(t, int32(3), got.Status.Replicas)
				want := corev1.ConditionTrue
				if mode == writer.ModePatch {
					want = corev1.ConditionFalse
				}
				assert.Equal(t, want, conditionOf(got, "Ready"))
			})
		})
	}
}
