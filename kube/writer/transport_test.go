package writer_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// wire is an API server for one Deployment, default/web, served in memory
// (no sockets, so that it runs in a synctest bubble) to client-go's real
// clients: each request is answered by the next fault queued for its
// method and path, else as a server would, minimally.
type wire struct {
	mu     sync.Mutex
	obj    *appsv1.Deployment
	faults map[string][]func(http.ResponseWriter) error // "GET", "PUT /status", "PATCH"
	seen   []string
}

func newWire() *wire {
	return &wire{
		obj: &appsv1.Deployment{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1", ResourceVersion: "1"},
		},
		faults: map[string][]func(http.ResponseWriter) error{},
	}
}

func (s *wire) fail(key string, f func(http.ResponseWriter) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[key] = append(s.faults[key], f)
}

func (s *wire) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

func (s *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Method
	if strings.HasSuffix(r.URL.Path, "/status") {
		key += " /status"
	}
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
	}
	rec := httptest.NewRecorder()
	s.mu.Lock()
	s.seen = append(s.seen, key)
	var f func(http.ResponseWriter) error
	if q := s.faults[key]; len(q) > 0 {
		f, s.faults[key] = q[0], q[1:]
	}
	if f == nil && r.Method != http.MethodGet { // a write: a new resourceVersion
		rv, _ := strconv.Atoi(s.obj.ResourceVersion)
		s.obj.ResourceVersion = strconv.Itoa(rv + 1)
	}
	body, _ := json.Marshal(s.obj)
	s.mu.Unlock()
	if f != nil {
		if err := f(rec); err != nil {
			return nil, err
		}
	} else {
		rec.Header().Set("Content-Type", "application/json")
		_, _ = rec.Write(body)
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

func (s *wire) config() *rest.Config {
	return writer.RESTConfig(&rest.Config{Host: "http://apiserver.invalid", Transport: s})
}

func connReset(http.ResponseWriter) error { return syscall.ECONNRESET }

// wireTyped is the writer's adapter of client-go's typed client over s.
func wireTyped(t *testing.T, s *wire) writer.Client[deploy] {
	cs, err := kubernetes.NewForConfig(s.config())
	require.NoError(t, err)
	return writer.Typed(func(ns string) writer.TypedClient[deploy] { return cs.AppsV1().Deployments(ns) })
}

// A broken connection under the writer's read is retried by the writer, in
// its queue: client-go does not resend it asleep in the worker.
func TestBrokenReadRetriedInTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newWire()
		s.fail("GET", connReset)
		w, err := writer.New(wireTyped(t, s), writer.Options[deploy]{})
		require.NoError(t, err)
		defer w.Close(t.Context())
		given := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1"}} // no resourceVersion: read first
		tk, err := w.Submit(t.Context(), given, status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		t.Log(s.requests(), res.Attempts, w.Stats().Reads)
		assert.Equal(t, dispatch.StateSucceeded, res.State)
		assert.Equal(t, 2, res.Attempts, "the writer retried the read")
		assert.Equal(t, uint64(2), w.Stats().Reads, "each read sent is the writer's")
		assert.Equal(t, []string{"GET", "GET", "PUT /status"}, s.requests())

		// A connection that stays broken: the writer's attempts, each one
		// read, and the outcome's error is the transport's.
		s = newWire()
		for range 3 {
			s.fail("GET", connReset)
		}
		w2, err := writer.New(wireTyped(t, s), writer.Options[deploy]{Retry: dispatch.RetryPolicy{MaxAttempts: 3}})
		require.NoError(t, err)
		defer w2.Close(t.Context())
		tk, err = w2.Submit(t.Context(), given, status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err = tk.Wait(t.Context())
		require.ErrorIs(t, err, syscall.ECONNRESET)
		var ue *url.Error
		require.ErrorAs(t, err, &ue)
		assert.Contains(t, err.Error(), "connection reset by peer")
		assert.Equal(t, dispatch.StateFailed, res.State)
		assert.Equal(t, 3, res.Attempts)
		assert.Equal(t, []string{"GET", "GET", "GET"}, s.requests())

		// Through a config RESTConfig made twice: the same.
		s = newWire()
		for range 3 {
			s.fail("GET", connReset)
		}
		cs, err := kubernetes.NewForConfig(writer.RESTConfig(s.config()))
		require.NoError(t, err)
		twice := writer.Typed(func(ns string) writer.TypedClient[deploy] { return cs.AppsV1().Deployments(ns) })
		w3, err := writer.New(twice, writer.Options[deploy]{Retry: dispatch.RetryPolicy{MaxAttempts: 3}})
		require.NoError(t, err)
		defer w3.Close(t.Context())
		tk, err = w3.Submit(t.Context(), given, status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err = tk.Wait(t.Context())
		require.ErrorIs(t, err, syscall.ECONNRESET)
		assert.Equal(t, 3, res.Attempts)
		assert.Equal(t, []string{"GET", "GET", "GET"}, s.requests())
	})
}

func statusAnswer(code int, reason metav1.StatusReason, details *metav1.StatusDetails) func(http.ResponseWriter) error {
	return func(w http.ResponseWriter) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		return json.NewEncoder(w).Encode(metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Details: details, Message: string(reason),
		})
	}
}

