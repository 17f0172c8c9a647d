// Package writer writes the desired state of Kubernetes objects — status
// first, and the object itself (labels, annotations, finalizers, spec) —
// in the background, for a controller: a Reconcile says what an object
// should look like and returns at once; the writer coalesces, skips what
// changes nothing, fences, orders, limits, retries and reports. It runs on
// the dispatch library, with client-go's typed and dynamic clients (Typed,
// Dynamic); controller-runtime's client is adapted by the separate module
// github.com/coalescer/dispatch/kube/writer/crclient, so that client-go
// users never build controller-runtime.
//
// # Mental model
//
// A Writer[O] serves one Go type of object (a pointer type, such as
// *corev1.ConfigMap or *unstructured.Unstructured). A desire is a Change —
// a function that makes an object what it should be — for the status, the
// object, or both (Desire). Set hands one over, fire and forget; Submit
// returns a Ticket for a caller that must know the write landed (a
// finalizer's removal before the object may go).
//
//	w, err := writer.New(writer.Typed(func(ns string) writer.TypedClient[*v1.Widget] {
//		return clientset.ExampleV1().Widgets(ns)
//	}), writer.Options[*v1.Widget]{Classes: map[string]int{"ready": 10, "routine": 0}})
//	defer w.Close(ctx)
//
//	// In Reconcile, with the object as the informer gave it:
//	err = w.Set(widget, writer.Desire[*v1.Widget]{Status: func(o *v1.Widget) error {
//		meta.SetStatusCondition(&o.Status.Conditions, ready) // keeps lastTransitionTime if unchanged
//		o.Status.ObservedGeneration = o.Generation
//		return nil
//	}}, writer.SetOptions{Class: "ready"})
//
// # One lane per object
//
// Desires are keyed by the object's UID: per object at most one write is in
// flight and one is pending. A desire for an object with a pending write
// is merged into it — per target, the newest change replaces the pending
// one (it is the whole truth), or Options.Merge combines them (Chain runs
// both) — so ten desires in a second cost one write, not ten. A desire for
// an object whose write is in flight waits, and is then applied to the
// object that write returned. A target whose write landed is not written
// again for the same desire: when the object's write after it is retried,
// the status is not resent, and a desire merged into that retry is merged
// with nothing there (its change is written alone).
//
// # Nothing sent for nothing
//
// The writer keeps, per object with a write queued or in flight, the
// object as the server last returned it, and takes the object given to
// Set if that is newer (a larger resourceVersion): the baseline. The
// change is applied to a copy of the baseline; if the result equals the
// baseline in the part written (the status; or the body, labels,
// annotations, finalizers and owner references) — nil and empty equal
// (in an unstructured object, a null and an absent key too), timestamps
// compared as instants — nothing is sent: no request, no new
// resourceVersion, no watch event, no reconcile triggered by the
// controller's own write. Set runs that test at once when the object has
// nothing queued, and then queues nothing at all (no queue slot, no
// token); otherwise the worker runs it just before the write. A change
// must therefore be a deterministic function of the object: stamp a
// condition's lastTransitionTime only when its status changes
// (meta.SetStatusCondition does). In ModePatch, a change that differs
// from the object only below what JSON keeps (a time within the same
// second) is found a no-op only by the worker, after the write took its
// token: it ends Skipped, and nothing is sent.
//
// When an object's lane ends, its baseline is forgotten (memory is bounded
// by the objects with a write queued or in flight); only its
// resourceVersion is kept, for up to Options.Capacity objects, so that a
// later desire given an object older than the writer's own last write
// (an informer not caught up yet) is read fresh instead of trusted.
//
// # Modes, and what a write costs
//
// A write is one request when the baseline is fresh; a desire that changes
// nothing is none. Beyond that, by Options.Mode:
//
//   - ModeUpdate (default): a replacement carrying the baseline's
//     resourceVersion. If someone else wrote first (409), one read and the
//     change applied again to what was read — never overwriting their
//     change — then one more write (or none, if the desire is now met).
//     An object given without a resourceVersion costs one read first.
//   - ModePatch: a JSON patch of the fields the change changed, each tested
//     against the value it replaces: a refusal only when someone else
//     changed one of those very fields (a list is one field); then one read
//     and one patch tested against the read resourceVersion.
//   - ModeApply: a server-side apply (Options.FieldManager) of the fields
//     the change sets on an object holding only the identity. The body is
//     that object as JSON, without nulls: for a typed object, every field
//     whose JSON tag has no omitempty is sent, a zero one too (a
//     PodDisruptionBudget's status counts, say), and is then this
//     manager's — but the empty struct of such a field the change left
//     alone, while an empty struct it set (a securityContext: {}) is sent;
//     apply *unstructured.Unstructured objects (Dynamic) to send only what
//     the change sets, an empty map too. No read (but with Options.ApplyResourceVersion, below);
//     no conflict on fields this manager owns. A field another manager owns
//     is a 409 that no re-read resolves: the write fails at once, unless
//     Options.Force takes such fields over. Its no-op test is that every
//     field set already has that value live (a list's elements matched by
//     content, so that this manager's condition is found among others'):
//     a desire that only stops setting a field is therefore not sent on its
//     own, and set timestamps from the object given to Set, or every apply
//     differs.
//
// Every further request of a write (the read after a conflict; the
// object's write after its status's) takes a token of its own, so
// Options.QPS bounds requests, not writes.
//
// # Fencing
//
// A write never lands on another object that took the name of the one it
// was meant for (deleted and recreated: a new UID). The apiserver
// (k8s.io/apiserver v0.37) enforces it differently per request:
//
//   - An update carrying metadata.uid: the handler makes the UID a storage
//     precondition (rest.DefaultUpdatedObjectInfo's Preconditions), checked
//     against the stored object before anything else, for every resource
//     and subresource: a 409 ("Precondition failed: UID in
//     precondition"). ModeUpdate always sends the UID.
//   - A patch or an apply carrying metadata.uid: the patch handler sets no
//     precondition; the changed UID is refused by update validation as an
//     immutable field (422, cause metadata.uid) — except where the
//     resource's status strategy first copies the stored object over the
//     request: a custom resource's status (apiextensions-apiserver's
//     statusStrategy.PrepareForUpdate), where the body's UID is silently
//     replaced and the write lands.
//   - A JSON patch's "test" of /metadata/uid runs against the stored
//     object before any strategy, for every resource: a 422. ModePatch
//     always starts with it.
//   - A resourceVersion in a patch or apply body is compared with the
//     stored one (409); etcd revisions only grow, so a recreated object
//     never has the old one's.
//
// So ModeUpdate and ModePatch are fenced everywhere; ModeApply is fenced by
// the UID on every object endpoint and built-in type's status, but a
// custom resource's status needs Options.ApplyResourceVersion (the apply
// then also carries the baseline's resourceVersion, a desire without one —
// its object given with none, or older than the writer's own last write —
// reads the object first, and a conflict is re-read as in ModeUpdate). A fenced write, or a write to an object that
// is gone, ends Failed with ErrReplaced or ErrGone and is not retried; the
// writer reads the object to tell a refusal from a conflict when the answer
// does not say, and to tell a status write's 404 from a resource without a
// status subresource (a custom resource whose definition declares none is
// answered as a deleted object is), whose write fails with an error saying
// so, not ErrGone. Call Forget from the informer's delete handler to end
// what waits at once.
//
// # Order, rate, tenants
//
// Each desire names a class (SetOptions.Class, Options.Classes) whose
// priority orders the queue, with aging within a band (a Ready flip at 10
// is written before every routine write at 0, however old). The writer
// takes each request's token (Options.QPS) before it chooses the write to
// send, so the most urgent write gets the next token; give its client no
// limit of its own (RESTConfig). Options.Tenancy makes each namespace (or
// kind, a typed object's told by its scheme) a tenant with its own quota
// (Options.DefaultTenant) and a fair
// share at equal priority, so one noisy namespace cannot starve the
// others. A full writer refuses a new object's desire
// (dispatch.ErrBackpressure) unless it outranks a droppable one.
//
// # Errors and retries
//
// kube.Classify judges the API's errors (Options.Classify to replace it):
// 429, 5xx, timeouts and broken connections are retried with backoff in
// the queue, never asleep in a worker — a server's Retry-After is the
// backoff (with a client built from RESTConfig, client-go neither sleeps
// it out first nor resends a read whose connection broke); a conflict is
// re-read and re-applied at once; the rest fail. A desire ends exactly
// once, in one dispatch.State, told to its Ticket, to Options.OnDone and
// to the Observer (a *dispatchprom.Observer exports it to Prometheus,
// labelled by class and tenant) — but a write in flight that Close gave
// up on, whose desires hear Closed, reaches OnDone Stale once its request
// returns (it may have landed), and a desire Set finds already met, with
// nothing queued for its object, which ends there, Skipped, without
// reaching the queue: Stats counts it (Desires, NoOps), and neither OnDone
// nor the Observer hears of it. Stats counts
// what the writes cost: desires, writes sent and accepted, reads, no-ops,
// conflicts re-applied, fenced writes.
//
// # Callbacks
//
// A Change (and Options.Merge, which runs inside the merged change, never
// under the dispatcher's lock) is user code. Whatever it does the writer
// goes on: an error or a panic (or runtime.Goexit) ends its write Failed
// (a *dispatch.PanicError), never retried; one that blocks holds its write
// until the write's deadline, its cancellation or Close ends it; it may
// call the Writer, and Close called from a change returns
// dispatch.ErrReentrant instead of waiting for itself (it finishes in the
// background, and a later Close waits for it). Set runs the change
// once on the caller's goroutine to test for a no-op: a panic there is
// recovered and the desire queued (its write then fails), but a change that
// blocks there blocks Set, one that calls Close there closes the writer as
// the caller's Close would (it waits, and Set then returns
// dispatch.ErrClosed), and one that calls runtime.Goexit there ends the
// caller's goroutine, as any code it runs could, before anything is
// queued.
//
// Options.Classify, Options.OnDone and the Observer are the dispatcher's
// callbacks, run on its goroutines with no deadline of their own: a panic
// in one is contained (Classify's fails its write), but one that blocks
// holds its worker, and Close, past Close's ctx, until it returns. Keep
// them fast.
//
// # Concurrency
//
// A Writer is safe for concurrent use, and so is a Ticket. An object given
// to Set is read, never written, until its write is done: do not modify
// it meanwhile (informer objects never are). Results carry the server's
// objects: treat them as read-only, as informer objects.
package writer
