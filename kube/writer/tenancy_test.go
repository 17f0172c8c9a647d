package writer_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// TestTenancyKindOfTypedObjects: typed objects from client-go's typed
// clients and informers come with an empty TypeMeta, so their kind "as
// given" is "" — every typed object of every kind shared one tenant, and
// Options.Tenants["ConfigMap"] never applied. The kind of such an object
// is its type's, as an apply names it: the client's scheme's, or
// client-go's.
func TestTenancyKindOfTypedObjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		obs := &tenants{}
		w := newWriter(t, e, writer.Options[deploy]{Tenancy: writer.TenancyKind, Observer: obs})
		a := e.get(t, "a")
		require.Empty(t, a.Kind, "a typed object as read: no TypeMeta")
		require.NoError(t, w.Set(a, status(replicas(1)), writer.SetOptions{}))
		settle(t, w)
		assert.Equal(t, []string{"Deployment.apps"}, obs.seen)
		assert.Equal(t, int32(1), e.get(t, "a").Status.Replicas)
	})
}

// TestTenancyKindMixedTypes: a Writer of an interface type takes objects
// of several kinds; each typed kind is a tenant of its own.
func TestTenancyKindMixedTypes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &tenants{}
		w, err := writer.New[writer.Object](nowhere{}, writer.Options[writer.Object]{Tenancy: writer.TenancyKind, Observer: obs})
		require.NoError(t, err)
		defer w.Close(canceledCtx())
		label := func(o writer.Object) error { o.SetLabels(map[string]string{"x": "y"}); return nil }
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c", UID: "u1"}}
		dp := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "d", UID: "u2"}}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "s", UID: "u3"}}
		sec.APIVersion, sec.Kind = "v1", "Secret" // as given
		for _, o := range []writer.Object{cm, dp, sec, cm.DeepCopy()} {
			require.NoError(t, w.Set(o, writer.Desire[writer.Object]{Object: label}, writer.SetOptions{}))
		}
		assert.Equal(t, []string{"ConfigMap", "Deployment.apps", "Secret", "ConfigMap"}, obs.seen)

		// A type no scheme knows, given without its kind: refused, naming
		// the way out, rather than put in a tenant "".
		err = w.Set(&thing{ObjectMeta: metav1.ObjectMeta{Name: "t", UID: "u4"}}, writer.Desire[writer.Object]{Object: label}, writer.SetOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "TenancyKind")
		assert.Contains(t, err.Error(), "SetOptions.Tenant")
		// SetOptions.Tenant needs no kind.
		require.NoError(t, w.Set(&thing{ObjectMeta: metav1.ObjectMeta{Name: "t", UID: "u4"}}, writer.Desire[writer.Object]{Object: label}, writer.SetOptions{Tenant: "things"}))
		assert.Equal(t, "things", obs.seen[len(obs.seen)-1])
	})
}

// thing is a typed object no scheme knows.
type thing struct {
	metav1.TypeMeta
	metav1.ObjectMeta
}

func (t *thing) DeepCopyObject() runtime.Object {
	c := *t
	t.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// nowhere is a Client whose requests never return before their context
// ends: the writes stay queued or in flight.
type nowhere struct{}

var errNowhere = errors.New("nowhere")

func (nowhere) Get(ctx context.Context, _ writer.Object) (writer.Object, error) {
	<-ctx.Done()
	return nil, errNowhere
}

func (nowhere) Update(ctx context.Context, _ writer.Object, _ string, _ metav1.UpdateOptions) (writer.Object, error) {
	<-ctx.Done()
	return nil, errNowhere
}

func (nowhere) Patch(ctx context.Context, _ writer.Object, _ types.PatchType, _ []byte, _ string, _ metav1.PatchOptions) (writer.Object, error) {
	<-ctx.Done()
	return nil, errNowhere
}

func canceledCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
