package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/coalescer/dispatch/internal/due"
	"github.com/coalescer/dispatch/internal/fallback"
	"github.com/coalescer/dispatch/internal/hist"
	"github.com/coalescer/dispatch/internal/window"
)

// ExecFunc performs one call: the slow, side-effecting operation (an API
// write) that the dispatcher takes off the caller's loop. ctx is cancelled
// when the call loses every waiter, is superseded by a newer generation, or
// the dispatcher is closed, and carries the latest deadline of the call's
// waiters; exec must honour it. The call value is as merged from every
// submission that coalesced into it. exec is user code (package
// documentation, "Callbacks"). ctx belongs to this one execution, and
// context.Cause reports why the dispatcher cancelled it — ErrCanceled with Cancel's cause, ErrStale,
// ErrClosed, ErrExpired (then Err is context.DeadlineExceeded) — and, once
// exec has returned, ErrAttemptEnded if nothing ended it earlier. A context
// exec hands to work that outlives it stays done with that cause, like an
// http.Request's context after its handler returns. Contexts derived from
// it need no goroutine.
type ExecFunc[K comparable, T any] func(ctx context.Context, key K, call T) error

// Dispatcher runs calls asynchronously: per key at most one running and one
// pending, pending submissions coalesced, ready calls run by priority with
// aging, every submission ended exactly once. All methods are safe for
// concurrent use. Create one with [New]; the zero value is not usable.
type Dispatcher[K comparable, T any] struct {
	// The lock rule: every unexported function expects d.mu held and
	// returns with it held, unless its name or doc comment says otherwise.
	// A name ending in Unlock is called with the lock and returns without
	// it (runSyncUnlock, runInlineUnlock, exitAdmitUnlock); Lock, called
	// without it, returns with it (settleAttemptLock); Relock releases it
	// meanwhile and returns with it again (runRelock). "It takes the lock
	// itself" (leave, submit, amend, awaitDrain, the goroutine bodies) and
	// "without the lock" (the teller, labelOf: user code never runs under
	// it) are said in the doc comment.
	exec ExecFunc[K, T]
	cfg  settings[K, T] // validated, defaults filled in; never changes
	clk  timebase       // times are int64 ns since its epoch

	base       context.Context // the token fetcher's: cancelled by Close (executions have their own, internal/execctx)
	baseCancel context.CancelCauseFunc
	stopCh     chan struct{} // closed when Close ends the rest
	wg         sync.WaitGroup

	guess clockGuess // whether Post reads the clock before the lock

	mu      sync.Mutex
	lanes   laneTable[K, T]
	q       queue[K, T]
	seq     uint64
	waiters waiters[K, T]
	wake    wakes // idle workers and state changes
	running int   // calls in flight, on workers or inline
	calls   liveCalls[K, T]
	gate    startGate // may the next execution start (start.go)
	warmed  uint64    // what the last laneTable.line read: kept, so that the compiler keeps the load

	started bool
	drain   drain // Close's: admission stopped, nothing left
	stopped bool

	due due.List // when the clock must act, by duty (clock.go)

	fetchCond sync.Cond // the token fetcher waits here

	budget   retryBudget
	fallback *fallback.State

	queueWait hist.Recent
	execTime  hist.Recent
	mode      Mode
	handover  handovers // what switches to Sync mode left to the workers, while a SetMode waits

	owned      owners       // goroutines Close would wait for: its own, and inline runners
	callers    owners       // Sync-mode callers Close waits for until they have told their outcomes
	notify     outbox[K, T] // what the notifier tells next
	notifyCond sync.Cond    // the notifier waits here
	tell       teller[K, T] // outcomes, hooks and events, outside the lock

	tenants tenants[K, T]

	totals counters

	// awaiting counts inline attempts whose callers wait for a rate-limiter
	// token: counted queued, not in flight (Stats.Ready, begin).
	awaiting int
}

// New returns a Dispatcher that runs calls with exec, configured by cfg
// (whose zero fields mean their defaults). It starts no goroutine: workers
// start on the first submission. An invalid configuration is reported here,
// never later, with an error naming the field.
func New[K comparable, T any](exec ExecFunc[K, T], cfg Config[K, T]) (*Dispatcher[K, T], error) {
	if exec == nil {
		return nil, errors.New("dispatch: New: nil ExecFunc")
	}
	set, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	d := &Dispatcher[K, T]{
		exec:      exec,
		cfg:       set,
		clk:       timebase{epoch: time.Now().Add(-epochOffset)},
		drain:     drain{done: make(chan struct{})},
		stopCh:    make(chan struct{}),
		lanes:     newLaneTable[K, T](),
		q:         newQueue[K, T](set.aging, set.band),
		budget:    retryBudget{win: window.New(set.Retry.BudgetWindow), ratio: set.Retry.BudgetRatio, min: set.Retry.BudgetMin},
		queueWait: hist.NewRecent(latencyWindow),
		execTime:  hist.NewRecent(latencyWindow),
		mode:      set.Rollout.Mode,
		tenants:   newTenants[K, T](set.Tenants, set.DefaultTenant),
		owned:     owners{},
		callers:   owners{},
	}
	d.init()
	return d, nil
}

