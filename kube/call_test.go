package kube

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

const ns = "default"

var podsResource = v1.Resource("pods")

// newPod returns an unbound pod named name, with UID "uid-"+name.
func newPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)}}
}

// unschedulable is the condition kube-scheduler reports for a pod it could
// not place.
func unschedulable(msg string) v1.PodCondition {
	return v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: msg}
}

func ptr[T any](v T) *T { return &v }

// invalidCalls are calls that cannot be sent, and what their error says.
func invalidCalls() []struct {
	name string
	call Call
	want string
} {
	pod := newPod("p")
	return []struct {
		name string
		call Call
		want string
	}{
		{"zero Call", Call{}, "the zero Call"},
		{"nil pod", Bind(nil, "n1"), "pod_binding: pod is nil"},
		{"no name", Bind(&v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u"}}, "n1"), "pod has no name"},
		{"no UID", PatchStatus(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}, StatusPatch{NominatedNodeName: ptr("n")}), "pod default/p has no UID"},
		{"binding without node", Bind(pod, ""), "binding has no node"},
		{"patch setting nothing", PatchStatus(pod, StatusPatch{}), "status patch sets nothing"},
		{"condition without type", PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{{Status: v1.ConditionTrue}}}), "condition 0 has no type"},
		{"condition twice", PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{unschedulable("a"), unschedulable("b")}}), "condition type PodScheduled given twice"},
		{"deletion condition without type", Delete(pod, &v1.PodCondition{}), "condition has no type"},
	}
}

// TestCallValidation: a call that cannot be sent says why, with an error
// matching ErrInvalidCall.
func TestCallValidation(t *testing.T) {
	for _, c := range invalidCalls() {
		t.Run(c.name, func(t *testing.T) {
			err := c.call.Err()
			require.ErrorIs(t, err, ErrInvalidCall)
			assert.Contains(t, err.Error(), c.want)
			assert.False(t, isNoOp(&c.call), "an invalid call runs, so that exec says why")
		})
	}
	pod := newPod("p")
	valid := []Call{Bind(pod, "n1"), PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("")}), Delete(pod, nil)}
	for _, c := range valid {
		assert.NoError(t, c.Err(), c.String())
	}
}

// TestCallAccessors: what a call tells about itself, for logs and the
// completion hook.
func TestCallAccessors(t *testing.T) {
	pod := newPod("p")
	b := Bind(pod, "n1")
	assert.Equal(t, PodBinding, b.Type())
	assert.Equal(t, types.UID("uid-p"), b.UID())
	assert.Equal(t, types.NamespacedName{Namespace: ns, Name: "p"}, b.Pod())
	assert.Equal(t, "n1", b.Node())
	assert.Equal(t, "pod_binding default/p -> n1", b.String())
	assert.Equal(t, "pod_status_patch default/p", PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("n")}).String())
	assert.Empty(t, Delete(pod, nil).Node())
	assert.Equal(t, []CallType{PodStatusPatch, PodBinding, PodDeletion}, CallTypes())
}

// TestCallsCopyTheirInputs: a call holds its own copy of the pod's status
// and of the conditions, so the caller may reuse both.
func TestCallsCopyTheirInputs(t *testing.T) {
	pod := newPod("p")
	pod.Status.NominatedNodeName = "n1"
	conds := []v1.PodCondition{unschedulable("no fit")}
	c := PatchStatus(pod, StatusPatch{Conditions: conds, NominatedNodeName: ptr("n1")})
	require.True(t, isNoOp(&c) == false)
	pod.Status.Conditions = append(pod.Status.Conditions, unschedulable("no fit"))
	conds[0].Message = "changed"
	assert.False(t, isNoOp(&c), "the baseline is the pod as it was")
	assert.Equal(t, "no fit", c.conds[0].Message)
	cond := v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue}
	del := Delete(pod, &cond)
	cond.Status = v1.ConditionFalse
	assert.Equal(t, v1.ConditionTrue, del.disruption.Status)
}

