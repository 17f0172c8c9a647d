package writer

import (
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// target is the part of an object one request writes: the status, through
// the status subresource, or the rest, through the object's own endpoint.
type target uint8

const (
	targetStatus target = iota
	targetObject
	numTargets
)

func (t target) String() string {
	if t == targetStatus {
		return "status"
	}
	return "object"
}

// subresource is the subresource t is written through.
func (t target) subresource() string {
	if t == targetStatus {
		return "status"
	}
	return ""
}

// writableMeta are the metadata fields a write of the object may change:
// the rest are the server's (name, uid, resourceVersion, generation, ...)
// or immutable.
var writableMeta = [...]string{"labels", "annotations", "finalizers", "ownerReferences"}

// same reports whether a and b agree on t's part: the no-op test. Nil and
// empty slices and maps are equal, and so are timestamps at one instant
// (equality.Semantic).
func same(t target, a, b Object) bool {
	if t == targetStatus {
		return sameStatus(a, b)
	}
	return sameMeta(a, b) && sameBody(a, b)
}

func sameStatus(a, b runtime.Object) bool {
	if ua, ok := a.(*unstructured.Unstructured); ok {
		ub, _ := b.(*unstructured.Unstructured)
		return sameContent(ua.Object["status"], ub.Object["status"])
	}
	fa, _ := statusField(a)
	fb, _ := statusField(b)
	return equality.Semantic.DeepEqual(fa.Interface(), fb.Interface())
}

func sameMeta(a, b Object) bool {
	return equality.Semantic.DeepEqual(a.GetLabels(), b.GetLabels()) &&
		equality.Semantic.DeepEqual(a.GetAnnotations(), b.GetAnnotations()) &&
		equality.Semantic.DeepEqual(a.GetFinalizers(), b.GetFinalizers()) &&
		equality.Semantic.DeepEqual(a.GetOwnerReferences(), b.GetOwnerReferences())
}

// sameBody compares everything but the type, the metadata and the status:
// the spec, or a ConfigMap's data.
func sameBody(a, b Object) bool {
	if ua, ok := a.(*unstructured.Unstructured); ok {
		ub, _ := b.(*unstructured.Unstructured)
		return sameKeys(ua.Object, ub.Object) && sameKeys(ub.Object, ua.Object)
	}
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := range va.NumField() {
		switch va.Type().Field(i).Name {
		case "TypeMeta", "ObjectMeta", "Status":
			continue
		}
		if !va.Field(i).CanInterface() {
			continue
		}
		if !equality.Semantic.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return false
		}
	}
	return true
}

// sameKeys reports whether every body key of a has b's value.
func sameKeys(a, b map[string]any) bool {
	for k, v := range a {
		if bodyKey(k) && !sameContent(v, b[k]) {
			return false
		}
	}
	return true
}

// sameContent is the no-op test's equality of an unstructured object's
// values, as equality.Semantic is a typed object's: a null value, an
// absent key and an empty list are equal (a nil pointer's or nil slice's
// JSON without omitempty, which an API server prunes from a custom
// resource, or keeps to the same meaning); numbers by value. An empty map
// is not null: in unstructured form it may be a struct whose presence
// means something (a volume's `emptyDir: {}`), which a typed object's nil
// pointer and empty struct tell apart too.
func sameContent(a, b any) bool {
	if empty(a) || empty(b) {
		return empty(a) && empty(b)
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range x {
			if !sameContent(v, y[k]) {
				return false
			}
		}
		for k, v := range y {
			if _, ok := x[k]; !ok && !empty(v) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		return ok && slices.EqualFunc(x, y, sameContent)
	}
	return sameScalar(a, b)
}

// empty reports whether v is null or an empty list.
func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		return len(x) == 0
	}
	return false
}

// bodyKey reports whether a top-level key of an object is its body.
func bodyKey(k string) bool {
	switch k {
	case "apiVersion", "kind", "metadata", "status":
		return false
	}
	return true
}

// part returns t's part of m, an object's unstructured form, as an object
// with those keys alone: the status, or the body and the writable
// metadata. It shares m's memory.
func part(t target, m map[string]any) map[string]any {
	if t == targetStatus {
		if st, ok := m["status"]; ok {
			return map[string]any{"status": st}
		}
		return map[string]any{}
	}
	out := map[string]any{}
	for k, v := range m {
		if bodyKey(k) {
			out[k] = v
		}
	}
	meta, _ := m["metadata"].(map[string]any)
	wm := map[string]any{}
	for _, k := range writableMeta {
		if v, ok := meta[k]; ok {
			wm[k] = v
		}
	}
	out["metadata"] = wm
	return out
}

// unstructuredOf returns o's unstructured form, sharing an Unstructured's
// memory: it is only read.
func unstructuredOf(o runtime.Object) (map[string]any, error) {
	if u, ok := o.(*unstructured.Unstructured); ok {
		return u.Object, nil
	}
	return runtime.DefaultUnstructuredConverter.ToUnstructured(o)
}
