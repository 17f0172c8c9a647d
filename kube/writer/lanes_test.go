package writer_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// A change that blocks, run for a desire queued behind a write in flight,
// holds its write only until the desire's deadline: the object's next
// desire is written, and Forget ends what is left (doc, "Callbacks").
func TestBlockedChangeHoldsItsWriteOnlyUntilItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		release, held := make(chan struct{}), make(chan struct{})
		defer close(release)
		var once sync.Once
		e.api.Before(func(fakeapi.Request) { once.Do(func() { <-held }) })
		w := newWriter(t, e, writer.Options[deploy]{})
		a := e.get(t, "a")
		require.NoError(t, w.Set(a, status(replicas(1)), writer.SetOptions{}))
		synctest.Wait() // in flight, held
		blocked, err := w.Submit(t.Context(), a, status(func(deploy) error { <-release; return nil }),
			writer.SetOptions{Timeout: time.Second})
		require.NoError(t, err)
		close(held) // the first lands; its successor's change blocks in the no-op test
		synctest.Wait()

		r, err := blocked.Wait(t.Context())
		require.ErrorIs(t, err, dispatch.ErrExpired)
		assert.Equal(t, dispatch.StateExpired, r.State)

		// The deadline has passed: the write is no longer held.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		next, err := w.Submit(ctx, e.get(t, "a"), status(replicas(7)), writer.SetOptions{})
		require.NoError(t, err)
		_, err = next.Wait(ctx)
		assert.NoError(t, err, "the object's next desire, a minute after the blocked one expired")
		assert.Equal(t, int32(7), e.get(t, "a").Status.Replicas, "replicas 7 never written")

		w.Forget(a.UID) // "cancels its write in flight"
		synctest.Wait()
		assert.False(t, w.Busy(a.UID), "after Forget, the lane is still held by the blocked change")
	})
}

// Two desires for one object made at once, with Chain: one is queued while
// Set tests the other for a no-op. The second merges into the first, and
// both are written: the merged change runs, not the one Set tested.
func TestChainKeepsADesireMergedWhileSetTestedIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		w := newWriter(t, e, writer.Options[deploy]{Workers: 1, Merge: writer.Chain[deploy]})
		held := make(chan struct{})
		e.api.Before(func(r fakeapi.Request) {
			if r.Name == "b" {
				<-held
			}
		})
		require.NoError(t, w.Set(e.get(t, "b"), status(replicas(9)), writer.SetOptions{}))
		synctest.Wait() // the one worker is busy with b

		a := e.get(t, "a")
		entered, proceed := make(chan struct{}), make(chan struct{})
		var first sync.Once
		xChange := func(d deploy) error {
			first.Do(func() { close(entered); <-proceed }) // reconciler X, preempted in Set
			setCondition(d, "X", corev1.ConditionTrue, "")
			return nil
		}
		done := make(chan error)
		go func() { done <- w.Set(a, status(xChange), writer.SetOptions{}) }()
		<-entered
		// Reconciler Y's desire is queued meanwhile.
		require.NoError(t, w.Set(a, status(condition("Y", corev1.ConditionTrue)), writer.SetOptions{}))
		close(proceed)
		require.NoError(t, <-done) // merged into Y's pending desire: Chain(Y, X)
		close(held)
		settle(t, w)
		synctest.Wait() // the lane's end reaches the writer (OnDone)

		got := e.get(t, "a")
		assert.Equal(t, corev1.ConditionTrue, conditionOf(got, "X"))
		assert.Equal(t, corev1.ConditionTrue, conditionOf(got, "Y"), "Y's desire, merged by Chain, was lost")
	})
}

// The writer keeps the last resourceVersion of up to Options.Capacity
// objects whose writes ended, per object: an object written twice counts
// once, so a stale informer object of it is still read fresh, not trusted.
func TestEndedVersionsKeptPerObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("x"), deployment("y"))
		w := newWriter(t, e, writer.Options[deploy]{Capacity: 2})
		stale := e.get(t, "x") // the informer's view, never caught up: replicas 0
		require.NoError(t, w.Set(stale, status(replicas(1)), writer.SetOptions{}))
		settle(t, w)
		synctest.Wait() // the lane's end reaches the writer (OnDone)
		require.NoError(t, w.Set(e.get(t, "x"), status(replicas(2)), writer.SetOptions{}))
		settle(t, w)
		synctest.Wait() // the lane's end reaches the writer (OnDone)
		require.NoError(t, w.Set(e.get(t, "y"), status(replicas(1)), writer.SetOptions{}))
		settle(t, w)
		synctest.Wait() // the lane's end reaches the writer (OnDone)
		// Two objects only, Capacity 2: x's last version is still kept, so
		// the stale object is not trusted.
		require.NoError(t, w.Set(stale, status(replicas(0)), writer.SetOptions{}))
		settle(t, w)
		synctest.Wait() // the lane's end reaches the writer (OnDone)
		assert.Equal(t, int32(0), e.get(t, "x").Status.Replicas, "desire replicas=0 dropped as a no-op on a stale object")
	})
}

// A closed writer refuses every desire with ErrClosed, one the object
// already meets too: nothing is accepted after Close.
func TestClosedRefusesADesireAlreadyMet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{})
		require.NoError(t, w.Close(t.Context()))
		a := e.get(t, "a")
		require.ErrorIs(t, w.Set(a, status(replicas(0)), writer.SetOptions{}), dispatch.ErrClosed)
		_, err := w.Submit(t.Context(), a, status(replicas(0)), writer.SetOptions{})
		require.ErrorIs(t, err, dispatch.ErrClosed)
		assert.Zero(t, w.Stats().Desires, "nothing accepted after Close")
	})
}

// A write that did not run to its end reaches OnDone without an object,
// as its Ticket does, though its requests were accepted (its status
// landed, and its object's update, cut off by Forget, returned anyway):
// Writes says so.
func TestOnDoneObjectOnlyForAWriteRunToItsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		var done []writer.Result[deploy]
		w := newWriter(t, e, writer.Options[deploy]{OnDone: func(r writer.Result[deploy]) { done = append(done, r) }})
		held := make(chan struct{})
		e.api.Before(func(r fakeapi.Request) {
			if r.Verb == "update" && r.Subresource == "" {
				<-held
			}
		})
		a := e.get(t, "a")
		tk, err := w.Submit(t.Context(), a, writer.Desire[deploy]{
			Status: replicas(3),
			Object: func(d deploy) error { d.Labels = map[string]string{"x": "y"}; return nil },
		}, writer.SetOptions{})
		require.NoError(t, err)
		synctest.Wait() // the status landed; the object's update is held
		require.Equal(t, int32(3), e.get(t, "a").Status.Replicas)
		require.True(t, w.Forget(a.UID))
		res, err := tk.Wait(t.Context())
		require.ErrorIs(t, err, writer.ErrGone)
		assert.Nil(t, res.Object)
		close(held)
		synctest.Wait()
		require.Len(t, done, 1)
		assert.NotEqual(t, dispatch.StateSucceeded, done[0].State)
		assert.Nil(t, done[0].Object, "%v: not run to its end", done[0].State)
		assert.Equal(t, dispatch.StateStale, done[0].State)
		assert.Equal(t, 2, done[0].Writes, "both updates were accepted")
	})
}