// TestNoOp: a status patch is a no-op when its baseline already says what
// it would write (the cases of kube-scheduler's IsNoOp test, and more); a
// binding when the baseline shows the pod on its node; a deletion never.
func TestNoOp(t *testing.T) {
	base := newPod("p")
	base.Status = v1.PodStatus{
		NominatedNodeName: "node-a",
		Conditions: []v1.PodCondition{{
			Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes",
			LastTransitionTime: metav1.NewTime(time.Unix(100, 0)),
		}},
	}
	same := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes"}
	with := func(f func(*v1.PodCondition)) v1.PodCondition { c := same; f(&c); return c }
	patch := func(nnn *string, conds ...v1.PodCondition) Call {
		return PatchStatus(base, StatusPatch{Conditions: conds, NominatedNodeName: nnn})
	}
	bound := base.DeepCopy()
	bound.Spec.NodeName = "node-a"
	cases := []struct {
		name string
		call Call
		want bool
	}{
		{"condition and node name match", patch(ptr("node-a"), same), true},
		{"condition status differs", patch(ptr("node-a"), with(func(c *v1.PodCondition) { c.Status = v1.ConditionTrue })), false},
		{"nominated node differs", patch(ptr("node-b"), same), false},
		{"only the node name, matching", patch(ptr("node-a")), true},
		{"only the node name, differing", patch(ptr("node-b")), false},
		{"clearing a node name that is set", patch(ptr("")), false},
		{"node name not set by the patch", patch(nil, same), true},
		{"one of two conditions differs", patch(nil, same, v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue}), false},
		{"reason differs", patch(nil, with(func(c *v1.PodCondition) { c.Reason = "SchedulerError" })), false},
		{"message differs", patch(nil, with(func(c *v1.PodCondition) { c.Message = "0/4 nodes" })), false},
		{"observed generation differs", patch(nil, with(func(c *v1.PodCondition) { c.ObservedGeneration = 2 })), false},
		{"probe time differs", patch(nil, with(func(c *v1.PodCondition) { c.LastProbeTime = metav1.NewTime(time.Unix(5, 0)) })), false},
		{"only the transition time differs", patch(nil, with(func(c *v1.PodCondition) { c.LastTransitionTime = metav1.NewTime(time.Unix(200, 0)) })), true},
		{"binding of an unbound pod", Bind(base, "node-a"), false},
		{"binding already in place", Bind(bound, "node-a"), true},
		{"binding of a pod bound elsewhere", Bind(bound, "node-b"), false},
		{"deletion", Delete(base, nil), false},
		{"deletion whose condition is there", Delete(base, &same), false},
		{"invalid call", Bind(base, ""), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, isNoOp(&c.call))
		})
	}
}

