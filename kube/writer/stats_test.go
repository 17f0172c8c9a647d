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

// A target written by an attempt is not counted a no-op when a later
// attempt, retrying the desire's other target, finds it already as the
// change makes it: it was sent, once.
func TestWrittenTargetIsNotANoOpOnRetry(t *testing.T) {
	faults := map[string]fakeapi.Fault{
		"server error": {Key: "update", Times: 1, Err: apierrors.NewInternalError(context.DeadlineExceeded)},
		"conflict":     {Key: "update", Times: 1, Err: apierrors.NewConflict(deploymentsGVR.GroupResource(), "a", context.Canceled)},
	}
	for name, f := range faults {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				w := newWriter(t, e, writer.Options[deploy]{})
				e.api.Fail(f)
				tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[deploy]{
					Status: replicas(3),
					Object: func(d deploy) error { metav1.SetMetaDataLabel(&d.ObjectMeta, "x", "y"); return nil },
				}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				require.Equal(t, 2, res.Attempts)
				assert.Equal(t, 2, res.Writes)
				s := w.Stats()
				assert.Equal(t, uint64(3), s.Writes, "status, object refused, object")
				assert.Equal(t, uint64(2), s.Written)
				assert.Zero(t, s.NoOps, "the status was written, not skipped")
			})
		})
	}
}

// A target found met is counted a no-op once, though a desire for the
// object's other target merges into the write while it waits to retry.
func TestNoOpCountedOnceAcrossAMerge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{})
		held := make(chan struct{})
		var once sync.Once
		e.api.Before(func(r fakeapi.Request) {
			if r.Verb == "update" && r.Subresource == "" {
				once.Do(func() { <-held })
			}
		})
		e.api.Fail(fakeapi.Fault{Key: "update", Times: 1, Err: apierrors.NewConflict(deploymentsGVR.GroupResource(), "a", context.Canceled)})
		a := e.get(t, "a")
		label := func(k string) writer.Change[deploy] {
			return func(d deploy) error { metav1.SetMetaDataLabel(&d.ObjectMeta, k, "y"); return nil }
		}
		first, err := w.Submit(t.Context(), a, writer.Desire[deploy]{Status: replicas(0), Object: label("x")}, writer.SetOptions{})
		require.NoError(t, err)
		synctest.Wait() // the status is met (a no-op); the object's update is on the wire
		second, err := w.Submit(t.Context(), a, writer.Desire[deploy]{Object: label("z")}, writer.SetOptions{})
		require.NoError(t, err)
		close(held) // refused as stale: the second desire merges into the retry
		r1, err := first.Wait(t.Context())
		require.NoError(t, err)
		r2, err := second.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, r1.Object, r2.Object, "one write")
		assert.Equal(t, "y", e.get(t, "a").Labels["z"])
		assert.Equal(t, uint64(1), w.Stats().NoOps, "the status, met, counted once")
	})
}
