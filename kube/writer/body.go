package writer

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
)

// jsonOp is one operation of a JSON patch (RFC 6902).
type jsonOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patchBody is ModePatch's request: a JSON patch that first tests the
// object's UID (the fence), then, per field the change changed, tests the
// value it had in base and sets the new one — or, strict, tests base's
// resourceVersion once instead of each value. A field is a map's key; a
// list is one field. A key base lacks is tested to be absent (a test for
// null passes only then).
//
// It returns nil if the patch would set nothing: the change left only
// values that differ in Go but not in JSON (an int for an int64).
func patchBody(t target, base, desired Object, uid types.UID, strict bool) ([]byte, error) {
	bm, err := unstructuredOf(base)
	if err != nil {
		return nil, fmt.Errorf("writer: patch of %s: %w", key(base), err)
	}
	dm, err := unstructuredOf(desired)
	if err != nil {
		return nil, fmt.Errorf("writer: patch of %s: %w", key(base), err)
	}
	ops := []jsonOp{{Op: "test", Path: "/metadata/uid", Value: string(uid)}}
	if strict {
		ops = append(ops, jsonOp{Op: "test", Path: "/metadata/resourceVersion", Value: base.GetResourceVersion()})
	}
	tests := len(ops)
	ops = diff(ops, part(t, bm), part(t, dm), "", !strict)
	if !slices.ContainsFunc(ops[tests:], func(o jsonOp) bool { return o.Op != "test" }) {
		return nil, nil
	}
	return json.Marshal(ops)
}

