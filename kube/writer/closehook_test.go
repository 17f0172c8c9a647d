package writer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Close called from OnDone writes nothing more: what is queued ends Closed
// at once, and Close says it could not wait (ErrReentrant), as its
// documentation says.
func TestCloseFromOnDoneEndsTheRestAtOnce(t *testing.T) {
	text := fileDoc(t, "writer.go")
	require.Contains(t, text, "Called from Options.OnDone, the Observer or Options.Classify, which run on the dispatcher's own goroutines, it writes nothing more: it ends what remains Closed at once and returns an error wrapping dispatch.ErrReentrant (dispatch.Dispatcher.Close).")
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		ds := e.create(t, "default", 5)
		held := make(chan struct{})
		var once sync.Once
		e.api.Before(func(fakeapi.Request) { once.Do(func() { <-held }) })
		var w *writer.Writer[deploy]
		var closeErr error
		called, closed := false, 0
		w, err := writer.New(e.c, writer.Options[deploy]{QPS: 2, Burst: 1, OnDone: func(r writer.Result[deploy]) {
			if r.State == dispatch.StateClosed {
				closed++
			}
			if !called {
				called = true
				closeErr = w.Close(context.Background())
			}
		}})
		require.NoError(t, err)
		for _, d := range ds {
			require.NoError(t, w.Set(d, status(replicas(1)), writer.SetOptions{}))
		}
		close(held) // the first write lands once every desire is queued
		settle(t, w)
		synctest.Wait()
		require.ErrorIs(t, closeErr, dispatch.ErrReentrant)
		assert.Equal(t, 1, e.api.Calls("update/status"), "written after Close was called from OnDone")
		assert.Equal(t, 4, closed)
		assert.Contains(t, closeErr.Error(), "4 desires ended Closed")
		require.NoError(t, w.Close(t.Context()))
	})
}

// heldDone is a context whose Done answers only once release is closed
// (reached says it was asked): it holds a Close under way on its own
// goroutine, as a busy scheduler might.
type heldDone struct {
	context.Context
	reached, release chan struct{}
	once             sync.Once
}

func (c *heldDone) Done() <-chan struct{} {
	c.once.Do(func() { close(c.reached) })
	<-c.release
	return c.Context.Done()
}

// Close called from a change finishes on a goroutine of its own; a later
// Close from outside waits for it, so that no goroutine of the writer's
// outlives Close.
func TestCloseWaitsForTheCloseAChangeBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w, err := writer.New(e.c, writer.Options[deploy]{})
		require.NoError(t, err)
		ctx := &heldDone{Context: context.Background(), reached: make(chan struct{}), release: make(chan struct{})}
		var inner error
		change := func(d deploy) error {
			d.Status.Replicas = 1
			inner = w.Close(ctx)
			<-ctx.reached // the Close under way waits for the drain
			return nil
		}
		tk, err := w.Submit(t.Context(), e.identity(t, "a"), status(change), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, int32(1), res.Object.Status.Replicas)
		require.ErrorIs(t, inner, dispatch.ErrReentrant)
		var outer error
		returned := make(chan struct{})
		go func() {
			outer = w.Close(t.Context())
			close(returned)
		}()
		synctest.Wait()
		select {
		case <-returned:
			t.Error("Close returned while the Close the change began was under way")
		default:
		}
		close(ctx.release)
		<-returned
		require.NoError(t, outer)
	})
}

// A change that calls Close in Set's no-op test, on Set's caller's
// goroutine, is the caller's own Close: it waits, as Close does, for what
// is queued, returns nil once all is written, and Set then refuses the
// desire (ErrClosed), as the package documentation says.
func TestCloseFromSetsNoOpTest(t *testing.T) {
	text := fileDoc(t, "doc.go")
	const doc = "a change that blocks there blocks Set, one that calls Close there closes the writer as the caller's Close would (it waits, and Set then returns dispatch.ErrClosed), and one that calls runtime.Goexit there ends the caller's goroutine"
	require.True(t, strings.Contains(text, doc), "the package documentation says %q", doc)
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		w, err := writer.New(e.c, writer.Options[deploy]{})
		require.NoError(t, err)
		require.NoError(t, w.Set(e.get(t, "b"), status(replicas(2)), writer.SetOptions{}))
		var closeErr error
		closed := false
		change := func(d deploy) error {
			if !closed {
				closed = true
				closeErr = w.Close(context.Background())
			}
			d.Status.Replicas = 1
			return nil
		}
		require.ErrorIs(t, w.Set(e.get(t, "a"), status(change), writer.SetOptions{}), dispatch.ErrClosed)
		require.NoError(t, closeErr, "the caller's Close")
		assert.Equal(t, int32(2), e.get(t, "b").Status.Replicas, "queued before Close: written")
		assert.Equal(t, int32(0), e.get(t, "a").Status.Replicas)
	})
}

