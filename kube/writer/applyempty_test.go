package writer_test

import (
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// A typed change in ModeApply that sets a pointer to an empty struct
// (a pod template's securityContext: {}) sends it — the body is the object
// as JSON — while the empty structs of fields it leaves zero are not: the
// desire lands, and is met once live.
func TestApplySendsAnEmptyStructATypedChangeSets(t *testing.T) {
	require.Contains(t, fileDoc(t, "doc.go"), "The body is that object as JSON, without nulls: for a typed object, every field whose JSON tag has no omitempty is sent, a zero one too (a PodDisruptionBudget's status counts, say), and is then this manager's — but the empty struct of such a field the change left alone, while an empty struct it set (a securityContext: {}) is sent; apply *unstructured.Unstructured objects (Dynamic) to send only what the change sets, an empty map too.")
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{Mode: writer.ModeApply})
		d := writer.Desire[deploy]{Object: func(d deploy) error {
			d.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{}
			return nil
		}}
		tk, err := w.Submit(t.Context(), e.get(t, "a"), d, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, res.Writes)
		require.Len(t, e.api.Requests(), 1)
		body := string(e.api.Requests()[0].Body)
		assert.Contains(t, body, `"securityContext":{}`)
		assert.NotContains(t, body, `"strategy"`, "a zero struct the change left alone")
		assert.NotContains(t, body, `"status"`)
		require.NotNil(t, e.get(t, "a").Spec.Template.Spec.SecurityContext)

		require.NoError(t, w.Set(e.get(t, "a"), d, writer.SetOptions{}))
		assert.Len(t, e.api.Requests(), 1, "live already: nothing sent")
	})
}
