package writer

import (
	"reflect"
	"slices"
	"sync"

	"github.com/coalescer/dispatch"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// op is one write: the dispatcher's call value for an object's lane. Set
// makes one per desire; a newer one is merged into a pending one
// (mergeOps). Per lane one op runs at a time, so the fields the worker
// writes are the worker's while the call runs, and its waiters' once the
// call has ended.
type op[O Object] struct {
	obj    O // as given: identity, and a baseline if it has a resourceVersion
	uid    types.UID
	desire Desire[O]
	class  string

	prep    [numTargets]prepared[O] // the no-op test's work, reused to send
	strict  bool                    // ModePatch: a patch was refused; test the resourceVersion
	reread  bool                    // a write was refused as stale: read before the next
	counted [numTargets]bool        // the target was written, or its no-op is in Stats.NoOps
	landed  [numTargets]bool        // the target's write was accepted: a retry of the other does not resend it
	out     O                       // the object as the server last returned it
	writes  int                     // write requests the server accepted
}

// prepared is a change applied, and judged.
type prepared[O Object] struct {
	base    O // what it was applied to (ModeApply: judged against); nil if none
	desired O
	noop    bool
	done    bool // computed for base
}

// mergeOps is the dispatcher's Merge: incoming, holding per target the
// merge of its change with pending's (unless pending's landed: then
// incoming's alone), the newer of the two baselines, and pending's
// progress (a write that landed before a retry, a refusal that calls for
// a read, a target written or counted a no-op whose change is still
// pending's). The work Set's no-op test did for incoming's own
// change is kept only for a target pending does not change: a merged
// change has not run yet.
func (w *Writer[O]) mergeOps(pending, incoming *op[O]) (*op[O], error) {
	out := incoming
	out.obj = newer(incoming.obj, pending.obj)
	for t := range numTargets {
		if pending.desire.change(t) != nil {
			out.prep[t] = prepared[O]{}
		}
		if incoming.desire.change(t) == nil { // the target's change stays pending's
			out.counted[t] = pending.counted[t]
			out.landed[t] = pending.landed[t]
		}
	}
	out.desire = Desire[O]{
		Status: w.mergeChange(pending.live(targetStatus), incoming.desire.Status),
		Object: w.mergeChange(pending.live(targetObject), incoming.desire.Object),
	}
	out.out, out.writes = pending.out, pending.writes
	out.strict, out.reread = pending.strict, pending.reread
	return out, nil
}

// live is p's change of target t, unless its write has landed: what a
// newer change of t merges with.
func (p *op[O]) live(t target) Change[O] {
	if p.landed[t] {
		return nil
	}
	return p.desire.change(t)
}

// mergeChange merges two changes of one target. The user's Merge runs
// later, inside the merged change, where a change runs (see call): never
// under the dispatcher's lock, which Merge could block or re-enter.
func (w *Writer[O]) mergeChange(pending, incoming Change[O]) Change[O] {
	switch {
	case incoming == nil:
		return pending
	case pending == nil || w.merge == nil:
		return incoming
	}
	merge := w.merge
	return func(obj O) error {
		if m := merge(pending, incoming); m != nil {
			return m(obj)
		}
		return nil
	}
}

// newer returns b if it is known to be newer than a (a larger
// resourceVersion), else a, or whichever is not nil.
func newer[O Object](a, b O) O {
	switch {
	case isNil(b) || b.GetResourceVersion() == "":
		return a
	case isNil(a) || a.GetResourceVersion() == "":
		return b
	}
	if c, err := resourceversion.CompareResourceVersion(a.GetResourceVersion(), b.GetResourceVersion()); err == nil && c < 0 {
		return b
	}
	return a
}

// copyOf returns a deep copy of o.
func copyOf[O Object](o O) O {
	c, _ := o.DeepCopyObject().(O)
	return c
}

// skeleton returns an empty object of like's type with p's identity: what a
// ModeApply change sets its fields on.
func skeleton[O Object](like O, uid types.UID) O {
	var obj O
	if u, ok := any(like).(*unstructured.Unstructured); ok {
		n := &unstructured.Unstructured{Object: map[string]any{}}
		n.SetAPIVersion(u.GetAPIVersion())
		n.SetKind(u.GetKind())
		obj, _ = any(n).(O)
	} else {
		obj, _ = reflect.New(reflect.TypeOf(like).Elem()).Interface().(O)
		obj.GetObjectKind().SetGroupVersionKind(like.GetObjectKind().GroupVersionKind())
	}
	obj.SetName(like.GetName())
	obj.SetNamespace(like.GetNamespace())
	obj.SetUID(uid)
	return obj
}

// known keeps, per object UID, the object as the server last returned it:
// the freshest baseline a write can have. An object is kept while its
// object's lane lives (Writer.done forgets it when the lane ends), so
// their memory is bounded by the dispatcher's capacity. What outlives the
// lane is its resourceVersion alone, for up to capacity objects, oldest
// first out: a desire that comes later with an older object (an
// informer's, not yet caught up with the writer's own write) is then known
// to hold a stale view, which the writer neither trusts to judge a no-op
// nor sends as a baseline; it reads the object instead.
type known[O Object] struct {
	mu    sync.Mutex
	m     map[types.UID]entry[O]
	stamp uint64 // counts remembers: an entry's age

	versions map[types.UID]version // of ended lanes
	// ring holds versions' keys, oldest first, each with the stamp of its
	// version: an entry whose stamp is not its key's version's any more
	// (the object's lane ended again since, or it was forgotten) is
	// skipped, and dropped when the ring is compacted.
	ring     []ringEntry
	capacity int
}

type ringEntry struct {
	uid   types.UID
	stamp uint64
}

type entry[O Object] struct {
	obj   O
	stamp uint64
}

type version struct {
	rv    string
	stamp uint64
}

func (k *known[O]) init(capacity int) {
	k.m = make(map[types.UID]entry[O])
	k.versions = make(map[types.UID]version)
	k.capacity = capacity
}

func (k *known[O]) get(uid types.UID) O {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[uid].obj
}

// stale reports whether obj is older than the last answer the server gave
// for its object, as remembered after its lane ended.
func (k *known[O]) stale(uid types.UID, obj O) bool {
	k.mu.Lock()
	v, ok := k.versions[uid]
	k.mu.Unlock()
	if !ok {
		return false
	}
	c, err := resourceversion.CompareResourceVersion(obj.GetResourceVersion(), v.rv)
	return err == nil && c < 0
}

func (k *known[O]) remember(uid types.UID, obj O) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stamp++
	k.m[uid] = entry[O]{obj, k.stamp}
}

