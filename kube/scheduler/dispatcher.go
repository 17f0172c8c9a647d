package scheduler

import (
	"context"
	"errors"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/preset"
	"github.com/coalescer/dispatch/kube/internal/retryafter"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// Dispatcher is an fwk.APIDispatcher that runs any fwk.APICall through a
// dispatch.Dispatcher, keyed by the call's object UID. It is safe for
// concurrent use; create one with New, start it with Start, and Close it.
type Dispatcher struct {
	core       *dispatch.Dispatcher[types.UID, *entry]
	relevances fwk.APICallRelevances
	set        settings
	wire       wire
	logger     atomic.Pointer[klog.Logger]
	logs       atomic.Pointer[context.Context] // holds only logger, for execCtx
	started    atomic.Bool

	pending pendingGauge
	panics  panics // contained by the adapter itself, for Stats
	pace    *pacer // Options.PaceStatusPatches; nil: off
	// epoch is the origin an execution's time is read from, as
	// time.Since(epoch): the monotonic clock alone, where time.Now reads
	// the wall clock too.
	epoch time.Time
}

var _ fwk.APIDispatcher = (*Dispatcher)(nil)

// New returns a Dispatcher that runs calls with client, configured by o.
// relevances is the scheduler's relevance table (upstream's
// apicalls.Relevances, extended by plugins): a call type it does not name
// has relevance 0. Nothing is executed before Start. An invalid option is
// reported here, naming the Options field set ("scheduler:
// Options.Retry.MaxAttempts: …"), one dispatch.New checks as well.
//
// If client is a clientset built from a rest.Config, calls run on a
// clientset derived from it without client-go's rate limiter, and each
// request takes its token from client's own limiter instead, the first one
// before the call is chosen (see the package documentation). Any other
// client — a fake, a wrapper — is used as it is.
func New(client kubernetes.Interface, relevances fwk.APICallRelevances, o Options) (*Dispatcher, error) {
	if client == nil {
		return nil, errors.New("scheduler: New: client is nil")
	}
	set, err := o.resolve()
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		relevances: relevances,
		set:        set,
		wire:       newWire(client),
		epoch:      time.Now(),
	}
	d.core, err = dispatch.New(d.exec, d.coreConfig(o))
	if err != nil {
		// Every setting the core checks that a caller can make bad is
		// passed to it as it is, under the same name (Aging, Retry,
		// Breaker, Rollout, Start, Tenants; the Workers, Capacity and
		// AgingBand it checks are the adapter's own, checked first).
		return nil, preset.OptionsErr("scheduler:", err)
	}
	d.pending.init(d.core, set.metrics, d.contain)
	d.wire.gate.shares, d.wire.gate.demand = maxShares, d.demand
	if set.pace && d.wire.metered && d.wire.gate.l != nil { // no bucket (QPS < 0): no rate to follow
		d.pace = newPacer(float64(d.wire.gate.l.QPS()), set.workers, set.reserved, func(n int) error {
			return d.core.SetTenantMaxInFlight(string(podStatusPatch), n)
		})
	}
	return d, nil
}

// Start lets calls run: upstream's Run. Calls added before Start wait,
// and merge and sync as usual; in dispatch.ModeSync, Add waits for Start
// too. logger is given to every call's
// Execute through its context (klog.FromContext) and receives the
// dispatcher's own log lines. Start returns at once; calling it again, or
// after Close, does nothing.
func (d *Dispatcher) Start(logger klog.Logger) {
	if !d.started.CompareAndSwap(false, true) {
		return
	}
	d.logger.Store(&logger)
	logs := klog.NewContext(context.Background(), logger)
	d.logs.Store(&logs)
	d.pending.start()
	d.wire.gate.open()
	s := d.core.Stats()
	rate := "taken from the client's own limiter before each call is chosen"
	if !d.wire.metered {
		rate = "the client's own, if any (" + d.wire.why + ")"
	}
	logger.V(2).Info("API dispatcher started", "dispatcher", "github.com/coalescer/dispatch/kube/scheduler",
		"workers", s.Concurrency, "reservedForBindings", s.Reserved, "mode", s.Mode, "rateLimit", rate)
}

