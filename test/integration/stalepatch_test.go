package integration

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// testStalePatch is scenario 3, kubernetes#139602: a PodScheduled=False
// status patch computed from the pod as it was before its binding — with
// that view's resourceVersion — is submitted after the binding has landed.
// The server refuses it (409: the resourceVersion precondition fails); the
// adapter reads the pod back, finds it bound and drops the stale condition.
// A patch that had nothing else to say ends Skipped; one that also set
// another condition sends that alone, at the fresh resourceVersion.
//
// It proves: the first status write is answered 409; nothing makes
// PodScheduled False afterwards (the binding's PodScheduled=True stays);
// spec.nodeName stays; the patch's other fields still land.
func testStalePatch(t *testing.T, s *apiserver.Server) {
	const node = "node-stale"
	ns := createNamespace(t, s.AdminClient, "stale")
	d := newDispatcher(t, s.Config, kube.Options{})
	reported := corev1.PodCondition{Type: "example.com/Reported", Status: corev1.ConditionTrue, Reason: "Test"}
	for i, tc := range []struct {
		name  string
		conds []corev1.PodCondition
		want  dispatch.State
		codes []string // status writes at the server
	}{
		{"PodScheduled=False only", []corev1.PodCondition{unschedulable("0/3 nodes are available")}, dispatch.StateSkipped, []string{"409"}},
		{"PodScheduled=False and another condition", []corev1.PodCondition{unschedulable("0/3 nodes are available"), reported}, dispatch.StateSucceeded, []string{"409", "200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := createPods(t, s.AdminClient, ns, fmt.Sprintf("case%d", i), 1)[0]
			tk, err := d.Submit(t.Context(), kube.Bind(before, node), kube.SubmitOptions{})
			require.NoError(t, err)
			res := wait(t, tk)
			require.Equal(t, dispatch.StateSucceeded, res.State, "binding: %v", res.Err)

			// The stale view: the pod as it was before the binding.
			tk, err = d.Submit(t.Context(), kube.PatchStatus(before, kube.StatusPatch{Conditions: tc.conds}), kube.SubmitOptions{})
			require.NoError(t, err)
			res = wait(t, tk)
			assert.Equal(t, tc.want, res.State, "stale patch: %v", res.Err)

			writes := s.Proxy.Filter(func(r apiserver.Request) bool {
				return isStatusPatch(r) && r.Namespace == ns && r.Name == before.Name
			})
			assert.Equal(t, tc.codes, statuses(writes), "status writes at the server")
			if len(writes) > 0 {
				assert.Equal(t, http.StatusConflict, writes[0].Status, "the stale patch reached the server and was refused")
			}

			after := getPod(t, s, ns, before.Name)
			assert.Equal(t, node, after.Spec.NodeName, "the binding stays")
			if c := condition(after, corev1.PodScheduled); assert.NotNil(t, c, "PodScheduled") {
				assert.NotEqual(t, corev1.ConditionFalse, c.Status, "PodScheduled overwritten: %+v", *c)
			}
			if len(tc.conds) > 1 {
				if c := condition(after, reported.Type); assert.NotNil(t, c, "the patch's other condition did not land") {
					assert.Equal(t, corev1.ConditionTrue, c.Status)
				}
			}
		})
	}
}
