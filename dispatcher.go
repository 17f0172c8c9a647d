package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// ExecFunc performs one call: the slow, side-effecting operation (an API
// write) that the dispatcher takes off the caller's loop. ctx is cancelled
// when the call loses every waiter, is superseded by a newer generation, or
// the dispatcher is closed, and carries the latest deadline of the call's
// waiters; exec must honour it. The call value is as merged from every
// submission that coalesced into it.
type ExecFunc[K comparable, T any] func(ctx context.Context, key K, call T) error

// SubmitOptions are the per-submission settings. The zero value means
// priority 0, no deadline, no tenant, generation 0, no idempotency key, not
// droppable.
type SubmitOptions struct {
	// Priority orders ready calls: higher runs first. A coalesced call runs
	// at the highest priority of its live waiters. With aging, a call gains
	// one level per aging interval it waits.
	Priority int
	// Deadline, if set, ends this submission as Expired when it passes. The
	// earlier of Deadline and the Submit context's deadline applies. A call's
	// execution context carries the latest deadline of its live waiters.
	Deadline time.Time
	// Tenant names who submits (a plugin, a call type) for quotas and
	// fairness.
	Tenant string
	// Generation fences stale work for the key (for example the scheduling
	// attempt). A newer generation supersedes older ones: their pending call
	// ends Stale and their in-flight execution is cancelled. A submission
	// older than the key's newest is rejected with ErrStale. Generations are
	// compared as numbers, so 0 is the oldest: once a key has been submitted
	// with a generation, keep giving one. They are remembered while the key
	// is tracked.
	Generation uint64
	// IdempotencyKey names the logical operation, for servers that
	// deduplicate by it. It is passed to exec unchanged on every attempt (see
	// IdempotencyKey). A submission with a different non-empty key than the
	// pending call's is rejected with ErrMergeRejected: two distinct
	// operations are never merged.
	IdempotencyKey string
	// Droppable marks work that may be shed under load because it can be
	// rebuilt. A call is droppable only if every submission in it is.
	Droppable bool
}

// Dispatcher runs calls asynchronously: per key at most one in flight and one
// pending, pending submissions coalesced, ready calls run by priority with
// aging, every submission ended exactly once. All methods are safe for
// concurrent use. Create one with [New]; the zero value is not usable.
type Dispatcher[K comparable, T any] struct {
	exec  ExecFunc[K, T]
	cfg   settings[K, T] // validated, defaults filled in; never changes
	epoch time.Time      // clock origin: times are int64 ns since epoch

	base       context.Context // parent of every execution context
	baseCancel context.CancelCauseFunc
	drained    chan struct{} // closed when Close finds nothing left to run
	stopCh     chan struct{} // closed when Close ends the rest
	wg         sync.WaitGroup

	mu      sync.Mutex
	cond    sync.Cond // workers wait here for ready calls
	slots   map[K]*slot[K, T]
	free    []*slot[K, T] // released slots for reuse, at most maxFreeSlots
	q       queue[K, T]
	seq     uint64
	tickets int // live tickets
	liveFF  int // live fire-and-forget submissions
	idle    int // workers waiting on cond
	running int // calls in flight
	// workerRunning counts calls in flight on workers (not inline).
	workerRunning int
	calls         int // live calls: ready, delayed, successors and in flight

	started       bool
	closing       bool
	stopped       bool
	drainedClosed bool

	timer   *time.Timer // the one timer: delay index and deadlines
	timerAt int64       // when it is armed for; MaxInt64 if not

	budget window   // retry budget: first attempts and retries
	br     *breaker // nil: no circuit breaker

	labels map[string]int // live calls by label, if Config.Label is set
	qwait  recentHist     // queue wait
	exect  recentHist     // execution time
	mode   Mode
	fb     *fallbackState
	kickCh chan struct{} // closed and cleared on every state change; see kick

	t0      *tenant[K, T] // the tenant of submissions that name none
	tenants map[string]*tenant[K, T]

	st counters
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
		exec:    exec,
		cfg:     set,
		budget:  newWindow(set.Retry.BudgetWindow),
		epoch:   time.Now().Add(-epochOffset),
		drained: make(chan struct{}),
		stopCh:  make(chan struct{}),
		slots:   make(map[K]*slot[K, T]),
		q:       newQueue[K, T](set.aging),
		timerAt: maxTime,
		mode:    set.Mode,
		tenants: map[string]*tenant[K, T]{},
	}
	if set.Label != nil {
		d.labels = map[string]int{}
	}
	if set.Fallback != nil {
		d.fb = newFallbackState(*set.Fallback)
	}
	c0, ok := set.Tenants[""]
	if !ok {
		c0 = set.DefaultTenant
	}
	d.t0 = newTenant[K, T]("", c0)
	d.tenants[""] = d.t0
	if set.Breaker != nil {
		d.br = &breaker{p: *set.Breaker, win: newWindow(set.Breaker.Window), obs: set.Observer}
	}
	d.base, d.baseCancel = context.WithCancelCause(context.Background())
	d.cond.L = &d.mu
	return d, nil
}

