package scheduler

import (
	"context"
	"sync"
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// onSubmitHook is an Observer that runs a hook once, on the next merged
// submission's OnSubmit: in the Add that merged, after the core admitted
// it and before Add returns.
type onSubmitHook struct {
	dispatch.NopObserver
	mu   sync.Mutex
	hook func()
}

func (o *onSubmitHook) OnSubmit(_ dispatch.Event, coalesced bool) {
	o.mu.Lock()
	h := o.hook
	if coalesced {
		o.hook = nil
	}
	o.mu.Unlock()
	if coalesced && h != nil {
		h()
	}
}

// pendingBehindHook returns an idle dispatcher whose observer runs
// obs.hook inside the next merged Add, the journal of its calls, and the
// OnFinish of a low-priority call "a" pending for pod UID "1".
func pendingBehindHook(t *testing.T) (*Dispatcher, *onSubmitHook, *journal, chan error) {
	t.Helper()
	obs := &onSubmitHook{}
	d := newIdleDispatcher(t, Options{Observer: obs})
	j := &journal{}
	chA := make(chan error, 1)
	require.NoError(t, d.Add(newCall(j, "a", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: chA}))
	return d, obs, j, chA
}

// TestNoOpMergeDroppedAtOnce: a call that is a no-op once merged with the
// pending call is skipped together with it, in the step that admits it, as
// upstream's is: a call added for the object right after — before the
// Add that merged has returned — finds no pending call. The no-op's Add
// and its OnFinish agree (skipped), the pending call it merged is told it
// was overwritten, and the later call is admitted as for an idle object:
// not merged with the no-op, and run.
func TestNoOpMergeDroppedAtOnce(t *testing.T) {
	d, obs, j, chA := pendingBehindHook(t)

	e := newCall(j, "e", typeLow, "1", "x")
	e.noop = ptr(true)
	f := newCall(j, "f", typeLow, "1", "y")
	chE, chF := make(chan error, 1), make(chan error, 1)
	var addF error
	obs.hook = func() { addF = d.Add(f, fwk.APICallOptions{OnFinish: chF}) }
	addE := d.Add(e, fwk.APICallOptions{OnFinish: chE})

	assert.ErrorIs(t, addE, fwk.ErrCallSkipped, "e is a no-op once merged")
	assert.ErrorIs(t, outcome(t, chE), fwk.ErrCallSkipped, "e's OnFinish agrees with its Add")
	assert.ErrorIs(t, outcome(t, chA), fwk.ErrCallOverwritten)
	require.NoError(t, addF)
	assert.Equal(t, []string{"merge e<-a"}, j.only("merge"), "f finds no pending call to merge")
	d.Start(testLogger(t))
	assert.NoError(t, outcome(t, chF))
	assert.Equal(t, []string{"execute f"}, j.only("execute"))
}

// TestNoOpMergeDroppedBeforeSyncObject: SyncObject right after a call
// that is a no-op once merged — before the Add that merged has returned —
// finds no pending call, as upstream's does, whose drop is in the step
// that admits the call: it returns the object as given and leaves the
// no-op dropped, even if the object it is given would make the call do
// something again.
func TestNoOpMergeDroppedBeforeSyncObject(t *testing.T) {
	d, obs, j, chA := pendingBehindHook(t)

	e := newCall(j, "e", typeLow, "1", "x")
	e.noop = ptr(true)
	chE := make(chan error, 1)
	obj := &metav1.ObjectMeta{Name: "pod", UID: "1"} // lacks x: e would set it
	var synced metav1.Object
	var syncErr error
	obs.hook = func() {
		e.mu.Lock()
		e.noop = nil // from now on IsNoOp follows the object
		e.mu.Unlock()
		synced, syncErr = d.SyncObject(obj)
	}
	assert.ErrorIs(t, d.Add(e, fwk.APICallOptions{OnFinish: chE}), fwk.ErrCallSkipped)
	require.NoError(t, syncErr)
	assert.Same(t, obj, synced, "no pending call: the object as given")
	assert.Empty(t, j.only("sync"), "no call to sync")
	assert.ErrorIs(t, outcome(t, chE), fwk.ErrCallSkipped)
	assert.ErrorIs(t, outcome(t, chA), fwk.ErrCallOverwritten)
	d.Start(testLogger(t))
	require.NoError(t, d.Close(context.Background()))
	assert.Empty(t, j.only("execute"), "the no-op never runs")
}

// TestSyncObjectDropsAMergedCallAfterItsAdmission: a call merged with the
// pending call, not a no-op as admitted, that SyncObject then finds a
// no-op — before the Add that merged has returned — was queued, as
// upstream's Add says (nil); SyncObject drops it, and its OnFinish says
// it was skipped.
func TestSyncObjectDropsAMergedCallAfterItsAdmission(t *testing.T) {
	d, obs, j, chA := pendingBehindHook(t)

	e := newCall(j, "e", typeLow, "1", "y")
	chE := make(chan error, 1)
	var syncErr error
	obs.hook = func() {
		// The object now has everything e (with a's x) sets.
		_, syncErr = d.SyncObject(&metav1.ObjectMeta{Name: "pod", UID: "1", Labels: map[string]string{"x": "", "y": ""}})
	}
	assert.NoError(t, d.Add(e, fwk.APICallOptions{OnFinish: chE}), "queued: not a no-op as admitted")
	require.NoError(t, syncErr)
	assert.Equal(t, []string{"sync e"}, j.only("sync"))
	assert.ErrorIs(t, outcome(t, chE), fwk.ErrCallSkipped, "dropped by SyncObject")
	assert.ErrorIs(t, outcome(t, chA), fwk.ErrCallOverwritten)
	d.Start(testLogger(t))
	require.NoError(t, d.Close(context.Background()))
	assert.Empty(t, j.only("execute"))
}