// TestMerge is the coalescing table of the three calls, pure: relevance
// across types (deletion > binding > status patch: replace, or skip the
// incoming call), combination within status patches, replacement within
// bindings and deletions. Upstream's call_queue_test.go cases are the
// first rows.
func TestMerge(t *testing.T) {
	old, cur := newPod("p"), newPod("p")
	old.ResourceVersion, cur.ResourceVersion = "1", "2"
	bound := cur.DeepCopy()
	bound.ResourceVersion, bound.Spec.NodeName = "3", "n1"
	sched := unschedulable("0/3 nodes")
	ready := v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse}
	disrupt := v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}
	evict := v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: "EvictionByEvictionAPI"}
	patch := func(pod *v1.Pod, nnn *string, conds ...v1.PodCondition) Call {
		return PatchStatus(pod, StatusPatch{Conditions: conds, NominatedNodeName: nnn})
	}
	cases := []struct {
		name              string
		pending, incoming Call
		skip              bool
		replace           bool // a new operation (ReplacePending)
		want              Call
	}{
		{name: "more relevant call overwrites", pending: patch(old, nil, sched), incoming: Bind(cur, "n1"), replace: true, want: Bind(cur, "n1")},
		{name: "less relevant call is skipped", pending: Bind(old, "n1"), incoming: patch(cur, nil, sched), skip: true},
		{name: "same type merges", pending: patch(old, nil, sched), incoming: patch(cur, nil, ready),
			want: func() Call { c := patch(cur, nil, ready, sched); return c }()},
		{name: "newer condition of a type wins", pending: patch(old, nil, sched), incoming: patch(cur, nil, unschedulable("0/4 nodes")),
			want: patch(cur, nil, unschedulable("0/4 nodes"))},
		{name: "nomination kept when the newer patch leaves it out", pending: patch(old, ptr("n1")), incoming: patch(cur, nil, sched),
			want: patch(cur, ptr("n1"), sched)},
		{name: "newer nomination wins", pending: patch(old, ptr("n1"), sched), incoming: patch(cur, ptr("n2")),
			want: patch(cur, ptr("n2"), sched)},
		{name: "newer clearing of the nomination wins", pending: patch(old, ptr("n1")), incoming: patch(cur, ptr("")),
			want: patch(cur, ptr(""))},
		{name: "deletion overwrites a status patch", pending: patch(old, nil, sched), incoming: Delete(cur, nil), replace: true, want: Delete(cur, nil)},
		{name: "deletion overwrites a binding", pending: Bind(old, "n1"), incoming: Delete(cur, &disrupt), replace: true, want: Delete(cur, &disrupt)},
		{name: "newer binding wins", pending: Bind(old, "n1"), incoming: Bind(cur, "n2"), want: Bind(cur, "n2")},
		{name: "status patch onto a deletion is skipped", pending: Delete(old, nil), incoming: patch(cur, nil, sched), skip: true},
		{name: "binding onto a deletion is skipped", pending: Delete(old, nil), incoming: Bind(cur, "n1"), skip: true},
		{name: "deletion keeps the older condition", pending: Delete(old, &disrupt), incoming: Delete(cur, nil), want: Delete(cur, &disrupt)},
		{name: "newer deletion condition wins", pending: Delete(old, &disrupt), incoming: Delete(cur, &evict), want: Delete(cur, &evict)},
		// The pending call was rebased onto a newer view (a write's
		// response, a read) than the incoming one was built from: the
		// merged call keeps that view, and the incoming call's fields.
		{name: "the newer baseline is kept", pending: patch(cur, ptr("n1")), incoming: patch(old, nil, sched),
			want: patch(cur, ptr("n1"), sched)},
		{name: "a newer baseline that shows the pod bound drops a stale PodScheduled=False and nomination",
			pending: patch(bound, nil, ready), incoming: patch(old, ptr("n2"), sched), want: patch(bound, nil, ready)},
		{name: "a newer baseline that shows the pod bound drops the pending patch's stale PodScheduled=False and nomination",
			pending: patch(old, ptr("n2"), sched), incoming: patch(bound, nil, ready), want: patch(bound, nil, ready)},
		{name: "a binding keeps the newer baseline", pending: Bind(cur, "n1"), incoming: Bind(old, "n2"), want: Bind(cur, "n2")},
		{name: "a valid call replaces an invalid pending one", pending: Call{}, incoming: Bind(cur, "n1"), want: Bind(cur, "n1")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := merge(c.pending, c.incoming)
			if c.skip {
				require.ErrorIs(t, err, dispatch.SkipIncoming)
				assert.Equal(t, c.pending, got)
				return
			}
			if c.replace {
				require.ErrorIs(t, err, dispatch.ReplacePending)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, c.want, got)
		})
	}
	t.Run("an invalid incoming call is refused", func(t *testing.T) {
		pending := patch(old, nil, sched)
		got, err := merge(pending, Bind(cur, ""))
		require.ErrorIs(t, err, ErrInvalidCall)
		assert.NotErrorIs(t, err, dispatch.SkipIncoming)
		assert.Equal(t, pending, got)
	})
	t.Run("behind a deletion that landed, every incoming call is moot", func(t *testing.T) {
		pending := patch(old, nil, sched)
		pending.gone = true // as the deletion's success leaves its successor
		for _, incoming := range []Call{patch(cur, nil, ready), Bind(cur, "n1"), Delete(cur, &disrupt)} {
			got, err := merge(pending, incoming)
			require.ErrorIs(t, err, dispatch.SkipIncoming, "%v", incoming)
			assert.Equal(t, pending, got)
		}
	})
	t.Run("merging never writes either call's conditions", func(t *testing.T) {
		incoming := patch(cur, nil, ready)
		incoming.conds = append(make([]v1.PodCondition, 0, 4), incoming.conds...) // room to append in place
		pending := patch(old, nil, sched)
		got, err := merge(pending, incoming)
		require.NoError(t, err)
		assert.Len(t, got.conds, 2)
		assert.Len(t, incoming.conds, 1)
		assert.Equal(t, v1.PodConditionType(""), incoming.conds[:2][1].Type, "incoming's spare capacity untouched")
	})
}

