package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	held    *tenant[K, T] // whose place c keeps until its attempt begins (holdPlace)
	inline  bool          // run by a Sync-mode caller, not a worker
	ev      Event         // for the observer, if any
	n       int           // attempt number
	wait    time.Duration // queue wait
	// observed: the observer hears of its start (OnStart), unless OnStart
	// ended the goroutine maxStartExits times in a row before it.
	observed bool
	// token: an inline attempt has its rate-limiter token (a worker took
	// its own before it chose the call); awaiting: it has none yet, and
	// its caller waits for it, the call counted queued meanwhile, not in
	// flight (begin, awaitToken).
	token, awaiting bool
	attemptEnd
}

// execution is one execution of a call: its context, and what the call's
// executions add up to so far. Each execution has a new one, never
// reused (user code may keep the context): a worker allocates its next
// before it takes the lock (runner.stock), so that the allocation is not
// made under it, and begin takes it. The call keeps its last one between
// attempts. So a queued call that has not started holds none of
// it, and an execution makes one allocation, as its context alone would:
// 80 bytes on a 64-bit platform, one allocation of 80
// (TestExecutionSizeDoc).
type execution struct {
	ctx    execctx.Ctx
	runner uint64 // goroutine id of the execution
	sofar
}

// sofar is what a call's executions add up to; each execution carries it
// on from the last.
type sofar struct {
	attempts   int
	firstStart int64 // the clock reading the call first started at
	runTime    time.Duration
	// startExits counts the times in a row Observer.OnStart ended the
	// goroutine before the call's next attempt began (maxStartExits).
	startExits uint8
}

// maxStartExits is how many times in a row Observer.OnStart may end the
// goroutine before one attempt of a call begins: each sends the call back
// to the queue untouched, and the attempt after the last begins without
// OnStart, so that an OnStart that always exits cannot hold a call back
// forever.
const maxStartExits = 3

// attemptEnd is what an attempt brings back.
type attemptEnd struct {
	site      string // the user code of this call running, or last run; "" before any
	abandoned bool   // the goroutine ended before any of it ran: no attempt was made
	startExit bool   // abandoned by Observer.OnStart (maxStartExits)
	err       error
	panicked  bool // err is a *PanicError the dispatcher recovered: never retried
	class     Class
	ran       bool // exec was called
	skipped   bool // the no-op test said so, or exec (SkipCall)
	done      bool // the before-retry hook found the earlier attempt took effect
	rebuilt   bool // the before-retry hook returned the value to run
	timedOut  bool // exec's error is a timeout (readErr)
	hookErr   error
	callDone  bool // the call's own context ended (deadline, cancel, Close)
	runTime   time.Duration
	hint      time.Duration // the server's Retry-After in exec's error, if > 0 (readErr)
	end       int64         // the clock when exec returned; 0 if it did not run
}

// execute runs one attempt outside the lock, which has its rate-limiter
// token: the before-retry hook (on a retry), the no-op test, exec, and the
// classifier. A panic in any of them ends the call Failed with a
// *PanicError, never retried: exec may have done half of its side effect.
func (a *attempt[K, T]) execute(cfg *settings[K, T], exec ExecFunc[K, T], clk *timebase) {
	if a.lastErr != nil && cfg.BeforeRetry != nil && !a.beforeRetry(cfg.BeforeRetry) {
		return
	}
	if cfg.NoOp != nil && a.noOp(cfg.NoOp) {
		return
	}
	if timeout := cfg.Retry.AttemptTimeout; timeout > 0 {
		// The timeout bounds exec alone: not an inline caller's wait for
		// its token, nor the before-retry hook or the no-op test, whose
		// time would otherwise come out of exec's. Its timer is made here,
		// outside the lock.
		a.ctx, a.stop = context.WithTimeout(a.callCtx, timeout)
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
		// The error's methods are user code too (Is, As, RetryAfter,
		// Timeout): what the dispatcher needs of them is read here, outside
		// the lock, and a panic in one is exec's.
		var skip bool
		if pe, _ := guard(callbackExec, func() error { skip = a.readErr(err); return nil }, nil); pe != nil {
			a.err, a.panicked = pe, true
			return
		}
		if skip {
			a.err, a.skipped = nil, true
			return
		}
		// An error from a call whose own context ended is the end of the
		// call, not a verdict on the API: it is not classified or retried.
		if a.callDone = a.callCtx.Err() != nil; a.callDone {
			return
		}
		// The attempt's own timer ended it (RetryPolicy.AttemptTimeout):
		// retried, whatever the classifier makes of the error it caused.
		if a.ctx.Err() != nil {
			a.class = ClassRetry
			return
		}
		a.site = callbackClassify
		if pe, _ := guard(callbackClassify, func() error { a.class = cfg.Classify(err); return nil }, nil); pe != nil {
			a.err = fmt.Errorf("%w (judging the error: %w)", pe, err)
			a.panicked = true
		}
		if a.class > ClassRecompute {
			a.class = ClassPermanent // a Class this package does not define fails safe
		}
	}
}

