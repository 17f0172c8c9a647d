package dispatch

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/coalescer/dispatch/internal/execctx"
	"github.com/coalescer/dispatch/internal/tokens"
)

// This file is execution: the worker loop, and one attempt of a call —
// begin under the lock, execute outside it, endAttempt under it again.

// worker runs ready calls until Close ends the dispatcher. It takes the
// lock itself, and holds it except while it tells waiters and while user
// code (exec, the no-op test, the before-retry hook, the classifier) runs.
func (d *Dispatcher[K, T]) worker(id uint64) {
	rn := runner{id: id, onWorker: true}
	var ob outbox[K, T]
	d.mu.Lock()
	// One clock reading serves an iteration: the end of the execution the
	// worker just ran, or a new one after it waited or told outcomes.
	// Decisions are then at most the time it took to retake the lock late.
	now := d.clk.now()
	for !d.stopped {
		// Anything past its deadline is expired here too, not only by the
		// clock, so a worker never starts a call nobody is waiting for.
		d.expireDue(now, &ob)
		d.q.promote(now)
		c := d.next(now, &ob)
		if c == nil {
			if !ob.empty() {
				d.mu.Unlock()
				d.tell.deliver(&ob)
				d.mu.Lock()
				now = d.clk.now()
				continue
			}
			d.wake.idleWait()
			now = d.clk.now()
			continue
		}
		d.passOn()
		now = d.run(c, now, &ob, rn)
	}
	d.mu.Unlock()
	d.tell.deliver(&ob)
}

// passOn wakes an idle worker, if calls are still ready and a worker is
// still free, before this one leaves the lock to run the call it took. The
// next call needs someone to take its token (or to ask the limiter, the
// clock or the fetcher for one), and nobody else may: the submissions'
// wakes may all have been spent before the limiter granted, and the
// executions running may not end for a long time. Without it, once the
// limiter's burst is spent, calls ready behind executions that hang start
// only as those end, however many workers are free.
func (d *Dispatcher[K, T]) passOn() {
	if d.q.nready > 0 && d.gate.running+1 < d.gate.limit() {
		d.wake.worker()
	}
}

// runner is who executes a call: a worker, or a caller running it inline
// (Sync mode), by goroutine id.
type runner struct {
	id       uint64
	onWorker bool
}

// run executes one attempt of c, which the caller has taken from the
// queue: it releases the lock for user code and the waiters' delivery, and
// returns with the lock held and the attempt's end recorded.
//
// If a callback ends the goroutine (runtime.Goexit), the attempt is ended
// on the way out, so that no outcome is lost and the key is not wedged:
// while earlier outcomes are told (ob, before any of c's own user code
// runs), c goes back to the queue untouched — the hook that exited was not
// c's; during c's attempt, the attempt ends Failed with a *PanicError.
//
// It returns the clock reading its attempt ended at.
func (d *Dispatcher[K, T]) run(c *call[K, T], now int64, ob *outbox[K, T], rn runner) int64 {
	a := d.begin(c, now, rn)
	d.mu.Unlock()
	ended := false
	defer func() {
		if r := recover(); r != nil {
			crash(r) // the dispatcher's own code panicked, perhaps under the lock
		}
		if ended {
			return
		}
		if a.site == "" {
			a.abandoned = true
		} else {
			a.panicked = true
			a.err = &PanicError{Callback: a.site, Value: ErrGoexit, Stack: debug.Stack()}
			a.ran = a.ran || a.site == callbackExec
		}
		d.settleAttempt(c, &a, ob, rn)
		d.mu.Unlock()
		d.tell.deliver(ob)
	}()
	d.tell.deliver(ob)
	if obs := d.cfg.Observer; obs != nil {
		a.site = callbackObserver
		d.tell.observe(func() { obs.OnStart(a.ev, a.n, a.wait) })
	}
	a.execute(&d.cfg, d.exec, &d.clk)
	ended = true
	return d.settleAttempt(c, &a, ob, rn)
}

// settleAttempt ends the attempt's contexts and records its end. It is
// called without the lock, and returns with it held, and the clock reading
// the attempt ended at.
//
// The call's context is cancelled (cause ErrAttemptEnded, unless the call
// ended before) before AttemptTimeout's is stopped, so that a context exec
// derived or kept reports the same cause.
func (d *Dispatcher[K, T]) settleAttempt(c *call[K, T], a *attempt[K, T], ob *outbox[K, T], rn runner) int64 {
	a.callCtx.Cancel(ErrAttemptEnded, false)
	if a.stop != nil {
		a.stop()
	}
	if rn.onWorker {
		ob.stock() // outside the lock: the Result its call's tickets read
	}
	d.mu.Lock()
	if rn.onWorker {
		d.gate.running--
		if c.low {
			d.gate.low--
			c.low = false
		}
	} else {
		d.owned.drop(rn.id)
		d.wake.kick()
	}
	c.ctx = nil
	if a.end == 0 {
		a.end = d.clk.now()
	}
	d.endAttempt(c, a, ob, a.end)
	return a.end
}

