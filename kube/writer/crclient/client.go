package crclient

import (
	"context"
	"fmt"
	"reflect"

	"github.com/coalescer/dispatch/kube/writer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// New returns the writer.Client that sends a Writer's requests through c:
// reads with reader (c if nil), writes with c — the status through
// c.Status(), the object through c itself.
//
// The writer reads an object only when it needs the live one: after a
// write refused as stale, or for a desire given without a
// resourceVersion. Give c no client-side rate limit of its own, so the
// writer's priority order holds, and a server's Retry-After is waited out
// in the writer's queue: build it from writer.RESTConfig,
//
//	c, err := client.New(writer.RESTConfig(cfg), client.Options{Scheme: scheme})
//
// Such a client reads from the API server: give a nil reader. A manager's
// default client (mgr.GetClient()) reads from the informer cache, which
// may not have caught up: give it a reader made as c is above — not
// mgr.GetAPIReader(), whose config leaves a throttled read's Retry-After,
// and a read's broken connection, to client-go, which waits them out and
// resends inside the writer's worker.
//
// c's scheme names the apiVersion and kind of a server-side apply
// (writer.ModeApply) for a typed object.
//
// A nil c (or a nil pointer of a client type) gives a nil Client, which
// writer.New refuses.
func New[O client.Object](c client.Client, reader client.Reader) writer.Client[O] {
	if c == nil || reflect.ValueOf(c).Kind() == reflect.Pointer && reflect.ValueOf(c).IsNil() {
		return nil
	}
	if reader == nil {
		reader = c
	}
	return &adapter[O]{c: c, r: reader}
}

type adapter[O client.Object] struct {
	c client.Client
	r client.Reader
}

// fresh returns an empty object of like's type, with like's apiVersion and
// kind: controller-runtime reads an unstructured or a metadata-only
// (*metav1.PartialObjectMetadata) object by them.
func fresh[O client.Object](like O) O {
	o, _ := reflect.New(reflect.TypeOf(like).Elem()).Interface().(O)
	o.GetObjectKind().SetGroupVersionKind(like.GetObjectKind().GroupVersionKind())
	return o
}

func (a *adapter[O]) Get(ctx context.Context, obj O) (O, error) {
	out := fresh(obj)
	if err := a.r.Get(ctx, client.ObjectKeyFromObject(obj), out); err != nil {
		var none O
		return none, err
	}
	return out, nil
}

// Update sends a copy of obj: controller-runtime writes the server's
// answer into the object it is given, and the writer's objects are never
// changed once handed over.
func (a *adapter[O]) Update(ctx context.Context, obj O, sub string, opts metav1.UpdateOptions) (O, error) {
	out, _ := obj.DeepCopyObject().(O)
	var err error
	// controller-runtime copies its own fields over Raw's (AsUpdateOptions),
	// so the request's options go in both.
	uo := client.UpdateOptions{Raw: &opts, DryRun: opts.DryRun, FieldManager: opts.FieldManager, FieldValidation: opts.FieldValidation}
	switch sub {
	case "":
		err = a.c.Update(ctx, out, &uo)
	case "status":
		err = a.c.Status().Update(ctx, out, &client.SubResourceUpdateOptions{UpdateOptions: uo})
	default:
		err = fmt.Errorf("crclient: cannot update subresource %q", sub)
	}
	if err != nil {
		var none O
		return none, err
	}
	return out, nil
}

func (a *adapter[O]) Patch(ctx context.Context, obj O, pt types.PatchType, data []byte, sub string, opts metav1.PatchOptions) (O, error) {
	out, _ := obj.DeepCopyObject().(O)
	p := client.RawPatch(pt, data)
	var err error
	switch sub {
	case "":
		err = a.c.Patch(ctx, out, p, &client.PatchOptions{Raw: &opts})
	case "status":
		err = a.c.Status().Patch(ctx, out, p, &client.SubResourcePatchOptions{PatchOptions: client.PatchOptions{Raw: &opts}})
	default:
		err = fmt.Errorf("crclient: cannot patch subresource %q", sub)
	}
	if err != nil {
		var none O
		return none, err
	}
	return out, nil
}

// GroupVersionKindFor is c's: the writer asks it for the apiVersion and
// kind of an apply.
func (a *adapter[O]) GroupVersionKindFor(obj runtime.Object) (schema.GroupVersionKind, error) {
	return a.c.GroupVersionKindFor(obj)
}
