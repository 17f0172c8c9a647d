package scheduler

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fwk "k8s.io/kube-scheduler/framework"
)

var pods = schema.GroupResource{Resource: "pods"}

// TestRetries: the API's errors are judged by kube.Classify — a 503 or a
// 429 is retried after a backoff in the queue, a 400 or a 404 fails at
// once, a 409 (which needs the call rebuilt, which an fwk.APICall cannot
// be) fails at once — and the attempts are bounded by Retry.MaxAttempts.
func TestRetries(t *testing.T) {
	for _, tc := range []struct {
		name     string
		errs     []error // what successive executions return; then nil
		attempts int
		fails    bool
	}{
		{"503 then success", []error{apierrors.NewServiceUnavailable("busy")}, 2, false},
		{"429 twice then success", []error{apierrors.NewTooManyRequests("slow down", 0), apierrors.NewTooManyRequests("slow down", 0)}, 3, false},
		{"500 every time", []error{apierrors.NewInternalError(errTest), apierrors.NewInternalError(errTest), apierrors.NewInternalError(errTest), apierrors.NewInternalError(errTest)}, 3, true},
		{"400", []error{apierrors.NewBadRequest("no")}, 1, true},
		{"404", []error{apierrors.NewNotFound(pods, "p")}, 1, true},
		{"409", []error{apierrors.NewConflict(pods, "p", errTest)}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newTestDispatcher(t, Options{})
				j := &journal{}
				c := newCall(j, "a", podStatusPatch, "1", "x")
				var mu sync.Mutex
				n := 0
				c.exec = func(context.Context, *testCall) error {
					mu.Lock()
					defer mu.Unlock()
					n++
					if n <= len(tc.errs) {
						return tc.errs[n-1]
					}
					return nil
				}
				tk, err := d.Submit(c, fwk.APICallOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, tc.attempts, res.Outcome.Attempts)
				assert.Len(t, j.only("execute"), tc.attempts)
				if tc.fails {
					assert.Error(t, res.Err)
					assert.Equal(t, dispatch.StateFailed, res.Outcome.State)
					assert.Same(t, tc.errs[tc.attempts-1], res.Err, "the error the last Execute returned, unchanged, as upstream sends it")
					var re *dispatch.RetryError
					assert.ErrorAs(t, res.Outcome.Err, &re, "the dispatcher's account is in the Outcome")
				} else {
					assert.NoError(t, res.Err)
				}
			})
		})
	}
}

// TestTimeout: a call that cannot run within its type's timeout ends with
// ErrExpired on its OnFinish; a type without a limit waits.
func TestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newIdleDispatcher(t, Options{
			Timeout:  time.Minute,
			Timeouts: map[fwk.APICallType]time.Duration{podBinding: -1, typeLow: 10 * time.Second},
		})
		j := &journal{}
		ch := map[string]chan error{}
		for _, c := range []*testCall{
			newCall(j, "low", typeLow, "1", "x"),
			newCall(j, "patch", podStatusPatch, "2", "x"),
			newCall(j, "bind", podBinding, "3", "x"),
		} {
			ch[c.name] = make(chan error, 1)
			require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: ch[c.name]}))
		}
		// Never started: nothing runs, and the deadlines pass.
		start := time.Now()
		assert.ErrorIs(t, <-ch["low"], dispatch.ErrExpired)
		assert.Equal(t, 10*time.Second, time.Since(start))
		assert.ErrorIs(t, <-ch["patch"], dispatch.ErrExpired)
		assert.Equal(t, time.Minute, time.Since(start))
		time.Sleep(time.Hour)
		select {
		case err := <-ch["bind"]:
			t.Fatalf("the binding, without a limit, ended: %v", err)
		default:
		}
		d.Start(testLogger(t))
		assert.NoError(t, <-ch["bind"])
	})
}