// Close stops the dispatcher. It refuses new calls at once, runs what is
// queued, by priority, until ctx ends, then ends the rest — each queued
// call's OnFinish gets an error matching dispatch.ErrClosed, each running
// call's context is cancelled — and returns when every execution has
// returned and every goroutine it started has exited. It returns nil if
// everything drained, else ctx's error. A cancelled ctx closes at once, as
// upstream's Close does. Before Start nothing can run, so Close then also
// ends what is queued at once, as a cancelled ctx does, whatever ctx is,
// and a later Start does nothing. It is idempotent. Called from a call's
// Execute, which runs on a worker Close would wait for, Close cannot wait:
// it ends what remains at once, as a cancelled ctx does, and returns an
// error matching dispatch.ErrReentrant; a later Close waits for the
// execution. Called from Metrics.Pending, it closes as from anywhere else,
// but for the goroutine that calls Pending, its own, which it cannot wait
// for: it returns an error matching dispatch.ErrReentrant, and a later
// Close waits for that goroutine.
func (d *Dispatcher) Close(ctx context.Context) error {
	if d.started.CompareAndSwap(false, true) {
		// Never started: what is queued would wait for Start forever.
		c, cancel := context.WithCancel(ctx)
		cancel()
		ctx = c
	}
	err := d.core.Close(ctx)
	d.wire.gate.close()
	if d.pending.stop() {
		// Called from Metrics.Pending: Close cannot wait for the goroutine
		// that calls it, its own.
		return errors.Join(err, dispatch.ErrReentrant)
	}
	return err
}

// Add hands call to the dispatcher: the fwk.APIDispatcher method. It
// returns at once, in Async mode; its outcome goes to opts.OnFinish, once.
//
// Upstream's rules apply, per object UID, against the object's newest
// call: the pending one, or, if none is pending, the one in flight (from
// the moment it leaves the queue until its end is recorded). A less
// relevant call is refused with an error matching fwk.ErrCallSkipped. A
// more relevant one overwrites a pending call, and runs after a call in
// flight. One of the same type absorbs the newest call through its own
// Merge and takes a pending call's place — whose OnFinish then gets an
// error matching fwk.ErrCallOverwritten — or runs after a call in flight.
// A call that IsNoOp after this is refused as skipped, with the pending
// call it merged, unless its object has a call in flight: then it is kept,
// and runs. These decisions are made under the dispatcher's lock, in the
// step that admits the call (dispatch.Config.Follow and Merge).
//
// Beyond upstream, Add refuses with the dispatcher's error (matching
// dispatch.ErrBackpressure, ErrClosed, …) when the call cannot be queued;
// the same error goes to OnFinish. A call whose Merge or IsNoOp panics is
// refused with its *dispatch.PanicError; one whose Merge or IsNoOp ends
// its goroutine (runtime.Goexit) ends Add's, which never returns, and its
// OnFinish still gets its one value, a *dispatch.PanicError holding
// dispatch.ErrGoexit.
func (d *Dispatcher) Add(call fwk.APICall, opts fwk.APICallOptions) error {
	return d.add(newEntry(call, opts.OnFinish))
}

// Submit is Add with a Ticket on the outcome, which keeps it: where
// OnFinish's non-blocking send drops the result for a channel that is not
// ready, the Ticket never loses it. The error is Add's; when it is not nil
// the Ticket holds the same error, as does a Ticket whose call is skipped.
func (d *Dispatcher) Submit(call fwk.APICall, opts fwk.APICallOptions) (*Ticket, error) {
	e := newEntry(call, opts.OnFinish)
	e.ticket = &Ticket{done: make(chan struct{})}
	return e.ticket, d.add(e)
}

