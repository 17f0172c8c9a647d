package writer_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

type cm = *corev1.ConfigMap

var configMapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func configMaps(t *testing.T, objs ...runtime.Object) (*fake.Clientset, *fakeapi.Server, writer.Client[cm]) {
	cs := fake.NewSimpleClientset()
	api, err := fakeapi.Install(&cs.Fake, cs.Tracker(), objs...)
	require.NoError(t, err)
	return cs, api, writer.Typed(func(ns string) writer.TypedClient[cm] { return cs.CoreV1().ConfigMaps(ns) })
}

func getCM(t *testing.T, cs *fake.Clientset, name string) cm {
	o, err := cs.Tracker().Get(configMapsGVR, "default", name)
	require.NoError(t, err)
	return o.(cm)
}

func annotate(k, v string) writer.Desire[cm] {
	return writer.Desire[cm]{Object: func(c cm) error {
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, k, v)
		return nil
	}}
}

// The object's own endpoint, in each mode, for a type without a status.
func TestTypedObjectWrites(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cs, api, c := configMaps(t, &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c"},
					Data:       map[string]string{"k": "v"},
				})
				w, err := writer.New(c, writer.Options[cm]{Mode: mode, FieldManager: "demo"})
				require.NoError(t, err)
				defer w.Close(t.Context())
				live := getCM(t, cs, "c")

				tk, err := w.Submit(t.Context(), live, annotate("demo/keys", "1"), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, "1", res.Object.Annotations["demo/keys"])
				got := getCM(t, cs, "c")
				assert.Equal(t, "1", got.Annotations["demo/keys"])
				assert.Equal(t, map[string]string{"k": "v"}, got.Data)

				// Set again against the answer: nothing to send.
				require.NoError(t, w.Set(res.Object, annotate("demo/keys", "1"), writer.SetOptions{}))
				assert.Equal(t, uint64(1), w.Stats().NoOps)

				reqs := api.Requests()
				require.Len(t, reqs, 1)
				switch mode {
				case writer.ModeUpdate:
					assert.Equal(t, "demo", reqs[0].Options.(metav1.UpdateOptions).FieldManager)
				case writer.ModePatch:
					assert.Equal(t, types.JSONPatchType, reqs[0].PatchType)
					var ops []map[string]any
					require.NoError(t, json.Unmarshal(reqs[0].Body, &ops))
					assert.Equal(t, map[string]any{"op": "test", "path": "/metadata/uid", "value": string(live.UID)}, ops[0])
				case writer.ModeApply:
					assert.Equal(t, types.ApplyPatchType, reqs[0].PatchType)
					assert.Equal(t, "demo", reqs[0].Options.(metav1.PatchOptions).FieldManager)
					assert.Nil(t, reqs[0].Options.(metav1.PatchOptions).Force)
					assert.JSONEq(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"default","uid":"`+string(live.UID)+`","annotations":{"demo/keys":"1"}}}`, string(reqs[0].Body),
						"the configuration: what the change set, and the identity")
				}
			})
		})
	}
}

func TestStatusOfATypeWithoutOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs, _, c := configMaps(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c"}})
		w, err := writer.New(c, writer.Options[cm]{})
		require.NoError(t, err)
		defer w.Close(t.Context())
		tk, err := w.Submit(t.Context(), getCM(t, cs, "c"), writer.Desire[cm]{Status: writer.CopyStatus(getCM(t, cs, "c"))}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		assert.ErrorContains(t, err, "has no status")
		assert.Equal(t, dispatch.StateFailed, res.State)
	})
}

// CopyStatus is the value form of a desire.
func TestCopyStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{})
		live := e.get(t, "a")
		want := live.DeepCopy()
		want.Status.Replicas, want.Status.ObservedGeneration = 3, 2
		change := writer.CopyStatus(want)
		want.Status.Replicas = 99 // copied already
		tk, err := w.Submit(t.Context(), live, status(change), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, int32(3), res.Object.Status.Replicas)
		assert.Equal(t, int64(2), res.Object.Status.ObservedGeneration)
	})
}

// ModePatch tests only what it sets: another writer's change elsewhere is
// no conflict; a change to the same field is, and the retry tests the
// resourceVersion read.
func TestPatchFieldLevelConcurrency(t *testing.T) {
	for _, sameField := range []bool{false, true} {
		t.Run(map[bool]string{false: "other field", true: "same field"}[sameField], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				stale := e.get(t, "a")
				require.NoError(t, e.api.Change(deploymentsGVR, "default", "a", func(o runtime.Object) {
					d := o.(deploy)
					if sameField {
						d.Status.Replicas = 5
					} else {
						d.Status.ObservedGeneration = 4
					}
				}))
				w := newWriter(t, e, writer.Options[deploy]{Mode: writer.ModePatch})
				tk, err := w.Submit(t.Context(), stale, status(replicas(2)), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				got := e.get(t, "a")
				assert.Equal(t, int32(2), got.Status.Replicas)
				if sameField {
					assert.Equal(t, uint64(1), w.Stats().Conflicts)
					last := e.api.Requests()[1]
					assert.Contains(t, string(last.Body), `"path":"/metadata/resourceVersion"`, "the retry is strict")
					return
				}
				assert.Equal(t, int64(4), got.Status.ObservedGeneration, "kept")
				assert.Zero(t, w.Stats().Conflicts)
				assert.Equal(t, 1, res.Attempts)
			})
		})
	}
}

// ModeApply: Force is sent, a desire already live is not, and a conflict
// with another manager's fields fails at once, without re-reading.
func TestApplyOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{Mode: writer.ModeApply, FieldManager: "ctl", Force: true})
		a := e.get(t, "a")
		tk, err := w.Submit(t.Context(), a, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		opts := e.api.Requests()[0].Options.(metav1.PatchOptions)
		require.NotNil(t, opts.Force)
		assert.True(t, *opts.Force)

		// The configuration is already live (its timestamps too): not sent.
		live := res.Object.DeepCopy()
		ready := live.Status.Conditions[0]
		same := func(d deploy) error { d.Status.Conditions = append(d.Status.Conditions, ready); return nil }
		require.NoError(t, w.Set(live, status(same), writer.SetOptions{}))
		assert.Len(t, e.api.Requests(), 1)

		e.api.Fail(fakeapi.Fault{Key: "patch/status", Times: 1, Err: managerConflictErr()})
		tk, err = w.Submit(t.Context(), live, status(replicas(3)), writer.SetOptions{})
		require.NoError(t, err)
		res, _ = tk.Wait(t.Context())
		assert.Equal(t, dispatch.StateFailed, res.State)
		assert.Equal(t, 1, res.Attempts)
		assert.Zero(t, e.api.Calls("get"))
	})
}

func managerConflictErr() error {
	return &apiStatusError{metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonConflict,
		Message: "Apply failed with 1 conflict: conflict with \"other\": .status.replicas",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldManagerConflict, Field: ".status.replicas"}}},
	}}
}

type apiStatusError struct{ s metav1.Status }

func (e *apiStatusError) Error() string         { return e.s.Message }
func (e *apiStatusError) Status() metav1.Status { return e.s }

func TestDynamicClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newDynEnv(t, widget("a"))
		obs := &tenants{}
		w, err := writer.New(e.c, writer.Options[*unstructured.Unstructured]{Tenancy: writer.TenancyKind, Observer: obs})
		require.NoError(t, err)
		defer w.Close(t.Context())
		tk, err := w.Submit(t.Context(), e.get(t, "a"), writer.Desire[*unstructured.Unstructured]{
			Status: setPhase("Ready"),
			Object: func(u *unstructured.Unstructured) error { u.SetLabels(map[string]string{"ready": "yes"}); return nil },
		}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Writes)
		got := e.get(t, "a")
		phase, _, _ := unstructured.NestedString(got.Object, "status", "phase")
		assert.Equal(t, "Ready", phase)
		assert.Equal(t, "yes", got.GetLabels()["ready"])
		assert.Equal(t, []string{"Widget.example.com"}, obs.seen, "TenancyKind")
	})
}

// tenants records the tenants of submissions.
type tenants struct {
	dispatch.NopObserver
	seen []string
}

func (o *tenants) OnSubmit(e dispatch.Event, _ bool) { o.seen = append(o.seen, e.Tenant) }

// RESTConfig: the writer's requests get no client-side bucket, and a 429's
// Retry-After comes back to the writer, which waits it out in its queue:
// client-go does not resend inside the worker.
func TestRESTConfigHandsRetryAfterToTheWriter(t *testing.T) {
	var puts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPut && puts.Add(1) == 1 {
			rw.Header().Set("Retry-After", "1")
			rw.WriteHeader(http.StatusTooManyRequests)
			_, _ = rw.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`))
			return
		}
		cmap := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c", UID: "u1", ResourceVersion: "2"}}
		_ = json.NewEncoder(rw).Encode(cmap)
	}))
	defer srv.Close()
	cfg := writer.RESTConfig(&rest.Config{Host: srv.URL, QPS: 5, Burst: 10})
	assert.Equal(t, float32(-1), cfg.QPS)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	w, err := writer.New(writer.Typed(func(ns string) writer.TypedClient[cm] { return cs.CoreV1().ConfigMaps(ns) }), writer.Options[cm]{})
	require.NoError(t, err)
	defer w.Close(t.Context())

	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c", UID: "u1", ResourceVersion: "1"}}
	start := time.Now()
	tk, err := w.Submit(t.Context(), obj, annotate("a", "b"), writer.SetOptions{})
	require.NoError(t, err)
	res, err := tk.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, res.Attempts, "the writer retried, not client-go")
	assert.Equal(t, int32(2), puts.Load())
	assert.GreaterOrEqual(t, time.Since(start), time.Second)
	assert.Equal(t, uint64(1), w.Stats().Dispatch.Retries)
}