// TestSyncMode: in dispatch.ModeSync (the gate off) Add runs the call in the
// caller, through the same rules, so its result is on OnFinish when Add
// returns; SetMode switches at run time.
func TestSyncMode(t *testing.T) {
	d := newTestDispatcher(t, Options{Rollout: dispatch.RolloutPolicy{Mode: kube.ModeOf(false)}})
	j := &journal{}
	ch := make(chan error, 1)
	require.NoError(t, d.Add(newCall(j, "a", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: ch}))
	select {
	case err := <-ch:
		assert.NoError(t, err)
	default:
		t.Fatal("Sync mode: no outcome when Add returned")
	}
	assert.Equal(t, []string{"execute a"}, j.only("execute"))

	require.NoError(t, d.SetMode(t.Context(), kube.ModeOf(true)))
	assert.Equal(t, dispatch.ModeAsync, d.Mode())
	hold := newHolder()
	b := newCall(j, "b", typeLow, "2", "x")
	b.exec = hold.exec
	require.NoError(t, d.Add(b, fwk.APICallOptions{OnFinish: ch}), "returns at once in Async mode")
	<-hold.arrived
	hold.release <- struct{}{}
	assert.NoError(t, outcome(t, ch))
}

// TestStatsByCallType: each call type is its own tenant and label.
func TestStatsByCallType(t *testing.T) {
	d := newIdleDispatcher(t, Options{Tenants: map[fwk.APICallType]dispatch.TenantConfig{podStatusPatch: {MaxQueued: 2}}})
	j := &journal{}
	for i, typ := range []fwk.APICallType{podStatusPatch, podStatusPatch, podBinding} {
		require.NoError(t, d.Add(newCall(j, "c", typ, typeUID(string(rune('a'+i))), "x"), fwk.APICallOptions{}))
	}
	err := d.Add(newCall(j, "d", podStatusPatch, "d", "x"), fwk.APICallOptions{})
	assert.ErrorIs(t, err, dispatch.ErrBackpressure, "the status patches' quota")
	s := d.Stats()
	assert.Equal(t, 2, s.Tenants[string(podStatusPatch)].Queued)
	assert.Equal(t, 1, s.Tenants[string(podBinding)].Queued)
	assert.Equal(t, map[string]int{string(podStatusPatch): 2, string(podBinding): 1}, s.Labels)
}

// TestOverwriteStartsFresh: a call that overwrites a pending call of
// another type is another operation — it runs at once, not after the
// backoff of the retry it replaces, and with every attempt of its own —
// while a call of the same type that merges into a retry is the same
// operation, updated: it keeps the retry's backoff and attempts.
func TestOverwriteStartsFresh(t *testing.T) {
	const backoff = time.Minute
	for _, tc := range []struct {
		name       string
		incoming   fwk.APICallType
		wait       time.Duration // from the incoming call's Add to its first execution
		executions int           // of the incoming call, when every one fails
	}{
		{"a more relevant type", typeHigh, 0, 3},
		{"another type of the same relevance", typePeer, 0, 3},
		{"the same type", typeLow, backoff - time.Second, 1}, // the retry's third and last attempt, when its backoff ends
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newTestDispatcher(t, Options{Retry: dispatch.RetryPolicy{MaxAttempts: 3, InitialBackoff: backoff, MaxBackoff: backoff, Jitter: dispatch.JitterNone, BudgetRatio: 1}})
				j := &journal{}
				var mu sync.Mutex
				var runs []time.Time
				failing := func(ctx context.Context, c *testCall) error {
					mu.Lock()
					defer mu.Unlock()
					if c.name == "incoming" {
						runs = append(runs, time.Now())
					}
					return errRetryable
				}
				first := newCall(j, "first", typeLow, "1", "x")
				first.exec = failing
				firstDone := make(chan error, 1)
				require.NoError(t, d.Add(first, fwk.APICallOptions{OnFinish: firstDone}))
				time.Sleep(backoff + time.Second) // two executions failed: in its last backoff
				synctest.Wait()
				require.Len(t, j.only("execute first"), 2)

				in := newCall(j, "incoming", tc.incoming, "1", "y")
				in.exec = failing
				done := make(chan error, 1)
				added := time.Now()
				require.NoError(t, d.Add(in, fwk.APICallOptions{OnFinish: done}))
				assert.ErrorIs(t, <-done, errRetryable) // synctest: a receive lets the clock run
				assert.ErrorIs(t, <-firstDone, fwk.ErrCallOverwritten)
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, runs, tc.executions)
				assert.Equal(t, tc.wait, runs[0].Sub(added))
				assert.Len(t, j.only("execute first"), 2)
			})
		})
	}
}
