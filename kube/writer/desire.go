package writer

import (
	"errors"
	"fmt"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// Object is what a Writer writes: a pointer to a Kubernetes API type
// (*corev1.ConfigMap, *unstructured.Unstructured, a custom resource's Go
// type), as controller-runtime's client.Object is.
type Object interface {
	metav1.Object
	runtime.Object
}

// Change makes obj what the controller wants it to be. In ModeUpdate and
// ModePatch, obj is a private copy of the newest object the writer knows —
// the server's last answer, or the object given to Set if that is newer —
// and the change may read it (keep a condition's lastTransitionTime when
// its status stays, count what is there) as well as write it: it is a
// function of the live object, run again on a fresh copy whenever the
// server refuses a write as stale. In ModeApply, obj holds only the
// object's identity, and the change sets the fields the controller owns.
//
// A change must be a deterministic function of obj, may run more than once
// per write, and should be fast: it runs on the writer's workers, and on
// the caller's goroutine when Set tests whether anything would change.
// Its error ends the write Failed with that error. The object's namespace,
// name and UID are the writer's, not the change's: whatever the change
// sets them to, the write goes to the object the desire was for.
type Change[O Object] func(obj O) error

// Desire is what a controller wants of one object: its status, and the
// object itself (spec, labels, annotations, finalizers, owner
// references), each as a Change, nil meaning nothing. The status is written
// through the status subresource, the object through the object's own
// endpoint, in that order when both are set, so that a status lands before
// a finalizer's removal lets the object go.
type Desire[O Object] struct {
	Status Change[O]
	Object Change[O]
}

// empty reports whether d asks for nothing.
func (d Desire[O]) empty() bool { return d.Status == nil && d.Object == nil }

// change returns d's change of target t.
func (d Desire[O]) change(t target) Change[O] {
	if t == targetStatus {
		return d.Status
	}
	return d.Object
}

// CopyStatus returns the Change that sets an object's status to desired's:
// the value form of a desire ("the status should be this"). desired is
// copied once here, and its status again each time the change runs, so
// later changes to desired, or in-place edits by a change chained after
// this one, touch neither.
//
// The status is desired's field named Status, or, for an
// *unstructured.Unstructured, its "status" key. A type with neither, or a
// nil desired, gets a Change that fails with an error saying so.
func CopyStatus[O Object](desired O) Change[O] {
	if isNil(desired) {
		err := errors.New("writer: CopyStatus: desired is nil")
		return func(O) error { return err }
	}
	src, ok := desired.DeepCopyObject().(O)
	if !ok || !hasStatus(src) {
		err := fmt.Errorf("writer: CopyStatus: %T has no status", desired)
		return func(O) error { return err }
	}
	return func(obj O) error {
		fresh, _ := src.DeepCopyObject().(O)
		setStatus(obj, fresh)
		return nil
	}
}

// Chain returns the Change that runs first, then then: the merge of two
// partial desires (one sets a condition, the next another), for
// Options.Merge. A chain of n merged changes runs n changes per write.
func Chain[O Object](first, then Change[O]) Change[O] {
	switch {
	case first == nil:
		return then
	case then == nil:
		return first
	}
	return func(obj O) error {
		if err := first(obj); err != nil {
			return err
		}
		return then(obj)
	}
}

// errNoStatus is the error of a status desire for an object without one.
var errNoStatus = errors.New("has no status")

// hasStatus reports whether o has a status: a field named Status, or an
// unstructured object.
func hasStatus(o runtime.Object) bool {
	if _, ok := o.(*unstructured.Unstructured); ok {
		return true
	}
	_, ok := statusField(o)
	return ok
}

// statusKnown says whether objects of a Writer's type have a status:
// decided once from the type, or per object for an interface type.
type statusKnown uint8

const (
	statusYes statusKnown = iota
	statusNo
	statusAsk
)

// statusOfType is statusKnown for O: a pointer to a struct has a status
// if it has a field named Status (an *unstructured.Unstructured always).
func statusOfType[O Object]() statusKnown {
	t := reflect.TypeFor[O]()
	switch {
	case t == reflect.TypeFor[*unstructured.Unstructured]():
		return statusYes
	case t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct:
		return statusAsk
	}
	if f, ok := t.Elem().FieldByName("Status"); ok && f.IsExported() {
		return statusYes
	}
	return statusNo
}

// statusField returns o's field named Status.
func statusField(o runtime.Object) (reflect.Value, bool) {
	v := reflect.ValueOf(o)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	f := v.Elem().FieldByName("Status")
	return f, f.IsValid() && f.CanSet()
}

// setStatus sets dst's status to src's, sharing src's memory.
func setStatus(dst, src runtime.Object) {
	if u, ok := dst.(*unstructured.Unstructured); ok {
		s, _ := src.(*unstructured.Unstructured)
		if st, found := s.Object["status"]; found {
			if u.Object == nil {
				u.Object = map[string]any{}
			}
			u.Object["status"] = st
		} else {
			delete(u.Object, "status")
		}
		return
	}
	d, _ := statusField(dst)
	s, _ := statusField(src)
	d.Set(s)
}