// now returns the stamp of the latest remember.
func (k *known[O]) now() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stamp
}

// end forgets uid's object unless it was remembered after stamp s (by a
// new lane), keeping its resourceVersion.
func (k *known[O]) end(uid types.UID, s uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.m[uid]
	if !ok || e.stamp > s {
		return
	}
	delete(k.m, uid)
	if k.capacity <= 0 {
		return
	}
	k.versions[uid] = version{e.obj.GetResourceVersion(), e.stamp}
	k.ring = append(k.ring, ringEntry{uid, e.stamp})
	for len(k.versions) > k.capacity {
		old := k.ring[0]
		k.ring = k.ring[1:]
		if k.live(old) {
			delete(k.versions, old.uid)
		}
	}
	if len(k.ring)-k.capacity > k.capacity { // twice the capacity, which may not fit in an int
		k.ring = slices.DeleteFunc(slices.Clone(k.ring), func(r ringEntry) bool { return !k.live(r) })
	}
}

// live reports whether r is its object's current version in the ring.
func (k *known[O]) live(r ringEntry) bool {
	v, ok := k.versions[r.uid]
	return ok && v.stamp == r.stamp
}

func (k *known[O]) forget(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, uid)
	delete(k.versions, uid)
}

func (k *known[O]) clear() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.m)
	clear(k.versions)
	k.ring = nil
}

func (k *known[O]) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// done is the dispatcher's OnDone: once the object's lane has ended, what
// the writer knew of the object is forgotten (a desire that comes later
// brings its own baseline); then the user's hook.
func (w *Writer[O]) done(r dispatch.Result[types.UID, *op[O]]) {
	s := w.known.now()
	if !w.d.Busy(r.Key) {
		w.known.end(r.Key, s) // an entry remembered since is a new lane's
	}
	if w.onDone != nil {
		w.onDone(resultOf(r, true))
	}
}
