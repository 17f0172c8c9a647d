package writer_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A target whose write landed is not written again when the desire's other
// target is retried: each change takes effect once per desire.
func TestLandedTargetIsNotWrittenAgainOnRetry(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				w := newWriter(t, e, writer.Options[deploy]{Mode: mode})
				e.api.Fail(fakeapi.Fault{Key: map[writer.Mode]string{writer.ModeUpdate: "update", writer.ModePatch: "patch"}[mode], Times: 1, Err: apierrors.NewInternalError(context.Canceled)})
				tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[deploy]{
					Status: func(d deploy) error { d.Status.ObservedGeneration++; return nil },
					Object: func(d deploy) error { metav1.SetMetaDataLabel(&d.ObjectMeta, "x", "y"); return nil },
				}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, 2, res.Attempts)
				assert.Equal(t, int64(1), e.get(t, "a").Status.ObservedGeneration, "the status change took effect twice")
				assert.Equal(t, "y", e.get(t, "a").Labels["x"])
			})
		})
	}
}

// With Chain, a desire merged into a write whose status landed before its
// object's write was refused chains onto nothing there: the landed status
// change is not run, and sent, again.
func TestChainDoesNotReapplyALandedTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{Merge: writer.Chain[deploy]})
		held := make(chan struct{})
		var once sync.Once
		e.api.Before(func(r fakeapi.Request) {
			if r.Verb == "update" && r.Subresource == "" {
				once.Do(func() { <-held })
			}
		})
		e.api.Fail(fakeapi.Fault{Key: "update", Times: 1, Err: apierrors.NewInternalError(context.Canceled)})
		a := e.get(t, "a")
		first, err := w.Submit(t.Context(), a, writer.Desire[deploy]{
			Status: func(d deploy) error { d.Status.ObservedGeneration++; return nil },
			Object: func(d deploy) error { metav1.SetMetaDataLabel(&d.ObjectMeta, "x", "y"); return nil },
		}, writer.SetOptions{})
		require.NoError(t, err)
		synctest.Wait() // the status landed; the object's update is on the wire
		second, err := w.Submit(t.Context(), a, status(replicas(4)), writer.SetOptions{})
		require.NoError(t, err)
		close(held) // refused: the second desire merges into the retry
		for _, tk := range []*writer.Ticket[deploy]{first, second} {
			_, err := tk.Wait(t.Context())
			require.NoError(t, err)
		}
		got := e.get(t, "a")
		assert.Equal(t, int64(1), got.Status.ObservedGeneration, "the first status change took effect twice")
		assert.Equal(t, int32(4), got.Status.Replicas, "the second desire")
		assert.Equal(t, "y", got.Labels["x"])
	})
}