// init sets up the parts the configuration turns on, the tenants it
// names, and the conditions the dispatcher's goroutines wait on.
func (d *Dispatcher[K, T]) init() {
	set := &d.cfg
	d.gate = newStartGate(set, &d.clk, &d.due, &d.fetchCond)
	if set.Label != nil {
		d.calls.tags = map[tagKey[K, T]]*callTag[K, T]{}
	}
	if set.Rollout.Fallback != nil {
		d.fallback = fallback.New(set.Rollout.Fallback.fallbackPolicy())
	}
	d.due = due.New(d.clk.arm)
	d.q.due = &d.due
	d.waiters = newWaiters[K, T](&d.due)
	d.base, d.baseCancel = context.WithCancelCause(context.Background())
	d.wake.cond.L = &d.mu
	d.tell.onDone, d.tell.obs, d.tell.workers = set.OnDone, set.Observer, &d.wake.cond
	d.notifyCond.L = &d.mu
	d.fetchCond.L = &d.mu
}

// Submit hands a call to the dispatcher and returns at once with a Ticket on
// its outcome. If a call for key is pending it is coalesced into it (see
// Config.Merge); if one is running, this call becomes its successor and runs
// after it; otherwise it is queued by priority.
//
// ctx scopes this submission's interest only: when it is cancelled or its
// deadline passes, this waiter ends Canceled or Expired, and the call goes
// on for its other waiters — if it has none left, a pending call is removed
// and a running one has its context cancelled. Use
// context.WithoutCancel(ctx), or Post, for a submission that must outlive
// the caller. Submit returns an error and enqueues nothing if the dispatcher is closed
// (ErrClosed), ctx is done or the deadline has passed (ErrCanceled,
// ErrExpired), the generation is stale (ErrStale), the merge is refused
// (ErrMergeRejected) or the dispatcher is full (ErrBackpressure).
func (d *Dispatcher[K, T]) Submit(ctx context.Context, key K, call T, o SubmitOptions) (*Ticket[K, T], error) {
	return d.submit(ctx, key, call, o, nil)
}

