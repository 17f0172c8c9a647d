package scheduler

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fwk "k8s.io/kube-scheduler/framework"
)

// The tests in this file pin upstream's rules for an object whose call is
// in flight, as call_queue.go states them: the queue keeps the object's
// newest call — the pending one, or the call in flight when nothing is
// pending — and the set of objects in flight. A new call is merged with
// (or skipped against) the newest call; a call that IsNoOp is dropped only
// if its object has no call in flight; SyncObject syncs the newest call
// only, returns what that call's Sync returns, and drops it (if it is then
// a no-op) only if the object has no call in flight.
//
// "In flight" begins when upstream pops the call, before its Execute runs.
// The core starts a call (and tells Observer.OnStart) before the adapter's
// exec runs, so startGate holds the adapter in that window: the call has
// left the queue, and its Execute has not begun.
//
// The differential harness in upstream/differential runs the same cases
// through upstream's dispatcher and the drop-in, with upstream's own calls.

// startGate is an Observer whose OnStart blocks the first start of a call
// of type typ until the test opens the gate.
type startGate struct {
	dispatch.NopObserver
	typ     fwk.APICallType
	entered chan struct{}
	release chan struct{}
	first   sync.Once
	opened  sync.Once
}

// newGatedHarness returns a rules harness whose dispatcher's Observer is
// a startGate for calls of type typ.
func newGatedHarness(t *testing.T, typ fwk.APICallType) (*rulesHarness, *startGate) {
	g := &startGate{typ: typ, entered: make(chan struct{}, 1), release: make(chan struct{})}
	h := newRulesHarness(t, Options{Observer: g})
	// Registered after the harness's Close (cleanups run last first), so
	// that a failing test does not leave Close waiting on a held worker.
	t.Cleanup(g.open)
	return h, g
}

func (g *startGate) OnStart(e dispatch.Event, _ int, _ time.Duration) {
	if e.Label != string(g.typ) {
		return
	}
	hold := false
	g.first.Do(func() { hold = true })
	if !hold {
		return
	}
	g.entered <- struct{}{}
	<-g.release
}

// wait returns once the gated call has started and is held before its
// Execute.
func (g *startGate) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not start within 10s")
	}
}

func (g *startGate) open() { g.opened.Do(func() { close(g.release) }) }

// errForbidden is a 403: kube.Classify does not retry it, and upstream's
// calls do not retry it inside Execute.
var errForbidden = apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", nil)

// inFlightThenFail is the harness's inFlight for a call whose Execute,
// once released, fails with err.
func inFlightThenFail(h *rulesHarness, c *testCall, err error) {
	h.t.Helper()
	c.exec = func(ctx context.Context, c *testCall) error {
		if herr := h.hold.exec(ctx, c); herr != nil {
			return herr
		}
		return err
	}
	require.NoError(h.t, h.add(c))
	h.start()
	require.Equal(h.t, c.name, <-h.hold.arrived)
}

// TestInFlightWhileStarting: a call is in flight from the moment it leaves
// the queue, not only once its Execute runs. Upstream pops the call (the
// object is in flight, the call still its newest) before it starts the
// goroutine that executes it.
func TestInFlightWhileStarting(t *testing.T) {
	t.Run("a less relevant call added while the object's call is starting is skipped", func(t *testing.T) {
		// A status patch (PodScheduled=False) added as the binding starts
		// must not be sent after the binding.
		h, g := newGatedHarness(t, typeHigh)
		require.NoError(t, h.add(h.call("bind", typeHigh, "1", "x")))
		h.start()
		g.wait(t)
		err := h.add(h.call("patch", typeLow, "1", "y"))
		g.open()
		assert.ErrorIs(t, err, fwk.ErrCallSkipped, "upstream: the binding is still the object's newest call, and more relevant")
		assert.ErrorIs(t, h.outcome("patch"), fwk.ErrCallSkipped)
		assert.NoError(t, h.outcome("bind"))
		assert.Equal(t, []string{"execute bind"}, h.j.only("execute"), "the status patch is never sent")
	})
	t.Run("SyncObject while the object's call is starting syncs that call", func(t *testing.T) {
		h, g := newGatedHarness(t, typeLow)
		a := h.call("a", typeLow, "1", "x")
		require.NoError(t, h.add(a))
		h.start()
		g.wait(t)
		got, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1"})
		g.open()
		require.NoError(t, err)
		assert.Equal(t, []string{"sync a"}, h.j.only("sync"), "upstream syncs the object's newest call: the one in flight")
		assert.Equal(t, map[string]string{"x": "a"}, got.GetLabels(), "what the call in flight's Sync returns")
		assert.NoError(t, h.outcome("a"), "a call in flight is never dropped")
		assert.Equal(t, []string{"execute a"}, h.j.only("execute"))
	})
}