// attempt is what an execution needs outside the lock, and what it brings
// back.
type attempt[K comparable, T any] struct {
	callCtx *execctx.Ctx    // the call's context: waiters, deadline, Close
	ctx     context.Context // this attempt's: callCtx plus AttemptTimeout
	key     K
	val     T
	lastErr error // the previous attempt's error, if this is a retry
	stop    context.CancelFunc
	inline  bool          // run by a Sync-mode caller, not a worker
	ev      Event         // for the observer, if any
	n       int           // attempt number
	wait    time.Duration // queue wait

	// Results.
	site      string // the user code of this call running, or last run; "" before any
	abandoned bool   // the goroutine ended before any of it ran: no attempt was made
	err       error
	panicked  bool // err is a *PanicError the dispatcher recovered: never retried
	class     Class
	ran       bool // exec was called
	skipped   bool // the no-op test said so
	done      bool // the before-retry hook found the earlier attempt took effect
	rebuilt   bool // the before-retry hook returned the value to run
	hookErr   error
	callDone  bool // the call's own context ended (deadline, cancel, Close)
	runTime   time.Duration
	end       int64 // the clock when exec returned; 0 if it did not run
}

// begin marks c running and gives it its execution context (execctx.go):
// cancelled when c loses its waiters (among them, when their deadlines
// pass) or the dispatcher closes, reporting the latest deadline of c's live
// waiters (none if any waiter has none), carrying the idempotency key.
func (d *Dispatcher[K, T]) begin(c *call[K, T], now int64, rn runner) attempt[K, T] {
	if rn.onWorker {
		d.gate.running++
		if c.low {
			d.gate.low++
		}
	} else {
		c.low = false      // inline executions are their callers' own
		d.owned.add(rn.id) // Close waits for this execution
	}
	c.runner = rn.id
	if c.probe {
		d.gate.breaker.StartProbe(rn.id)
	}
	l := c.lane
	l.running = c
	if l.pending == c {
		l.pending = nil
	}
	c.enter(csRunning)
	if c.firstStart < 0 {
		d.firstStart(c, now)
	}
	d.running++
	c.ten.queued--
	c.ten.inflight++
	var dl time.Time
	if at := c.execDeadline(); at != 0 {
		dl = d.clk.wall(at)
	}
	ctx := execctx.New(dl, c.idem) // each execution its own: never reused
	c.ctx = ctx
	a := attempt[K, T]{callCtx: ctx, ctx: ctx, key: l.key, val: c.val, lastErr: c.lastErr, inline: !rn.onWorker}
	if d.cfg.Observer != nil {
		a.ev, a.n, a.wait = c.event(), c.attempts+1, time.Duration(c.firstStart-c.enq)
	}
	if t := d.cfg.Retry.AttemptTimeout; t > 0 {
		a.ctx, a.stop = context.WithTimeout(ctx, t)
	}
	return a
}

// firstStart records the first execution of c, at now: its queue wait,
// and a first attempt for the retry budget.
func (d *Dispatcher[K, T]) firstStart(c *call[K, T], now int64) {
	c.firstStart = now
	wait := time.Duration(max(now-c.enq, 0))
	d.queueWait.Observe(now, wait)
	if d.fallback != nil {
		d.fallback.Waited(now, wait)
	}
	d.budget.first(now)
}

// execute runs one attempt outside the lock: the before-retry hook (on a
// retry), the no-op test, a rate-limiter token, exec, and the classifier.
// A panic in any of them ends the call Failed with a *PanicError, never
// retried: exec may have done half of its side effect.
func (a *attempt[K, T]) execute(cfg *settings[K, T], exec ExecFunc[K, T], clk *timebase) {
	if a.lastErr != nil && cfg.BeforeRetry != nil {
		a.site = callbackBeforeRetry
		var next T
		var done bool
		_, err := guard(callbackBeforeRetry, func() (err error) {
			next, done, err = cfg.BeforeRetry(a.callCtx, a.key, a.val, a.lastErr)
			return err
		}, nil)
		switch {
		case err != nil:
			a.hookErr = err
			return
		case done:
			a.done = true
			return
		}
		a.val, a.rebuilt = next, true
	}
	if cfg.NoOp != nil {
		a.site = callbackNoOp
		var isNoop bool
		if pe, _ := guard(callbackNoOp, func() error { isNoop = cfg.NoOp(a.key, a.val); return nil }, nil); pe != nil {
			a.err, a.panicked = pe, true
			return
		}
		if isNoop {
			a.skipped = true
			return
		}
	}
	if l := cfg.RateLimit; l != nil && a.inline {
		// A worker took its token before choosing the call; an inline
		// caller waits for one here, under the call's own context (not
		// AttemptTimeout's, which bounds one execution). It fails only when
		// that context ends, which ends the call.
		if err := tokens.Wait(a.callCtx, l); err != nil {
			a.err = fmt.Errorf("dispatch: rate limiter: %w", err)
			a.callDone = true
			return
		}
	}
	a.site = callbackExec
	start := clk.now()
	pe, err := guard(callbackExec, func() error { return exec(a.ctx, a.key, a.val) }, nil)
	a.end = clk.now()
	a.runTime = time.Duration(a.end - start)
	a.ran = true
	a.err = err
	switch {
	case pe != nil:
		a.panicked = true
	case err != nil:
		// An error from a call whose own context ended is the end of the
		// call, not a verdict on the API: it is not classified or retried.
		if a.callDone = a.callCtx.Err() != nil; a.callDone {
			return
		}
		a.site = callbackClassify
		if pe, _ := guard(callbackClassify, func() error { a.class = cfg.Classify(err); return nil }, nil); pe != nil {
			a.err = fmt.Errorf("%w (judging the error: %w)", pe, err)
			a.panicked = true
		}
	}
}