// readErr reads what the dispatcher needs of exec's error: whether it is
// SkipCall, the server's Retry-After, and whether it is a timeout.
func (a *attempt[K, T]) readErr(err error) (skip bool) {
	if errors.Is(err, SkipCall) {
		return true
	}
	a.hint, _ = retryAfter(err)
	var ne net.Error
	a.timedOut = errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	return false
}

// unhold lets go of the place holdPlace kept, if any.
func (a *attempt[K, T]) unhold() {
	if t := a.held; t != nil {
		t.held.Add(-1)
		a.held = nil
	}
}

// inlineToken waits for l's token for an inline (Sync-mode) attempt that
// found none held (begin), and reports whether it got one. A worker took
// its token before choosing the call; an inline caller waits for one
// here, before the attempt begins (awaitToken), under the call's own
// context (not AttemptTimeout's, which bounds one execution). It fails
// only when that context ends, which ends the call. A Wait that panics
// has failed, and is tried again after a back-off (teller.waitToken); one
// that ends the goroutine has made no attempt: the call waits in the
// queue again (runRelock), for a worker to take a token for it.
func (a *attempt[K, T]) inlineToken(l RateLimiter, tl *teller[K, T]) bool {
	a.site = callbackRateLimit
	wait := func(ctx context.Context) error { return tl.waitToken(ctx, l, func() {}) }
	if err := tokens.Wait(a.callCtx, wait); err != nil {
		a.err = fmt.Errorf("dispatch: rate limiter: %w", err)
		a.callDone = true
		return false
	}
	return true
}

// newAttempt makes the attempt c is about to run, beginning at now, under
// the context of its execution e (begin), set up here: cancelled when c
// loses its waiters or the dispatcher closes, reporting the latest
// deadline of c's live waiters (none if any waiter has none), carrying the
// idempotency key. inline: run by a Sync-mode caller; observed: an observer is set,
// which hears of it unless its OnStart exited too often (maxStartExits).
// RetryPolicy.AttemptTimeout is not set here: execute sets it as exec
// begins.
func (c *call[K, T]) newAttempt(e *execution, now int64, clk *timebase, inline, observed bool) attempt[K, T] {
	var dl time.Time
	if at := c.execDeadline(); at != 0 {
		dl = clk.wall(at)
	}
	ctx := &e.ctx
	ctx.Init(dl, c.idem())
	a := attempt[K, T]{callCtx: ctx, ctx: ctx, key: c.lane.key, val: c.val, lastErr: c.lastErr(), inline: inline}
	if a.observed = observed && e.startExits < maxStartExits; a.observed {
		// The queue wait is the first start's: an inline one waiting for
		// its token has none yet, and awaitToken sets it when it comes.
		a.ev, a.n, a.wait = c.event(), e.attempts+1, time.Duration(e.firstStart-c.enq)
	}
	return a
}

