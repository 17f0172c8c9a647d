package dispatch

import (
	"context"
	"fmt"
	"time"
)

// start launches the workers and the clock. It runs once, under the lock,
// on the first submission: a Dispatcher that is never used starts nothing.
// Every goroutine it starts is awaited by Close.
func (d *Dispatcher[K, T]) start() {
	d.started = true
	d.timer = time.NewTimer(time.Hour)
	d.timer.Stop()
	d.wg.Add(d.cfg.Workers + 1)
	for range d.cfg.Workers {
		go d.worker()
	}
	go d.clock()
	if d.fb != nil {
		d.fb.next = d.now() + max(int64(d.fb.p.Window)/windowBuckets, 1)
		d.armTimer(d.fb.next)
	}
}

// wakeWorker wakes one idle worker, if any, for a call that became ready.
func (d *Dispatcher[K, T]) wakeWorker() {
	if d.idle > 0 {
		d.cond.Signal()
	}
}

// worker runs ready calls until Close ends the dispatcher. It holds the lock
// except while it tells waiters and while user code (exec, the no-op test,
// the before-retry hook, the classifier) runs.
func (d *Dispatcher[K, T]) worker() {
	defer d.wg.Done()
	var ob outbox[K, T]
	d.mu.Lock()
	for !d.stopped {
		now := d.now()
		// Anything past its deadline is expired here too, not only by the
		// clock, so a worker never starts a call nobody is waiting for.
		d.expireDue(now, &ob)
		d.q.promote(now)
		c := d.next(now, &ob)
		if c == nil {
			if len(ob.tickets) > 0 || len(ob.hooks) > 0 || len(ob.notes) > 0 {
				d.mu.Unlock()
				d.deliver(&ob)
				d.mu.Lock()
				continue
			}
			d.idle++
			d.cond.Wait()
			d.idle--
			continue
		}
		d.workerRunning++
		d.run(c, now, &ob)
		d.workerRunning--
	}
	d.mu.Unlock()
	d.deliver(&ob)
}

// run executes one attempt of c, which the caller has taken from the
// queue: it unlocks for user code and the waiters' delivery, and returns
// with the lock held and the attempt's end recorded.
func (d *Dispatcher[K, T]) run(c *call[K, T], now int64, ob *outbox[K, T]) {
	a := d.begin(c, now)
	d.mu.Unlock()
	d.deliver(ob)
	if d.cfg.Observer != nil {
		d.cfg.Observer.OnStart(a.ev, a.n, a.wait)
	}
	out := d.execute(a)
	if out.stop != nil {
		out.stop()
	}
	c.cancel(nil) // release the contexts' resources
	d.mu.Lock()
	d.finish(c, &out, ob)
}

// next pops the best ready call, if the circuit breaker lets one start.
func (d *Dispatcher[K, T]) next(now int64, ob *outbox[K, T]) *call[K, T] {
	if d.q.nready == 0 {
		return nil
	}
	ten := d.q.pick(now)
	if ten == nil {
		return nil // every tenant with ready calls is at its in-flight cap
	}
	probe := false
	if d.br != nil {
		probe = d.br.state != BreakerClosed
		if !d.br.admits(now, &ob.notes) {
			if d.br.state == BreakerOpen {
				d.armTimer(d.br.openUntil)
			}
			return nil
		}
	}
	c := d.q.popFrom(ten)
	c.probe = probe
	return c
}

// attempt is what a worker needs to run a call outside the lock, and what
// it brings back.
type attempt[K comparable, T any] struct {
	callCtx context.Context // the call's context: waiters, deadline, Close
	ctx     context.Context // this attempt's: callCtx plus AttemptTimeout
	key     K
	val     T
	lastErr error // the previous attempt's error, if this is a retry
	stop    context.CancelFunc
	ev      Event         // for the observer, if any
	n       int           // attempt number
	wait    time.Duration // queue wait

	// Results.
	err      error
	class    Class
	ran      bool // exec was called
	skipped  bool // the no-op test said so
	done     bool // the before-retry hook found the earlier attempt took effect
	rebuilt  bool // the before-retry hook returned the value to run
	hookErr  error
	callDone bool // the call's own context ended (deadline, cancel, Close)
	runTime  time.Duration
}