// TestSyncObjectKeepsPendingWhileInFlight: SyncObject refreshes the
// object's newest call from the object as given — not from the object as
// the call in flight would leave it, since that call may yet fail — and
// never drops a call while the object has one in flight.
func TestSyncObjectKeepsPendingWhileInFlight(t *testing.T) {
	t.Run("a pending call repeating the one in flight lands when that one fails", func(t *testing.T) {
		// A status patch in flight, the same patch pending behind it, and
		// SyncObject with the pod as the server has it (the patch in
		// flight has not landed). Upstream keeps the pending patch; when
		// the one in flight fails with a 403, it is sent.
		h := newRulesHarness(t, Options{})
		a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "x")
		inFlightThenFail(h, a, errForbidden)
		require.NoError(t, h.add(b))
		_, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1"})
		require.NoError(t, err)
		assert.Empty(t, h.j.only("sync a"), "the call in flight is not the newest: upstream does not sync it")
		assert.Empty(t, b.have, "b is refreshed from the object as given")
		h.release()
		assert.ErrorIs(t, h.outcome("a"), errForbidden)
		assert.NoError(t, h.outcome("b"), "b was kept, and ran")
		assert.Equal(t, []string{"execute a", "execute b"}, h.j.only("execute"))
	})
	t.Run("a pending call that is a no-op after sync is kept while the object has a call in flight", func(t *testing.T) {
		// The object given already has b's change: b IsNoOp after the
		// sync. Upstream drops it only if no call is in flight
		// (noOp && !inFlight).
		h := newRulesHarness(t, Options{})
		a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y")
		h.inFlight(a)
		require.NoError(t, h.add(b))
		_, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1", Labels: map[string]string{"y": ""}})
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"y"}, b.have, "b is refreshed from the object as given")
		h.release()
		assert.NoError(t, h.outcome("a"))
		assert.NoError(t, h.outcome("b"), "b was kept, and ran")
		assert.Equal(t, []string{"execute a", "execute b"}, h.j.only("execute"))
	})
}

// TestNoOpMergeKeptWhileInFlight: a call that IsNoOp once merged with the
// object's pending call is skipped only if the object has no call in
// flight (upstream's enqueue: noOp && !inFlight). With a call in flight,
// it replaces the pending one (which is told it was overwritten) and runs.
func TestNoOpMergeKeptWhileInFlight(t *testing.T) {
	h := newRulesHarness(t, Options{})
	a, b, c := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y"), h.call("c", typeLow, "1", "y")
	c.noop = ptr(true)
	h.inFlight(a)
	require.NoError(t, h.add(b))
	err := h.add(c)
	assert.NoError(t, err, "upstream keeps a no-op while the object's call is in flight")
	assert.ErrorIs(t, h.outcome("b"), fwk.ErrCallOverwritten, "c merged b")
	h.release()
	assert.NoError(t, h.outcome("a"))
	if err == nil {
		assert.NoError(t, h.outcome("c"))
	} else {
		assert.ErrorIs(t, h.outcome("c"), fwk.ErrCallSkipped) // what today's code sends with the refusal
	}
	assert.Equal(t, []string{"execute a", "execute c"}, h.j.only("execute"))
}

// TestSyncObjectReturnsNewestCallsSync: with a call in flight and another
// pending, SyncObject syncs the pending call only, and returns what its
// Sync returns: for a binding (whose Sync returns the object as given),
// the object as given — without the change of the status patch in flight.
func TestSyncObjectReturnsNewestCallsSync(t *testing.T) {
	h := newRulesHarness(t, Options{})
	a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeHigh, "1")
	b.noop = ptr(false) // as a binding's: IsNoOp is always false
	h.inFlight(a)
	require.NoError(t, h.add(b))
	got, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1"})
	require.NoError(t, err)
	assert.Equal(t, []string{"sync b"}, h.j.only("sync"), "only the newest call is synced")
	assert.Empty(t, got.GetLabels(), "b's Sync changes nothing; the change in flight is not applied")
	h.release()
	assert.NoError(t, h.outcome("a"))
	assert.NoError(t, h.outcome("b"))
	assert.Equal(t, []string{"execute a", "execute b"}, h.j.only("execute"))
}

