package integration

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// TestScenarios runs the kube adapter against a real kube-apiserver and
// etcd: the scenarios that no fake can settle, because they
// depend on what the server really does — pods/binding's 409, a
// resourceVersion precondition, a pod gone under a queued call, responses
// lost after the write happened, throttling with Retry-After.
//
// The subtests share one apiserver, each in a namespace of its own, and
// each builds its own dispatcher; the throttling scenario starts a second
// apiserver with tight inflight limits on the same etcd. Every assertion is
// about what reached the server — counted at the proxy in front of it and
// read back through the admin client — and about order, never about wall
// time.
func TestScenarios(t *testing.T) {
	s := apiserver.Start(t)
	t.Run("1 binds during a status-patch storm", func(t *testing.T) { testBindStorm(t, s) })
	t.Run("2 lost binding response", func(t *testing.T) { testLostBinding(t, s) })
	t.Run("3 stale status patch after a bind", func(t *testing.T) { testStalePatch(t, s) })
	t.Run("4 pod deleted while its call is queued", func(t *testing.T) { testDeletedWhileQueued(t, s) })
	t.Run("5 server throttling", func(t *testing.T) {
		testThrottled(t, apiserver.Start(t, apiserver.WithEtcd(s.Etcd), apiserver.WithInflightLimits(4, 2)))
	})
}

// callTimeout bounds every wait for an outcome: a call that has not ended by
// then is a bug (a retry loop, a lost outcome), not a slow machine.
const callTimeout = 30 * time.Second

// newDispatcher returns the preset dispatcher configured by o, with a
// clientset of its own made from cfg as the adapter asks (kube.RESTConfig:
// no client-side token bucket, the dispatcher limits the rate). It is
// closed when the test ends.
func newDispatcher(t *testing.T, cfg *rest.Config, o kube.Options) *kube.Dispatcher {
	t.Helper()
	cs, err := kubernetes.NewForConfig(kube.RESTConfig(cfg))
	require.NoError(t, err)
	d, err := kube.NewDispatcher(cs, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d
}

// createPods creates n pods named prefix-0 … prefix-(n-1) in ns with c,
// a few at a time, and returns them as the server answered: with UID and
// resourceVersion, as an informer would show them.
func createPods(t *testing.T, c kubernetes.Interface, ns, prefix string, n int) []*corev1.Pod {
	t.Helper()
	pods := make([]*corev1.Pod, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	const parallel = 8
	for w := range parallel {
		wg.Go(func() {
			for i := w; i < n; i += parallel {
				pods[i], errs[i] = c.CoreV1().Pods(ns).Create(t.Context(), newPod(fmt.Sprintf("%s-%d", prefix, i)), metav1.CreateOptions{})
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "create pod %s-%d", prefix, i)
	}
	return pods
}

func newPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1"}},
		},
	}
}

// getPod reads the pod back from the server, as the admin.
func getPod(t *testing.T, s *apiserver.Server, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := s.AdminClient.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	require.NoError(t, err, "get pod %s/%s", ns, name)
	return p
}

// deletePod deletes the pod at once, as the admin.
func deletePod(t *testing.T, s *apiserver.Server, ns, name string) {
	t.Helper()
	zero := int64(0)
	require.NoError(t, s.AdminClient.CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
}

// wait returns the submission's outcome, failing the test if it takes
// longer than callTimeout.
func wait(t *testing.T, tk *kube.Ticket) kube.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	res, err := tk.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatalf("no outcome within %v: %v", callTimeout, err)
	}
	return res
}

// unschedulable is the condition kube-scheduler reports for a pod it could
// not place.
func unschedulable(msg string) corev1.PodCondition {
	return corev1.PodCondition{
		Type:    corev1.PodScheduled,
		Status:  corev1.ConditionFalse,
		Reason:  corev1.PodReasonUnschedulable,
		Message: msg,
	}
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// Matchers over the proxy's log, for one namespace.

func inNamespace(ns string) apiserver.Match {
	return func(r apiserver.Request) bool { return r.Namespace == ns }
}

func isStatusPatch(r apiserver.Request) bool {
	return r.Method == http.MethodPatch && r.Resource == "pods" && r.Subresource == "status"
}

func isBinding(r apiserver.Request) bool {
	return r.Method == http.MethodPost && r.Resource == "pods" && r.Subresource == "binding"
}

func isPodGet(ns, pod string) apiserver.Match {
	return func(r apiserver.Request) bool {
		return r.Method == http.MethodGet && r.Resource == "pods" && r.Subresource == "" && r.Namespace == ns && r.Name == pod
	}
}

// statuses lists the HTTP statuses of reqs, with a * for a response the
// proxy withheld, for assertions and failure messages.
func statuses(reqs []apiserver.Request) []string {
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = fmt.Sprint(r.Status)
		if r.Dropped {
			out[i] += "*"
		}
	}
	return out
}