func (d *Dispatcher) add(e *entry) error {
	uid := e.call.UID()
	d.pending.see(e.typ)
	posted := false
	defer func() {
		if !posted {
			d.exited(e)
		}
	}()
	err := d.core.Post(uid, e, d.set.options(e.typ))
	posted = true
	if err != nil {
		e.displaced.Store(nil) // refused: whatever it merged stays in place
	}
	d.tellDisplaced(e)
	d.pending.kick()
	switch {
	case err != nil:
		var me *mergeError
		if errors.As(err, &me) {
			err = me // upstream's wording; the call's own error is wrapped
		}
		d.tell(e, err, dispatch.Outcome{})
		return err
	case e.is(aMoot):
		d.tell(e, errNoEffect, dispatch.Outcome{State: dispatch.StateSkipped})
		return errNoEffect
	case e.is(aLessInFlight):
		d.tell(e, errLessInFlight, dispatch.Outcome{State: dispatch.StateSkipped})
		return errLessInFlight
	case e.is(aSkipped):
		d.tell(e, errLessRelevant, dispatch.Outcome{State: dispatch.StateSkipped})
		return errLessRelevant
	case e.is(aMergedNoOp): // as admitted: a SyncObject since may have changed noop
		d.dropNoOp(uid, e)
		return errNoEffect
	case !e.is(aMerged) && !d.pacedOut(e.typ):
		d.wire.gate.added() // a call more waits to run
	}
	return nil
}

// exited tells e, whose Add never returns, its outcome: a callback the
// core ran on the Add's goroutine to admit e — the call's Merge or IsNoOp
// — ended that goroutine (runtime.Goexit), and the core refused e, as it
// refuses a call whose Merge panics. Whatever e merged stays in place. (An
// Execute run inline, in ModeSync, that ends it has been told by the core,
// on the way out, before this runs: e is not told twice.)
func (d *Dispatcher) exited(e *entry) {
	e.displaced.Store(nil)
	pe := &dispatch.PanicError{Callback: "add", Value: dispatch.ErrGoexit, Stack: debug.Stack()}
	d.tell(e, pe, dispatch.Outcome{})
	d.pending.kick()
}

// demand is the gate's count of the calls waiting to run that may start
// soon: every waiting call, except the status patches beyond what the
// pacer's cap lets run at once. Those start only as earlier ones end, and
// a wait on the client's bucket kept for each would put their tokens ahead
// of the bucket's other users — preemption deletes its victims on the same
// clientset, and a preemptor waits for that deletion.
// It reads the core's counters once per call type seen.
func (d *Dispatcher) demand() int {
	n := 0
	for t := range *d.pending.types.Load() {
		q := d.core.Queued(string(t))
		if t == podStatusPatch && d.pace != nil {
			q = min(q, d.pace.current())
		}
		n += q
	}
	return n
}

// pacedOut reports whether a call of type typ just added waits behind the
// pacer's cap, so that it gets no wait on the bucket of its own (demand).
func (d *Dispatcher) pacedOut(typ fwk.APICallType) bool {
	return typ == podStatusPatch && d.pace != nil && d.wire.gate.asking.Load() > 0 &&
		d.core.Queued(string(podStatusPatch)) > d.pace.current()
}

// dropNoOp drops e, a merged call that changes nothing, if it has not
// started. The core's no-op test reads the same flag, so a worker that
// took it meanwhile skips it too; either way its outcome is Skipped.
func (d *Dispatcher) dropNoOp(uid types.UID, e *entry) {
	d.core.Amend(uid, func(p *entry) (*entry, error) {
		if p != e {
			return p, errReplaced // a later call took its place: leave that one be
		}
		return p, nil
	})
}

// SyncObject brings the object's newest call in line with obj, the
// fwk.APIDispatcher method, as upstream does: the pending call, or, if
// none is pending, the call in flight, refreshes itself from obj through
// its Sync, and SyncObject returns what that Sync returns, as it returns
// it — obj, a changed copy, or nil — and its error, unwrapped. With no
// call for the object, it returns obj. If the pending call then IsNoOp
// and the object has no call in flight, it is dropped; its OnFinish gets
// an error matching fwk.ErrCallSkipped. A call is never dropped while the
// object has one in flight: that one may yet fail, and the pending call is
// then the one that lands.
func (d *Dispatcher) SyncObject(obj metav1.Object) (metav1.Object, error) {
	out := obj
	var syncErr error
	_, err := d.core.AmendNewest(obj.GetUID(), func(e *entry, inFlight bool) (*entry, error) {
		if !inFlight && e.noop.Load() {
			// A pending no-op whose drop, right after the step that found
			// it, has not happened yet: upstream's is gone in that step.
			return e, nil
		}
		// What Sync returns, as it returns it: nil too, with its error
		// or without.
		out, syncErr = e.call.Sync(obj)
		e.noop.Store(!inFlight && e.call.IsNoOp())
		return e, nil
	})
	d.pending.kick()
	if err != nil { // a panic in Sync or IsNoOp, which upstream's would not survive
		return out, err
	}
	return out, syncErr
}

