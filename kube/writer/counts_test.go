package writer_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// overloaded answers every read 429 (Retry-After 5s) until its time ends.
type overloaded struct {
	writer.Client[deploy]
	until time.Time
	reads *int
}

func (c overloaded) Get(ctx context.Context, obj deploy) (deploy, error) {
	*c.reads++
	if time.Now().Before(c.until) {
		return nil, apierrors.NewTooManyRequests("overloaded", 5)
	}
	return c.Client.Get(ctx, obj)
}

// After a conflict the object is read again; a read the server answers 429
// with a Retry-After is waited out in the queue, as any request's is, and
// the change is applied to the object once the read succeeds.
func TestConflictReReadWaitsOutRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		stale := e.get(t, "a")
		require.NoError(t, e.api.Change(deploymentsGVR, "default", "a", func(o runtime.Object) { o.(deploy).Labels = map[string]string{"x": "y"} }))
		reads := 0
		start := time.Now()
		w, err := writer.New[deploy](overloaded{e.c, start.Add(10 * time.Second), &reads}, writer.Options[deploy]{})
		require.NoError(t, err)
		defer w.Close(context.Background())
		tk, err := w.Submit(t.Context(), stale, status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		t.Logf("state %v after %v, %d attempts, %d update requests, %d reads: %v",
			res.State, time.Since(start), res.Attempts, e.api.Calls("update/status"), reads, err)
		require.NoError(t, err, "the server asked for 5s; the writer gave up after %v", time.Since(start))
		assert.Equal(t, int32(1), e.get(t, "a").Status.Replicas)
	})
}

// Stats.NoOps counts a target not sent once per desire, however many
// attempts its other target takes.
func TestNoOpsCountedOncePerTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{})
		e.api.Fail(fakeapi.Fault{Key: "update", Times: 1, Err: apierrors.NewInternalError(context.DeadlineExceeded)})
		tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[deploy]{
			Status: replicas(0), // already met
			Object: func(d deploy) error { metav1.SetMetaDataLabel(&d.ObjectMeta, "x", "y"); return nil },
		}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempts)
		assert.Equal(t, uint64(1), w.Stats().NoOps, "one target not sent, once")
	})
}

// In ModePatch a change whose JSON is the live object's (a time within the
// same second) sends nothing: it is a no-op, not a write sent and accepted,
// and the desire ends Skipped.
func TestPatchWithNothingToSendIsANoOp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := deployment("a")
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: "Ready", Status: corev1.ConditionTrue, LastUpdateTime: metav1.NewTime(at)}}
		e := newEnv(t, d)
		w := newWriter(t, e, writer.Options[deploy]{Mode: writer.ModePatch})
		tk, err := w.Submit(t.Context(), e.get(t, "a"), status(func(d deploy) error {
			d.Status.Conditions[0].LastUpdateTime = metav1.NewTime(at.Add(500 * time.Millisecond)) // the same in JSON
			return nil
		}), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		s := w.Stats()
		t.Logf("state %v, Result.Writes %d, Stats.Writes %d, Written %d, patch requests %d", res.State, res.Writes, s.Writes, s.Written, e.api.Calls("patch/status"))
		assert.Equal(t, uint64(e.api.Calls("patch/status")), s.Writes, "Stats.Writes: write requests sent")
		assert.Equal(t, 0, res.Writes, "Result.Writes: requests the server accepted")
		assert.Equal(t, dispatch.StateSkipped, res.State)
		assert.Equal(t, uint64(1), s.NoOps)
	})
}

// In ModePatch, a change that differs from the object only below what
// JSON keeps is found a no-op by the worker, not by Set: the desire is
// queued and takes a token, then ends Skipped with nothing sent, as the
// package documentation says.
func TestPatchBelowJSONPrecisionIsFoundANoOpByTheWorker(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(doc), "\n//", "\n")), " ")
	require.Contains(t, text, "In ModePatch, a change that differs from the object only below what JSON keeps (a time within the same second) is found a no-op only by the worker, after the write took its token: it ends Skipped, and nothing is sent.")
	synctest.Test(t, func(t *testing.T) {
		d := deployment("a")
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: "Ready", Status: corev1.ConditionTrue, LastUpdateTime: metav1.NewTime(at)}}
		e := newEnv(t, d)
		var done []writer.Result[deploy]
		w := newWriter(t, e, writer.Options[deploy]{Mode: writer.ModePatch, OnDone: func(r writer.Result[deploy]) { done = append(done, r) }})
		require.NoError(t, w.Set(e.get(t, "a"), status(func(d deploy) error {
			d.Status.Conditions[0].LastUpdateTime = metav1.NewTime(at.Add(500 * time.Millisecond))
			return nil
		}), writer.SetOptions{}))
		settle(t, w)
		synctest.Wait()
		s := w.Stats()
		assert.Equal(t, uint64(1), s.Dispatch.Submitted, "queued")
		assert.Equal(t, uint64(1), s.Dispatch.Calls[dispatch.StateSkipped])
		require.Len(t, done, 1)
		assert.Equal(t, dispatch.StateSkipped, done[0].State)
		assert.Zero(t, e.api.Calls("patch/status"), "nothing sent")
		assert.Zero(t, s.Writes)
		assert.Equal(t, uint64(1), s.NoOps)
	})
}
