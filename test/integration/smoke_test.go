package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"

	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// TestAPIServerSmoke checks the test stack end to end and logs, for each
// failure the dispatcher will have to classify, the error value client-go
// returns: run with -v to read them.
func TestAPIServerSmoke(t *testing.T) {
	s := apiserver.Start(t)
	ctx := t.Context()
	ns := createNamespace(t, s.Client, "smoke")

	t.Run("bind", func(t *testing.T) {
		pod := createPod(t, s.Client, ns, "bound")
		if err := bind(ctx, s.Client, ns, pod, "node-a"); err != nil {
			t.Fatalf("bind: %v", err)
		}
		if got := nodeName(t, s.AdminClient, ns, pod); got != "node-a" {
			t.Fatalf("spec.nodeName = %q, want node-a", got)
		}
		if got := s.Proxy.PodWrites(ns, pod); len(got) != 1 || got[0].Subresource != "binding" || got[0].Status != http.StatusCreated {
			t.Fatalf("recorded writes = %v, want one binding answered 201", got)
		}
	})

	// A binding the apiserver carries out, whose answer the client never
	// gets; then the retry the client would make.
	for _, tc := range []struct {
		proto string
		mode  apiserver.DropMode
	}{
		{"h2", apiserver.AbortRequest},
		{"h2", apiserver.ResetConnection},
		{"http/1.1", apiserver.AbortRequest},
		{"http/1.1", apiserver.ResetConnection},
	} {
		t.Run("lost response/"+tc.proto+"/"+tc.mode.String(), func(t *testing.T) {
			client := s.Client
			if tc.proto == "http/1.1" {
				cfg := *s.Config
				cfg.TLSClientConfig.NextProtos = []string{"http/1.1"}
				client = kubernetes.NewForConfigOrDie(&cfg)
			}
			name := "lost-" + strings.NewReplacer("/", "", ".", "").Replace(tc.proto) + "-" + strings.ToLower(tc.mode.String())
			pod := createPod(t, client, ns, name)
			s.Proxy.DropResponses(apiserver.MatchBinding(ns, pod), 1, tc.mode)

			err := bind(ctx, client, ns, pod, "node-a")
			t.Logf("lost response (%s, %s): %s", tc.proto, tc.mode, describe(err))
			if err == nil {
				t.Fatal("bind through a dropped response succeeded")
			}
			var status apierrors.APIStatus
			if errors.As(err, &status) {
				t.Fatalf("bind error carries an API status: %v", err)
			}
			if got := nodeName(t, s.AdminClient, ns, pod); got != "node-a" {
				t.Fatalf("after the lost response spec.nodeName = %q, want node-a: the apiserver did not bind", got)
			}

			err = bind(ctx, client, ns, pod, "node-a")
			t.Logf("second binding (%s, %s): %s", tc.proto, tc.mode, describe(err))
			if !apierrors.IsConflict(err) {
				t.Fatalf("second bind: got %v, want Conflict", err)
			}

			writes := s.Proxy.PodWrites(ns, pod)
			if len(writes) != 2 ||
				writes[0].Status != http.StatusCreated || !writes[0].Dropped ||
				writes[1].Status != http.StatusConflict || writes[1].Dropped {
				t.Fatalf("recorded writes = %v, want 201 (dropped) then 409", writes)
			}
		})
	}

	t.Run("patch deleted pod", func(t *testing.T) {
		pod := createPod(t, s.Client, ns, "deleted")
		zero := int64(0)
		if err := s.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatalf("delete: %v", err)
		}
		_, err := s.Client.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType,
			[]byte(`{"metadata":{"labels":{"dispatch":"x"}}}`), metav1.PatchOptions{})
		t.Logf("patch of a deleted pod: %s", describe(err))
		if !apierrors.IsNotFound(err) {
			t.Fatalf("got %v, want NotFound", err)
		}
		_, err = s.Client.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType,
			[]byte(`{"status":{"message":"x"}}`), metav1.PatchOptions{}, "status")
		t.Logf("status patch of a deleted pod: %s", describe(err))
		if !apierrors.IsNotFound(err) {
			t.Fatalf("got %v, want NotFound", err)
		}
	})

	t.Run("stale resourceVersion", func(t *testing.T) {
		pod := createPod(t, s.Client, ns, "stale")
		old, err := s.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		patch := func(rv, msg string) error {
			body := fmt.Sprintf(`{"metadata":{"resourceVersion":%q},"status":{"message":%q}}`, rv, msg)
			_, err := s.Client.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status")
			return err
		}
		if err := patch(old.ResourceVersion, "first"); err != nil {
			t.Fatalf("status patch at the current resourceVersion: %v", err)
		}
		err = patch(old.ResourceVersion, "second")
		t.Logf("status patch with a stale resourceVersion: %s", describe(err))
		if !apierrors.IsConflict(err) {
			t.Fatalf("got %v, want Conflict", err)
		}
	})

	t.Run("throttling", func(t *testing.T) {
		testThrottling(t, apiserver.Start(t, apiserver.WithEtcd(s.Etcd), apiserver.WithInflightLimits(1, 1)))
	})
}

