package writer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/preset"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Writer writes the desired state of objects of type O in the background:
// one lane per object UID, the newest desire coalesced into the pending
// one, nothing sent when nothing would change, every write fenced by the
// object's UID, by priority of class, fair across tenants, at a bounded
// rate. Create one with New; the zero value is not usable. A Writer is
// safe for concurrent use.
type Writer[O Object] struct {
	d       *dispatch.Dispatcher[types.UID, *op[O]]
	c       Client[O]
	mode    Mode
	manager string
	force   bool
	applyRV bool
	classes map[string]int
	tenancy Tenancy
	merge   func(pending, incoming Change[O]) Change[O]
	onDone  func(Result[O])
	// limiter charges a write's requests after its first, whose token the
	// dispatcher took before it chose the write.
	limiter  dispatch.RateLimiter
	classify func(error) dispatch.Class
	known    known[O]
	n        counters
	// closing is set once Close begins: Set and Submit refuse from then
	// on, a desire already met too.
	closing  atomic.Bool
	changing changes
	// behind counts the Closes a change began, each finishing on a
	// goroutine of its own (listed in closers): a later Close waits for
	// them.
	behind  sync.WaitGroup
	closers changes
	// status says whether O has a status to write.
	status statusKnown
	// zero is, per target, an empty O's unstructured form (zeroOf): the
	// zero structs ModeApply does not send.
	zero [numTargets]map[string]any
	// kinds holds, by Go type, the tenant of a typed object given without
	// its kind under TenancyKind (kindTenant).
	kinds sync.Map
}

// SetOptions are one desire's settings; the zero value is valid: class "",
// the Writer's tenancy, no deadline, never shed.
type SetOptions struct {
	// Class names the write's class (Options.Classes): its priority and its
	// label in Stats and metrics.
	Class string
	// Tenant, if set, is the write's tenant instead of the one
	// Options.Tenancy gives.
	Tenant string
	// Deadline, if set, ends the desire Expired if it has not been written
	// by then (with Submit, the context's deadline counts too).
	Deadline time.Time
	// Timeout, if positive, is a deadline that long after the Set or
	// Submit, on the dispatcher's own clock (dispatch.SubmitOptions.Timeout);
	// with Deadline or the context's deadline too, the earliest counts. A
	// negative one has passed already: the desire is refused (ErrExpired).
	Timeout time.Duration
	// Droppable lets a full writer shed this desire for a more urgent
	// one (it ends Dropped): a routine write the next reconcile will make
	// again.
	Droppable bool
}

