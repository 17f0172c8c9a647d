package writer_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var deploymentsGR = schema.GroupResource{Group: "apps", Resource: "deployments"}

// A 429's Retry-After is waited out in the queue: the write runs again no
// sooner, and meanwhile the workers write other objects.
func TestRetryAfterWaitsInTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Times: 1, Err: apierrors.NewTooManyRequests("slow down", 3)})
		w := newWriter(t, e, writer.Options[deploy]{Workers: 1})
		start := time.Now()
		tk, err := w.Submit(t.Context(), e.get(t, "a"), status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)
		synctest.Wait()
		tb, err := w.Submit(t.Context(), e.get(t, "b"), status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)
		rb, err := tb.Wait(t.Context())
		require.NoError(t, err)
		assert.Less(t, time.Since(start), time.Second, "b did not wait behind a's retry")
		assert.Equal(t, 1, rb.Writes)

		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.GreaterOrEqual(t, time.Since(start), 3*time.Second, "the server's delay was honoured")
		assert.Equal(t, 2, res.Attempts)
		assert.Equal(t, int32(1), e.get(t, "a").Status.Replicas)
		assert.Equal(t, uint64(1), w.Stats().Dispatch.Retries)
	})
}

func TestServerErrorsAreRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Times: 2, Err: apierrors.NewInternalError(errors.New("etcd hiccup"))})
		w := newWriter(t, e, writer.Options[deploy]{})
		tk, err := w.Submit(t.Context(), e.get(t, "a"), status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 3, res.Attempts)
		assert.Equal(t, int32(2), e.get(t, "a").Status.Replicas)
	})
}

func TestPermanentErrorsAreNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Err: apierrors.NewForbidden(deploymentsGR, "a", errors.New("no RBAC"))})
		var done []writer.Result[deploy]
		w := newWriter(t, e, writer.Options[deploy]{OnDone: func(r writer.Result[deploy]) { done = append(done, r) }})
		require.NoError(t, w.Set(e.get(t, "a"), status(replicas(2)), writer.SetOptions{}))
		settle(t, w)
		require.Len(t, done, 1, "a fire-and-forget outcome reaches OnDone")
		assert.Equal(t, dispatch.StateFailed, done[0].State)
		assert.True(t, apierrors.IsForbidden(done[0].Err))
		assert.Equal(t, 1, done[0].Attempts)
		assert.Equal(t, 1, e.api.Calls("update/status"))
	})
}

// A slow server holds a worker, never the caller: Set returns at once, and
// a deadline ends the desire.
func TestSlowServerAndDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Times: 1, Delay: time.Minute})
		w := newWriter(t, e, writer.Options[deploy]{})
		start := time.Now()
		require.NoError(t, w.Set(e.get(t, "a"), status(replicas(1)), writer.SetOptions{}))
		assert.Zero(t, time.Since(start), "Set never waits on the network")
		synctest.Wait() // in flight

		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		tk, err := w.Submit(ctx, e.get(t, "a"), status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.ErrorIs(t, err, dispatch.ErrExpired)
		assert.Equal(t, dispatch.StateExpired, res.State)
		settle(t, w)
		assert.Equal(t, int32(1), e.get(t, "a").Status.Replicas, "the first write landed; the expired one never ran")
	})
}

func TestSetOptionsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		w := newWriter(t, e, writer.Options[deploy]{QPS: 1, Burst: 1})
		require.NoError(t, w.Set(e.get(t, "a"), status(replicas(1)), writer.SetOptions{}))
		tk, err := w.Submit(t.Context(), e.get(t, "b"), status(replicas(1)), writer.SetOptions{Deadline: time.Now().Add(100 * time.Millisecond)})
		require.NoError(t, err)
		res, _ := tk.Wait(t.Context())
		assert.Equal(t, dispatch.StateExpired, res.State)

		// A Timeout is a deadline that long after the Submit; with a later
		// Deadline too, the earlier counts.
		start := time.Now()
		tk, err = w.Submit(t.Context(), e.get(t, "b"), status(replicas(2)), writer.SetOptions{Timeout: 50 * time.Millisecond, Deadline: start.Add(time.Hour)})
		require.NoError(t, err)
		res, _ = tk.Wait(t.Context())
		assert.Equal(t, dispatch.StateExpired, res.State)
		assert.Equal(t, 50*time.Millisecond, time.Since(start), "expired at its Timeout")
		err = w.Set(e.get(t, "b"), status(replicas(3)), writer.SetOptions{Timeout: -time.Nanosecond})
		require.ErrorIs(t, err, dispatch.ErrExpired, "a negative Timeout has passed already")
		assert.ErrorContains(t, err, "SetOptions.Timeout")

		_, err = w.Submit(t.Context(), e.get(t, "b"), status(replicas(1)), writer.SetOptions{Deadline: time.Now()})
		require.ErrorIs(t, err, dispatch.ErrExpired, "a deadline already past is refused")
		require.ErrorIs(t, w.Set(e.get(t, "b"), status(replicas(1)), writer.SetOptions{Deadline: time.Now().Add(-time.Second)}), dispatch.ErrExpired)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = w.Submit(ctx, e.get(t, "b"), status(replicas(1)), writer.SetOptions{})
		require.ErrorIs(t, err, dispatch.ErrCanceled)
		require.ErrorIs(t, err, context.Canceled)
	})
}
