package writer_test

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
)

// A desire whose status landed and whose object's write, refused as stale,
// is then found met on the object read again, ends with that object in its
// Result: the newest the writer found, which meets the desire — not the
// status write's answer, which predates it.
func TestResultIsTheObjectFoundMetAfterARead(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := deployment("a")
				d.Finalizers = []string{"example.com/x"}
				e := newEnv(t, d)
				var once sync.Once
				e.api.Before(func(r fakeapi.Request) {
					if (r.Verb == "update" || r.Verb == "patch") && r.Subresource == "" {
						once.Do(func() { // another controller removes the finalizer first
							require.NoError(t, e.api.Change(deploymentsGVR, "default", "a", func(o runtime.Object) { o.(deploy).Finalizers = nil }))
						})
					}
				})
				var done []writer.Result[deploy]
				w := newWriter(t, e, writer.Options[deploy]{Mode: mode, OnDone: func(r writer.Result[deploy]) { done = append(done, r) }})
				tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[deploy]{
					Status: replicas(3),
					Object: func(d deploy) error {
						d.Finalizers = slices.DeleteFunc(d.Finalizers, func(f string) bool { return f == "example.com/x" })
						return nil
					},
				}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, dispatch.StateSucceeded, res.State)
				assert.Equal(t, 1, res.Writes, "the status")
				require.NotNil(t, res.Object)
				live := e.get(t, "a")
				assert.Empty(t, res.Object.Finalizers, "Result.Object still holds the finalizer the desire removed")
				assert.Equal(t, live.ResourceVersion, res.Object.ResourceVersion)
				assert.Equal(t, int32(3), res.Object.Status.Replicas)
				settle(t, w)
				synctest.Wait()
				require.Len(t, done, 1)
				assert.Equal(t, res.Object, done[0].Object)
			})
		})
	}
}
