// Package fakeapi gives client-go's fake clientsets the write semantics of
// a kube-apiserver that the writer depends on, which the fakes' object
// tracker lacks: a resourceVersion bumped on every change (and not on a
// write that changes nothing), optimistic concurrency, the UID
// precondition of an update, metadata.uid refused in a patch, JSON patch
// tests, and the status subresource. It is a stand-in for tests and
// examples, not a server: server-side apply is modelled as a merge of the
// configuration (no field ownership), and an *unstructured.Unstructured
// object is treated as a custom resource (whose status writes keep the
// stored metadata, metadata.uid included). The fake clientset runs its
// reactors under one lock: a Before hook or a fault's Delay holds every
// request, not just its own.
//
// The server also serves watches (watch.go): an event for every change it
// makes, held for each watcher until it is taken, where the tracker's own
// watch panics once a watcher falls 100 events behind. A change made on
// the tracker directly is not seen by a watch.
package fakeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// Server serves a fake clientset's requests.
type Server struct {
	tracker k8stesting.ObjectTracker

	mu       sync.Mutex
	rv       int64
	watchers []*watcher
	uids     int
	calls    map[string]int
	faults   []*Fault
	before   func(Request)
	bodies   []Request
}

// Request is one request the server handled, as a test sees it.
type Request struct {
	Verb, Subresource, Name, Namespace string
	PatchType                          types.PatchType
	Body                               []byte // a patch's body
	Object                             runtime.Object
	Options                            any // metav1.UpdateOptions or PatchOptions
}

// Key is "verb" or "verb/subresource": the key of Calls and Fail.
func (r Request) Key() string {
	if r.Subresource != "" {
		return r.Verb + "/" + r.Subresource
	}
	return r.Verb
}

// Fault makes the next Times requests matching Key fail with Err after
// Delay; Times 0 means every one.
type Fault struct {
	Key   string
	Times int
	Err   error
	Delay time.Duration
}

// Install puts the server in front of f's tracker (a fake clientset's
// Fake and Tracker), and stamps objs with a UID and a resourceVersion
// before adding them.
func Install(f *k8stesting.Fake, tracker k8stesting.ObjectTracker, objs ...runtime.Object) (*Server, error) {
	s := &Server{tracker: tracker, calls: map[string]int{}}
	for _, o := range objs {
		o = o.DeepCopyObject()
		m, err := meta.Accessor(o)
		if err != nil {
			return nil, err
		}
		s.stamp(m)
		if err := tracker.Add(o); err != nil {
			return nil, err
		}
	}
	f.PrependReactor("*", "*", s.react)
	f.PrependWatchReactor("*", s.watch)
	return s, nil
}

// stamp gives a new object its UID, if none, and a resourceVersion.
func (s *Server) stamp(m metav1.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stampLocked(m)
}

func (s *Server) stampLocked(m metav1.Object) {
	if m.GetUID() == "" {
		s.uids++
		m.SetUID(types.UID(fmt.Sprintf("uid-%d", s.uids)))
	}
	s.rv++
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
}

