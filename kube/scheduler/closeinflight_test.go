package scheduler

import (
	"context"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestRunPastItsEndTellsWhatExecuteReturned: a call in flight when Close
// cancels it, or when its deadline passes, that returns afterwards gets on
// its OnFinish what its Execute returned — nil for one that took effect, its
// error unchanged for one that failed — as upstream's dispatcher sends it;
// the Ticket's Outcome says that it ended Stale.
func TestRunPastItsEndTellsWhatExecuteReturned(t *testing.T) {
	for _, tc := range []struct {
		name    string
		result  error // what Execute returns once cancelled
		timeout bool  // the deadline ends it, not Close
	}{
		{name: "succeeds after Close", result: nil},
		{name: "fails after Close", result: errTest},
		{name: "succeeds after its deadline", result: nil, timeout: true},
		{name: "fails after its deadline", result: errTest, timeout: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := Options{}
				if tc.timeout {
					o.Timeout = time.Minute
				}
				d := newTestDispatcher(t, o)
				c := newCall(&journal{}, "a", typeLow, "1", "x")
				started := make(chan struct{})
				c.exec = func(ctx context.Context, _ *testCall) error {
					close(started)
					<-ctx.Done()
					time.Sleep(time.Second) // it takes effect, or fails, regardless
					return tc.result
				}
				ch := make(chan error, 1)
				tk, err := d.Submit(c, fwk.APICallOptions{OnFinish: ch})
				require.NoError(t, err)
				<-started
				if tc.timeout {
					time.Sleep(2 * time.Minute)
				} else {
					require.ErrorIs(t, d.Close(canceled()), context.Canceled, "Close did not wait for the call to drain")
				}
				synctest.Wait()
				got := <-ch
				assert.Equal(t, tc.result, got, "OnFinish gets what Execute returned")
				res, ok := tk.Result()
				require.True(t, ok)
				assert.Equal(t, tc.result, res.Err)
				assert.Equal(t, dispatch.StateStale, res.Outcome.State)
			})
		})
	}
}

// TestCloseCancelsWithItsCause checks what the README says of a call in
// flight that Close cancels: its context's Err is context.Canceled, as
// upstream's, and its cause dispatch.ErrClosed; it gets what its Execute
// returned.
func TestCloseCancelsWithItsCause(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, strings.Join(strings.Fields(string(readme)), " "),
		"A call in flight that `Close` cancels gets what its `Execute` returned, as upstream's does; but its context's cause (`context.Cause`, which net/http's transport returns for a cancelled request) is `dispatch.ErrClosed`, where upstream's is `context.Canceled`, so that the error says who ended it (its `Err()` is `context.Canceled` in both).")
	synctest.Test(t, func(t *testing.T) {
		d := newTestDispatcher(t, Options{})
		c := newCall(&journal{}, "a", typeLow, "1", "x")
		started := make(chan struct{})
		var ctxErr, cause error
		c.exec = func(ctx context.Context, _ *testCall) error {
			close(started)
			<-ctx.Done()
			ctxErr, cause = ctx.Err(), context.Cause(ctx)
			return cause
		}
		ch := make(chan error, 1)
		require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: ch}))
		<-started
		require.ErrorIs(t, d.Close(canceled()), context.Canceled)
		assert.Equal(t, context.Canceled, ctxErr)
		assert.Equal(t, dispatch.ErrClosed, cause)
		assert.Equal(t, dispatch.ErrClosed, <-ch, "what Execute returned")
	})
}

// TestCloseFromExecute: Close called from a call's Execute, which runs on
// a worker Close would wait for, ends what remains at once and returns an
// error matching dispatch.ErrReentrant, as its documentation says; the
// call that called it gets what its Execute returned, and a later Close
// waits for it.
func TestCloseFromExecute(t *testing.T) {
	text := fileDoc(t, "dispatcher.go")
	const doc = "Called from a call's Execute, which runs on a worker Close would wait for, Close cannot wait: it ends what remains at once, as a cancelled ctx does, and returns an error matching dispatch.ErrReentrant; a later Close waits for the execution."
	require.True(t, strings.Contains(text, doc), "Close's documentation says %q", doc)
	synctest.Test(t, func(t *testing.T) {
		d := newIdleDispatcher(t, Options{Workers: 1, Start: dispatch.StartPolicy{ReservedWorkers: -1}})
		j := &journal{}
		var closeErr error
		returned := make(chan struct{})
		a := newCall(j, "a", typeLow, "1", "x")
		a.exec = func(context.Context, *testCall) error {
			closeErr = d.Close(context.Background())
			<-returned
			return nil
		}
		chA, chB := make(chan error, 1), make(chan error, 1)
		require.NoError(t, d.Add(a, fwk.APICallOptions{OnFinish: chA}))
		require.NoError(t, d.Add(newCall(j, "b", typeLow, "2", "x"), fwk.APICallOptions{OnFinish: chB}))
		d.Start(testLogger(t))
		synctest.Wait()
		require.ErrorIs(t, closeErr, dispatch.ErrReentrant)
		assert.ErrorIs(t, <-chB, dispatch.ErrClosed, "ended at once")
		closed := make(chan error, 1)
		go func() { closed <- d.Close(context.Background()) }()
		synctest.Wait()
		assert.Empty(t, closed, "a later Close waits for the execution")
		close(returned)
		<-closed
		assert.NoError(t, <-chA, "what its Execute returned")
		assert.Equal(t, []string{"execute a"}, j.only("execute "))
	})
}