// begin marks c in flight and derives its execution context: cancelled
// when c loses its waiters or the dispatcher closes, with the latest
// deadline of c's live waiters (none if any waiter has none), carrying the
// idempotency key.
func (d *Dispatcher[K, T]) begin(c *call[K, T], now int64) attempt[K, T] {
	s := c.s
	s.run = c
	if s.next == c {
		s.next = nil
	}
	c.state = csRunning
	if c.firstStart < 0 {
		c.firstStart = now
		wait := time.Duration(max(now-c.enq, 0))
		d.qwait.observe(now, wait)
		if d.fb != nil {
			d.fb.waited(now, wait)
		}
	}
	if c.attempts == 0 && c.lastErr == nil {
		d.budget.at(now).first++
	}
	d.running++
	c.ten.queued--
	c.ten.inflight++
	ctx, cancel := context.WithCancelCause(d.base)
	c.cancel = cancel
	if dl := c.execDeadline(); dl != 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, d.epoch.Add(time.Duration(dl)))
		c.cancel = func(cause error) { cancel(cause); stop() }
	}
	if c.idem != "" {
		ctx = context.WithValue(ctx, idemKey{}, c.idem)
	}
	a := attempt[K, T]{callCtx: ctx, ctx: ctx, key: s.key, val: c.val, lastErr: c.lastErr}
	if d.cfg.Observer != nil {
		a.ev, a.n, a.wait = c.event(), c.attempts+1, time.Duration(c.firstStart-c.enq)
	}
	if t := d.cfg.Retry.AttemptTimeout; t > 0 {
		a.ctx, a.stop = context.WithTimeout(ctx, t)
	}
	return a
}

// execDeadline is the latest deadline among c's live waiters, or 0 if any
// of them has none.
func (c *call[K, T]) execDeadline() int64 {
	var dl int64
	if c.nff > 0 {
		if c.ffForever {
			return 0
		}
		dl = c.ff.deadline
	}
	for w := c.head; w != nil; w = w.next {
		if w.deadline == 0 {
			return 0
		}
		dl = max(dl, w.deadline)
	}
	return dl
}

// execute runs one attempt outside the lock: the before-retry hook (on a
// retry), the no-op test, a rate-limiter token, exec, and the classifier.
// Panics in user code become errors.
func (d *Dispatcher[K, T]) execute(a attempt[K, T]) attempt[K, T] {
	if a.lastErr != nil && d.cfg.BeforeRetry != nil {
		var next T
		var done bool
		err := safeCall(func() (err error) {
			next, done, err = d.cfg.BeforeRetry(a.callCtx, a.key, a.val, a.lastErr)
			return err
		})
		switch {
		case err != nil:
			a.hookErr = err
			return a
		case done:
			a.done = true
			return a
		}
		a.val, a.rebuilt = next, true
	}
	if d.cfg.NoOp != nil {
		var isNoop bool
		if err := safeCall(func() error { isNoop = d.cfg.NoOp(a.key, a.val); return nil }); err != nil {
			a.err = err
			return a
		}
		if isNoop {
			a.skipped = true
			return a
		}
	}
	if d.cfg.RateLimit != nil {
		if err := d.cfg.RateLimit.Wait(a.ctx); err != nil {
			a.err = fmt.Errorf("dispatch: rate limiter: %w", err)
			a.callDone = a.callCtx.Err() != nil
			a.class = Retry
			return a
		}
	}
	start := time.Now()
	a.err = safeCall(func() error { return d.exec(a.ctx, a.key, a.val) })
	a.runTime = time.Since(start)
	a.ran = true
	if a.err != nil {
		// An error from a call whose own context ended is the end of the
		// call, not a verdict on the API: it is not classified or retried.
		a.callDone = a.callCtx.Err() != nil
		if !a.callDone {
			_ = safeCall(func() error { a.class = d.cfg.Classify(a.err); return nil })
		}
	}
	return a
}

