package writer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
)

// gate is a rate limiter that grants nothing until it is opened: writes
// queued behind it wait, holding no request.
type gate chan struct{}

func (g gate) Wait(ctx context.Context) error {
	select {
	case <-g:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// testRecreated: desires for objects are queued (the writer's limiter
// grants no token yet); each object is then deleted and created again
// under the same name — a new UID — and only then may the writes go.
// Nothing lands on the new objects: every desire ends Failed with
// writer.ErrReplaced, and each new object is as it was created, to its
// resourceVersion.
//
// The fence differs per mode (the package documentation says why, from
// the apiserver's code): an update's UID is a storage precondition (409), a
// JSON patch first tests /metadata/uid (422), and a server-side apply to a
// custom resource's status is fenced only by the resourceVersion it
// carries with Options.ApplyResourceVersion (409). The last subtest pins
// the documented gap: without ApplyResourceVersion, the apiserver's status
// strategy for custom resources replaces the body's UID with the stored
// one, and the apply lands on the new object.
func testRecreated(t *testing.T, st *stack) {
	type tc struct {
		name   string
		opts   writer.Options[*U]
		fenced bool
	}
	for i, c := range []tc{
		{"update", writer.Options[*U]{Mode: writer.ModeUpdate}, true},
		{"patch", writer.Options[*U]{Mode: writer.ModePatch}, true},
		{"apply with resourceVersion", writer.Options[*U]{Mode: writer.ModeApply, ApplyResourceVersion: true}, true},
		{"apply without resourceVersion: the documented gap", writer.Options[*U]{Mode: writer.ModeApply}, false},
	} {
		t.Run(c.name, func(t *testing.T) { recreated(t, st, fmt.Sprint("recreated-", i), c.opts, c.fenced) })
	}
}

func recreated(t *testing.T, st *stack, ns string, o writer.Options[*U], fenced bool) {
	const objects = 10
	st.namespace(t, ns)
	cfg := st.controller(t, ns)
	objs := st.createWidgets(t, ns, "w", objects)
	g := make(gate)
	o.RateLimit = g
	w := newWriter(t, cfg, o)

	tickets := make([]*writer.Ticket[*U], objects)
	for i, obj := range objs {
		var err error
		tickets[i], err = w.Submit(t.Context(), obj, writer.Desire[*U]{
			Status: setStatus(map[string]any{"phase": "for-the-old-object"}),
		}, writer.SetOptions{})
		require.NoError(t, err)
	}
	client := st.admin.Resource(widgets).Namespace(ns)
	fresh := make([]*U, objects)
	for i, obj := range objs {
		require.NoError(t, client.Delete(t.Context(), obj.GetName(), metav1.DeleteOptions{}))
		var err error
		fresh[i], err = client.Create(t.Context(), newWidget(obj.GetName()), metav1.CreateOptions{})
		require.NoError(t, err)
		require.NotEqual(t, obj.GetUID(), fresh[i].GetUID())
	}
	require.Zero(t, w.Stats().Dispatch.Executions, "a write started before its object was replaced")
	close(g)

	for i, tk := range tickets {
		res := wait(t, tk)
		got := st.get(t, ns, fresh[i].GetName())
		if !fenced {
			assert.Equal(t, dispatch.StateSucceeded, res.State, "%s: %v", got.GetName(), res.Err)
			assert.Equal(t, "for-the-old-object", statusOf(got, "phase"),
				"%s: the apply did not land on the new object: the documented gap is closed", got.GetName())
			continue
		}
		assert.Equal(t, dispatch.StateFailed, res.State, got.GetName())
		assert.True(t, errors.Is(res.Err, writer.ErrReplaced), "%s: %v", got.GetName(), res.Err)
		assert.Nil(t, got.Object["status"], "%s: a write for the old object landed on the new one", got.GetName())
		assert.Equal(t, fresh[i].GetResourceVersion(), got.GetResourceVersion(),
			"%s: the new object changed", got.GetName())
	}
	answers := map[int]int{}
	for _, r := range st.Proxy.Filter(isStatusWrite(ns)) {
		answers[r.Status]++
	}
	s := w.Stats()
	if fenced {
		assert.Equal(t, uint64(objects), s.Replaced)
		assert.Zero(t, answers[200], "status writes the server accepted")
	}
	t.Logf("%v (ApplyResourceVersion %v): status writes answered %v; %d replaced, %d reads",
		o.Mode, o.ApplyResourceVersion, answers, s.Replaced, s.Reads)
}
