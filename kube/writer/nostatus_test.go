package writer_test

import (
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A status desire for a type without a status fails, saying so, in every
// mode: neither a panic of the writer's own no-op test, nor a desire
// skipped as met, and nothing is sent.
func TestStatusDesireForATypeWithoutOne(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cs, api, c := configMaps(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c"}})
				w, err := writer.New(c, writer.Options[cm]{Mode: mode})
				require.NoError(t, err)
				defer w.Close(t.Context())
				tk, err := w.Submit(t.Context(), getCM(t, cs, "c"), writer.Desire[cm]{Status: func(c cm) error {
					c.Data = map[string]string{"k": "v"}
					return nil
				}}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.ErrorContains(t, err, "has no status")
				var pe *dispatch.PanicError
				assert.NotErrorAs(t, err, &pe)
				assert.Equal(t, dispatch.StateFailed, res.State)
				assert.Equal(t, 1, res.Attempts, "never retried")
				assert.Empty(t, api.Requests(), "nothing sent")
			})
		})
	}
}
