package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/coalescer/dispatch/internal/execctx"
	"github.com/coalescer/dispatch/internal/tokens"
)

// This file is one attempt of a call: what it needs outside the lock, its
// execution there (the before-retry hook, the no-op test, exec, the
// classifier), and the verdict recorded under the lock again when it ends.

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
