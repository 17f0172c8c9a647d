package writer_test

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
)

// An object deleted and recreated under its name while a write for the old
// one waits: in every mode the write is kept off the new object, and ends
// Failed with ErrReplaced.
func TestFenceKeepsWritesOffARecreatedObject(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				old := e.get(t, "a")
				var once sync.Once
				e.api.Before(func(r fakeapi.Request) {
					if r.Verb == "update" || r.Verb == "patch" {
						once.Do(func() { assert.NoError(t, e.api.Recreate(deploymentsGVR, deployment("a"))) })
					}
				})
				w := newWriter(t, e, writer.Options[deploy]{Mode: mode})

				tk, err := w.Submit(t.Context(), old, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())

				require.ErrorIs(t, err, writer.ErrReplaced)
				assert.Equal(t, dispatch.StateFailed, res.State)
				now := e.get(t, "a")
				assert.NotEqual(t, old.UID, now.UID)
				assert.Empty(t, now.Status.Conditions, "nothing landed on the new object")
				assert.Equal(t, uint64(1), w.Stats().Replaced)
			})
		})
	}
}

func TestGoneObjectFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		old := e.get(t, "a")
		require.NoError(t, e.cs.Tracker().Delete(deploymentsGVR, "default", "a"))
		w := newWriter(t, e, writer.Options[deploy]{})

		tk, err := w.Submit(t.Context(), old, status(replicas(3)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.ErrorIs(t, err, writer.ErrGone)
		assert.Equal(t, dispatch.StateFailed, res.State)
		assert.Equal(t, 1, res.Attempts, "not retried")
		assert.Equal(t, uint64(1), w.Stats().Gone)
	})
}

// Forget, from an informer's delete handler, ends what waits.
func TestForgetEndsPendingDesires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		w := newWriter(t, e, writer.Options[deploy]{QPS: 1, Burst: 1})
		a, b := e.get(t, "a"), e.get(t, "b")
		require.NoError(t, w.Set(a, status(replicas(1)), writer.SetOptions{})) // takes the one token
		tk, err := w.Submit(t.Context(), b, status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)

		assert.True(t, w.Forget(b.UID))
		res, err := tk.Wait(t.Context())
		require.ErrorIs(t, err, writer.ErrGone)
		assert.Equal(t, dispatch.StateCanceled, res.State)
		assert.False(t, w.Forget(b.UID), "nothing left")
		settle(t, w)
		assert.Zero(t, e.get(t, "b").Status.Replicas)
	})
}

var widgetsGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

func widget(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("example.com/v1")
	u.SetKind("Widget")
	u.SetNamespace("default")
	u.SetName(name)
	return u
}

type dynEnv struct {
	cs  *dynfake.FakeDynamicClient
	api *fakeapi.Server
	c   writer.Client[*unstructured.Unstructured]
}

func newDynEnv(t *testing.T, objs ...runtime.Object) *dynEnv {
	t.Helper()
	cs := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{widgetsGVR: "WidgetList"})
	api, err := fakeapi.Install(&cs.Fake, cs.Tracker(), objs...)
	require.NoError(t, err)
	return &dynEnv{cs: cs, api: api, c: writer.Dynamic(cs.Resource(widgetsGVR))}
}

func (e *dynEnv) get(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	o, err := e.cs.Tracker().Get(widgetsGVR, "default", name)
	require.NoError(t, err)
	return o.(*unstructured.Unstructured)
}

func setPhase(phase string) writer.Change[*unstructured.Unstructured] {
	return func(u *unstructured.Unstructured) error {
		return unstructured.SetNestedField(u.Object, phase, "status", "phase")
	}
}

// A custom resource's status: the server keeps the stored metadata on a
// status patch or apply, metadata.uid included, so only the update's
// precondition, the JSON patch's test or the apply's resourceVersion fence
// it. A plain apply lands on the new object: the gap the package
// documentation states.
func TestFenceOnCustomResourceStatus(t *testing.T) {
	cases := []struct {
		name   string
		o      writer.Options[*unstructured.Unstructured]
		landed bool
	}{
		{"update", writer.Options[*unstructured.Unstructured]{}, false},
		{"patch", writer.Options[*unstructured.Unstructured]{Mode: writer.ModePatch}, false},
		{"apply", writer.Options[*unstructured.Unstructured]{Mode: writer.ModeApply}, true},
		{"apply+resourceVersion", writer.Options[*unstructured.Unstructured]{Mode: writer.ModeApply, ApplyResourceVersion: true}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newDynEnv(t, widget("a"))
				old := e.get(t, "a")
				var once sync.Once
				e.api.Before(func(r fakeapi.Request) {
					if r.Verb == "update" || r.Verb == "patch" {
						once.Do(func() { assert.NoError(t, e.api.Recreate(widgetsGVR, widget("a"))) })
					}
				})
				w, err := writer.New(e.c, tc.o)
				require.NoError(t, err)
				defer w.Close(t.Context())

				tk, err := w.Submit(t.Context(), old, writer.Desire[*unstructured.Unstructured]{Status: setPhase("Ready")}, writer.SetOptions{})
				require.NoError(t, err)
				_, err = tk.Wait(t.Context())
				phase, _, _ := unstructured.NestedString(e.get(t, "a").Object, "status", "phase")
				if tc.landed {
					assert.NoError(t, err)
					assert.Equal(t, "Ready", phase, "the documented gap")
					return
				}
				assert.True(t, errors.Is(err, writer.ErrReplaced), "%v", err)
				assert.Empty(t, phase)
			})
		})
	}
}

// With ApplyResourceVersion, an apply carries the baseline's
// resourceVersion: a desire given an object with none (its identity only),
// or older than the writer's own last write, reads the object first, so the
// write is fenced from a recreated object.
func TestApplyResourceVersionFencesWithoutABaseline(t *testing.T) {
	for _, variant := range []string{"identity", "stale informer"} {
		t.Run(variant, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newDynEnv(t, widget("a"))
				old := e.get(t, "a")
				w, err := writer.New(e.c, writer.Options[*unstructured.Unstructured]{Mode: writer.ModeApply, ApplyResourceVersion: true})
				require.NoError(t, err)
				defer w.Close(t.Context())
				given := old.DeepCopy()
				switch variant {
				case "identity":
					given.SetResourceVersion("")
				case "stale informer":
					// The writer's own write, then its lane ends.
					tk, err := w.Submit(t.Context(), old, writer.Desire[*unstructured.Unstructured]{Status: setPhase("Pending")}, writer.SetOptions{})
					require.NoError(t, err)
					_, err = tk.Wait(t.Context())
					require.NoError(t, err)
					settle(t, w)
					synctest.Wait() // the lane's end reaches the writer (OnDone)
				}
				require.NoError(t, e.api.Recreate(widgetsGVR, widget("a")))
				tk, err := w.Submit(t.Context(), given, writer.Desire[*unstructured.Unstructured]{Status: setPhase("Ready")}, writer.SetOptions{})
				require.NoError(t, err)
				_, err = tk.Wait(t.Context())
				now := e.get(t, "a")
				require.NotEqual(t, old.GetUID(), now.GetUID())
				phase, _, _ := unstructured.NestedString(now.Object, "status", "phase")
				assert.Empty(t, phase, "the write for the old UID landed on the new object")
				assert.ErrorIs(t, err, writer.ErrReplaced)
			})
		})
	}
}