// TestCloseEndsTheCallBehindOneInFlight checks what the README says of the
// ends: a call queued behind its object's call in flight is told
// dispatch.ErrClosed at Close and never starts, where upstream's may start
// it after Close; SyncObject after Close finds no call and returns the
// object as given; Start after Close starts nothing.
func TestCloseEndsTheCallBehindOneInFlight(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	flat := strings.Join(strings.Fields(string(readme)), " ")
	require.Contains(t, flat, "Here nothing starts once `Close` has returned. After `Close`, `SyncObject` finds no call (each has ended) and returns the object as given; upstream's still syncs the calls its `Close` left queued, which never run — unless `Run` follows: upstream's `Run` after `Close` runs them, where here it starts nothing.")
	synctest.Test(t, func(t *testing.T) {
		h := newRulesHarness(t, Options{})
		a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y")
		h.inFlight(a)
		require.NoError(t, h.add(b))
		closed := make(chan error, 1)
		go func() { closed <- h.d.Close(canceled()) }()
		synctest.Wait()
		assert.ErrorIs(t, h.outcome("b"), dispatch.ErrClosed, "told at Close")
		assert.ErrorIs(t, h.outcome("a"), dispatch.ErrClosed, "what its Execute returned: the cancellation's cause")
		require.ErrorIs(t, <-closed, context.Canceled)
		obj := &metav1.ObjectMeta{UID: "1"}
		got, err := h.d.SyncObject(obj)
		require.NoError(t, err)
		assert.Same(t, obj, got, "no call to sync")
		synctest.Wait()
		assert.Equal(t, []string{"execute a"}, h.j.only("execute"), "b never starts")
		assert.Empty(t, h.j.only("sync"))
	})
	synctest.Test(t, func(t *testing.T) {
		h := newRulesHarness(t, Options{})
		require.NoError(t, h.add(h.call("a", typeLow, "1", "x")))
		require.ErrorIs(t, h.d.Close(context.Background()), context.Canceled, "closed before Start: ended at once")
		assert.ErrorIs(t, h.outcome("a"), dispatch.ErrClosed)
		h.start()
		synctest.Wait()
		assert.Empty(t, h.j.only("execute"), "Start after Close starts nothing")
	})
}

// TestCloseInterruptsRetryOnError checks what the README says of a call
// that retries inside its Execute with client-go's retry.OnError, as
// upstream's status patch and binding do, when Close cancels it: the call
// ends with the cause, dispatch.ErrClosed, which retry.OnError does not
// take for an interruption; upstream's cause, context.Canceled, it does,
// and returns the error of the attempt before, with which upstream's call
// ends.
func TestCloseInterruptsRetryOnError(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, strings.Join(strings.Fields(string(readme)), " "),
		"So code that takes `context.Canceled` for an interruption does not take the cause for one: client-go's `retry.OnError`, in which upstream's status patch retries a 409, a 500 or a 503 inside `Execute` and its binding a 500 or a 503, returns the error of the attempt before the one `Close` cancelled, and upstream's call ends with that; here it ends with `dispatch.ErrClosed`, which says why it stopped.")
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", errTest)
	// retrying is an Execute's retry: a conflict, then an attempt that
	// waits for ctx to end, and fails with its cause.
	retrying := func(ctx context.Context, started chan<- struct{}) error {
		first := true
		return retry.OnError(retry.DefaultBackoff, apierrors.IsConflict, func() error {
			if first {
				first = false
				return conflict
			}
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}
	synctest.Test(t, func(t *testing.T) {
		d := newTestDispatcher(t, Options{})
		c := newCall(&journal{}, "a", typeLow, "1", "x")
		started := make(chan struct{})
		c.exec = func(ctx context.Context, _ *testCall) error { return retrying(ctx, started) }
		ch := make(chan error, 1)
		require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: ch}))
		<-started
		require.ErrorIs(t, d.Close(canceled()), context.Canceled)
		assert.Equal(t, dispatch.ErrClosed, <-ch, "the cause")

		started = make(chan struct{})
		assert.Equal(t, conflict, retrying(canceled(), started), "upstream's cause: the attempt before")
	})
}