// submit is Submit; label, if not nil, is the call's label, already
// computed (a Sync-mode Post's), so that Config.Label runs once per
// submission. It takes the lock itself.
func (d *Dispatcher[K, T]) submit(ctx context.Context, key K, call T, o SubmitOptions, label *string) (*Ticket[K, T], error) {
	if label == nil {
		l := d.cfg.labelOf(key, call, &d.tell)
		label = &l
	}
	if ctx.Err() != nil {
		err := ctxErr(ctx)
		d.mu.Lock() // to count the refusal
		d.tenants.count(d.tenants.get(o.Tenant), errRejectPast, &d.totals)
		d.mu.Unlock()
		d.tell.submitted(*label, &o, false, err)
		return nil, err
	}
	now := d.clk.now() // outside the lock, as is the hash
	t, deadline := d.ticketFor(ctx, &o, now)
	h := d.lanes.hash(key)
	d.lanes.prefetch(h)
	var ob outbox[K, T]
	d.mu.Lock()
	coalesced, err := d.admitTicket(ctx, &submission[K, T]{key: key, h: h, val: call, o: o, now: now, deadline: deadline, t: t, ten: d.tenants.get(o.Tenant), label: *label}, &ob)
	if err == nil && d.mode == ModeSync {
		d.runSyncUnlock(t, Event{Label: *label, Tenant: o.Tenant}, coalesced, &ob)
		return t, nil
	}
	d.mu.Unlock()
	if err != nil {
		t.stopWatch()
	}
	// Outcomes first: an observer that panics or exits must not keep the
	// waiters this submission displaced from hearing.
	d.tell.deliver(&ob)
	if d.cfg.Observer != nil {
		d.tell.submitted(*label, &o, coalesced, err)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// admitTicket is admit for a Submit under ctx: refused if ctx ended before
// the lock was taken, the deadline has passed, or, in Sync mode, the call
// would wait for its own goroutine. It counts the submission for its
// tenant; a refused one's ticket is done.
func (d *Dispatcher[K, T]) admitTicket(ctx context.Context, s *submission[K, T], ob *outbox[K, T]) (coalesced bool, err error) {
	switch {
	case s.t.state == tsDone: // ctx ended before we took the lock
		err = ctxErr(ctx)
	case s.o.Timeout < 0:
		err = errTimeoutPast
	case s.deadline != 0 && s.deadline <= s.now:
		err = errRejectPast
	case d.mode == ModeSync && d.runsHere(s.key):
		err = ErrReentrant
	default:
		coalesced, err = d.admit(d.lanes.get(s.key, s.h), s, ob)
	}
	d.tenants.count(s.ten, err, &d.totals)
	if err != nil {
		s.t.state = tsDone
	}
	return coalesced, err
}

// ticketFor makes the ticket of a submission under ctx with options o,
// made at now, and returns it with its deadline: the earliest of o's, its
// Timeout's and ctx's. A ctx that can end is watched by one callback
// registration, no goroutine: the callback takes the waiter out.
func (d *Dispatcher[K, T]) ticketFor(ctx context.Context, o *SubmitOptions, now int64) (*Ticket[K, T], int64) {
	deadline := d.clk.deadline(o, now)
	if cd, ok := ctx.Deadline(); ok {
		if c := d.clk.at(cd); deadline == 0 || c < deadline {
			deadline = c
		}
	}
	watch := ctx.Done() != nil
	t := newTicket(d, deadline, watch)
	if watch {
		t.x.stop = context.AfterFunc(ctx, func() { t.ctxDone(ctx) })
	}
	return t, deadline
}

// Post is the fire-and-forget form of Submit: no ticket, no context, and no
// allocation when it coalesces into a pending call (nor, in the steady
// state, for a new key). The submission is a waiter that never leaves: only
// its deadline (o.Deadline, o.Timeout), Cancel, a newer generation or
// Close end it.
// Its outcome reaches only the completion hook and Stats; posts merged into
// one call share the latest of their deadlines, and one outcome. Post
// returns only why a submission was refused, in either mode: in Sync mode
// it runs the call first, but a failed execution still returns nil.
func (d *Dispatcher[K, T]) Post(key K, call T, o SubmitOptions) error {
	var label string // none, the usual, without a call
	if d.cfg.Label != nil {
		label = d.cfg.labelOf(key, call, &d.tell)
	}
	h := d.lanes.hash(key) // outside the lock
	d.lanes.prefetch(h)
	// The clock, before the lock, when admission will need it (a deadline,
	// a timeout, recent Posts that needed it: clockGuess). Otherwise admit
	// reads it if it must: a Post into fire-and-forget posts never does.
	var now, deadline int64
	if !o.Deadline.IsZero() || o.Timeout != 0 || d.guess.pre.Load() {
		now = d.clk.now()
		deadline = d.clk.deadline(&o, now)
	}
	d.mu.Lock()
	if d.mode == ModeSync {
		d.mu.Unlock()
		// Run inline, through submit (with the label computed here); the
		// call's outcome reaches the completion hook and Stats, and Post
		// returns only a refusal.
		_, err := d.submit(context.Background(), key, call, o, &label)
		return err
	}
	ten := d.tenants.none // the usual tenant, none, without a call
	if o.Tenant != "" {
		ten = d.tenants.get(o.Tenant)
	}
	l := d.lanes.get(key, h)
	if deadline == 0 && l != nil && l.pending != nil && d.postInto(l, call, &o, ten, label, now) {
		d.tenants.count(ten, nil, &d.totals)
		d.mu.Unlock() // and nothing to deliver
		if d.cfg.Observer != nil {
			d.tell.submitted(label, &o, true, nil)
		}
		return nil
	}
	var ob outbox[K, T]
	var err error
	coalesced := false
	switch {
	case o.Timeout < 0:
		err = errTimeoutPast
	case deadline != 0 && deadline <= now:
		err = errRejectPast
	default:
		coalesced, err = d.admit(l, &submission[K, T]{key: key, h: h, val: call, o: o, now: now, deadline: deadline, ten: ten, label: label}, &ob)
	}
	d.tenants.count(ten, err, &d.totals)
	d.mu.Unlock()
	d.tell.deliver(&ob)
	if d.cfg.Observer != nil { // not even a call on the hot path without one
		d.tell.submitted(label, &o, coalesced, err)
	}
	return err
}

// Cancel ends every submission for key with Canceled, wrapping cause: the
// pending call is removed and the running call's context is cancelled
// with cause (its execution, when it returns, is reported Stale). It
// reports whether there was anything to cancel.
func (d *Dispatcher[K, T]) Cancel(key K, cause error) bool {
	err := canceledErr(cause)
	var ob outbox[K, T]
	d.mu.Lock()
	found := false
	if l := d.lanes.lookup(key); l != nil {
		found = d.endLane(l, StateCanceled, err, d.clk.now(), withRunning, &ob)
	}
	d.mu.Unlock()
	d.tell.deliver(&ob)
	return found
}

// Busy reports whether key has a call that has not finished: queued,
// waiting for retry, or running — including an execution that was
// cancelled but has not returned yet, since it may still take effect. A
// caller that must not act before an earlier write lands (binding after its
// prerequisite) checks this.
func (d *Dispatcher[K, T]) Busy(key K) bool {
	d.mu.Lock()
	ok := d.lanes.lookup(key) != nil
	d.mu.Unlock()
	return ok
}

// labelOf runs Config.Label, if set. It runs outside the lock, before
// anything is admitted. A panic in it is contained and counted, and the
// call goes unlabelled; a runtime.Goexit is counted, and ends the
// submitting goroutine with nothing submitted.
func (s *settings[K, T]) labelOf(key K, call T, tl *teller[K, T]) string {
	if s.Label == nil {
		return ""
	}
	var label string
	pe, _ := guard(callbackLabel, func() error { label = s.Label(key, call); return nil }, tl.contain)
	tl.contain(pe)
	return label
}
