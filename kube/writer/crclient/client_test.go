package crclient_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/crclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

type deploy = *appsv1.Deployment

// deployOptions are a real controller-runtime client's options for
// Deployments, with a mapper that needs no discovery.
func deployOptions(t *testing.T) client.Options {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("Deployment"), meta.RESTScopeNamespace)
	return client.Options{Scheme: scheme, Mapper: mapper}
}

func newClient(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	return fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&appsv1.Deployment{}).
		WithObjects(objs...).
		WithInterceptorFuncs(funcs).
		Build()
}

func web() deploy {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1"}}
}

func get(t *testing.T, c client.Client) deploy {
	t.Helper()
	var d appsv1.Deployment
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "web"}, &d))
	return &d
}

func ready(d deploy) error {
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: "Available", Status: corev1.ConditionTrue}}
	return nil
}

// Each mode writes through controller-runtime's client, and the object
// given is never changed.
func TestModes(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newClient(t, interceptor.Funcs{}, web())
				w, err := writer.New(crclient.New[deploy](c, nil), writer.Options[deploy]{Mode: mode, FieldManager: "ctl"})
				require.NoError(t, err)
				defer w.Close(t.Context())
				given := get(t, c)
				before := given.DeepCopy()

				tk, err := w.Submit(t.Context(), given, writer.Desire[deploy]{
					Status: ready,
					Object: func(d deploy) error { d.Labels = map[string]string{"ready": "yes"}; return nil },
				}, writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)

				assert.Equal(t, before, given, "the object given is not changed")
				got := get(t, c)
				assert.Equal(t, corev1.ConditionTrue, got.Status.Conditions[0].Status)
				assert.Equal(t, "yes", got.Labels["ready"])
				assert.Equal(t, got.ResourceVersion, res.Object.ResourceVersion)
				assert.Equal(t, 2, res.Writes)
			})
		})
	}
}

// A conflict is re-read through the reader given, and re-applied.
func TestConflictReadsThroughTheReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, interceptor.Funcs{}, web())
		stale := get(t, c)
		other := stale.DeepCopy()
		other.Status.ObservedGeneration = 7
		require.NoError(t, c.Status().Update(t.Context(), other))
		reads := 0
		reader := readerFunc(func(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			reads++
			return c.Get(ctx, key, obj, opts...)
		})
		w, err := writer.New(crclient.New[deploy](c, reader), writer.Options[deploy]{})
		require.NoError(t, err)
		defer w.Close(t.Context())

		tk, err := w.Submit(t.Context(), stale, writer.Desire[deploy]{Status: ready}, writer.SetOptions{})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.NoError(t, err)
		got := get(t, c)
		assert.Equal(t, int64(7), got.Status.ObservedGeneration, "the other write is kept")
		assert.Len(t, got.Status.Conditions, 1)
		assert.Equal(t, 1, reads)
		assert.Equal(t, uint64(1), w.Stats().Conflicts)
	})
}

// Faults through controller-runtime's interceptor: a 429 is retried, a
// deleted object fails with ErrGone.
func TestFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		c := newClient(t, interceptor.Funcs{
			SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if calls++; calls == 1 {
					return apierrors.NewTooManyRequests("slow down", 1)
				}
				return cl.SubResource(sub).Update(ctx, obj, opts...)
			},
		}, web())
		w, err := writer.New(crclient.New[deploy](c, nil), writer.Options[deploy]{})
		require.NoError(t, err)
		defer w.Close(t.Context())
		tk, err := w.Submit(t.Context(), get(t, c), writer.Desire[deploy]{Status: ready}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Attempts)

		gone := get(t, c)
		require.NoError(t, c.Delete(t.Context(), gone))
		tk, err = w.Submit(t.Context(), gone, writer.Desire[deploy]{Status: func(d deploy) error { d.Status.Replicas = 9; return nil }}, writer.SetOptions{})
		require.NoError(t, err)
		res, err = tk.Wait(t.Context())
		assert.True(t, errors.Is(err, writer.ErrGone), "%v", err)
		assert.Equal(t, dispatch.StateFailed, res.State)
	})
}