func wireDynamic(t *testing.T, s *wire) writer.Client[*unstructured.Unstructured] {
	dc, err := dynamic.NewForConfig(s.config())
	require.NoError(t, err)
	return writer.Dynamic(dc.Resource(deploymentsGVR))
}

// A status written to a resource with no status subresource — a custom
// resource whose definition declares none — is answered 404 naming the
// object, as its deletion would be (apiextensions-apiserver's
// crdHandler): the object is there, so the write fails saying why, not
// ErrGone, and is not retried.
func TestStatusOfAResourceWithoutTheSubresource(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newWire()
				notFound := statusAnswer(http.StatusNotFound, metav1.StatusReasonNotFound, &metav1.StatusDetails{Name: "web", Group: "apps", Kind: "deployments"})
				s.fail("PUT /status", notFound)
				s.fail("PATCH /status", notFound)
				w, err := writer.New(wireDynamic(t, s), writer.Options[*unstructured.Unstructured]{Mode: mode})
				require.NoError(t, err)
				defer w.Close(t.Context())
				given := &unstructured.Unstructured{}
				given.SetAPIVersion("apps/v1")
				given.SetKind("Deployment")
				given.SetNamespace("default")
				given.SetName("web")
				given.SetUID("uid-1")
				given.SetResourceVersion("1")
				tk, err := w.Submit(t.Context(), given, writer.Desire[*unstructured.Unstructured]{Status: func(u *unstructured.Unstructured) error {
					return unstructured.SetNestedField(u.Object, "Ready", "status", "phase")
				}}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				t.Log(err, s.requests())
				assert.Equal(t, dispatch.StateFailed, res.State)
				assert.NotErrorIs(t, err, writer.ErrGone, "the object is there")
				assert.False(t, apierrors.IsNotFound(err), "not to be ignored as a deleted object's")
				assert.ErrorContains(t, err, "no status subresource")
				assert.Equal(t, 1, res.Attempts)
				assert.Zero(t, w.Stats().Gone)

				// The object deleted: the read says so.
				s.fail("PUT /status", notFound)
				s.fail("PATCH /status", notFound)
				s.fail("GET", notFound)
				tk, err = w.Submit(t.Context(), given, writer.Desire[*unstructured.Unstructured]{Status: func(u *unstructured.Unstructured) error {
					return unstructured.SetNestedField(u.Object, "Gone", "status", "phase")
				}}, writer.SetOptions{})
				require.NoError(t, err)
				res, err = tk.Wait(t.Context())
				assert.Equal(t, dispatch.StateFailed, res.State)
				assert.ErrorIs(t, err, writer.ErrGone)
				assert.True(t, apierrors.IsNotFound(err))
				assert.Equal(t, uint64(1), w.Stats().Gone)
			})
		})
	}
}

// Typed and Dynamic given nothing give a nil Client, which New refuses,
// instead of one that panics in every write.
func TestNilAdaptersRefused(t *testing.T) {
	_, err := writer.New(writer.Typed[deploy](nil), writer.Options[deploy]{})
	assert.ErrorContains(t, err, "client is nil")
	_, err = writer.New(writer.Dynamic(nil), writer.Options[*unstructured.Unstructured]{})
	assert.ErrorContains(t, err, "client is nil")
}

