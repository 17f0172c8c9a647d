package writer_test

import (
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// An unstructured desire that the object meets but for nulls and empty
// lists — a status built as a Go struct and converted
// (runtime.DefaultUnstructuredConverter gives a nil pointer or a zero
// time without omitempty as null), which a custom resource's API server
// prunes — is a no-op, as a typed object's nil and empty are: nothing is
// sent, however often the controller makes it again. A real change still
// is, and so is an empty map where the object has none (it is a value:
// TestUnstructuredEmptyMapIsAValue). (ModeApply judges by its own rule:
// the configuration, pruned of nulls, already live.)
func TestUnstructuredNullIsAbsent(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				wd := widget("a")
				require.NoError(t, unstructured.SetNestedField(wd.Object, "Ready", "status", "phase"))
				require.NoError(t, unstructured.SetNestedField(wd.Object, int64(2), "spec", "size"))
				require.NoError(t, unstructured.SetNestedMap(wd.Object, map[string]any{}, "spec", "template"))
				e := newDynEnv(t, wd)
				w, err := writer.New(e.c, writer.Options[*unstructured.Unstructured]{Mode: mode})
				require.NoError(t, err)
				defer w.Close(t.Context())
				type status struct {
					Phase      string    `json:"phase"`
					Message    *string   `json:"message"`
					Conditions []string  `json:"conditions"`
					Extra      *struct{} `json:"extra,omitempty"`
				}
				st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status{Phase: "Ready"})
				require.NoError(t, err)
				require.Contains(t, st, "message") // null
				met := writer.Desire[*unstructured.Unstructured]{
					Status: func(u *unstructured.Unstructured) error {
						u.Object["status"] = runtime.DeepCopyJSON(st)
						return nil
					},
					Object: func(u *unstructured.Unstructured) error {
						spec, _ := u.Object["spec"].(map[string]any)
						if spec == nil {
							spec = map[string]any{}
							u.Object["spec"] = spec
						}
						spec["size"], spec["owner"], spec["ports"] = int64(2), nil, []any{}
						spec["template"] = map[string]any{"labels": nil}
						return nil
					},
				}
				for range 3 {
					require.NoError(t, w.Set(e.get(t, "a"), met, writer.SetOptions{}))
				}
				assert.Equal(t, uint64(6), w.Stats().NoOps, "nothing to write, three times over, per target")
				assert.Empty(t, e.api.Requests())

				tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[*unstructured.Unstructured]{Status: setPhase("Done")}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, 1, res.Writes)
			})
		})
	}
}

// An empty map is a value in unstructured form — a volume's emptyDir: {}
// chooses its type — so a desire that adds one where the object has none
// is written, once, as a typed object's non-nil pointer to an empty struct
// would be.
func TestUnstructuredEmptyMapIsAValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wd := widget("a")
		require.NoError(t, unstructured.SetNestedField(wd.Object, int64(2), "spec", "size"))
		e := newDynEnv(t, wd)
		w, err := writer.New(e.c, writer.Options[*unstructured.Unstructured]{Mode: writer.ModePatch})
		require.NoError(t, err)
		defer w.Close(t.Context())
		tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[*unstructured.Unstructured]{
			Object: func(u *unstructured.Unstructured) error {
				return unstructured.SetNestedMap(u.Object, map[string]any{}, "spec", "emptyDir")
			},
		}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, res.Writes, "the empty map is written")
		got, ok, err := unstructured.NestedMap(e.get(t, "a").Object, "spec", "emptyDir")
		require.NoError(t, err)
		assert.True(t, ok, "spec.emptyDir is on the object")
		assert.Empty(t, got)
	})
}

// In ModeApply too an empty map an unstructured change sets is a value,
// sent as it is set ("only what the change sets"), not pruned as the
// empty structs a typed object's conversion leaves: it lands, and a desire
// that sets it again once it is live sends nothing.
func TestApplySendsAnEmptyMapTheChangeSets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wd := widget("a")
		require.NoError(t, unstructured.SetNestedField(wd.Object, int64(2), "spec", "size"))
		e := newDynEnv(t, wd)
		w, err := writer.New(e.c, writer.Options[*unstructured.Unstructured]{Mode: writer.ModeApply})
		require.NoError(t, err)
		defer w.Close(t.Context())
		d := writer.Desire[*unstructured.Unstructured]{
			Object: func(u *unstructured.Unstructured) error {
				return unstructured.SetNestedMap(u.Object, map[string]any{}, "spec", "emptyDir")
			},
		}
		tk, err := w.Submit(t.Context(), e.get(t, "a"), d, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, res.Writes)
		require.Len(t, e.api.Requests(), 1)
		assert.Contains(t, string(e.api.Requests()[0].Body), `"emptyDir":{}`)
		_, ok, err := unstructured.NestedMap(e.get(t, "a").Object, "spec", "emptyDir")
		require.NoError(t, err)
		assert.True(t, ok, "spec.emptyDir is on the object")

		require.NoError(t, w.Set(e.get(t, "a"), d, writer.SetOptions{}))
		assert.False(t, w.Busy(wd.GetUID()))
		assert.Len(t, e.api.Requests(), 1, "live already: nothing sent")
	})
}