// A later Close waits for the Close a change began only as long as its own
// ctx lasts: a change that called Close and then blocks holds that Close,
// but not the caller's, which returns once its ctx ends, saying so.
func TestCloseWaitForTheCloseAChangeBeganEndsWithCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w, err := writer.New(e.c, writer.Options[deploy]{})
		require.NoError(t, err)
		release := make(chan struct{})
		reached := make(chan struct{})
		change := func(d deploy) error {
			d.Status.Replicas = 1
			_ = w.Close(context.Background())
			close(reached)
			<-release // blocks, and so holds the Close it began
			return nil
		}
		_, err = w.Submit(t.Context(), e.identity(t, "a"), status(change), writer.SetOptions{})
		require.NoError(t, err)
		<-reached
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		var outer error
		returned := make(chan struct{})
		go func() {
			outer = w.Close(ctx)
			close(returned)
		}()
		select {
		case <-returned:
			require.ErrorIs(t, outer, context.DeadlineExceeded)
		case <-time.After(time.Minute):
			t.Error("Close did not return once its ctx ended, waiting for the Close a blocked change began")
		}
		close(release)
		<-returned
		require.NoError(t, w.Close(t.Context()))
	})
}

// Close's error is about what Close itself ended: a desire that failed on
// its own (a permanent API error) before Close reached its outcome, which
// OnDone hears; Close returns nil, as its documentation says.
func TestCloseReturnsNilWhenEveryDesireReachedItsOutcome(t *testing.T) {
	text := fileDoc(t, "writer.go")
	require.Contains(t, text, "It returns nil if it ended no desire itself — each reached its own outcome, written, found met or failed, which OnDone and its Ticket tell — else an error that says how many desires it ended and wraps ctx's error.")
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Times: 1, Err: apierrors.NewBadRequest("refused")})
		var states []dispatch.State
		w, err := writer.New(e.c, writer.Options[deploy]{OnDone: func(r writer.Result[deploy]) { states = append(states, r.State) }})
		require.NoError(t, err)
		require.NoError(t, w.Set(e.get(t, "a"), status(replicas(1)), writer.SetOptions{}))
		synctest.Wait()
		assert.NoError(t, w.Close(context.Background()))
		assert.Equal(t, []dispatch.State{dispatch.StateFailed}, states, "the failure is OnDone's to tell")
	})
}

// A write in flight when Close's ctx ends: its Ticket hears Closed at once,
// while OnDone, which hears the write, hears Stale once its request
// returns (it may have landed), as the package documentation says.
func TestWriteInFlightAtCloseIsClosedForItsTicketStaleForOnDone(t *testing.T) {
	text := fileDoc(t, "doc.go")
	require.Contains(t, text, "A desire ends exactly once, in one dispatch.State, told to its Ticket, to Options.OnDone and to the Observer (a *dispatchprom.Observer exports it to Prometheus, labelled by class and tenant) — but a write in flight that Close gave up on, whose desires hear Closed, reaches OnDone Stale once its request returns (it may have landed), and a desire Set finds already met")
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Times: 1, Delay: time.Minute})
		var states []dispatch.State
		w, err := writer.New(e.c, writer.Options[deploy]{OnDone: func(r writer.Result[deploy]) { states = append(states, r.State) }})
		require.NoError(t, err)
		tk, err := w.Submit(t.Context(), e.get(t, "a"), status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, w.Close(ctx), context.DeadlineExceeded)
		res, _ := tk.Wait(t.Context())
		assert.Equal(t, dispatch.StateClosed, res.State, "the ticket")
		assert.Equal(t, []dispatch.State{dispatch.StateStale}, states, "OnDone")
	})
}