// An object recreated under its name: the write is fenced. For ModePatch,
// the interceptor answers a failed JSON patch test as the apiserver does
// (a 422 with a generic message), where the fake returns the patch
// library's own error.
func TestFenceOnRecreate(t *testing.T) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newClient(t, interceptor.Funcs{
					SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
						err := cl.SubResource(sub).Patch(ctx, obj, p, opts...)
						var status apierrors.APIStatus
						if err != nil && !errors.As(err, &status) {
							return apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", err.Error(), 0, false)
						}
						return err
					},
				}, web())
				old := get(t, c)
				require.NoError(t, c.Delete(t.Context(), old))
				n := web()
				n.UID = "uid-2"
				require.NoError(t, c.Create(t.Context(), n))
				w, err := writer.New(crclient.New[deploy](c, nil), writer.Options[deploy]{Mode: mode})
				require.NoError(t, err)
				defer w.Close(t.Context())
				tk, err := w.Submit(t.Context(), old, writer.Desire[deploy]{Status: ready}, writer.SetOptions{})
				require.NoError(t, err)
				_, err = tk.Wait(t.Context())
				require.ErrorIs(t, err, writer.ErrReplaced)
				assert.Empty(t, get(t, c).Status.Conditions)
			})
		})
	}
}

type readerFunc func(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error

func (f readerFunc) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return f(ctx, key, obj, opts...)
}

func (readerFunc) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not used")
}

// A nil controller-runtime client is refused by writer.New, as a nil
// writer.Client is, instead of panicking in every write.
func TestNilClientRefused(t *testing.T) {
	_, err := writer.New(crclient.New[deploy](nil, nil), writer.Options[deploy]{})
	assert.ErrorContains(t, err, "client is nil")
}

// A metadata-only or an unstructured object (controller-runtime reads one
// by its apiVersion and kind, through its metadata or its unstructured
// client): the read the writer makes for an object given without a
// resourceVersion keeps them.
func TestReadKeepsKind(t *testing.T) {
	gvk := appsv1.SchemeGroupVersion.WithKind("Deployment")
	t.Run("PartialObjectMetadata", func(t *testing.T) {
		obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1"}}
		obj.SetGroupVersionKind(gvk)
		readKeepsKind(t, obj)
	})
	t.Run("Unstructured", func(t *testing.T) {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gvk)
		obj.SetNamespace("default")
		obj.SetName("web")
		obj.SetUID("uid-1")
		readKeepsKind(t, obj)
	})
}

func readKeepsKind[O client.Object](t *testing.T, obj O) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, interceptor.Funcs{}, web())
		w, err := writer.New(crclient.New[O](c, nil), writer.Options[O]{Mode: writer.ModePatch})
		require.NoError(t, err)
		defer w.Close(t.Context())
		tk, err := w.Submit(t.Context(), obj, writer.Desire[O]{Object: func(o O) error {
			o.SetLabels(map[string]string{"ready": "yes"})
			return nil
		}}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, res.Writes)
		assert.Equal(t, uint64(1), w.Stats().Reads, "the object was read first")
		assert.Equal(t, "yes", get(t, c).Labels["ready"])
	})
}

// nilClient is a controller-runtime client type whose nil pointer a caller
// may pass by mistake.
type nilClient struct{ client.Client }

// A typed nil controller-runtime client (a nil pointer of a client type)
// is refused by writer.New as a nil one is, instead of panicking in every
// write.
func TestTypedNilClientRefused(t *testing.T) {
	var c *nilClient
	_, err := writer.New(crclient.New[deploy](c, nil), writer.Options[deploy]{})
	assert.ErrorContains(t, err, "client is nil")
}

// TestTenancyKindFromTheClientsScheme: under writer.TenancyKind, a typed
// object as controller-runtime reads it (an empty TypeMeta) is the tenant
// of its kind as the client's scheme names it, each kind its own; before,
// every typed object was the one tenant "".
func TestTenancyKindFromTheClientsScheme(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c", UID: "uid-2"}}
		c := newClient(t, interceptor.Funcs{}, web(), cm)
		var seen []string
		obs := &submitTenants{seen: &seen}
		w, err := writer.New(crclient.New[client.Object](c, nil), writer.Options[client.Object]{Tenancy: writer.TenancyKind, Observer: obs})
		require.NoError(t, err)
		defer w.Close(t.Context())
		label := writer.Desire[client.Object]{Object: func(o client.Object) error { o.SetLabels(map[string]string{"x": "y"}); return nil }}
		var d appsv1.Deployment
		require.NoError(t, c.Get(t.Context(), client.ObjectKeyFromObject(web()), &d))
		var m corev1.ConfigMap
		require.NoError(t, c.Get(t.Context(), client.ObjectKeyFromObject(cm), &m))
		require.Empty(t, d.Kind+m.Kind, "typed objects as read: no TypeMeta")
		require.NoError(t, w.Set(&d, label, writer.SetOptions{}))
		require.NoError(t, w.Set(&m, label, writer.SetOptions{}))
		assert.Equal(t, []string{"Deployment.apps", "ConfigMap"}, seen)
	})
}

type submitTenants struct {
	dispatch.NopObserver
	seen *[]string
}

func (o *submitTenants) OnSubmit(e dispatch.Event, _ bool) { *o.seen = append(*o.seen, e.Tenant) }
