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