// A ModePatch patch refused 422 by an admission webhook — its own message,
// no field causes — is final, as in the other modes: only the apiserver's
// answer to a failed JSON patch test (a 422 of its generic message) is
// re-read and patched again.
func TestPatchRefusedByAWebhookIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newWire()
		denied := func(w http.ResponseWriter) error {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			return json.NewEncoder(w).Encode(metav1.Status{
				TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status:   metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
				Message: `admission webhook "replicas.example.com" denied the request: replicas must be odd`,
			})
		}
		for range 10 {
			s.fail("PATCH /status", denied)
		}
		w, err := writer.New(wireTyped(t, s), writer.Options[deploy]{Mode: writer.ModePatch})
		require.NoError(t, err)
		defer w.Close(t.Context())
		given := deployment("web")
		given.UID, given.ResourceVersion = "uid-1", "1"
		tk, err := w.Submit(t.Context(), given, status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		assert.Equal(t, dispatch.StateFailed, res.State)
		assert.True(t, apierrors.IsInvalid(err), "%v", err)
		assert.ErrorContains(t, err, "replicas must be odd")
		assert.Equal(t, 1, res.Attempts)
		assert.Equal(t, []string{"PATCH /status"}, s.requests())
		assert.Zero(t, w.Stats().Conflicts)

		// The apiserver's answer to a failed test is still re-read.
		s = newWire()
		s.fail("PATCH /status", func(w http.ResponseWriter) error {
			e := apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", "testing value /status/replicas failed", 0, false)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			st := e.ErrStatus
			st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
			return json.NewEncoder(w).Encode(st)
		})
		w2, err := writer.New(wireTyped(t, s), writer.Options[deploy]{Mode: writer.ModePatch})
		require.NoError(t, err)
		defer w2.Close(t.Context())
		tk, err = w2.Submit(t.Context(), given, status(replicas(2)), writer.SetOptions{})
		require.NoError(t, err)
		res, err = tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Attempts)
		assert.Equal(t, []string{"PATCH /status", "GET", "PATCH /status"}, s.requests())
	})
}

// gadget is a custom resource's Go type, in no scheme the writer knows.
type gadget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            struct {
		Phase string `json:"phase,omitempty"`
	} `json:"status,omitempty"`
}

func (g *gadget) DeepCopyObject() runtime.Object {
	c := *g
	g.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

type gadgets struct{ writer.TypedClient[*gadget] }

// An apply of a typed object whose kind the writer cannot tell — its
// TypeMeta empty, as informers and typed clients leave it, and its type in
// no scheme the writer reads — fails saying how to tell it: by adding the
// type to client-go's scheme, not by writing to the informer's objects.
func TestApplyKindUnknownSaysHow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := writer.New(writer.Typed(func(string) writer.TypedClient[*gadget] { return gadgets{} }), writer.Options[*gadget]{Mode: writer.ModeApply})
		require.NoError(t, err)
		defer w.Close(t.Context())
		g := &gadget{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "g", UID: "uid-1", ResourceVersion: "1"}}
		tk, err := w.Submit(t.Context(), g, writer.Desire[*gadget]{Status: func(g *gadget) error { g.Status.Phase = "Ready"; return nil }}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		assert.Equal(t, dispatch.StateFailed, res.State)
		assert.ErrorContains(t, err, "*writer_test.gadget")
		assert.ErrorContains(t, err, "k8s.io/client-go/kubernetes/scheme")
	})
}

// A status desire for a type without a status (no field Status) fails,
// saying so, in every mode, and sends nothing: not a write that panics in
// the writer's own comparison, nor one that ends Skipped as though the
// object met it.
func TestStatusDesireOfATypeWithoutOne(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cs, api, c := configMaps(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c"}})
				w, err := writer.New(c, writer.Options[cm]{Mode: mode})
				require.NoError(t, err)
				defer w.Close(t.Context())
				d := writer.Desire[cm]{Status: func(c cm) error { c.Data = map[string]string{"a": "b"}; return nil }}
				require.NoError(t, w.Set(getCM(t, cs, "c"), d, writer.SetOptions{}))
				tk, err := w.Submit(t.Context(), getCM(t, cs, "c"), d, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				assert.Equal(t, dispatch.StateFailed, res.State)
				assert.ErrorContains(t, err, "Desire.Status for default/c: *v1.ConfigMap has no status")
				var pe *dispatch.PanicError
				assert.NotErrorAs(t, err, &pe)
				assert.Equal(t, 1, res.Attempts)
				assert.Empty(t, api.Requests())
			})
		})
	}
}