// epochOffset puts the clock's origin before New, so that every time the
// dispatcher compares is positive, 0 can mean "no deadline", and a deadline
// from before New still compares as past.
const epochOffset = time.Hour

// now reads the clock once: monotonic ns since d.epoch.
func (d *Dispatcher[K, T]) now() int64 { return int64(time.Since(d.epoch)) }

// deadlineOf converts a submission's deadline (the earlier of opts and ctx)
// to the dispatcher's clock; 0 means none.
func (d *Dispatcher[K, T]) deadlineOf(ctx context.Context, o *SubmitOptions) int64 {
	dl := o.Deadline
	if ctx != nil {
		if cd, ok := ctx.Deadline(); ok && (dl.IsZero() || cd.Before(dl)) {
			dl = cd
		}
	}
	if dl.IsZero() {
		return 0
	}
	return max(int64(dl.Sub(d.epoch)), 1)
}

// Submit hands a call to the dispatcher and returns at once with a Ticket on
// its outcome. If a call for key is pending it is coalesced into it (see
// Config.Merge); if one is in flight, this call becomes its successor and runs
// after it; otherwise it is queued by priority.
//
// ctx scopes this submission's interest only: when it is cancelled or its
// deadline passes, this waiter ends Canceled or Expired, and the call goes
// on for its other waiters — if it has none left, a pending call is removed
// and an in-flight one has its context cancelled. Use
// context.WithoutCancel(ctx), or Post, for a submission that must outlive
// the caller.
//
// Submit returns an error and enqueues nothing if the dispatcher is closed
// (ErrClosed), ctx is done or the deadline has passed (ErrCanceled,
// ErrExpired), the generation is stale (ErrStale), the merge is refused
// (ErrMergeRejected) or the dispatcher is full (ErrBackpressure).
func (d *Dispatcher[K, T]) Submit(ctx context.Context, key K, call T, o SubmitOptions) (*Ticket[K, T], error) {
	if ctx.Err() != nil {
		err := ctxErr(ctx)
		d.rejectEarly(o.Tenant)
		if d.cfg.Observer != nil {
			d.observeSubmit(d.labelOf(key, call), &o, false, err)
		}
		return nil, err
	}
	deadline := d.deadlineOf(ctx, &o)
	label := d.labelOf(key, call)
	t := &Ticket[K, T]{d: d}
	t.w.t = t
	if ctx.Done() != nil {
		// One callback registration, no goroutine: ctx is watched by the
		// context package, and the callback takes this waiter out.
		t.stop = context.AfterFunc(ctx, func() { d.ctxDone(t, ctx) })
	}
	var ob outbox[K, T]
	d.mu.Lock()
	now := d.now()
	ten := d.tenantFor(o.Tenant)
	var err error
	coalesced := false
	switch {
	case t.state == tsDone: // ctx ended before we took the lock
		err = ctxErr(ctx)
	case deadline != 0 && deadline <= now:
		err = errRejectPast
	default:
		coalesced, err = d.admit(key, call, &o, now, deadline, t, ten, label, &ob)
	}
	d.count(ten, err)
	if err != nil {
		t.state = tsDone
	}
	if err == nil && d.mode == Sync {
		if d.cfg.Observer != nil {
			so := o // a copy, so that o itself stays on the stack in every Submit
			ob.notes = append(ob.notes, func() { d.observeSubmit(label, &so, coalesced, nil) })
		}
		d.runInline(t, &ob) // releases the lock
		d.deliver(&ob)
		// The outcome is recorded; if a worker ran the call (a retry it
		// picked up first), it may still be telling the ticket.
		<-t.Done()
		return t, nil
	}
	d.mu.Unlock()
	d.observeSubmit(label, &o, coalesced, err)
	d.deliver(&ob)
	if err != nil {
		if t.stop != nil {
			t.stop()
		}
		return nil, err
	}
	return t, nil
}