// TestInFlightCallEndsWithItsOwnOutcome pins that the call in flight is not
// told it was overwritten: a call added while it is in flight runs after
// it, and when the call in flight fails and its retry absorbs that call,
// it ends with its own execution's error, as upstream's call in flight
// does. A pending call — a retry waiting out its backoff — that a new call
// replaces is told it was overwritten.
func TestInFlightCallEndsWithItsOwnOutcome(t *testing.T) {
	cases := []struct {
		name     string
		inFlight bool // the second call arrives during the first's execution, not its backoff
		typ      fwk.APICallType
		want     error
	}{
		{"a call of the same type behind it", true, typeLow, errRetryable},
		{"a more relevant call behind it", true, typeHigh, errRetryable},
		{"a call of the same type replacing its retry", false, typeLow, fwk.ErrCallOverwritten},
		{"a more relevant call replacing its retry", false, typeHigh, fwk.ErrCallOverwritten},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newTestDispatcher(t, Options{Retry: dispatch.RetryPolicy{InitialBackoff: 10 * time.Second, Jitter: dispatch.JitterNone, BudgetRatio: 1}})
				j := &journal{}
				first := failsOnce(j, "first")
				chFirst, chNext := make(chan error, 2), make(chan error, 2)
				require.NoError(t, d.Add(first, fwk.APICallOptions{OnFinish: chFirst}))
				if c.inFlight {
					time.Sleep(50 * time.Millisecond)
				} else {
					time.Sleep(time.Second) // its retry waits out the backoff
				}
				require.NoError(t, d.Add(newCall(j, "next", c.typ, "1", "y"), fwk.APICallOptions{OnFinish: chNext}))
				time.Sleep(time.Minute)
				synctest.Wait()

				require.NoError(t, outcome(t, chNext))
				err := outcome(t, chFirst)
				assert.ErrorIs(t, err, c.want)
				if c.want != fwk.ErrCallOverwritten {
					assert.NotErrorIs(t, err, fwk.ErrCallOverwritten)
				}
				requireNoMore(t, chFirst)
				requireNoMore(t, chNext)
			})
		})
	}
}

// TestMergeAskedOncePerAdd pins that a call's Merge is asked once per Add
// with the object's newest call, as upstream asks it: a call that absorbs
// the call in flight (follow) is not merged with it again when that call
// fails and its retry absorbs the newcomer.
func TestMergeAskedOncePerAdd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newTestDispatcher(t, Options{})
		j := &journal{}
		first := failsOnce(j, "first")
		ch := make(chan error, 2)
		require.NoError(t, d.Add(first, fwk.APICallOptions{}))
		time.Sleep(50 * time.Millisecond) // first is in flight
		next := newCall(j, "next", typeLow, "1", "y")
		require.NoError(t, d.Add(next, fwk.APICallOptions{OnFinish: ch}))
		time.Sleep(time.Minute)
		synctest.Wait()

		require.NoError(t, outcome(t, ch))
		assert.Equal(t, []string{"merge next<-first"}, j.only("merge "), "Merge asked once for the pair")
		assert.Equal(t, []string{"execute first", "execute next"}, j.only("execute "), "the retry runs the merged call")
		assert.ElementsMatch(t, []string{"x", "y"}, next.fieldList())
	})
}

// failsOnce is a call of typeLow on object "1" whose execution takes
// 100 ms and fails retryably the first time, then succeeds.
func failsOnce(j *journal, name string) *testCall {
	c := newCall(j, name, typeLow, "1", "x")
	runs := 0
	c.exec = func(context.Context, *testCall) error {
		time.Sleep(100 * time.Millisecond)
		if runs++; runs == 1 {
			return errRetryable
		}
		return nil
	}
	return c
}

// nilSync is a testCall whose Sync refuses every object, returning nil and
// errTest, as a plugin's Sync may.
type nilSync struct{ *testCall }

func (c nilSync) Sync(obj metav1.Object) (metav1.Object, error) {
	c.j.add("sync " + c.name)
	return nil, errTest
}

// TestSyncObjectReturnsWhatSyncReturns: SyncObject returns what the
// newest call's Sync returns, as upstream's does — nil, and its error
// itself, not wrapped — whether that call is pending or in flight.
func TestSyncObjectReturnsWhatSyncReturns(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		d := newIdleDispatcher(t, Options{})
		j := &journal{}
		require.NoError(t, d.Add(nilSync{newCall(j, "a", typeLow, "1", "x")}, fwk.APICallOptions{}))
		got, err := d.SyncObject(&metav1.ObjectMeta{UID: "1"})
		assert.Nil(t, got)
		assert.Same(t, errTest, err)
		assert.Equal(t, []string{"sync a"}, j.only("sync"))
	})
	t.Run("in flight", func(t *testing.T) {
		h := newRulesHarness(t, Options{})
		a := h.call("a", typeLow, "1", "x")
		a.exec = h.hold.exec
		h.ch["a"] = make(chan error, 1)
		require.NoError(t, h.d.Add(nilSync{a}, fwk.APICallOptions{OnFinish: h.ch["a"]}))
		h.start()
		require.Equal(t, "a", <-h.hold.arrived)
		got, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1"})
		assert.Nil(t, got)
		assert.Same(t, errTest, err)
		h.release()
		assert.NoError(t, h.outcome("a"))
	})
}