// Stats returns a snapshot of the dispatcher's state and counters; the
// tenants and labels are call types. CallbackPanics (and
// LastCallbackPanic) count, beside the core's callbacks, those the adapter
// contains itself: a send on an OnFinish channel that panicked (one its
// caller closed), and a panic in a Metrics method.
func (d *Dispatcher) Stats() dispatch.Stats {
	s := d.core.Stats()
	d.panics.into(&s)
	return s
}

// Mode returns the current mode.
func (d *Dispatcher) Mode() dispatch.Mode { return d.core.Mode() }

// SetMode switches between dispatch.ModeAsync and dispatch.ModeSync at run time
// (see dispatch.Dispatcher.SetMode): the feature gate's lever.
func (d *Dispatcher) SetMode(ctx context.Context, m dispatch.Mode) error {
	return d.core.SetMode(ctx, m)
}

// exec is the core's ExecFunc: one execution of e's call, on the wire's
// client, with the logger and the meter's account in its context.
func (d *Dispatcher) exec(ctx context.Context, uid types.UID, e *entry) error {
	d.tellDisplaced(e) // a retry may have absorbed e's predecessor
	d.pending.kick()
	a := d.execCtxFor(ctx, e)
	m, paced := d.set.metrics, d.pace != nil && e.typ == podStatusPatch
	timed := m != nil || paced // else nothing reads the execution's time
	var start time.Duration
	returned := false
	if timed {
		start = time.Since(d.epoch)
		defer func() {
			if !returned { // it panicked (the core contains it: the call fails), or ended its goroutine
				d.executed(e.typ, errExecuteDidNotReturn, start)
			}
		}()
	}
	err := e.call.Execute(a, d.wire.client)
	returned = true
	if err != nil {
		f := err           // declared here: only a failure allocates it
		e.failed.Store(&f) // its own outcome, if a retry absorbs its successor or it ends Stale
	} else if e.failed.Load() != nil {
		e.failed.Store(nil) // a retry that succeeded: the last execution's result is nil
	}
	if timed {
		d.executed(e.typ, err, start)
	}
	if err != nil && askedToWait(err) {
		err = retryafter.Wrap(err, time.Duration(a.retryAfter.Load()))
	}
	return err
}

// errExecuteDidNotReturn is what Metrics.Executed is told of an execution
// whose Execute panicked, or ended its goroutine, instead of returning.
var errExecuteDidNotReturn = errors.New("scheduler: Execute did not return")

// executed records an execution of a call of type t, begun at start (since
// d.epoch), that ended with err: for Options.Metrics, and, a status
// patch's, for the pacer.
func (d *Dispatcher) executed(t fwk.APICallType, err error, start time.Duration) {
	elapsed := time.Since(d.epoch) - start
	if m := d.set.metrics; m != nil {
		d.tellExecuted(m, t, err, elapsed)
	}
	if d.pace != nil && t == podStatusPatch {
		d.pace.observe(elapsed)
	}
}

// tellExecuted tells m an execution, containing a panic in it: the call's
// outcome is what its Execute returned, whatever the metrics do.
func (d *Dispatcher) tellExecuted(m Metrics, t fwk.APICallType, err error, elapsed time.Duration) {
	defer d.recoverMetrics("metrics_executed")
	m.Executed(t, err, elapsed)
}

// recoverMetrics, deferred around a call of a Metrics method, contains its
// panic.
func (d *Dispatcher) recoverMetrics(callback string) {
	if v := recover(); v != nil {
		d.contain(&dispatch.PanicError{Callback: callback, Value: v, Stack: debug.Stack()})
	}
}

// askedToWait reports whether err is an answer a server sends with a
// Retry-After — a 429 or a 5xx — so that the delay of the execution's last
// response is carried to the backoff only with the error it came with.
func askedToWait(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	code := status.Status().Code
	return code == http.StatusTooManyRequests || code >= 500
}