// labelOf runs the Config.Label function, if any, outside the lock.
func (d *Dispatcher[K, T]) labelOf(key K, call T) string {
	if d.cfg.Label == nil {
		return ""
	}
	return d.cfg.Label(key, call)
}

// observeSubmit queues the observer's submit or reject event.
func (d *Dispatcher[K, T]) observeSubmit(label string, o *SubmitOptions, coalesced bool, err error) {
	if d.cfg.Observer == nil {
		return
	}
	e := Event{Label: label, Tenant: o.Tenant}
	if err != nil {
		d.cfg.Observer.OnReject(e, err)
		return
	}
	d.cfg.Observer.OnSubmit(e, coalesced)
}

// Post is the fire-and-forget form of Submit: no ticket, no context, and no
// allocation when it coalesces into a pending call (nor, in the steady state,
// for a new key: it reuses a released key's slot). The submission counts
// as a waiter that never leaves: only its deadline (o.Deadline), Cancel, a
// newer generation or Close end it. Its outcome reaches only the completion
// hook and Stats. Fire-and-forget submissions merged into one call share one
// deadline, the latest of theirs, and one outcome.
func (d *Dispatcher[K, T]) Post(key K, call T, o SubmitOptions) error {
	deadline := d.deadlineOf(nil, &o)
	label := d.labelOf(key, call)
	var ob outbox[K, T]
	d.mu.Lock()
	if d.mode == Sync {
		d.mu.Unlock()
		return d.postSync(key, call, o)
	}
	ten := d.tenantFor(o.Tenant)
	var err error
	coalesced := false
	var now int64 // 0: admit reads the clock only if it needs it
	if deadline != 0 {
		if now = d.now(); deadline <= now {
			err = errRejectPast
		}
	}
	if err == nil {
		coalesced, err = d.admit(key, call, &o, now, deadline, nil, ten, label, &ob)
	}
	d.count(ten, err)
	d.mu.Unlock()
	if d.cfg.Observer != nil {
		d.observeSubmit(label, &o, coalesced, err)
	}
	d.deliver(&ob)
	return err
}

