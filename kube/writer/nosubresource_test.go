package writer_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// noStatusSubresource answers every write to the status subresource 404,
// as the API server does for a custom resource whose definition has no
// status subresource: the object is there, its /status is not.
type noStatusSubresource struct{ writer.Client[deploy] }

func notServed() error {
	return apierrors.NewGenericServerResponse(http.StatusNotFound, "put", deploymentsGVR.GroupResource(), "", "", 0, true)
}

func (c noStatusSubresource) Update(ctx context.Context, obj deploy, sub string, o metav1.UpdateOptions) (deploy, error) {
	if sub == "status" {
		return nil, notServed()
	}
	return c.Client.Update(ctx, obj, sub, o)
}

func (c noStatusSubresource) Patch(ctx context.Context, obj deploy, pt types.PatchType, data []byte, sub string, o metav1.PatchOptions) (deploy, error) {
	if sub == "status" {
		return nil, notServed()
	}
	return c.Client.Patch(ctx, obj, pt, data, sub, o)
}

// A status write answered 404 while the object is there (a resource
// without a status subresource) fails saying so, not ErrGone: the object
// is not gone, and a controller that forgets gone objects must not forget
// it.
func TestStatusNotServedIsNotGone(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				w, err := writer.New[deploy](noStatusSubresource{e.c}, writer.Options[deploy]{Mode: mode})
				require.NoError(t, err)
				defer w.Close(context.Background())
				tk, err := w.Submit(t.Context(), e.get(t, "a"), status(replicas(3)), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.Error(t, err)
				assert.NotErrorIs(t, err, writer.ErrGone)
				assert.ErrorContains(t, err, "no status subresource")
				assert.False(t, apierrors.IsNotFound(err), "a controller's IgnoreNotFound must not drop it: %v", err)
				assert.Equal(t, dispatch.StateFailed, res.State)
				assert.Equal(t, 1, res.Attempts)
				s := w.Stats()
				assert.Zero(t, s.Gone)
				assert.Equal(t, uint64(1), s.Reads, "one read tells a missing object from a missing subresource")
			})
		})
	}
}

// A status write answered 404 because the object is gone still ends
// ErrGone, and one whose name now holds another object ErrReplaced.
func TestStatusWriteToAGoneObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		w := newWriter(t, e, writer.Options[deploy]{})
		a, b := e.get(t, "a"), e.get(t, "b")
		require.NoError(t, e.cs.Tracker().Delete(deploymentsGVR, "default", "a"))
		require.NoError(t, e.api.Recreate(deploymentsGVR, deployment("b")))
		tk, err := w.Submit(t.Context(), a, status(replicas(3)), writer.SetOptions{})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.ErrorIs(t, err, writer.ErrGone)
		tk, err = w.Submit(t.Context(), b, status(replicas(3)), writer.SetOptions{})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.ErrorIs(t, err, writer.ErrReplaced)
		s := w.Stats()
		assert.Equal(t, uint64(1), s.Gone)
		assert.Equal(t, uint64(1), s.Replaced)
	})
}