// Fail adds a fault.
func (s *Server) Fail(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// Before sets a function run before each request is served, outside the
// server's lock: a concurrent writer's change, say.
func (s *Server) Before(f func(Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before = f
}

// Calls returns how many requests of key ("get", "update/status",
// "patch", ...) were served, faults included.
func (s *Server) Calls(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[key]
}

// Requests returns the write requests served, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.bodies...)
}

func (s *Server) react(action k8stesting.Action) (bool, runtime.Object, error) {
	r, ok := requestOf(action)
	if !ok {
		return false, nil, nil // list, watch: the tracker's
	}
	if err := s.enter(r); err != nil {
		return true, nil, err
	}
	gvr := action.GetResource()
	switch r.Verb {
	case "get":
		o, err := s.tracker.Get(gvr, r.Namespace, r.Name)
		return true, o, err
	case "create":
		o, err := s.create(gvr, r)
		return true, o, err
	case "delete":
		return true, nil, s.delete(gvr, r)
	}
	o, err := s.write(gvr, r)
	return true, o, err
}

// create serves a create under the server's lock.
func (s *Server) create(gvr schema.GroupVersionResource, r Request) (runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := r.Object.DeepCopyObject()
	m, _ := meta.Accessor(o)
	s.stampLocked(m)
	if err := s.tracker.Create(gvr, o, r.Namespace); err != nil {
		return nil, err
	}
	s.notify(gvr, r.Namespace, watch.Added, o)
	return o.DeepCopyObject(), nil
}

// delete serves a delete under the server's lock.
func (s *Server) delete(gvr schema.GroupVersionResource, r Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.tracker.Get(gvr, r.Namespace, r.Name)
	if err != nil {
		return err
	}
	if err := s.tracker.Delete(gvr, r.Namespace, r.Name); err != nil {
		return err
	}
	s.notify(gvr, r.Namespace, watch.Deleted, o)
	return nil
}

// enter counts r, runs the Before hook, and applies the first fault
// matching it.
func (s *Server) enter(r Request) error {
	s.mu.Lock()
	s.calls[r.Key()]++
	if r.Verb == "update" || r.Verb == "patch" {
		s.bodies = append(s.bodies, r)
	}
	before := s.before
	var fault *Fault
	for i, f := range s.faults {
		if f.Key == r.Key() {
			fault = f
			if f.Times > 0 {
				if f.Times--; f.Times == 0 {
					s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
				}
			}
			break
		}
	}
	s.mu.Unlock()
	if before != nil {
		before(r)
	}
	if fault == nil {
		return nil
	}
	time.Sleep(fault.Delay)
	return fault.Err
}

func requestOf(action k8stesting.Action) (Request, bool) {
	r := Request{Verb: action.GetVerb(), Subresource: action.GetSubresource(), Namespace: action.GetNamespace()}
	switch a := action.(type) {
	case k8stesting.GetActionImpl:
		r.Name = a.GetName()
	case k8stesting.CreateActionImpl:
		r.Object = a.GetObject()
		if m, err := meta.Accessor(r.Object); err == nil {
			r.Name = m.GetName()
		}
	case k8stesting.DeleteActionImpl:
		r.Name = a.GetName()
	case k8stesting.UpdateActionImpl:
		r.Object, r.Options = a.GetObject(), a.UpdateOptions
		if m, err := meta.Accessor(r.Object); err == nil {
			r.Name = m.GetName()
		}
	case k8stesting.PatchActionImpl:
		r.Name, r.PatchType, r.Body, r.Options = a.GetName(), a.GetPatchType(), a.GetPatch(), a.PatchOptions
	default:
		return r, false
	}
	return r, true
}

// write serves an update or a patch under the server's lock, so that
// writes to one object are serialized as etcd serializes them.
func (s *Server) write(gvr schema.GroupVersionResource, r Request) (runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.tracker.Get(gvr, r.Namespace, r.Name)
	if err != nil {
		return nil, err
	}
	gr := gvr.GroupResource()
	var next runtime.Object
	if r.Verb == "update" {
		next, err = updated(gr, r, cur)
	} else {
		next, err = patched(gr, r, cur)
	}
	if err != nil {
		return nil, err
	}
	next = stored(r.Subresource, cur, next)
	if reflect.DeepEqual(next, cur) {
		return cur, nil // no change: no new resourceVersion, no event
	}
	s.rv++
	m, _ := meta.Accessor(next)
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	if err := s.tracker.Update(gvr, next, r.Namespace); err != nil {
		return nil, err
	}
	s.notify(gvr, r.Namespace, watch.Modified, next)
	return next.DeepCopyObject(), nil
}

// updated checks an update's preconditions, as the storage does: the UID
// in the object's metadata, then its resourceVersion.
func updated(gr schema.GroupResource, r Request, cur runtime.Object) (runtime.Object, error) {
	cm, _ := meta.Accessor(cur)
	nm, err := meta.Accessor(r.Object)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if uid := nm.GetUID(); uid != "" && uid != cm.GetUID() {
		//lint:ignore ST1005 the storage's own message
		return nil, apierrors.NewConflict(gr, r.Name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", uid, cm.GetUID()))
	}
	if rv := nm.GetResourceVersion(); rv != "" && rv != cm.GetResourceVersion() {
		return nil, apierrors.NewConflict(gr, r.Name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	next := r.Object.DeepCopyObject()
	m, _ := meta.Accessor(next)
	m.SetUID(cm.GetUID())
	m.SetCreationTimestamp(cm.GetCreationTimestamp())
	return next, nil
}

// patched applies a patch to the stored object's JSON, then refuses a
// changed metadata.uid (but in a custom resource's status, whose strategy
// keeps the stored metadata) or resourceVersion.
func patched(gr schema.GroupResource, r Request, cur runtime.Object) (runtime.Object, error) {
	doc, err := json.Marshal(cur)
	if err != nil {
		return nil, err
	}
	switch r.PatchType {
	case types.JSONPatchType:
		p, err := jsonpatch.DecodePatch(r.Body)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if doc, err = p.Apply(doc); err != nil {
			return nil, apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", err.Error(), 0, false)
		}
	case types.MergePatchType, types.ApplyPatchType:
		if doc, err = jsonpatch.MergePatch(doc, r.Body); err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
	default:
		return nil, apierrors.NewBadRequest("unsupported patch type " + string(r.PatchType))
	}
	next, err := decodeLike(cur, doc)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	cm, _ := meta.Accessor(cur)
	nm, _ := meta.Accessor(next)
	_, custom := cur.(*unstructured.Unstructured)
	if nm.GetUID() != cm.GetUID() && !(custom && r.Subresource == "status") {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: gr.Resource}, r.Name, field.ErrorList{
			field.Invalid(field.NewPath("metadata", "uid"), nm.GetUID(), "field is immutable"),
		})
	}
	if nm.GetResourceVersion() != cm.GetResourceVersion() {
		return nil, apierrors.NewConflict(gr, r.Name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	return next, nil
}

func decodeLike(like runtime.Object, doc []byte) (runtime.Object, error) {
	if _, ok := like.(*unstructured.Unstructured); ok {
		u := &unstructured.Unstructured{}
		return u, u.UnmarshalJSON(doc)
	}
	o, _ := reflect.New(reflect.TypeOf(like).Elem()).Interface().(runtime.Object)
	return o, json.Unmarshal(doc, o)
}

// stored is what a write through sub leaves: through status, the stored
// object with next's status; through the object, next with the stored
// status (for a type that has one).
func stored(sub string, cur, next runtime.Object) runtime.Object {
	if sub == "status" {
		out := cur.DeepCopyObject()
		copyStatus(out, next)
		return out
	}
	copyStatus(next, cur)
	return next
}

func copyStatus(dst, src runtime.Object) {
	if u, ok := dst.(*unstructured.Unstructured); ok {
		s, _ := src.(*unstructured.Unstructured)
		if st, found := s.Object["status"]; found {
			u.Object["status"] = runtime.DeepCopyJSONValue(st)
		} else {
			delete(u.Object, "status")
		}
		return
	}
	d := reflect.ValueOf(dst).Elem().FieldByName("Status")
	if d.IsValid() {
		d.Set(reflect.ValueOf(src.DeepCopyObject()).Elem().FieldByName("Status"))
	}
}

// Change changes a stored object as another client's write would: f edits
// a copy, which is stored with a new resourceVersion. It does not go
// through the fake clientset, so it may be called from a Before hook.
func (s *Server) Change(gvr schema.GroupVersionResource, ns, name string, f func(runtime.Object)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.tracker.Get(gvr, ns, name)
	if err != nil {
		return err
	}
	next := cur.DeepCopyObject()
	f(next)
	s.rv++
	m, _ := meta.Accessor(next)
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	return s.tracker.Update(gvr, next, ns)
}

// Recreate deletes the object obj names and creates obj in its place,
// with a new UID: another object of the same name.
func (s *Server) Recreate(gvr schema.GroupVersionResource, obj runtime.Object) error {
	o := obj.DeepCopyObject()
	m, err := meta.Accessor(o)
	if err != nil {
		return err
	}
	if err := s.tracker.Delete(gvr, m.GetNamespace(), m.GetName()); err != nil {
		return err
	}
	m.SetUID("")
	s.stamp(m)
	return s.tracker.Create(gvr, o, m.GetNamespace())
}
