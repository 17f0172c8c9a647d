package scheduler

import (
	"context"
	"errors"
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// rulesHarness drives one Dispatcher through a case of TestRules: calls
// are added with an OnFinish channel each, and their outcomes collected.
type rulesHarness struct {
	t    *testing.T
	d    *Dispatcher
	j    *journal
	hold *holder
	ch   map[string]chan error
}

func newRulesHarness(t *testing.T, o Options) *rulesHarness {
	return &rulesHarness{t: t, d: newIdleDispatcher(t, o), j: &journal{}, hold: newHolder(), ch: map[string]chan error{}}
}

func (h *rulesHarness) call(name string, typ fwk.APICallType, uid string, fields ...string) *testCall {
	return newCall(h.j, name, typ, typeUID(uid), fields...)
}

// add adds c and returns Add's error.
func (h *rulesHarness) add(c *testCall) error {
	h.ch[c.name] = make(chan error, 1)
	return h.d.Add(c, fwk.APICallOptions{OnFinish: h.ch[c.name]})
}

func (h *rulesHarness) start() { h.d.Start(testLogger(h.t)) }

// outcome waits for c's one outcome.
func (h *rulesHarness) outcome(name string) error {
	h.t.Helper()
	err := outcome(h.t, h.ch[name])
	requireNoMore(h.t, h.ch[name])
	return err
}

// inFlight starts c and waits until its Execute runs, held.
func (h *rulesHarness) inFlight(c *testCall) {
	h.t.Helper()
	c.exec = h.hold.exec
	require.NoError(h.t, h.add(c))
	h.start()
	require.Equal(h.t, c.name, <-h.hold.arrived)
}

func (h *rulesHarness) release() { h.hold.release <- struct{}{} }

// TestRules is upstream's call-queue contract, case by case (modelled on
// the cases of call_queue_test.go and going beyond them: calls arriving
// while one is in flight, merge errors, equal relevances, unknown types,
// SyncObject of a call in flight): what Add returns, what each call's
// OnFinish gets, and which calls run with what.
func TestRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *rulesHarness)
	}{{
		name: "a first call runs",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("a", typeLow, "1", "x")))
			assert.Equal(t, []string{"noop? a"}, h.j.only("noop? a"), "IsNoOp asked once, as upstream asks it")
			h.start()
			assert.NoError(t, h.outcome("a"))
			assert.Equal(t, []string{"execute a"}, h.j.only("execute"))
		},
	}, {
		name: "a no-op call on an idle object is skipped at once",
		run: func(t *testing.T, h *rulesHarness) {
			c := h.call("a", typeLow, "1")
			c.noop = ptr(true)
			err := h.add(c)
			assert.ErrorIs(t, err, fwk.ErrCallSkipped)
			assert.ErrorIs(t, h.outcome("a"), fwk.ErrCallSkipped)
			assert.Equal(t, 0, h.d.Stats().Keys, "nothing is queued")
			assert.Equal(t, []string{"noop? a"}, h.j.only("noop? a"), "IsNoOp asked once")
			h.start()
			assert.Empty(t, h.j.only("execute"))
		},
	}, {
		name: "calls for different objects do not collide",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("a", typeLow, "1", "x")))
			require.NoError(t, h.add(h.call("b", typeHigh, "2", "x")))
			h.start()
			assert.NoError(t, h.outcome("a"))
			assert.NoError(t, h.outcome("b"))
			assert.ElementsMatch(t, []string{"execute a", "execute b"}, h.j.only("execute"))
		},
	}, {
		name: "a more relevant call overwrites the pending one",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("low", typeLow, "1", "x")))
			require.NoError(t, h.add(h.call("high", typeHigh, "1", "y")))
			assert.ErrorIs(t, h.outcome("low"), fwk.ErrCallOverwritten, "told at once, before Start")
			h.start()
			assert.NoError(t, h.outcome("high"))
			assert.Equal(t, []string{"execute high"}, h.j.only("execute"))
			assert.Empty(t, h.j.only("merge"), "different types never merge")
		},
	}, {
		name: "a call of another type at the same relevance overwrites the pending one",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("low", typeLow, "1", "x")))
			require.NoError(t, h.add(h.call("peer", typePeer, "1", "y")))
			assert.ErrorIs(t, h.outcome("low"), fwk.ErrCallOverwritten)
			h.start()
			assert.NoError(t, h.outcome("peer"))
			assert.Equal(t, []string{"execute peer"}, h.j.only("execute"))
		},
	}, {
		name: "a less relevant call is skipped and the pending one kept",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("high", typeHigh, "1", "x")))
			err := h.add(h.call("low", typeLow, "1", "y"))
			assert.ErrorIs(t, err, fwk.ErrCallSkipped)
			assert.ErrorIs(t, h.outcome("low"), fwk.ErrCallSkipped)
			h.start()
			assert.NoError(t, h.outcome("high"))
			assert.Equal(t, []string{"execute high"}, h.j.only("execute"))
		},
	}, {
		name: "a type the relevances do not name has relevance 0",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("low", typeLow, "1", "x")))
			assert.ErrorIs(t, h.add(h.call("other", typeOther, "1", "y")), fwk.ErrCallSkipped)
			require.NoError(t, h.add(h.call("other2", typeOther, "2", "y")))
			require.NoError(t, h.add(h.call("low2", typeLow, "2", "x")))
			assert.ErrorIs(t, h.outcome("other2"), fwk.ErrCallOverwritten)
			h.start()
			assert.NoError(t, h.outcome("low"))
			assert.NoError(t, h.outcome("low2"))
		},
	}, {
		name: "a call of the same type absorbs the pending one through its Merge",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y")
			require.NoError(t, h.add(a))
			require.NoError(t, h.add(b))
			assert.ErrorIs(t, h.outcome("a"), fwk.ErrCallOverwritten)
			assert.Equal(t, []string{"merge b<-a"}, h.j.only("merge"))
			h.start()
			assert.NoError(t, h.outcome("b"))
			assert.Equal(t, []string{"execute b"}, h.j.only("execute"))
			assert.ElementsMatch(t, []string{"x", "y"}, b.fieldList(), "b carries a's fields")
			assert.Equal(t, []string{"noop? b"}, h.j.only("noop? b"), "IsNoOp asked once, after the merge")
		},
	}, {
		name: "a merged call that is a no-op is dropped with the pending one",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "x")
			require.NoError(t, h.add(a))
			b.noop = ptr(true)
			assert.ErrorIs(t, h.add(b), fwk.ErrCallSkipped)
			assert.ErrorIs(t, h.outcome("a"), fwk.ErrCallOverwritten)
			assert.ErrorIs(t, h.outcome("b"), fwk.ErrCallSkipped)
			assert.Equal(t, 0, h.d.Stats().Keys, "nothing left queued")
			h.start()
			assert.Empty(t, h.j.only("execute"))
		},
	}, {
		name: "a failed Merge refuses the incoming call and keeps the pending one",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y")
			b.mergeErr = errTest
			require.NoError(t, h.add(a))
			err := h.add(b)
			assert.ErrorIs(t, err, errTest)
			assert.ErrorContains(t, err, "failed to merge API calls")
			assert.ErrorIs(t, h.outcome("b"), errTest)
			h.start()
			assert.NoError(t, h.outcome("a"))
			assert.Equal(t, []string{"execute a"}, h.j.only("execute"))
		},
	}, {
		name: "a call of the same type arriving in flight absorbs it through its Merge, and runs after it",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y")
			h.inFlight(a)
			require.NoError(t, h.add(b))
			select {
			case err := <-h.ch["a"]:
				t.Fatalf("the call in flight was told %v; it runs to its own end", err)
			default:
			}
			h.release()
			assert.NoError(t, h.outcome("a"), "the call in flight gets its own result")
			assert.NoError(t, h.outcome("b"))
			assert.Equal(t, []string{"execute a", "execute b"}, h.j.only("execute"))
			assert.Equal(t, []string{"merge b<-a"}, h.j.only("merge"), "upstream merges with the newest call, in flight or not")
			assert.ElementsMatch(t, []string{"x", "y"}, b.fieldList())
		},
	}, {
		name: "a more relevant call arriving in flight runs after it",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeHigh, "1", "y")
			h.inFlight(a)
			require.NoError(t, h.add(b))
			h.release()
			assert.NoError(t, h.outcome("a"))
			assert.NoError(t, h.outcome("b"))
			assert.Equal(t, []string{"execute a", "execute b"}, h.j.only("execute"))
		},
	}, {
		name: "a less relevant call arriving in flight is skipped",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeHigh, "1", "x"), h.call("b", typeLow, "1", "y")
			h.inFlight(a)
			assert.ErrorIs(t, h.add(b), fwk.ErrCallSkipped)
			assert.ErrorIs(t, h.outcome("b"), fwk.ErrCallSkipped)
			h.release()
			assert.NoError(t, h.outcome("a"))
			assert.Equal(t, []string{"execute a"}, h.j.only("execute"))
		},
	}, {
		name: "a no-op call arriving in flight is not skipped",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y")
			b.noop = ptr(true)
			h.inFlight(a)
			require.NoError(t, h.add(b), "upstream never skips while the object's call is in flight")
			h.release()
			assert.NoError(t, h.outcome("a"))
			assert.NoError(t, h.outcome("b"))
		},
	}, {
		name: "three calls while one is in flight: the successor absorbs the third",
		run: func(t *testing.T, h *rulesHarness) {
			a, b, c := h.call("a", typeLow, "1", "x"), h.call("b", typeLow, "1", "y"), h.call("c", typeLow, "1", "z")
			h.inFlight(a)
			require.NoError(t, h.add(b))
			require.NoError(t, h.add(c))
			assert.ErrorIs(t, h.outcome("b"), fwk.ErrCallOverwritten)
			h.release()
			assert.NoError(t, h.outcome("a"))
			assert.NoError(t, h.outcome("c"))
			assert.Equal(t, []string{"execute a", "execute c"}, h.j.only("execute"))
			assert.ElementsMatch(t, []string{"x", "y", "z"}, c.fieldList(), "b absorbed a, c absorbed b")
		},
	}, {
		name: "SyncObject projects the pending call and refreshes it",
		run: func(t *testing.T, h *rulesHarness) {
			a := h.call("a", typeLow, "1", "x")
			require.NoError(t, h.add(a))
			obj := &metav1.ObjectMeta{UID: "1", Labels: map[string]string{"w": ""}}
			got, err := h.d.SyncObject(obj)
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"w": "", "x": "a"}, got.GetLabels(), "the pending call's change applied")
			assert.Equal(t, map[string]string{"w": ""}, obj.Labels, "the object given is not written")
			assert.Equal(t, []string{"w"}, a.have, "the call refreshed from the object")
			h.start()
			assert.NoError(t, h.outcome("a"))
		},
	}, {
		name: "SyncObject drops a pending call that becomes a no-op",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("a", typeLow, "1", "x")))
			_, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1", Labels: map[string]string{"x": ""}})
			require.NoError(t, err)
			assert.ErrorIs(t, h.outcome("a"), fwk.ErrCallSkipped)
			h.start()
			assert.Empty(t, h.j.only("execute"))
		},
	}, {
		name: "SyncObject without a call returns the object as it is",
		run: func(t *testing.T, h *rulesHarness) {
			obj := &metav1.ObjectMeta{UID: "1"}
			got, err := h.d.SyncObject(obj)
			require.NoError(t, err)
			assert.Same(t, obj, got)
		},
	}, {
		name: "SyncObject applies the call in flight and never drops it",
		run: func(t *testing.T, h *rulesHarness) {
			a := h.call("a", typeLow, "1", "x")
			h.inFlight(a)
			got, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1", Labels: map[string]string{"x": ""}})
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"x": "a"}, got.GetLabels())
			h.release()
			assert.NoError(t, h.outcome("a"), "a call in flight is never dropped")
		},
	}, {
		name: "SyncObject syncs the successor only, from the object as given",
		run: func(t *testing.T, h *rulesHarness) {
			a, b := h.call("a", typeLow, "1", "x"), h.call("b", typeHigh, "1", "x", "y")
			h.inFlight(a)
			require.NoError(t, h.add(b))
			got, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1"})
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"x": "b", "y": "b"}, got.GetLabels())
			assert.Empty(t, b.have, "the successor's view is the object's, not what the call in flight would make it")
			assert.Equal(t, []string{"sync b"}, h.j.only("sync"), "the call in flight is not the newest: not synced")
			h.release()
			assert.NoError(t, h.outcome("a"))
			assert.NoError(t, h.outcome("b"))
		},
	}, {
		name: "a call's Execute error reaches its OnFinish",
		run: func(t *testing.T, h *rulesHarness) {
			a := h.call("a", typeLow, "1", "x")
			a.exec = func(context.Context, *testCall) error { return errTest }
			require.NoError(t, h.add(a))
			h.start()
			err := h.outcome("a")
			assert.ErrorIs(t, err, errTest)
			assert.Equal(t, []string{"execute a"}, h.j.only("execute"), "a plain error is not retried")
		},
	}, {
		name: "nothing runs before Start; merges and syncs do",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("a", typeLow, "1", "x")))
			require.NoError(t, h.add(h.call("b", typeLow, "1", "y")))
			_, err := h.d.SyncObject(&metav1.ObjectMeta{UID: "1"})
			require.NoError(t, err)
			assert.ErrorIs(t, h.outcome("a"), fwk.ErrCallOverwritten)
			assert.Equal(t, 1, h.d.Stats().Ready, "b waits for Start")
			assert.Empty(t, h.j.only("execute"))
			h.start()
			assert.NoError(t, h.outcome("b"))
		},
	}, {
		name: "Close ends queued calls with ErrClosed and refuses new ones",
		run: func(t *testing.T, h *rulesHarness) {
			require.NoError(t, h.add(h.call("a", typeLow, "1", "x")))
			assert.ErrorIs(t, h.d.Close(canceled()), context.Canceled, "a queued call had to be ended")
			assert.ErrorIs(t, h.outcome("a"), dispatch.ErrClosed)
			err := h.add(h.call("b", typeLow, "2", "x"))
			assert.ErrorIs(t, err, dispatch.ErrClosed)
			assert.ErrorIs(t, h.outcome("b"), dispatch.ErrClosed)
			c := h.call("c", typeLow, "3")
			c.noop = ptr(true)
			assert.ErrorIs(t, h.add(c), dispatch.ErrClosed, "a no-op too, as the README says")
			assert.ErrorIs(t, h.outcome("c"), dispatch.ErrClosed)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newRulesHarness(t, Options{}))
		})
	}
}

