package kube

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

// logLines captures a logger's lines, each with its verbosity ("level"=n)
// or its error.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

// logger returns a logger that keeps lines up to verbosity v.
func (l *logLines) logger(v int) klog.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: v})
}

// take returns the lines logged since the last take.
func (l *logLines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// TestLogging: the dispatcher logs each event at kube-scheduler's
// verbosity for it — a write sent at 3, a call not sent at 5, a deletion
// whose pod is gone at 2, a status patch that failed as an error — and
// nothing above the logger's verbosity.
func TestLogging(t *testing.T) {
	disruption := &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}
	cases := []struct {
		name  string
		fault fault
		call  func(api *fakeAPI) Call
		want  []string // each line's start, in order
	}{
		{"binding", nil, func(api *fakeAPI) Call { return Bind(api.pod("p"), "n1") }, []string{
			`"level"=3 "msg"="Binding pod to node" "pod"={"name"="p" "namespace"="default"} "node"="n1"`,
		}},
		{"binding with nothing to do", nil, func(api *fakeAPI) Call {
			return Bind(api.change("p", func(p *v1.Pod) { p.Spec.NodeName = "n1" }), "n1")
		}, []string{
			`"level"=5 "msg"="Call has no effect; not sent" "pod"={"name"="p" "namespace"="default"} "callType"="pod_binding"`,
		}},
		{"status patch", nil, func(api *fakeAPI) Call {
			return PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/1 nodes")}, NominatedNodeName: ptr("n2")})
		}, []string{
			`"level"=3 "msg"="Setting pod condition" "pod"={"name"="p" "namespace"="default"} "type"="PodScheduled" "status"="False" "reason"="Unschedulable"`,
			`"level"=3 "msg"="Setting pod's nominated node" "pod"={"name"="p" "namespace"="default"} "nominatedNodeName"="n2"`,
		}},
		{"status patch with nothing to do", nil, func(api *fakeAPI) Call {
			return PatchStatus(api.pod("p"), StatusPatch{NominatedNodeName: ptr("")})
		}, []string{
			`"level"=5 "msg"="Call has no effect; not sent" "pod"={"name"="p" "namespace"="default"} "callType"="pod_status_patch"`,
		}},
		{"status patch that fails", func(r request) (bool, error) {
			return false, apierrors.NewForbidden(podsResource, r.Name, errors.New("RBAC"))
		}, func(api *fakeAPI) Call {
			return PatchStatus(api.pod("p"), StatusPatch{NominatedNodeName: ptr("n2")})
		}, []string{
			`"level"=3 "msg"="Setting pod's nominated node"`,
			`"msg"="Status patch failed" "error"="dispatch: failed after 1 attempt(s) (permanent): pods \"p\" is forbidden: RBAC" "pod"={"name"="p" "namespace"="default"} "attempts"=1`,
		}},
		{"deletion with a condition", nil, func(api *fakeAPI) Call { return Delete(api.pod("p"), disruption) }, []string{
			`"level"=3 "msg"="Setting pod condition" "pod"={"name"="p" "namespace"="default"} "type"="DisruptionTarget" "status"="True" "reason"="PreemptionByScheduler"`,
			`"level"=3 "msg"="Deleting pod" "pod"={"name"="p" "namespace"="default"} "uid"="uid-p"`,
		}},
		{"deletion of a pod already gone", func(r request) (bool, error) {
			return false, apierrors.NewNotFound(podsResource, r.Name)
		}, func(api *fakeAPI) Call { return Delete(api.pod("p"), nil) }, []string{
			`"level"=3 "msg"="Deleting pod"`,
			`"level"=2 "msg"="Pod to delete is already gone" "pod"={"name"="p" "namespace"="default"} "uid"="uid-p"`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, v := range []int{5, 2} {
				var l logLines
				api := newFakeAPI(newPod("p"))
				api.setFault(c.fault)
				d := newTestDispatcher(t, api, Options{Logger: l.logger(v), Retry: dispatch.RetryPolicy{MaxAttempts: 1}})
				r := outcome(t, submit(t, d, c.call(api)))
				closeD(t, d)
				var want []string
				for _, w := range c.want {
					if !strings.HasPrefix(w, `"level"=`) || w[len(`"level"=`)]-'0' <= byte(v) {
						want = append(want, w)
					}
				}
				got := l.take()
				if assert.Len(t, got, len(want), "-v=%d, outcome %v: %q", v, r.State, got) {
					for i := range want {
						assert.True(t, strings.HasPrefix(got[i], want[i]), "-v=%d line %d:\n got %s\nwant %s…", v, i, got[i], want[i])
					}
				}
			}
		})
	}
}

// TestLoggerDefault: with no Logger, the dispatcher logs through klog's
// (klog.Background).
func TestLoggerDefault(t *testing.T) {
	var l logLines
	klog.SetLoggerWithOptions(l.logger(3), klog.ContextualLogger(true))
	t.Cleanup(klog.ClearLogger)
	api := newFakeAPI(newPod("p"))
	d, err := NewDispatcher(api.client(), Options{}) // newTestDispatcher would give it the test's logger
	require.NoError(t, err)
	t.Cleanup(func() { closeD(t, d) })
	require.Equal(t, dispatch.StateSucceeded, outcome(t, submit(t, d, Bind(api.pod("p"), "n1"))).State)
	got := l.take()
	require.Len(t, got, 1)
	assert.Contains(t, got[0], `"msg"="Binding pod to node"`)
}

// TestOnDoneSurvivesAPanickingLogger: the preset logs a status patch that
// failed for good before it calls Options.OnDone; a Logger whose sink
// panics there does not cost the user's hook its call — OnDone fires once
// per finished call, whatever the log does.
func TestOnDoneSurvivesAPanickingLogger(t *testing.T) {
	api := newFakeAPI() // the pod does not exist: the patch fails for good
	var mu sync.Mutex
	var done []dispatch.State
	d, err := NewDispatcher(api.client(), Options{
		Logger: funcr.New(func(_, args string) {
			if strings.Contains(args, "Status patch failed") {
				panic("log sink failed")
			}
		}, funcr.Options{}),
		OnDone: func(r Result) { mu.Lock(); done = append(done, r.State); mu.Unlock() },
	})
	require.NoError(t, err)
	tk, err := d.Submit(t.Context(), PatchStatus(newPod("p"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes")}}), SubmitOptions{})
	require.NoError(t, err)
	r, _ := tk.Wait(t.Context())
	assert.Equal(t, dispatch.StateFailed, r.State)
	require.NoError(t, d.Close(t.Context()))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []dispatch.State{dispatch.StateFailed}, done, "OnDone was called once")
}