// New returns a Writer that sends its writes through c, configured by o.
// It starts no goroutine until the first write. A bad option is reported
// here, naming the Options field the caller set ("writer: Options.QPS …"),
// a setting passed through to the dispatcher as well ("writer:
// Options.ReservedWorkers …"); dispatch.New's error stays wrapped.
func New[O Object](c Client[O], o Options[O]) (*Writer[O], error) {
	if c == nil || reflect.ValueOf(c).Kind() == reflect.Pointer && reflect.ValueOf(c).IsNil() {
		return nil, errors.New("writer: New: client is nil")
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	w := &Writer[O]{
		c: c, mode: o.Mode, manager: o.FieldManager, force: o.Force, applyRV: o.ApplyResourceVersion,
		classes: o.Classes, tenancy: o.Tenancy, merge: o.Merge, onDone: o.OnDone,
		limiter: o.limiter(), classify: o.Classify, status: statusOfType[O](), zero: zeroOf[O](),
	}
	if w.manager == "" {
		w.manager = defaultManager
	}
	w.known.init(capacityOf(o.Capacity))
	d, err := dispatch.New(w.exec, w.config(&o))
	if err != nil {
		// The options passed through keep their Config names (config), but
		// ReservedWorkers, which goes to Config.Start, and the urgent
		// priority there, which the writer takes from Classes.
		return nil, preset.OptionsErr("writer:", err,
			[2]string{"Start.ReservedWorkers", "ReservedWorkers"}, [2]string{"Start.UrgentPriority", "Classes"})
	}
	w.d = d
	return w, nil
}

// config is the dispatcher's configuration: the writer's rules and the
// options passed through.
func (w *Writer[O]) config(o *Options[O]) dispatch.Config[types.UID, *op[O]] {
	return dispatch.Config[types.UID, *op[O]]{
		Workers:       o.Workers,
		RateLimit:     w.limiter,
		Capacity:      o.Capacity,
		MaxWaiters:    o.MaxWaiters,
		Merge:         w.mergeOps,
		Classify:      w.judge,
		BeforeRetry:   w.beforeRetry,
		Retry:         o.retry(),
		OnDone:        w.done,
		Observer:      o.Observer,
		Aging:         o.Aging,
		AgingBand:     o.AgingBand,
		Label:         func(_ types.UID, p *op[O]) string { return p.class },
		Tenants:       o.Tenants,
		DefaultTenant: o.DefaultTenant,
		Breaker:       o.Breaker,
		Start:         dispatch.StartPolicy{ReservedWorkers: o.ReservedWorkers, UrgentPriority: urgent(o.Classes)},
	}
}

// capacityOf is Options.Capacity with the dispatcher's default: how many
// ended lanes' resourceVersions the writer keeps.
func capacityOf(c int) int {
	if c == 0 {
		return defaultCapacity
	}
	return c
}

// urgent is the highest priority of classes, the class "" included (0
// unless named), whatever their sign.
func urgent(classes map[string]int) int {
	top := classes[""]
	for _, p := range classes {
		top = max(top, p)
	}
	return top
}

// Set hands a desire for obj to the writer and returns at once, from a
// Reconcile say: fire and forget. obj is the object as the controller read
// it (from an informer's cache, or a Get): the writer takes its namespace,
// name and UID — the lane and the fence — and, if it has a
// resourceVersion and is newer than what the writer last heard from the
// server, uses it as the baseline the change is applied to. obj is read,
// never written, until the write is done: do not modify it meanwhile.
//
// If the object already has a pending desire, d is merged into it
// (Options.Merge, per target); if its write is in flight, d is written
// after it, against the object that write returns. If nothing is pending
// or in flight and d would change nothing on obj, nothing is queued and
// Set returns nil: no request, no token, no watch event.
//
// Set returns an error, and queues nothing, for an obj without a UID or a
// name, an empty desire, an unknown class, an object whose kind
// TenancyKind cannot tell, or when the writer is closed
// (dispatch.ErrClosed) or full (dispatch.ErrBackpressure). The outcome of
// a queued desire reaches Options.OnDone, the Observer and Stats; a desire
// found met here reaches Stats alone.
func (w *Writer[O]) Set(obj O, d Desire[O], o SetOptions) error {
	p, so, err := w.newOp(obj, d, o)
	if err != nil {
		return err
	}
	if err := w.refused(context.Background(), o); err != nil {
		return err
	}
	if w.moot(p) {
		return nil
	}
	return w.d.Post(p.uid, p, so)
}

// Submit is Set with a Ticket on the outcome, for a caller that must know
// the write landed (a finalizer's removal, say): Ticket.Wait returns the
// object as the server returned it. ctx scopes this caller's interest: if
// it ends first, this submission ends Canceled or Expired, and the write
// goes on for any other submissions merged into it. A desire that would
// change nothing returns a Ticket already Skipped.
func (w *Writer[O]) Submit(ctx context.Context, obj O, d Desire[O], o SetOptions) (*Ticket[O], error) {
	p, so, err := w.newOp(obj, d, o)
	if err != nil {
		return nil, err
	}
	if err := w.refused(ctx, o); err != nil {
		return nil, err
	}
	if w.moot(p) {
		return skippedTicket(p), nil
	}
	t, err := w.d.Submit(ctx, p.uid, p, so)
	if err != nil {
		return nil, err
	}
	return &Ticket[O]{t: t}, nil
}

// refused is the error for a submission to a closing writer, or whose
// context is done or whose deadline (o's) has passed, as the dispatcher
// would give it: Set's no-op test, which runs before the dispatcher sees
// the desire, must not accept what the dispatcher would refuse.
func (w *Writer[O]) refused(ctx context.Context, o SetOptions) error {
	err := ctx.Err()
	switch {
	case w.closing.Load():
		return dispatch.ErrClosed
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", dispatch.ErrExpired, err)
	case err != nil:
		return fmt.Errorf("%w: %w", dispatch.ErrCanceled, err)
	case o.Timeout < 0:
		return fmt.Errorf("%w: SetOptions.Timeout %v is negative", dispatch.ErrExpired, o.Timeout)
	case !o.Deadline.IsZero() && !time.Now().Before(o.Deadline):
		return fmt.Errorf("%w: SetOptions.Deadline %s has passed", dispatch.ErrExpired, o.Deadline.Format(time.RFC3339Nano))
	}
	return nil
}

// newOp checks a desire and makes it the dispatcher's call value.
func (w *Writer[O]) newOp(obj O, d Desire[O], o SetOptions) (*op[O], dispatch.SubmitOptions, error) {
	var so dispatch.SubmitOptions
	switch {
	case isNil(obj):
		return nil, so, errors.New("writer: obj is nil")
	case obj.GetUID() == "":
		return nil, so, fmt.Errorf("writer: obj %s has no UID: give the object as read from the server", key(obj))
	case obj.GetName() == "":
		return nil, so, fmt.Errorf("writer: obj of UID %s has no name", obj.GetUID())
	case d.empty():
		return nil, so, fmt.Errorf("writer: desire for %s is empty: set Status or Object", key(obj))
	}
	prio, ok := w.classes[o.Class]
	if !ok && o.Class != "" {
		return nil, so, fmt.Errorf("writer: SetOptions.Class %q is not in Options.Classes", o.Class)
	}
	so = dispatch.SubmitOptions{Priority: prio, Deadline: o.Deadline, Timeout: o.Timeout, Tenant: o.Tenant, Droppable: o.Droppable}
	if so.Tenant == "" {
		t, err := w.tenantOf(obj)
		if err != nil {
			return nil, so, err
		}
		so.Tenant = t
	}
	return &op[O]{obj: obj, uid: obj.GetUID(), desire: d, class: o.Class}, so, nil
}

// moot reports whether p may end at once, unsent: its object has nothing
// queued or in flight, and p changes nothing on the newest object known.
// If another desire for the object is admitted meanwhile, the two were
// concurrent, and p comes first.
func (w *Writer[O]) moot(p *op[O]) bool {
	if w.d.Busy(p.uid) || !w.unneededHere(p) {
		return false
	}
	w.n.moot.Add(1)
	return true
}

// tenantOf is obj's tenant under Options.Tenancy.
func (w *Writer[O]) tenantOf(obj O) (string, error) {
	switch w.tenancy {
	case TenancyNamespace:
		return obj.GetNamespace(), nil
	case TenancyKind:
		return w.kindTenant(obj)
	}
	return "", nil
}

// kindTenant is obj's group and kind (TenancyKind): its own if it names a
// kind, else, for a typed object whose TypeMeta is empty (as typed clients
// and informers leave it), its type's, as an apply names it (kindOf), kept
// per type.
func (w *Writer[O]) kindTenant(obj O) (string, error) {
	if gvk := obj.GetObjectKind().GroupVersionKind(); gvk.Kind != "" {
		return gvk.GroupKind().String(), nil
	}
	typ := reflect.TypeOf(obj)
	if k, ok := w.kinds.Load(typ); ok {
		return k.(string), nil
	}
	gvk, err := w.kindOf("Options.Tenancy TenancyKind (or give the write a SetOptions.Tenant)", obj)
	if err != nil {
		return "", err
	}
	k := gvk.GroupKind().String()
	if _, ok := any(obj).(runtime.Unstructured); !ok { // an unstructured object's kind is its own, not its type's
		w.kinds.Store(typ, k)
	}
	return k, nil
}

// Forget ends every desire for the object of UID uid that has not been
// written, Canceled with ErrGone, cancels its write in flight, and forgets
// what the writer knows of it. Call it when the object is deleted (from an
// informer's delete handler). It reports whether there was a desire to end.
func (w *Writer[O]) Forget(uid types.UID) bool {
	ended := w.d.Cancel(uid, ErrGone)
	w.known.forget(uid)
	return ended
}

// Busy reports whether the object of UID uid has a desire not yet written:
// queued, waiting for a retry, or in flight.
func (w *Writer[O]) Busy(uid types.UID) bool { return w.d.Busy(uid) }

// Close stops taking desires (ErrClosed), writes what is queued, most
// urgent first, until ctx ends, then ends the rest Closed — each reaches
// Options.OnDone with its object's identity, so it can be requeued (a
// write in flight is cancelled, and reaches OnDone Stale if its request
// returned anyway: it may have landed) — and returns once every request
// has returned. It returns nil if it ended no desire itself — each
// reached its own outcome, written, found met or failed, which OnDone and
// its Ticket tell — else an error that says how many desires it ended and
// wraps ctx's error. Close is idempotent and safe to call concurrently.
//
// Called from a change, Close cannot wait for the write that runs it: it
// stops admission, finishes in the background as Close(ctx) would, and
// returns dispatch.ErrReentrant at once; a later Close, not itself called
// from a change or a callback, waits for that one to finish too. Called
// from Options.OnDone, the Observer or Options.Classify, which run on the
// dispatcher's own goroutines, it writes nothing more: it ends what
// remains Closed at once and returns an error wrapping
// dispatch.ErrReentrant (dispatch.Dispatcher.Close).
func (w *Writer[O]) Close(ctx context.Context) error {
	if w.inChange() {
		w.behind.Add(1)
		go func() {
			defer w.behind.Done()
			id := goid()
			w.closers.Store(id, struct{}{})
			defer w.closers.Delete(id)
			_ = w.close(ctx)
		}()
		return dispatch.ErrReentrant
	}
	err := w.close(ctx)
	if _, ok := w.closers.Load(goid()); !ok && !errors.Is(err, dispatch.ErrReentrant) {
		// Not on a goroutine a Close under way waits for (a callback's, or
		// its own): wait for the Closes changes began.
		w.behind.Wait()
	}
	return err
}

func (w *Writer[O]) close(ctx context.Context) error {
	w.closing.Store(true)
	before := w.d.Stats().Outcomes[dispatch.StateClosed]
	err := w.d.Close(ctx)
	w.known.clear()
	if err == nil {
		return nil
	}
	n := w.d.Stats().Outcomes[dispatch.StateClosed] - before
	return fmt.Errorf("writer: Close: %d desires ended Closed, unwritten (or, if in flight, unconfirmed): %w", n, err)
}

// key names obj in errors.
func key(obj Object) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// isNil reports whether obj is a nil pointer.
func isNil(obj Object) bool {
	if obj == nil {
		return true
	}
	v := reflect.ValueOf(obj)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// unneededHere is Set's no-op test, run on the caller's goroutine: the
// changes run inline (the caller's own code, on its own goroutine), and a
// panic is taken as "needed": the desire is queued, and its write fails
// with the panic on a worker.
func (w *Writer[O]) unneededHere(p *op[O]) (moot bool) {
	defer func() {
		if recover() != nil {
			p.prep = [numTargets]prepared[O]{}
			moot = false
		}
	}()
	return w.unneeded(inline, p)
}