// admit places a submission, or returns why it cannot, having changed
// nothing. t is nil for a fire-and-forget submission. now is the clock
// reading, or 0 to have admit read it only if it needs it.
func (d *Dispatcher[K, T]) admit(key K, val T, o *SubmitOptions, now, deadline int64, t *Ticket[K, T], ten *tenant[K, T], label string, ob *outbox[K, T]) (coalesced bool, err error) {
	if d.closing {
		return false, ErrClosed
	}
	s := d.slots[key]
	if now == 0 {
		now = d.admitTime(s, t, o, deadline)
	}
	if s == nil {
		if t != nil && d.tickets >= d.cfg.MaxWaiters {
			return false, d.refuse(BoundWaiters)
		}
		// Decide every refusal and victim before changing anything: a
		// refused submission leaves the dispatcher as it was.
		k1, k2 := d.q.sortKey(o.Priority, now)
		var quotaVictim, capVictim *call[K, T]
		if ten.overQuota(0) {
			if quotaVictim = worst(ten.shed, k1, k2, d.seq+1, nil); quotaVictim == nil {
				return false, d.refuse(BoundQuota)
			}
		}
		// A quota victim is alone in its slot, so evicting it frees a key.
		if quotaVictim == nil && len(d.slots) >= d.cfg.Capacity {
			if capVictim = worst(d.q.shed, k1, k2, d.seq+1, nil); capVictim == nil {
				return false, d.refuse(BoundCapacity)
			}
		}
		if o.Droppable && d.br != nil && d.br.p.RefuseDroppable && d.br.state == BreakerOpen {
			return false, ErrCircuitOpen
		}
		if quotaVictim != nil {
			d.drop(quotaVictim, errDroppedQuota, BoundQuota, now, ob)
		}
		if capVictim != nil {
			d.drop(capVictim, errDroppedCapacity, BoundCapacity, now, ob)
		}
		if !d.started {
			d.start()
		}
		s = d.newSlot(key, o.Generation)
		d.slots[key] = s
		c := d.newCall(s, val, o, ten, label)
		d.join(c, t, o.Priority, now, deadline)
		d.q.push(c)
		if d.mode == Async {
			d.wakeWorker()
		}
		return false, nil
	}
	if o.Generation < s.gen {
		return false, errRejectStale // before any bound: it would never be accepted
	}
	if t != nil && d.tickets >= d.cfg.MaxWaiters {
		return false, d.refuse(BoundWaiters)
	}
	supersede := o.Generation > s.gen
	var quotaVictim *call[K, T]
	if supersede || s.next == nil {
		// This submission makes a new call for the key: it needs quota.
		freed := 0
		if supersede && s.next != nil && s.next.ten == ten {
			freed = 1
		}
		if ten.overQuota(freed) {
			k1, k2 := d.q.sortKey(o.Priority, now)
			if quotaVictim = worst(ten.shed, k1, k2, d.seq+1, s.next); quotaVictim == nil {
				return false, d.refuse(BoundQuota)
			}
		}
	}
	if supersede {
		d.supersede(s, o.Generation, now, ob)
	}
	if c := s.next; c != nil {
		if err := d.coalesce(c, val, o.IdempotencyKey); err == SkipIncoming {
			d.skipIncoming(key, val, t, label, ob)
			return true, nil
		} else if err != nil {
			return false, err
		}
		if !o.Droppable {
			c.droppable = false
			d.q.unshed(c)
		}
		d.join(c, t, o.Priority, now, deadline)
		d.st.coalesced++
		return true, nil
	}
	if quotaVictim != nil {
		d.drop(quotaVictim, errDroppedQuota, BoundQuota, now, ob)
	}
	// The key is in flight: this call is its successor, and enters the ready
	// index only when the in-flight call finishes, with the enqueue time it
	// has now.
	c := d.newCall(s, val, o, ten, label)
	d.join(c, t, o.Priority, now, deadline)
	if s.run == nil {
		// A newer generation just removed the key's only (queued) call.
		d.q.push(c)
		if d.mode == Async {
			d.wakeWorker()
		}
	}
	return false, nil
}

// skipIncoming ends an accepted submission at once as Skipped: the merge
// function found that the key's pending call makes it moot. It joins no
// call, so no completion hook fires for it.
func (d *Dispatcher[K, T]) skipIncoming(key K, val T, t *Ticket[K, T], label string, ob *outbox[K, T]) {
	d.st.coalesced++
	d.st.outcomes[Skipped]++
	if t == nil {
		return
	}
	t.res = Result[K, T]{Key: key, Call: val, Outcome: Outcome{State: Skipped, Waiters: 1}}
	t.state = tsDone
	ob.tickets = append(ob.tickets, t)
}

// admitTime returns the time admit works with. A fire-and-forget
// submission without a deadline that coalesces into a call already holding
// fire-and-forget submissions does not need the clock: its enqueue time
// matters only if it is earlier than the aggregate's (which is at or
// before the clock, and at or after the call's), so the aggregate's own
// enqueue time stands in for it and leaves every minimum as it is. That
// spares the busiest path — a hot key re-posted — a clock read.
func (d *Dispatcher[K, T]) admitTime(s *slot[K, T], t *Ticket[K, T], o *SubmitOptions, deadline int64) int64 {
	if t == nil && deadline == 0 && s != nil && o.Generation == s.gen {
		if c := s.next; c != nil && c.nff > 0 {
			return c.ff.enq
		}
	}
	return d.now()
}

// refuse counts and returns a backpressure refusal.
func (d *Dispatcher[K, T]) refuse(b Bound) error {
	d.st.refused[b.index()]++
	return &BackpressureError{Bound: b, Depth: len(d.slots)}
}

