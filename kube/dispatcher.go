package kube

import (
	"context"
	"errors"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/preset"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Dispatcher runs kube calls: a dispatch.Dispatcher keyed by pod UID,
// whose every call is a Call submitted under its own pod's UID, with the
// preset's defaults for each submission. Create one with NewDispatcher.
// Like the core Dispatcher it is safe for concurrent use.
//
// Its methods are the core's, typed for pods: Submit, Post and SyncObject
// take the key from the call or the pod, so that no call can be queued
// under another pod's lane; Cancel and Busy take a pod's UID; Stats, Mode,
// SetMode and Close are the core's as they are. The core's generic Amend
// is not offered: SyncObject is its form for pods.
type Dispatcher struct {
	d    *dispatch.Dispatcher[types.UID, Call]
	prio map[CallType]int // every call type's
}

// Ticket is the handle on one submission's outcome (see dispatch.Ticket).
type Ticket = dispatch.Ticket[types.UID, Call]

// Result is the outcome of one submission, or, for Options.OnDone, of one
// call (see dispatch.Result).
type Result = dispatch.Result[types.UID, Call]

// SubmitOptions are one submission's settings: those of
// dispatch.SubmitOptions, with the preset's defaults. The zero value means
// the call type's priority and tenant, no deadline, generation 0, no
// idempotency key, not droppable.
type SubmitOptions struct {
	// Priority, if not nil, is the submission's priority, whatever its
	// call type: new(0) is priority 0. nil means the call type's
	// (Options.Priorities). Higher runs first; a call never runs before a
	// ready call of a higher priority band (see Options.AgingBand).
	Priority *int
	// Deadline, if set, ends this submission Expired when it passes; the
	// earlier of it and the Submit context's deadline applies.
	Deadline time.Time
	// Timeout, if positive, is a deadline that long after the submission,
	// on the dispatcher's own clock (see dispatch.SubmitOptions.Timeout);
	// with Deadline or the context's deadline too, the earliest applies.
	Timeout time.Duration
	// Tenant names who submits, for quotas and fairness (Options.Tenants).
	// "" means the call type's name.
	Tenant string
	// Generation fences stale work for the pod (the scheduling attempt,
	// say): see dispatch.SubmitOptions.Generation.
	Generation uint64
	// IdempotencyKey names the logical operation (see
	// dispatch.SubmitOptions.IdempotencyKey).
	IdempotencyKey string
	// Droppable marks a call that may be shed under load because it can
	// be rebuilt: a status patch the next scheduling attempt reports
	// again, say.
	Droppable bool
}

// NewDispatcher returns a Dispatcher that runs kube calls with client,
// configured by o: the classifier, merge and no-op rules, SyncObject,
// labels, priorities, the workers kept for bindings and deletions, the
// QPS limit and logging.
//
// Bad options are reported here, each naming the Options field the caller
// set ("kube: Options.QPS …"), a setting passed through to the core (which
// has the Config field's name) as well ("kube: Options.Start.ReservedWorkers
// …"); dispatch.New's error stays wrapped.
func NewDispatcher(client kubernetes.Interface, o Options) (*Dispatcher, error) {
	if client == nil {
		return nil, errors.New("kube: NewDispatcher: client is nil")
	}
	a := &calls{pods: podsFor(client), log: o.Logger}
	if a.log.IsZero() {
		a.log = klog.Background()
	}
	cfg, prio, err := o.config(a)
	if err != nil {
		return nil, err
	}
	d, err := dispatch.New(a.exec, cfg)
	if err != nil {
		// Every Config field a caller can make bad is an Options field of
		// the same name passed through (TestOptionsCoverConfig).
		return nil, preset.OptionsErr("kube:", err)
	}
	a.amend = d.Amend // before any call can run: workers start on the first submission
	return &Dispatcher{d: d, prio: prio}, nil
}

// options is the core's form of o for c, with the preset's defaults: its
// call type's priority if o.Priority is nil, and its call type as tenant
// if o.Tenant is "".
func (d *Dispatcher) options(c Call, o SubmitOptions) dispatch.SubmitOptions {
	out := dispatch.SubmitOptions{
		Priority:       d.prio[c.typ],
		Deadline:       o.Deadline,
		Timeout:        o.Timeout,
		Tenant:         o.Tenant,
		Generation:     o.Generation,
		IdempotencyKey: o.IdempotencyKey,
		Droppable:      o.Droppable,
	}
	if o.Priority != nil {
		out.Priority = *o.Priority
	}
	if out.Tenant == "" {
		out.Tenant = string(c.typ)
	}
	return out
}

// Submit hands c to the dispatcher under its pod's UID and returns at once
// with a Ticket on its outcome, as dispatch.Dispatcher.Submit does, with
// the preset's defaults for what o leaves unset (see SubmitOptions). An
// invalid call is refused with an error matching ErrInvalidCall,
// and nothing is queued.
//
// Against a pending call for the same pod, relevance decides: a more
// relevant call replaces it (both submissions then share the outcome of
// the one that runs), a less relevant one ends Skipped at once, and a
// status patch folds into a pending status patch. A binding replaces a
// pending binding, unless that one was sent already and is being retried:
// it may have landed, so a binding to its node joins it, and one to
// another node is refused with a conflict (an error matching
// dispatch.ErrMergeRejected and apierrors.IsConflict). While the pod's
// call is in flight, c waits behind it, and ends Skipped if that call is a
// deletion that lands.
//
// A call that replaces a pending one runs at its own, higher priority, in
// its own tenant and under its own label: a binding that replaced a
// pending status patch runs, and is counted, as a binding. The replaced
// call's submitters are told its outcome: a binding a deletion replaced
// ends Succeeded once the pod is deleted, though it never bound the pod.
// The Result's Call is the call that ran — its Type tells that binding
// from one that landed. (kube-scheduler's dispatcher, and the scheduler
// adapter, tell an overwritten call fwk.ErrCallOverwritten instead.)
func (d *Dispatcher) Submit(ctx context.Context, c Call, o SubmitOptions) (*Ticket, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	return d.d.Submit(ctx, c.uid, c.submitted(), d.options(c, o))
}

// Post is the fire-and-forget form of Submit (see dispatch.Dispatcher.Post):
// its outcome reaches only Options.OnDone, the observer, the log and
// Stats.
func (d *Dispatcher) Post(c Call, o SubmitOptions) error {
	if err := c.Err(); err != nil {
		return err
	}
	return d.d.Post(c.uid, c.submitted(), d.options(c, o))
}

// SyncObject returns pod as it will look once its pending call lands —
// with a pending status patch's fields or a deletion's condition set, or a
// pending binding's node if pod is unbound — and makes pod the pending
// call's new baseline: the newest view of the pod, which the no-op test and
// the patch are computed against and whose resourceVersion a status patch
// sends as its precondition. If the call then has nothing left to change,
// it ends Skipped for every waiter: at once if the pod has no call in
// flight; otherwise once that call is done, unless what it did leaves the
// pending call something to change (its no-op test runs again before it
// starts). A pod older than the call's
// baseline (by resourceVersion: the call was rebased onto the response of
// the write before it, or a read, that the informer has not delivered yet)
// is projected but does not become the baseline, as when two calls merge:
// judged against the older view, the call could find nothing to change
// that the pod as it now is needs, and end Skipped unsent. Nor does a pod
// without a resourceVersion replace a baseline that has one: it cannot be
// ordered, and a status patch would lose its precondition. A pod bound to
// another node than its pending binding's is returned as it is: a pod's
// node never changes once set, so the server's truth wins over a binding
// that cannot land (it ends Failed when it runs). It is kube-scheduler's
// APIDispatcher.SyncObject, for an informer's update handler or the
// scheduler's cache.
//
// Only the pending call is seen and rewritten (see dispatch.Dispatcher.Amend): a
// call in flight may be taking effect already, and pod is returned as it
// is. pod is never written: a changed copy is returned, or pod itself if
// nothing changes.
func (d *Dispatcher) SyncObject(pod *v1.Pod) (*v1.Pod, error) {
	if pod == nil {
		return nil, errors.New("kube: SyncObject: pod is nil")
	}
	if pod.UID == "" {
		return pod, nil
	}
	b := baselineOf(pod) // outside the lock; rebase only assigns
	var pending Call
	found, err := d.d.Amend(pod.UID, func(c Call) (Call, error) {
		if c.Err() != nil {
			return c, c.Err()
		}
		pending = c
		if supersedes(b.rv, c.rv) { // as merge does: the newer baseline stays
			pending = c.rebase(b)
		}
		return pending, nil
	})
	if err != nil || !found {
		return pod, err
	}
	return pending.project(pod), nil
}

// Cancel ends every submission for the pod of UID uid with Canceled,
// wrapping cause: its pending call is removed, and its running call's
// context is cancelled (see dispatch.Dispatcher.Cancel). It reports
// whether there was anything to cancel.
func (d *Dispatcher) Cancel(uid types.UID, cause error) bool { return d.d.Cancel(uid, cause) }

// Busy reports whether the pod of UID uid has a call that has not
// finished: queued, waiting for a retry, or running (see
// dispatch.Dispatcher.Busy).
func (d *Dispatcher) Busy(uid types.UID) bool { return d.d.Busy(uid) }

// Stats returns a consistent snapshot of the dispatcher: its labels and
// tenants are the call types (see dispatch.Stats).
func (d *Dispatcher) Stats() dispatch.Stats { return d.d.Stats() }

// Close stops admission, runs what is queued until ctx ends, and returns
// once every execution and every callback of a call — Options.OnDone, the
// Observer's events — has returned, so that none runs after it (see
// dispatch.Dispatcher.Close). ctx bounds the draining, not them: a
// callback that blocks holds Close up past ctx until it returns. Called
// from one of those callbacks, Close ends what remains with Closed and
// returns dispatch.ErrReentrant at once.
func (d *Dispatcher) Close(ctx context.Context) error { return d.d.Close(ctx) }

// ModeOf maps a feature gate's position to the dispatcher's mode: enabled
// is Async, disabled is Sync, the synchronous path through the same
// machinery. Use it for Options.Rollout.Mode at start-up.
func ModeOf(enabled bool) dispatch.Mode {
	if enabled {
		return dispatch.ModeAsync
	}
	return dispatch.ModeSync
}

// Mode returns the current mode: Async, or Sync when the gate is off or
// the fallback switched (see dispatch.Dispatcher.Mode).
func (d *Dispatcher) Mode() dispatch.Mode { return d.d.Mode() }

// SetMode switches the dispatcher between Async and Sync at run time (see
// dispatch.Dispatcher.SetMode). Switching to Sync follows
// Options.Rollout for what is queued, and waits until ctx ends at most.
func (d *Dispatcher) SetMode(ctx context.Context, m dispatch.Mode) error { return d.d.SetMode(ctx, m) }

// SetEnabled flips the dispatcher with a feature gate at run time:
// SetMode(ctx, ModeOf(enabled)).
func (d *Dispatcher) SetEnabled(ctx context.Context, enabled bool) error {
	return d.SetMode(ctx, ModeOf(enabled))
}