// finish records the end of an attempt of c. A call orphaned meanwhile
// (cancelled, superseded, expired, closed) is reported Stale if exec ran —
// the side effect may have happened, but nobody is told it succeeded. A
// retryable failure sends the call back to the queue (requeue); otherwise
// its waiters are told. Then the key's successor, if any, becomes ready
// with its original enqueue time.
func (d *Dispatcher[K, T]) finish(c *call[K, T], a *attempt[K, T], ob *outbox[K, T]) {
	now := d.now()
	d.running--
	c.ten.inflight--
	c.runTime += a.runTime
	if a.ran {
		d.exect.observe(now, a.runTime)
	}
	if a.rebuilt {
		c.val = a.val
	}
	if a.ran {
		c.attempts++
		d.st.executions++
	}
	if d.br != nil {
		wasClosed := d.br.state == BreakerClosed
		counted := a.ran && !c.orphan && !a.callDone && (a.err == nil || a.class == Retry)
		d.br.record(now, c.probe, counted, a.err != nil, &ob.notes)
		c.probe = false
		switch {
		case d.br.state == BreakerClosed && !wasClosed:
			d.cond.Broadcast() // resume every worker
		case d.br.state == BreakerOpen:
			d.armTimer(d.br.openUntil)
		}
	}
	s := c.s
	switch {
	case c.orphan:
		st := c.endState
		if a.ran {
			st = Stale
			d.st.staleExecutions++
		}
		d.hook(c, st, staleErr(st, a.err), now, ob)
	case a.hookErr != nil:
		d.end(c, Failed, &RetryError{Attempts: c.attempts, Last: a.hookErr, Reason: GiveUpBeforeRetry}, now, a.ran, ob)
	case a.done:
		d.st.alreadyDone++
		d.end(c, Succeeded, nil, now, a.ran, ob)
	case a.skipped:
		d.end(c, Skipped, nil, now, a.ran, ob)
	case a.err == nil:
		d.end(c, Succeeded, nil, now, a.ran, ob)
	default:
		notBefore, reason := d.retryAt(c, a, now)
		if reason == "" {
			if obs := d.cfg.Observer; obs != nil {
				e, n, delay, err := c.event(), c.attempts, time.Duration(notBefore-now), a.err
				ob.notes = append(ob.notes, func() { obs.OnRetry(e, n, delay, err) })
			}
			d.requeue(c, a.err, notBefore, now, ob)
			d.kick()
			return
		}
		err := a.err
		if reason != giveUpPanic {
			err = &RetryError{Attempts: c.attempts, Last: a.err, Reason: reason}
		}
		d.end(c, Failed, err, now, a.ran, ob)
	}
	d.forget(c)
	s.run = nil
	c.state = csIdle
	if n := s.next; n != nil && n.state == csIdle {
		d.q.push(n)
		d.wakeWorker()
	}
	d.releaseSlot(s)
	d.kick()
}

// end tells c's waiters the outcome st and fires the hook. A waiter whose
// deadline passed meanwhile gets Expired instead; if every waiter did, an
// execution that ran is reported Stale.
func (d *Dispatcher[K, T]) end(c *call[K, T], st State, err error, now int64, ran bool, ob *outbox[K, T]) {
	switch {
	case d.settleAll(c, st, err, now, true, ob):
		d.hook(c, st, err, now, ob)
	case ran:
		d.st.staleExecutions++
		d.hook(c, Stale, staleErr(Stale, err), now, ob)
	default:
		d.hook(c, Expired, ErrExpired, now, ob)
	}
}