func (d *Dispatcher[K, T]) newCall(s *slot[K, T], val T, o *SubmitOptions, ten *tenant[K, T], label string) *call[K, T] {
	c := s.newCall()
	d.calls++
	c.label = label
	if d.labels != nil {
		d.labels[label]++
	}
	d.seq++
	ten.queued++
	c.ten = ten
	c.val, c.gen, c.seq, c.idem, c.droppable = val, o.Generation, d.seq, o.IdempotencyKey, o.Droppable
	s.next = c
	return c
}

// drop sheds a queued call to make room: every waiter gets Dropped with
// the reason, and the completion hook fires.
func (d *Dispatcher[K, T]) drop(c *call[K, T], err error, reason Bound, now int64, ob *outbox[K, T]) {
	d.st.shed[reason.index()]++
	c.ten.st.Dropped++
	if obs := d.cfg.Observer; obs != nil {
		e := c.event()
		ob.notes = append(ob.notes, func() { obs.OnDrop(e, reason) })
	}
	d.settleAll(c, Dropped, err, now, false, ob)
	d.endCall(c, Dropped, err, now, ob)
	d.releaseSlot(c.s)
}

// supersede ends the key's calls of older generations: their waiters get
// Stale, a pending call is removed, an in-flight one is cancelled.
func (d *Dispatcher[K, T]) supersede(s *slot[K, T], gen uint64, now int64, ob *outbox[K, T]) {
	s.gen = gen
	d.endKey(s, Stale, fmt.Errorf("%w: superseded by generation %d", ErrStale, gen), now, true, ob)
}

// endKey ends the live calls of s — the pending one, and the in-flight one
// too if inflight is set — with st for every waiter: a queued call is
// removed, an in-flight one has its context cancelled with err. It reports
// whether it ended any. The caller releases the slot if it should go.
func (d *Dispatcher[K, T]) endKey(s *slot[K, T], st State, err error, now int64, inflight bool, ob *outbox[K, T]) bool {
	ended := false
	for _, c := range [2]*call[K, T]{s.next, s.run} {
		if c != nil && !c.orphan && (inflight || c.state != csRunning) {
			ended = true
			d.settleAll(c, st, err, now, false, ob)
			d.endCall(c, st, err, now, ob)
		}
	}
	return ended
}

// Cancel ends every submission for key with Canceled, wrapping cause: the
// pending call is removed and the in-flight call's context is cancelled
// with cause (its execution, when it returns, is reported Stale). It
// reports whether there was anything to cancel.
func (d *Dispatcher[K, T]) Cancel(key K, cause error) bool {
	err := canceledErr(cause)
	var ob outbox[K, T]
	d.mu.Lock()
	s := d.slots[key]
	found := false
	if s != nil {
		found = d.endKey(s, Canceled, err, d.now(), true, &ob)
		d.releaseSlot(s)
	}
	d.mu.Unlock()
	d.deliver(&ob)
	return found
}

// Pending reports whether key has a call that has not finished: queued,
// waiting for retry, or in flight — including an execution that was
// cancelled but has not returned yet, since it may still take effect. A
// caller that must not act before an earlier write lands (binding after its
// prerequisite) checks this.
func (d *Dispatcher[K, T]) Pending(key K) bool {
	d.mu.Lock()
	_, ok := d.slots[key]
	d.mu.Unlock()
	return ok
}

// ctxDone is the AfterFunc of a Submit context.
func (d *Dispatcher[K, T]) ctxDone(t *Ticket[K, T], ctx context.Context) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		d.leave(t, Expired, ErrExpired)
		return
	}
	d.leave(t, Canceled, canceledErr(context.Cause(ctx)))
}

// leave ends one ticket with st. If it was its call's last waiter, the call
// ends too.
func (d *Dispatcher[K, T]) leave(t *Ticket[K, T], st State, err error) {
	var ob outbox[K, T]
	d.mu.Lock()
	switch t.state {
	case tsNew: // Submit has not admitted it yet; it will see this and refuse
		t.state = tsDone
	case tsLive:
		d.leaveLocked(t, st, err, d.now(), &ob)
	}
	d.mu.Unlock()
	d.deliver(&ob)
}