// done is the core's completion hook: it tells the entry that ran (or
// would have) its outcome.
func (d *Dispatcher) done(r dispatch.Result[types.UID, *entry]) {
	e := r.Call
	d.tellDisplaced(e)
	d.pending.kick()
	var err error
	switch r.State {
	case dispatch.StateSucceeded:
	case dispatch.StateSkipped:
		err = errNoEffect
		if e.is(aSkipped) {
			err = errLessRelevant
		}
	case dispatch.StateFailed:
		err = callError(r.Err)
	case dispatch.StateStale:
		err = ranResult(e, r.Err)
	default:
		err = r.Err
	}
	d.tell(e, err, r.Outcome)
	if err == nil {
		return // errors.As's target would cost every call an allocation
	}
	var pe *dispatch.PanicError
	if errors.As(err, &pe) {
		logErr(d.log(), pe, "API call panicked", "callType", e.typ, "uid", r.Key)
	}
}

// callError is what OnFinish gets for a failed call: the error its last
// Execute returned, unchanged — as upstream's dispatcher sends it, and as
// the scheduler puts it into its own messages and statuses — rather than
// the dispatcher's *RetryError around it, and without the server's delay
// the adapter carried to the backoff. (The Ticket's Outcome keeps the
// dispatcher's account: attempts, and why it gave up.) A panic in Execute
// stays a *dispatch.PanicError.
func callError(err error) error {
	var re *dispatch.RetryError
	if errors.As(err, &re) && re.Last != nil {
		err = re.Last
	}
	return retryafter.Strip(err)
}

// ranResult is what OnFinish gets for a call whose execution returned
// after Close or its deadline had ended it (Stale, r.Err): what that
// Execute returned, as upstream's dispatcher sends it — nil for a call
// that took effect, its error unchanged (callError) for one that failed,
// the *dispatch.PanicError for one that panicked. (The Ticket's Outcome
// says Stale.)
func ranResult(e *entry, stale error) error {
	var pe *dispatch.PanicError
	if errors.As(stale, &pe) {
		return pe
	}
	if f := e.failed.Load(); f != nil {
		return callError(*f)
	}
	return nil
}

// tellDisplaced tells the entries e overwrote that they were.
// One that was in flight as it was overwritten (aInFlight) is told the
// error of its execution instead, and a no-op replaced before its drop
// (aDropped) that it was skipped.
func (d *Dispatcher) tellDisplaced(e *entry) {
	for p := e.displaced.Swap(nil); p != nil; p = p.displaced.Swap(nil) {
		if f := p.failed.Load(); f != nil && p.is(aInFlight) {
			d.tell(p, *f, dispatch.Outcome{State: dispatch.StateFailed, Err: *f})
			continue
		}
		if p.is(aDropped) {
			d.tell(p, errNoEffect, dispatch.Outcome{State: dispatch.StateSkipped})
			continue
		}
		d.tell(p, errOverwritten, dispatch.Outcome{})
	}
}

// execCtxFor returns the context an execution of e gets, around ctx, the
// core's: e.first for e's first execution, which costs no allocation, and
// one of its own for each later one (a retry), so that no execution's
// context is reused.
func (d *Dispatcher) execCtxFor(ctx context.Context, e *entry) *execCtx {
	a := &e.first
	if admission(e.seen.Or(uint32(aRan)))&aRan != 0 {
		a = new(execCtx)
	}
	a.Context = ctx
	if a.logs = d.logs.Load(); a.logs == nil { // before Start: klog's
		logs := klog.NewContext(context.Background(), klog.Background())
		a.logs = &logs
	}
	a.prepaid.Store(d.wire.metered)
	return a
}

// execCtx is the context an execution's Execute gets: the core's context,
// with the logger (klog.FromContext) and the meter's account (attemptKey)
// in front of its values.
type execCtx struct {
	context.Context                  // the core's: deadline, cancellation, its values
	logs            *context.Context // holds only the logger
	attempt
}

func (c *execCtx) Value(key any) any {
	if key == (attemptKey{}) {
		return &c.attempt
	}
	if v := (*c.logs).Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}

// log returns the logger Start was given, or klog's before Start.
func (d *Dispatcher) log() klog.Logger {
	if l := d.logger.Load(); l != nil {
		return *l
	}
	return klog.Background()
}