// retryAt decides whether a failed attempt of c runs again, and when. It
// returns the time the retry may start, or the reason it may not.
func (d *Dispatcher[K, T]) retryAt(c *call[K, T], a *attempt[K, T], now int64) (int64, GiveUp) {
	p := &d.cfg.Retry
	var delay time.Duration
	switch {
	case a.callDone:
		return 0, GiveUpDeadline
	case a.class == Permanent:
		if _, ok := a.err.(*PanicError); ok {
			return 0, giveUpPanic // delivered as the *PanicError itself
		}
		return 0, GiveUpPermanent
	case a.class == Recompute && d.cfg.BeforeRetry == nil:
		return 0, GiveUpRecompute
	case c.attempts >= p.MaxAttempts:
		return 0, GiveUpAttempts
	case a.class == Recompute:
		// Rebuild from fresh state at once: waiting does not resolve a
		// conflict, re-reading does.
	default:
		if hint, ok := retryAfter(a.err); ok {
			delay = hint
		} else {
			delay = p.backoff(c.attempts)
		}
	}
	notBefore := now + int64(delay)
	if dl := c.execDeadline(); dl != 0 && notBefore >= dl {
		return 0, GiveUpDeadline
	}
	if !d.budgetAllows(now) {
		return 0, GiveUpBudget
	}
	return notBefore, ""
}

// requeue sends c back to the queue to run again at notBefore. The retry
// holds no worker: it waits in the delay index. While it waits it is the
// key's pending call, so new submissions coalesce into it and keep its
// backoff. A successor that arrived during the attempt is coalesced into it
// now; if the merge refuses, the retry keeps the in-flight position and the
// successor waits behind it.
func (d *Dispatcher[K, T]) requeue(c *call[K, T], lastErr error, notBefore, now int64, ob *outbox[K, T]) {
	s := c.s
	d.st.retries++
	c.ten.queued++
	c.lastErr = lastErr
	c.state = csIdle
	if n := s.next; n != nil {
		switch err := d.coalesce(c, n.val, n.idem); err {
		case nil:
			d.absorb(c, n)
			s.run, s.next = nil, c
		case SkipIncoming:
			// The retry makes the successor moot.
			d.settleAll(n, Skipped, nil, now, false, ob)
			d.endCall(n, Skipped, nil, now, ob)
			s.run, s.next = nil, c
		}
		// else: s.run stays c, and n stays its successor.
	} else {
		s.run, s.next = nil, c
	}
	if notBefore <= now {
		d.q.push(c)
		d.wakeWorker()
		return
	}
	d.q.delay(c, notBefore)
	d.armTimer(notBefore)
}

// absorb moves every waiter of the successor n into c (whose value already
// holds the merge of both) and forgets n.
func (d *Dispatcher[K, T]) absorb(c, n *call[K, T]) {
	for w := n.head; w != nil; {
		next := w.next
		w.c = c
		w.prev, w.next = nil, c.head
		if c.head != nil {
			c.head.prev = w
		}
		c.head = w
		w = next
	}
	c.nt += n.nt
	if n.nff > 0 {
		d.q.removeDeadline(&n.ff)
		d.addFF(c, n.nff, n.ff.prio, n.ff.enq, n.ff.deadline, n.ffForever)
	}
	c.joined += n.joined
	c.droppable = c.droppable && n.droppable
	d.st.coalesced += uint64(n.joined)
	n.head, n.nt, n.nff = nil, 0, 0
	n.ten.queued--
	d.forget(n)
	d.reprioritize(c)
}

// giveUpPanic ends a call whose exec panicked: its error is the
// *PanicError itself, not a *RetryError.
const giveUpPanic GiveUp = "panic"

// staleErr is the hook's error for a call that ended in st after losing
// its waiters; execErr is what exec returned, kept for audit.
func staleErr(st State, execErr error) error {
	if st != Stale {
		return stateErr(st)
	}
	if execErr != nil {
		return fmt.Errorf("%w: execution finished after its waiters left: %w", ErrStale, execErr)
	}
	return fmt.Errorf("%w: execution succeeded after its waiters left", ErrStale)
}

// stateErr is the sentinel for a terminal state that is not success or
// failure.
func stateErr(st State) error {
	switch st {
	case Canceled:
		return ErrCanceled
	case Expired:
		return ErrExpired
	case Dropped:
		return ErrDropped
	case Stale:
		return ErrStale
	case Closed:
		return ErrClosed
	}
	return nil
}