var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// diff appends the operations that take base to desired, recursing into
// maps both have; tests says whether each is preceded by a test of the
// value it replaces.
func diff(ops []jsonOp, base, desired map[string]any, path string, tests bool) []jsonOp {
	keys := slices.Sorted(maps.Keys(base))
	for k := range desired {
		if _, ok := base[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		p := path + "/" + pointerEscape.Replace(k)
		bv, inBase := base[k]
		dv, inDesired := desired[k]
		bm, bIsMap := bv.(map[string]any)
		dm, dIsMap := dv.(map[string]any)
		switch {
		case bIsMap && dIsMap:
			ops = diff(ops, bm, dm, p, tests)
			continue
		case inBase && inDesired && sameJSON(bv, dv):
			continue
		}
		if tests {
			ops = append(ops, jsonOp{Op: "test", Path: p, Value: bv}) // nil: absent
		}
		if inDesired {
			ops = append(ops, jsonOp{Op: "add", Path: p, Value: dv})
		} else {
			ops = append(ops, jsonOp{Op: "remove", Path: p})
		}
	}
	return ops
}

// applyBody is ModeApply's request: the configuration pr.desired holds for
// target t (applyConfig), with the identity: apiVersion, kind, name,
// namespace, the UID (the fence) and, with Options.ApplyResourceVersion,
// the baseline's resourceVersion.
func (w *Writer[O]) applyBody(t target, pr prepared[O], p *op[O]) ([]byte, error) {
	m, err := unstructuredOf(pr.desired)
	if err != nil {
		return nil, fmt.Errorf("writer: apply of %s: %w", key(p.obj), err)
	}
	gvk, err := w.kindOf("an apply", pr.desired, p.obj)
	if err != nil {
		return nil, err
	}
	body := w.applyConfig(t, pr.desired, m)
	meta, _ := body["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["name"], meta["uid"] = p.obj.GetName(), string(p.uid)
	if ns := p.obj.GetNamespace(); ns != "" {
		meta["namespace"] = ns
	}
	if w.applyRV && !isNil(pr.base) {
		meta["resourceVersion"] = pr.base.GetResourceVersion()
	}
	body["metadata"] = meta
	body["apiVersion"], body["kind"] = gvk.GroupVersion().String(), gvk.Kind
	return json.Marshal(body)
}

// kindOf returns the apiVersion and kind an apply names (or TenancyKind
// groups by; purpose says which, in the error): the object's own, or the
// client's answer (controller-runtime's clients know their scheme), or
// client-go's scheme's for a built-in type.
func (w *Writer[O]) kindOf(purpose string, objs ...O) (schema.GroupVersionKind, error) {
	for _, o := range objs {
		if gvk := o.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
			return gvk, nil
		}
	}
	if k, ok := w.c.(interface {
		GroupVersionKindFor(runtime.Object) (schema.GroupVersionKind, error)
	}); ok {
		gvk, err := k.GroupVersionKindFor(objs[0])
		if err != nil {
			return gvk, fmt.Errorf("writer: cannot tell the apiVersion and kind of %T for %s: %w", objs[0], purpose, err)
		}
		return gvk, nil
	}
	if gvks, _, err := scheme.Scheme.ObjectKinds(objs[0]); err == nil && len(gvks) > 0 {
		return gvks[0], nil
	}
	return schema.GroupVersionKind{}, fmt.Errorf("writer: cannot tell the apiVersion and kind of %T for %s: add the type to k8s.io/client-go/kubernetes/scheme.Scheme (its package's AddToScheme), or set them on copies of the objects given to Set", objs[0], purpose)
}

// applyConfig is t's part of m, desired's unstructured form, as an apply
// configuration: pruned of nulls and of the empty maps a typed object's
// conversion writes for the zero structs of fields without omitempty
// (those of w.zero, from the conversion of an empty object), which the change
// did not set. Any other empty map is the change's own, a value (a
// volume's emptyDir: {}, a securityContext: {}): it is sent.
func (w *Writer[O]) applyConfig(t target, desired O, m map[string]any) map[string]any {
	if _, u := any(desired).(*unstructured.Unstructured); u {
		return prune(part(t, m), nil, false)
	}
	return prune(part(t, m), w.zero[t], w.zero[t] == nil)
}

// zeroOf is, per target, the part of an empty O's unstructured form; nil
// if O is not a pointer to a struct (or is unstructured).
func zeroOf[O Object]() (z [numTargets]map[string]any) {
	typ := reflect.TypeFor[O]()
	if typ.Kind() != reflect.Pointer || typ.Elem().Kind() != reflect.Struct || typ == reflect.TypeFor[*unstructured.Unstructured]() {
		return z
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(reflect.New(typ.Elem()).Interface())
	if err != nil {
		return z
	}
	for t := range numTargets {
		z[t] = part(t, m)
	}
	return z
}

// prune returns a copy of m without nulls, and without the empty maps
// that zero has at the same place too (all of them, if all): the fields an
// apply configuration leaves unset.
func prune(m, zero map[string]any, all bool) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			z, zeroHas := zero[k].(map[string]any)
			if sub = prune(sub, z, all); len(sub) > 0 || !all && !zeroHas {
				out[k] = sub
			}
			continue
		}
		if v != nil {
			out[k] = v
		}
	}
	return out
}

// subset reports whether every field cfg sets has that value in live:
// maps key by key, a list's elements each matching one of live's (so that
// this manager's conditions match among other managers' ones).
func subset(cfg, live any) bool {
	switch c := cfg.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range c {
			if lv, ok := l[k]; !ok || !subset(v, lv) {
				return false
			}
		}
		return true
	case []any:
		l, ok := live.([]any)
		if !ok {
			return false
		}
		for _, e := range c {
			if !slices.ContainsFunc(l, func(le any) bool { return subset(e, le) }) {
				return false
			}
		}
		return true
	}
	return sameScalar(cfg, live)
}

// sameJSON compares JSON values, numbers by value.
func sameJSON(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !sameJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		return ok && slices.EqualFunc(x, y, sameJSON)
	}
	return sameScalar(a, b)
}

// sameScalar compares JSON scalars, numbers by value whatever their Go
// type.
func sameScalar(a, b any) bool {
	if fa, ok := number(a); ok {
		fb, ok := number(b)
		return ok && fa == fb
	}
	return reflect.DeepEqual(a, b)
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}