// endAttempt records the end, at now, of an attempt of c. A call orphaned meanwhile
// (cancelled, superseded, expired, closed) finishes Stale if exec ran — the
// side effect may have happened, but nobody is told it succeeded. A
// retryable failure sends the call back to the queue (requeue); otherwise
// its waiters are told and it finishes.
func (d *Dispatcher[K, T]) endAttempt(c *call[K, T], a *attempt[K, T], ob *outbox[K, T], now int64) {
	if testHookUnderLock != nil {
		testHookUnderLock()
	}
	d.running--
	c.ten.inflight--
	if d.q.nready > 0 {
		// The tenant may have been at its in-flight cap: a worker that found
		// it so went idle, and nothing else would wake it.
		d.wake.worker()
	}
	c.runTime += a.runTime
	if a.rebuilt {
		c.val = a.val
	}
	if a.ran {
		d.execTime.Observe(now, a.runTime)
		c.attempts++
		d.totals.executions++
	}
	d.recordAttempt(c, a, now, ob)
	c.enter(csEnded)
	switch {
	case c.orphan:
		st := c.endState
		if a.ran {
			st = StateStale
			d.totals.staleExecutions++
		}
		d.finish(c, st, staleErr(st, a.err), now, ob)
	case a.abandoned:
		// Not an attempt: c waits again, in its old place in the order —
		// if its tenant still has room, as a retry must: a submission may
		// have taken the place c left while earlier outcomes were told.
		if !d.roomForRetry(c, now, ob) {
			d.conclude(c, a, StateFailed, &RetryError{Attempts: c.attempts, Last: c.lastErr, Reason: giveUpQuota}, now, ob)
			break
		}
		d.requeue(c, c.lastErr, now, now, ob)
		d.wake.kick()
	case a.hookErr != nil:
		d.conclude(c, a, StateFailed, &RetryError{Attempts: c.attempts, Last: a.hookErr, Reason: giveUpBeforeRetry}, now, ob)
	case a.done:
		d.totals.alreadyDone++
		d.conclude(c, a, StateSucceeded, nil, now, ob)
	case a.skipped:
		d.conclude(c, a, StateSkipped, nil, now, ob)
	case a.err == nil:
		d.conclude(c, a, StateSucceeded, nil, now, ob)
	default:
		notBefore, reason := d.retryAt(c, a, now, ob)
		if reason == "" {
			if obs := d.cfg.Observer; obs != nil {
				e, n, delay, err := c.event(), c.attempts, time.Duration(notBefore-now), a.err
				ob.notes = append(ob.notes, func() { obs.OnRetry(e, n, delay, err) })
			}
			d.totals.retries++
			d.requeue(c, a.err, notBefore, now, ob)
			d.wake.kick()
			return
		}
		err := a.err
		if reason != giveUpPanic {
			err = &RetryError{Attempts: c.attempts, Last: a.err, Reason: reason}
		}
		d.conclude(c, a, StateFailed, err, now, ob)
	}
}

// conclude tells c's waiters the outcome st and finishes c. A waiter whose
// deadline passed meanwhile gets Expired instead; if every waiter did, an
// execution that ran is reported Stale.
func (d *Dispatcher[K, T]) conclude(c *call[K, T], a *attempt[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	switch {
	case d.waiters.settleAll(c, st, err, now, expireLate, ob):
	case a.ran:
		d.totals.staleExecutions++
		st, err = StateStale, staleErr(StateStale, err)
	default:
		st, err = StateExpired, ErrExpired
	}
	d.finish(c, st, err, now, ob)
}
