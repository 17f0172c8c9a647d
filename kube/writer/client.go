package writer

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// Client makes the requests a Writer sends for objects of type O: a read,
// a replacement and a patch, each of the object obj names (its namespace
// and name; an *unstructured.Unstructured also gives its kind), through
// subresource "status" or, for "", the object's own endpoint. Typed and
// Dynamic adapt client-go's clients; the crclient module adapts
// controller-runtime's.
//
// A Client returns a new object, never obj, and never keeps or changes
// obj. It is called from the writer's workers concurrently.
type Client[O Object] interface {
	Get(ctx context.Context, obj O) (O, error)
	Update(ctx context.Context, obj O, subresource string, opts metav1.UpdateOptions) (O, error)
	Patch(ctx context.Context, obj O, pt types.PatchType, data []byte, subresource string, opts metav1.PatchOptions) (O, error)
}

// TypedClient is the part of a generated client-go typed client (one
// namespace's, such as clientset.CoreV1().ConfigMaps(ns)) that Typed uses.
// A typed client with an UpdateStatus method can write the status through
// it in ModeUpdate; every mode can patch it.
type TypedClient[O Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (O, error)
	Update(ctx context.Context, obj O, opts metav1.UpdateOptions) (O, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (O, error)
}

// statusUpdater is the UpdateStatus method of typed clients of types with a
// status subresource.
type statusUpdater[O Object] interface {
	UpdateStatus(ctx context.Context, obj O, opts metav1.UpdateOptions) (O, error)
}

// Typed adapts a client-go typed client, given as the function that
// returns a namespace's (for a cluster-scoped type, the one client,
// whatever the namespace):
//
//	c := writer.Typed(func(ns string) writer.TypedClient[*corev1.ConfigMap] {
//		return clientset.CoreV1().ConfigMaps(ns)
//	})
//
// Build the clientset from RESTConfig, so that the writer's requests take
// no token of a client-side bucket behind its own priority order, and a
// server's Retry-After is waited out in the writer's queue.
//
// A ModeApply names the apiVersion and kind of the object; for a typed
// object whose TypeMeta is empty (as informers and typed clients leave
// it), they are looked up in client-go's scheme
// (k8s.io/client-go/kubernetes/scheme.Scheme): add a custom resource's
// type to it.
//
// A nil of gives a nil Client, which New refuses.
func Typed[O Object](of func(namespace string) TypedClient[O]) Client[O] {
	if of == nil {
		return nil
	}
	return typed[O]{of}
}

type typed[O Object] struct {
	of func(namespace string) TypedClient[O]
}

func (c typed[O]) Get(ctx context.Context, obj O) (O, error) {
	return c.of(obj.GetNamespace()).Get(ctx, obj.GetName(), metav1.GetOptions{})
}

func (c typed[O]) Update(ctx context.Context, obj O, sub string, opts metav1.UpdateOptions) (O, error) {
	tc := c.of(obj.GetNamespace())
	switch sub {
	case "":
		return tc.Update(ctx, obj, opts)
	case "status":
		if su, ok := tc.(statusUpdater[O]); ok {
			return su.UpdateStatus(ctx, obj, opts)
		}
		var zero O
		return zero, fmt.Errorf("writer: %T %w: its typed client has no UpdateStatus", obj, errNoStatus)
	}
	var zero O
	return zero, fmt.Errorf("writer: Typed cannot update subresource %q", sub)
}

func (c typed[O]) Patch(ctx context.Context, obj O, pt types.PatchType, data []byte, sub string, opts metav1.PatchOptions) (O, error) {
	return c.of(obj.GetNamespace()).Patch(ctx, obj.GetName(), pt, data, opts, subresources(sub)...)
}

// Dynamic adapts client-go's dynamic client for one resource:
//
//	c := writer.Dynamic(dynamicClient.Resource(widgetsGVR))
//
// Namespaced and cluster-scoped resources alike: the object's namespace,
// if any, is used. Build the client from RESTConfig (see Typed).
//
// A nil r gives a nil Client, which New refuses.
func Dynamic(r dynamic.NamespaceableResourceInterface) Client[*unstructured.Unstructured] {
	if r == nil {
		return nil
	}
	return dyn{r}
}

type dyn struct {
	r dynamic.NamespaceableResourceInterface
}

func (c dyn) of(obj *unstructured.Unstructured) dynamic.ResourceInterface {
	if ns := obj.GetNamespace(); ns != "" {
		return c.r.Namespace(ns)
	}
	return c.r
}

func (c dyn) Get(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return c.of(obj).Get(ctx, obj.GetName(), metav1.GetOptions{})
}

func (c dyn) Update(ctx context.Context, obj *unstructured.Unstructured, sub string, opts metav1.UpdateOptions) (*unstructured.Unstructured, error) {
	switch sub {
	case "":
		return c.of(obj).Update(ctx, obj, opts)
	case "status":
		return c.of(obj).UpdateStatus(ctx, obj, opts)
	}
	return nil, fmt.Errorf("writer: Dynamic cannot update subresource %q", sub)
}

func (c dyn) Patch(ctx context.Context, obj *unstructured.Unstructured, pt types.PatchType, data []byte, sub string, opts metav1.PatchOptions) (*unstructured.Unstructured, error) {
	return c.of(obj).Patch(ctx, obj.GetName(), pt, data, opts, subresources(sub)...)
}

func subresources(sub string) []string {
	if sub == "" {
		return nil
	}
	return []string{sub}
}