// testThrottling fires bounded rounds of concurrent requests at a server with
// inflight limits of 1 until the apiserver refuses one with 429, first with
// client-go's retries off, then with a clientset's defaults.
func testThrottling(t *testing.T, s *apiserver.Server) {
	ctx := t.Context()
	ns := createNamespace(t, s.AdminClient, "throttle")
	const (
		workers = 16
		rounds  = 200
	)
	rest := s.Client.CoreV1().RESTClient()

	for _, kind := range []string{"read", "mutating"} {
		var first error
		for round := 0; round < rounds && first == nil; round++ {
			errs := make([]error, workers)
			var wg sync.WaitGroup
			for i := range workers {
				wg.Go(func() {
					if kind == "read" {
						errs[i] = rest.Get().Namespace(ns).Resource("pods").MaxRetries(0).Do(ctx).Error()
						return
					}
					cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "cm-"}}
					errs[i] = rest.Post().Namespace(ns).Resource("configmaps").Body(cm).MaxRetries(0).Do(ctx).Error()
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil && !apierrors.IsTooManyRequests(err) {
					t.Fatalf("%s request: %v", kind, err)
				}
				if first == nil {
					first = err
				}
			}
		}
		if first == nil {
			t.Fatalf("no %s request got 429 in %d rounds of %d", kind, rounds, workers)
		}
		t.Logf("429 on a %s request, no client retries: %s", kind, describe(first))
	}

	// A clientset retries a 429 that carries Retry-After up to 10 times,
	// waiting as told: the caller sees the cost as latency, and a 429 only
	// once the retries are spent.
	s.Proxy.Reset()
	var slowest atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		wg.Go(func() {
			began := time.Now()
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "typed-"}}
			_, errs[i] = s.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			d := int64(time.Since(began))
			for {
				cur := slowest.Load()
				if d <= cur || slowest.CompareAndSwap(cur, d) {
					break
				}
			}
		})
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			t.Logf("typed create under throttling failed: %s", describe(err))
		}
	}
	throttled := s.Proxy.Count(func(r apiserver.Request) bool { return r.Status == http.StatusTooManyRequests })
	t.Logf("typed clientset, %d concurrent creates: %d answered 429 at the proxy, %d failed at the client, slowest call %v",
		workers, throttled, failed, time.Duration(slowest.Load()).Round(time.Millisecond))
}

func createNamespace(t *testing.T, c kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := c.CoreV1().Namespaces().Create(t.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

func createPod(t *testing.T, c kubernetes.Interface, ns, name string) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1"}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return name
}

func bind(ctx context.Context, c kubernetes.Interface, ns, pod, node string) error {
	return c.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
}

func nodeName(t *testing.T, c kubernetes.Interface, ns, pod string) string {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s/%s: %v", ns, pod, err)
	}
	return p.Spec.NodeName
}

// describe spells out what a caller can learn from err: its type and
// wrapping chain, the API status if any, and the usual transport checks.
func describe(err error) string {
	if err == nil {
		return "<nil>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%T: %q\n", err, err.Error())
	b.WriteString("  chain:")
	for e := err; e != nil; e = errors.Unwrap(e) {
		fmt.Fprintf(&b, " %T", e)
	}
	b.WriteString("\n")
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		st := status.Status()
		fmt.Fprintf(&b, "  status: code=%d reason=%q message=%q", st.Code, st.Reason, st.Message)
		if d := st.Details; d != nil {
			fmt.Fprintf(&b, " details={name=%q group=%q kind=%q causes=%v retryAfterSeconds=%d}",
				d.Name, d.Group, d.Kind, d.Causes, d.RetryAfterSeconds)
		}
		b.WriteString("\n")
	}
	delay, suggests := apierrors.SuggestsClientDelay(err)
	fmt.Fprintf(&b, "  apierrors: ReasonForError=%q IsConflict=%v IsAlreadyExists=%v IsNotFound=%v IsTooManyRequests=%v SuggestsClientDelay=(%d, %v) IsUnexpectedServerError=%v\n",
		apierrors.ReasonForError(err), apierrors.IsConflict(err), apierrors.IsAlreadyExists(err),
		apierrors.IsNotFound(err), apierrors.IsTooManyRequests(err), delay, suggests,
		apierrors.IsUnexpectedServerError(err))
	var se http2.StreamError
	fmt.Fprintf(&b, "  transport: utilnet.IsConnectionReset=%v IsProbableEOF=%v IsHTTP2ConnectionLost=%v errors.Is(io.EOF)=%v errors.Is(io.ErrUnexpectedEOF)=%v errors.Is(ECONNRESET)=%v http2.StreamError=%v",
		utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err), utilnet.IsHTTP2ConnectionLost(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.As(err, &se))
	if errors.As(err, &se) {
		fmt.Fprintf(&b, " (code=%v)", se.Code)
	}
	return b.String()
}