// TestStatusPatchBody: the patch is a strategic-merge patch that takes the
// baseline to the wanted status, with the pod's UID as a precondition, and
// the baseline's resourceVersion too unless Unconditional; applied to the
// pod it gives what kube-scheduler would write.
func TestStatusPatchBody(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	then := metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	pod := newPod("p")
	pod.ResourceVersion = "42"
	pod.Status = v1.PodStatus{
		Phase:             v1.PodPending,
		NominatedNodeName: "n1",
		Conditions: []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: "Unschedulable", Message: "old", LastTransitionTime: then},
			{Type: v1.PodReady, Status: v1.ConditionFalse},
		},
	}
	apply := func(t *testing.T, body []byte) v1.Pod {
		t.Helper()
		cur, err := json.Marshal(pod)
		require.NoError(t, err)
		out, err := strategicpatch.StrategicMergePatch(cur, body, &v1.Pod{})
		require.NoError(t, err)
		var got v1.Pod
		require.NoError(t, json.Unmarshal(out, &got))
		return got
	}
	precondition := func(t *testing.T, body []byte) map[string]string {
		t.Helper()
		var m struct {
			Metadata map[string]string `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal(body, &m))
		return m.Metadata
	}

	t.Run("same status, new message: transition time kept", func(t *testing.T) {
		c := PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{unschedulable("new")}})
		body, err := c.statusPatch(now)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"uid": "uid-p", "resourceVersion": "42"}, precondition(t, body))
		got := apply(t, body)
		require.Len(t, got.Status.Conditions, 2)
		assert.Equal(t, "new", got.Status.Conditions[0].Message)
		assert.True(t, then.Equal(&got.Status.Conditions[0].LastTransitionTime))
		assert.Equal(t, pod.Status.Conditions[1], got.Status.Conditions[1], "other conditions untouched")
		assert.Equal(t, "n1", got.Status.NominatedNodeName)
		var sent struct {
			Status struct {
				Conditions []map[string]any `json:"conditions"`
			} `json:"status"`
		}
		require.NoError(t, json.Unmarshal(body, &sent))
		assert.Equal(t, []map[string]any{{"type": "PodScheduled", "message": "new"}}, sent.Status.Conditions, "only what changes is sent")
	})
	t.Run("status flips: transition time is the write's", func(t *testing.T) {
		c := PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}})
		body, err := c.statusPatch(now)
		require.NoError(t, err)
		got := apply(t, body)
		assert.Equal(t, v1.ConditionTrue, got.Status.Conditions[0].Status)
		assert.True(t, now.Equal(&got.Status.Conditions[0].LastTransitionTime))
	})
	t.Run("new condition, given transition time kept", func(t *testing.T) {
		c := PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, LastTransitionTime: then}}})
		body, err := c.statusPatch(now)
		require.NoError(t, err)
		got := apply(t, body)
		require.Len(t, got.Status.Conditions, 3)
		assert.True(t, then.Equal(&got.Status.Conditions[2].LastTransitionTime))
	})
	t.Run("clearing the nomination, unconditionally", func(t *testing.T) {
		c := PatchStatus(pod, StatusPatch{NominatedNodeName: ptr(""), Unconditional: true})
		body, err := c.statusPatch(now)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"uid": "uid-p"}, precondition(t, body), "the UID fence stays")
		assert.Empty(t, apply(t, body).Status.NominatedNodeName)
	})
	t.Run("a pod without resourceVersion is fenced by its UID only", func(t *testing.T) {
		c := PatchStatus(newPod("q"), StatusPatch{NominatedNodeName: ptr("n2")})
		body, err := c.statusPatch(now)
		require.NoError(t, err)
		assert.JSONEq(t, `{"metadata":{"uid":"uid-q"},"status":{"nominatedNodeName":"n2"}}`, string(body))
	})
	t.Run("nothing to change: no patch", func(t *testing.T) {
		c := PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("n1")})
		body, err := c.statusPatch(now)
		require.NoError(t, err)
		assert.Nil(t, body)
	})
	t.Run("a deletion's condition is fenced by the UID only", func(t *testing.T) {
		c := Delete(pod, &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler})
		body, err := c.disruptionPatch(now)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"uid": "uid-p"}, precondition(t, body))
		assert.Len(t, apply(t, body).Status.Conditions, 3)
		plain := Delete(pod, nil)
		none, err := plain.disruptionPatch(now)
		require.NoError(t, err)
		assert.Nil(t, none)
	})
}

// TestRebase: a newer view of the pod becomes the call's baseline; if it
// shows the pod bound, a pending PodScheduled=False or nomination is stale
// (kubernetes#139602) and is dropped, and other conditions stay.
func TestRebase(t *testing.T) {
	pod := newPod("p")
	pod.ResourceVersion = "1"
	c := PatchStatus(pod, StatusPatch{
		Conditions:        []v1.PodCondition{unschedulable("no fit"), {Type: "example.com/Gate", Status: v1.ConditionTrue}},
		NominatedNodeName: ptr("n1"),
	})
	fresh := pod.DeepCopy()
	fresh.ResourceVersion = "2"
	r := c.rebase(baselineOf(fresh))
	assert.Equal(t, "2", r.rv)
	assert.Equal(t, c.conds, r.conds, "unbound: everything still stands")
	assert.True(t, r.setNNN)

	fresh.Spec.NodeName = "n1"
	r = c.rebase(baselineOf(fresh))
	assert.Equal(t, []v1.PodCondition{{Type: "example.com/Gate", Status: v1.ConditionTrue}}, r.conds)
	assert.False(t, r.setNNN)
	assert.Len(t, c.conds, 2, "the original call is untouched")
	assert.Equal(t, v1.PodScheduled, c.conds[0].Type)

	clear := PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("")}).rebase(baselineOf(fresh))
	assert.True(t, clear.setNNN, "clearing a nomination is never stale")

	b := Bind(pod, "n1").rebase(baselineOf(fresh))
	assert.True(t, isNoOp(&b), "a rebased binding sees the pod in place")
}

// TestStatusPatchBelowJSONPrecision: a status patch whose only change is
// below what the API keeps — a LastProbeTime that differs by less than a
// second, which JSON rounds away — sends nothing (upstream's patch helper
// sends no empty patch either) and ends Skipped, as a patch the no-op test
// finds changes nothing does; it sent a request with only its
// preconditions, which changed nothing, and ended Succeeded.
func TestStatusPatchBelowJSONPrecision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probed := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		cond := unschedulable("0/3 nodes")
		cond.LastProbeTime = probed
		pod := newPod("p")
		pod.Status.Conditions = []v1.PodCondition{cond}
		api := newFakeAPI(pod)
		d := newTestDispatcher(t, api, Options{})
		later := cond
		later.LastProbeTime = metav1.NewTime(probed.Add(500 * time.Millisecond))
		tk, err := d.Submit(context.Background(), PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{later}}), SubmitOptions{})
		require.NoError(t, err)
		assert.Equal(t, dispatch.StateSkipped, outcome(t, tk).State)
		assert.Zero(t, api.count("patch/status"), "nothing the API keeps would change")
	})
}

// TestMergeKeepsTheFence: a status patch built from a pod without a
// resourceVersion (one made by hand, not read from the API) that merges
// into a pending patch fenced by its pod's resourceVersion, or that
// SyncObject is given, does not strip the fence: StatusPatch.Unconditional
// promises that two merged patches are sent without the precondition only
// if both are Unconditional, for the other's fields may need it.
func TestMergeKeepsTheFence(t *testing.T) {
	fenced, bare := newPod("p"), newPod("p")
	fenced.ResourceVersion, bare.ResourceVersion = "7", ""
	sched := unschedulable("0/3 nodes")
	ready := v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse}
	got, err := merge(PatchStatus(fenced, StatusPatch{Conditions: []v1.PodCondition{sched}}).submitted(),
		PatchStatus(bare, StatusPatch{Conditions: []v1.PodCondition{ready}}).submitted())
	require.NoError(t, err)
	body, err := got.statusPatch(metav1.Now())
	require.NoError(t, err)
	assert.Contains(t, string(body), `"resourceVersion":"7"`, "merged: %s", body)

	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		d := newTestDispatcher(t, api, Options{})
		release := api.hold("create/binding", "p")
		bind := submit(t, d, Bind(api.pod("p"), "n1"))
		synctest.Wait() // in flight: the patch waits behind it
		patch := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{ready}}))
		unversioned := api.pod("p")
		unversioned.ResourceVersion = ""
		_, err := d.SyncObject(unversioned)
		require.NoError(t, err)
		release()
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, bind).State)
		outcome(t, patch)
		for _, r := range api.requests() {
			if r.kind() == "patch/status" {
				assert.Contains(t, r.Body, `"resourceVersion":`, "sent fenced")
			}
		}
	})
}