// beforeRetry runs the before-retry hook and reports whether the attempt
// goes on: not if the hook failed, or found the earlier attempt took
// effect.
func (a *attempt[K, T]) beforeRetry(hook func(context.Context, K, T, error) (T, bool, error)) bool {
	a.site = callbackBeforeRetry
	var next T
	var done bool
	_, err := guard(callbackBeforeRetry, func() (err error) {
		next, done, err = hook(a.callCtx, a.key, a.val, a.lastErr)
		return err
	}, nil)
	switch {
	case err != nil:
		a.hookErr = err
		return false
	case done:
		a.done = true
		return false
	}
	a.val, a.rebuilt = next, true
	return true
}

// noOp runs the no-op test and reports whether the attempt ends here:
// skipped, or the test panicked.
func (a *attempt[K, T]) noOp(test func(K, T) bool) bool {
	a.site = callbackNoOp
	var isNoop bool
	if pe, _ := guard(callbackNoOp, func() error { isNoop = test(a.key, a.val); return nil }, nil); pe != nil {
		a.err, a.panicked = pe, true
		return true
	}
	a.skipped = isNoop
	return isNoop
}

// endAttempt records the end, at now, of an attempt of c. A call orphaned
// meanwhile (cancelled, superseded, expired, closed) finishes Stale if exec
// ran — the side effect may have happened, but nobody is told it
// succeeded. A retryable failure sends the call back to the queue
// (requeue); otherwise its waiters are told and it finishes. An attempt
// abandoned before any of it ran is not an attempt: c waits again, in its
// old place in the order, and in the place under its tenant's MaxQueued
// that it held meanwhile (holdPlace).
//
// With calls ready, it wakes a worker: the tenant may have been at its
// in-flight cap, and a worker that found it so went idle with nothing else
// to wake it.
func (d *Dispatcher[K, T]) endAttempt(c *call[K, T], a *attempt[K, T], ob *outbox[K, T], now int64) {
	if testHookUnderLock != nil {
		testHookUnderLock()
	}
	a.unhold()
	d.running--
	c.tag.ten.inflight--
	if d.q.nready > 0 {
		d.wake.worker()
	}
	c.account(a)
	if a.ran {
		d.execTime.Observe(now, a.runTime)
		d.totals.executions++
	}
	d.recordAttempt(c, a, now, ob)
	c.enter(csEnded)
	switch {
	case c.orphaned():
		d.conclude(c, a, c.endState, a.err, now, ob)
	case a.abandoned:
		d.requeue(c, c.lastErr(), now, now, false, ob, nil)
		d.wake.kick()
	default:
		st, err, final := a.outcome(c.attempts())
		if !final {
			d.retry(c, a, now, ob)
			return
		}
		if a.done {
			d.totals.alreadyDone++
		}
		d.conclude(c, a, st, err, now, ob)
	}
}

// outcome is the outcome an attempt that was made gives its call, after
// attempts executions, if it is final: the before-retry hook failed, or
// found the earlier attempt took effect; the no-op test skipped it; it
// succeeded. Otherwise it failed, and the retry policy decides.
func (a *attemptEnd) outcome(attempts int) (st State, err error, final bool) {
	switch {
	case a.hookErr != nil:
		return StateFailed, &RetryError{Attempts: attempts, Last: a.hookErr, Reason: giveUpBeforeRetry}, true
	case a.done:
		return StateSucceeded, nil, true
	case a.skipped:
		return StateSkipped, nil, true
	case a.err == nil:
		return StateSucceeded, nil, true
	}
	return 0, nil, false
}

// account adds what attempt a did to c: its run time, the value a
// before-retry hook rebuilt, an execution, an exit of Observer.OnStart
// (maxStartExits).
func (c *call[K, T]) account(a *attempt[K, T]) {
	switch {
	case a.startExit:
		c.exec.startExits++
	case !a.abandoned: // the attempt began: OnStart is told of the next
		c.exec.startExits = 0
	}
	c.exec.runTime += a.runTime
	if a.rebuilt {
		c.val = a.val
	}
	if a.ran {
		c.exec.attempts++
	}
}
