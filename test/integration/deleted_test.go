package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// testDeletedWhileQueued is scenario 4: calls queue behind a rate limiter
// that grants nothing yet, their pods are deleted — or deleted and
// replaced by a new pod of the same name — and then the calls run.
//
// It proves what the adapter documents: a status patch or a binding whose
// pod is gone gets NotFound, which is permanent — it ends Failed after one
// attempt, with the NotFound in its error; a deletion whose pod is gone
// has succeeded, whether the pod is missing or its name holds another pod
// (the UID precondition keeps the newcomer alive); a status patch, a
// binding or a deletion's DisruptionTarget condition never lands on the
// newcomer: a status patch's metadata.uid is refused by the server (422,
// the UID is immutable), and a deletion whose condition patch is refused
// so ends there. Nothing retries on: every call is
// executed once and ends within callTimeout.
func testDeletedWhileQueued(t *testing.T, s *apiserver.Server) {
	ns := createNamespace(t, s.AdminClient, "gone")
	g := gate{open: make(chan struct{})}
	d := newDispatcher(t, s.Config, kube.Options{RateLimit: g})
	disruption := &corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}

	type tcase struct {
		name     string
		call     func(*corev1.Pod) kube.Call
		replace  bool // recreate the pod under its name after deleting it
		want     dispatch.State
		notFound bool     // the outcome's error is the server's NotFound
		writes   []string // "METHOD [subresource] STATUS" at the server, in order
	}
	cases := []tcase{
		{name: "status patch", call: func(p *corev1.Pod) kube.Call {
			return kube.PatchStatus(p, kube.StatusPatch{Conditions: []corev1.PodCondition{unschedulable("0/3 nodes are available")}})
		}, want: dispatch.StateFailed, notFound: true, writes: []string{"PATCH status 404"}},
		{name: "binding", call: func(p *corev1.Pod) kube.Call { return kube.Bind(p, "node-gone") },
			want: dispatch.StateFailed, notFound: true, writes: []string{"POST binding 404"}},
		{name: "deletion", call: func(p *corev1.Pod) kube.Call { return kube.Delete(p, nil) },
			want: dispatch.StateSucceeded, writes: []string{"DELETE 404"}},
		{name: "deletion with a condition", call: func(p *corev1.Pod) kube.Call { return kube.Delete(p, disruption) },
			want: dispatch.StateSucceeded, writes: []string{"PATCH status 404"}},
		{name: "status patch, pod replaced", replace: true, call: func(p *corev1.Pod) kube.Call {
			return kube.PatchStatus(p, kube.StatusPatch{Conditions: []corev1.PodCondition{unschedulable("0/3 nodes are available")}})
		}, want: dispatch.StateFailed, writes: []string{"PATCH status 409"}},
		{name: "binding, pod replaced", replace: true, call: func(p *corev1.Pod) kube.Call { return kube.Bind(p, "node-gone") },
			want: dispatch.StateFailed, writes: []string{"POST binding 409"}},
		{name: "deletion, pod replaced", replace: true, call: func(p *corev1.Pod) kube.Call { return kube.Delete(p, nil) },
			want: dispatch.StateSucceeded, writes: []string{"DELETE 409"}},
		{name: "deletion with a condition, pod replaced", replace: true, call: func(p *corev1.Pod) kube.Call { return kube.Delete(p, disruption) },
			want: dispatch.StateSucceeded, writes: []string{"PATCH status 422"}},
		{name: "unconditional status patch, pod replaced", replace: true, call: func(p *corev1.Pod) kube.Call {
			return kube.PatchStatus(p, kube.StatusPatch{Conditions: []corev1.PodCondition{unschedulable("0/3 nodes are available")}, Unconditional: true})
		}, want: dispatch.StateFailed, writes: []string{"PATCH status 422"}},
	}
	pods := make([]*corev1.Pod, len(cases))
	tickets := make([]*kube.Ticket, len(cases))
	for i, tc := range cases {
		pods[i] = createPods(t, s.AdminClient, ns, fmt.Sprintf("case%d", i), 1)[0]
		var err error
		tickets[i], err = d.Submit(t.Context(), tc.call(pods[i]), kube.SubmitOptions{})
		require.NoError(t, err, tc.name)
	}
	// Every call is queued, none has run.
	st := d.Stats()
	require.Zero(t, st.Executions)
	require.Equal(t, len(cases), st.Ready+st.InFlight)

	for i, tc := range cases {
		deletePod(t, s, ns, pods[i].Name)
		if tc.replace {
			_, err := s.AdminClient.CoreV1().Pods(ns).Create(t.Context(), newPod(pods[i].Name), metav1.CreateOptions{})
			require.NoError(t, err)
		}
	}
	opened := time.Now()
	close(g.open)

	var last time.Duration
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := wait(t, tickets[i])
			last = max(last, time.Since(opened))
			assert.Equal(t, tc.want, res.State, "outcome: %v", res.Err)
			assert.Equal(t, 1, res.Attempts, "executions")
			if tc.notFound {
				assert.True(t, apierrors.IsNotFound(res.Err), "error %v, want NotFound", res.Err)
			}
			var writes []string
			for _, r := range s.Proxy.PodWrites(ns, pods[i].Name) {
				writes = append(writes, strings.Join(strings.Fields(fmt.Sprintf("%s %s %d", r.Method, r.Subresource, r.Status)), " "))
			}
			assert.Equal(t, tc.writes, writes, "writes at the server")
			if tc.replace {
				// The newcomer is untouched: alive, unbound, not reported.
				p := getPod(t, s, ns, pods[i].Name)
				assert.NotEqual(t, pods[i].UID, p.UID)
				assert.Empty(t, p.Spec.NodeName, "newcomer bound")
				assert.Nil(t, condition(p, corev1.PodScheduled), "newcomer patched")
				assert.Nil(t, condition(p, corev1.DisruptionTarget), "newcomer marked for disruption")
			} else {
				_, err := s.AdminClient.CoreV1().Pods(ns).Get(t.Context(), pods[i].Name, metav1.GetOptions{})
				assert.True(t, apierrors.IsNotFound(err), "pod recreated: %v", err)
			}
		})
	}
	assert.Equal(t, uint64(len(cases)), d.Stats().Executions, "one execution per call: nothing retried")
	t.Logf("scenario 4: %d calls on deleted or replaced pods all ended %v after the rate limiter opened", len(cases), last.Round(time.Millisecond))
}

// gate is a rate limiter that grants no token until open is closed, then
// every token at once: calls queue behind it as behind a rate limit in a
// storm, for as long as the test needs.
type gate struct{ open chan struct{} }

func (g gate) Wait(ctx context.Context) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