// TestBackpressure: beyond Capacity a call for a new object evicts a queued
// status patch if it is a binding, and is otherwise refused, with the
// error on its OnFinish too.
func TestBackpressure(t *testing.T) {
	h := newRulesHarness(t, Options{Capacity: 2})
	require.NoError(t, h.add(h.call("bind1", podBinding, "1", "x")))
	require.NoError(t, h.add(h.call("patch2", podStatusPatch, "2", "x")))
	require.NoError(t, h.add(h.call("bind3", podBinding, "3", "x")), "a binding evicts the status patch")
	assert.ErrorIs(t, h.outcome("patch2"), dispatch.ErrDropped)
	err := h.add(h.call("patch4", podStatusPatch, "4", "x"))
	assert.ErrorIs(t, err, dispatch.ErrBackpressure)
	assert.ErrorIs(t, h.outcome("patch4"), dispatch.ErrBackpressure)
	err = h.add(h.call("bind5", podBinding, "5", "x"))
	assert.ErrorIs(t, err, dispatch.ErrBackpressure, "bindings are never shed")
	h.start()
	assert.NoError(t, h.outcome("bind1"))
	assert.NoError(t, h.outcome("bind3"))
	assert.True(t, errors.Is(h.outcome("bind5"), dispatch.ErrBackpressure))
}