func (d *Dispatcher[K, T]) leaveLocked(t *Ticket[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	c := t.w.c
	d.detach(t)
	d.settleTicket(t, c, st, err, now, ob)
	if c.live() == 0 {
		d.endCall(c, st, err, now, ob)
		d.releaseSlot(c.s)
		return
	}
	d.reprioritize(c)
}

// settleTicket records t's outcome; the caller has detached it. The ticket
// is told after the lock is released (deliver).
func (d *Dispatcher[K, T]) settleTicket(t *Ticket[K, T], c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	t.res = d.result(c, st, err, now)
	t.state = tsDone
	d.st.outcomes[st]++
	ob.tickets = append(ob.tickets, t)
}

// settleAll ends every live waiter of c with st. With expire set, a waiter
// whose deadline has passed gets Expired instead: a result that arrives
// after a waiter's deadline is never delivered to it as success. It reports
// whether any waiter got st.
func (d *Dispatcher[K, T]) settleAll(c *call[K, T], st State, err error, now int64, expire bool, ob *outbox[K, T]) bool {
	served := false
	for w := c.head; w != nil; {
		next := w.next
		d.q.removeDeadline(w)
		w.prev, w.next, w.c = nil, nil, nil
		wst, werr := st, err
		if expire && w.deadline != 0 && w.deadline <= now {
			wst, werr = Expired, ErrExpired
		} else {
			served = true
		}
		d.settleTicket(w.t, c, wst, werr, now, ob)
		w = next
	}
	d.tickets -= c.nt
	c.head, c.nt = nil, 0
	if c.nff > 0 {
		wst := st
		if expire && !c.ffForever && c.ff.deadline <= now {
			wst = Expired
		} else {
			served = true
		}
		d.st.outcomes[wst] += uint64(c.nff)
		d.liveFF -= c.nff
		c.nff, c.ffForever = 0, false
		d.q.removeDeadline(&c.ff)
	}
	return served
}

// endCall ends a call that has no live waiters left. A queued call is
// removed and reported to the hook; an in-flight one is orphaned and its
// context cancelled — the worker reports it when exec returns. The caller
// releases the slot if it should go.
func (d *Dispatcher[K, T]) endCall(c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	if c.state == csRunning {
		if !c.orphan {
			c.orphan, c.endState = true, st
			c.cancel(err)
		}
		return
	}
	d.q.remove(c)
	c.ten.queued--
	d.forget(c)
	d.kick()
	if s := c.s; s.next == c {
		s.next = nil
	} else {
		// A retry in backoff that could not absorb its successor (requeue):
		// the successor is next in line now.
		s.run = nil
		if n := s.next; n != nil && n.state == csIdle {
			d.q.push(n)
			d.wakeWorker()
		}
	}
	d.hook(c, st, err, now, ob)
}

// forget drops an ended call from the live counts.
func (d *Dispatcher[K, T]) forget(c *call[K, T]) {
	d.calls--
	if d.labels != nil {
		if d.labels[c.label]--; d.labels[c.label] == 0 {
			delete(d.labels, c.label)
		}
	}
}

// kick wakes whoever waits for the dispatcher's state to change: callers
// running calls inline (Sync mode) and SetMode draining the queue.
func (d *Dispatcher[K, T]) kick() {
	if d.kickCh != nil {
		close(d.kickCh)
		d.kickCh = nil
	}
}

// kicked returns a channel closed at the next state change.
func (d *Dispatcher[K, T]) kicked() <-chan struct{} {
	if d.kickCh == nil {
		d.kickCh = make(chan struct{})
	}
	return d.kickCh
}

// event describes c for the observer.
func (c *call[K, T]) event() Event {
	return Event{Label: c.label, Tenant: c.ten.name}
}

// maxFreeSlots bounds the free list of released slots. Reusing a slot
// spares a new key its one allocation (and the garbage collector the work
// of freeing it), so that a dispatcher whose keys come and go allocates
// nothing per key in the steady state. The bound caps what a burst of
// finished keys leaves behind at 4096 slots: about 1.2 MB with small keys
// and values (a slot is about 300 bytes, more for a large K or T).
const maxFreeSlots = 4096

// newSlot returns a slot for key, reused from the free list if it can be.
func (d *Dispatcher[K, T]) newSlot(key K, gen uint64) *slot[K, T] {
	n := len(d.free)
	if n == 0 {
		return &slot[K, T]{key: key, gen: gen}
	}
	s := d.free[n-1]
	d.free[n-1] = nil
	d.free = d.free[:n-1]
	s.key, s.gen = key, gen
	return s
}

// releaseSlot forgets s's key if it has no call left, and keeps s for
// reuse. Nothing may refer to a released slot or its calls: by then every
// waiter has been detached, every index has let go of its calls, and no
// worker runs one.
func (d *Dispatcher[K, T]) releaseSlot(s *slot[K, T]) {
	if s.run != nil || s.next != nil {
		return
	}
	if d.slots[s.key] == s {
		delete(d.slots, s.key)
		if len(d.free) < maxFreeSlots {
			*s = slot[K, T]{} // let go of the key, the value and the tenant
			d.free = append(d.free, s)
		}
	}
	if d.closing && len(d.slots) == 0 && !d.drainedClosed {
		d.drainedClosed = true
		close(d.drained)
	}
}

func (d *Dispatcher[K, T]) hook(c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	d.st.calls[st]++
	if d.fb != nil {
		d.fb.finished(now, st == Failed)
	}
	if d.cfg.OnDone == nil && d.cfg.Observer == nil {
		return
	}
	r := d.result(c, st, err, now)
	if d.cfg.OnDone != nil {
		ob.hooks = append(ob.hooks, r)
	}
	if obs := d.cfg.Observer; obs != nil {
		e := c.event()
		o := r.Outcome
		ob.notes = append(ob.notes, func() { obs.OnFinish(e, o) })
	}
}

func (d *Dispatcher[K, T]) result(c *call[K, T], st State, err error, now int64) Result[K, T] {
	wait := now - c.enq
	if c.firstStart >= 0 {
		wait = c.firstStart - c.enq
	}
	return Result[K, T]{Key: c.s.key, Call: c.val, Outcome: Outcome{
		State:     st,
		Err:       err,
		Attempts:  c.attempts,
		Waiters:   c.joined,
		QueueWait: time.Duration(max(wait, 0)),
		RunTime:   c.runTime,
	}}
}

// ticketState is a Ticket's lifecycle, guarded by the Dispatcher's lock.
type ticketState uint8

const (
	tsNew  ticketState = iota // created, not yet admitted
	tsLive                    // waiting on a call
	tsDone                    // outcome recorded (or never admitted)
)

// outbox collects what must be told once the lock is released: tickets to
// close and hook results to fire. Telling happens outside every lock, after
// the dispatcher's own state is final.
type outbox[K comparable, T any] struct {
	tickets []*Ticket[K, T]
	hooks   []Result[K, T]
	notes   notes
}

func (d *Dispatcher[K, T]) deliver(ob *outbox[K, T]) {
	for i, t := range ob.tickets {
		if t.stop != nil {
			t.stop()
		}
		t.tell()
		ob.tickets[i] = nil
	}
	ob.tickets = ob.tickets[:0]
	for i := range ob.hooks {
		d.cfg.OnDone(ob.hooks[i])
		ob.hooks[i] = Result[K, T]{}
	}
	ob.hooks = ob.hooks[:0]
	for i, f := range ob.notes {
		f()
		ob.notes[i] = nil
	}
	ob.notes = ob.notes[:0]
}

// count records a submission's admission or refusal.
func (d *Dispatcher[K, T]) count(ten *tenant[K, T], err error) {
	d.st.submitted++
	if err != nil {
		d.st.rejected++
		ten.st.Rejected++
		return
	}
	ten.st.Admitted++
}

// rejectEarly counts a submission refused before it reached the lock's
// critical section proper.
func (d *Dispatcher[K, T]) rejectEarly(name string) {
	d.mu.Lock()
	d.count(d.tenantFor(name), errRejectPast)
	d.mu.Unlock()
}

// ctxErr is the error for a submission whose context is already done.
func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errRejectPast
	}
	return canceledErr(context.Cause(ctx))
}

// safeCall runs f, turning a panic into a *PanicError.
func safeCall(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return f()
}
