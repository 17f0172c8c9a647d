package dispatch

import (
	"runtime/debug"
	"time"
)

// This file is execution: the worker loop, and one attempt of a call —
// begin under the lock, execute outside it, endAttempt under it again.

// worker runs ready calls until Close ends the dispatcher. It takes the
// lock itself, and holds it except while it tells waiters and while user
// code (exec, the no-op test, the before-retry hook, the classifier) runs.
func (d *Dispatcher[K, T]) worker(id uint64) {
	rn := runner{id: id, onWorker: true}
	var ob outbox[K, T]
	rn.stock()
	d.mu.Lock()
	// One clock reading serves an iteration: the end of the execution the
	// worker just ran, or a new one after it waited or told outcomes.
	// Decisions are then at most the time it took to retake the lock late.
	now := d.clk.now()
	for !d.stopped {
		// Anything past its deadline is expired here too, not only by the
		// clock, so a worker never starts a call nobody is waiting for.
		// (Both are asked only when their index holds anything: the usual
		// backlog has no deadline and no backoff, and the two calls add up
		// under the lock.)
		if d.waiters.anyDue() {
			d.expireDue(now, &ob)
		}
		if d.q.delayed.Len() > 0 {
			d.q.promote(now)
		}
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
		now = d.runRelock(c, now, &ob, &rn)
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
	// spare is a worker's record for its next execution, allocated before
	// it takes the lock (stock), so that the allocation is not made under
	// it. It is new, never used: begin takes it, and nothing else holds it.
	spare *execution
}

// stock allocates the runner's record for its next execution, unless it
// has one. A worker stocks before it takes the lock; an inline runner runs
// one call, and begin stocks for it.
func (rn *runner) stock() {
	if rn.spare == nil {
		rn.spare = &execution{runner: rn.id, sofar: sofar{firstStart: -1}}
	}
}

// runRelock executes one attempt of c, which the caller has taken from the
// queue: it releases the lock for user code and the waiters' delivery, and
// returns with the lock held and the attempt's end recorded.
//
// A Sync-mode caller that has no token for c waits for it (awaitToken)
// after the earlier outcomes are told, and before OnStart, as a worker
// took its own before it took c.
//
// If a callback ends the goroutine (runtime.Goexit), the attempt is ended
// on the way out, so that no outcome is lost and the key is not wedged:
// while earlier outcomes are told (ob) or the observer hears of the start
// (OnStart), before any of c's own user code runs, c goes back to the
// queue untouched — an observer's or hook's exit is only counted, and ends
// no call; the token taken for it, a worker's or a Sync-mode caller's, is
// held for the next execution — and so it does if the rate limiter's
// Wait, in a Sync-mode caller, exited: exec did not run; during the rest
// of c's attempt, the attempt ends Failed with a *PanicError. OnStart's
// exits are counted on c: after maxStartExits in a row, c's attempt begins
// without it, so that an OnStart that always exits does not send c back
// forever.
//
// It returns the clock reading its attempt ended at.
func (d *Dispatcher[K, T]) runRelock(c *call[K, T], now int64, ob *outbox[K, T], rn *runner) int64 {
	a := d.begin(c, now, rn)
	if !a.awaiting { // else once its token came (awaitToken)
		d.holdPlace(c, &a, ob)
	}
	d.mu.Unlock()
	ended, starting := false, false
	defer func() {
		if r := recover(); r != nil {
			crash(r) // the dispatcher's own code panicked, perhaps under the lock
		}
		if ended {
			return
		}
		if a.site == "" || a.site == callbackRateLimit {
			a.abandoned, a.startExit = true, starting
		} else {
			a.panicked = true
			a.err = &PanicError{Callback: a.site, Value: ErrGoexit, Stack: debug.Stack()}
			a.ran = a.ran || a.site == callbackExec
		}
		d.settleAttemptLock(c, &a, ob, rn)
		d.mu.Unlock()
		d.tell.deliver(ob)
	}()
	d.tell.deliver(ob)
	if a.awaiting && !d.awaitToken(c, &a, ob) {
		ended = true // the call's context ended first: no attempt was made
		return d.settleAttemptLock(c, &a, ob, rn)
	}
	if obs := d.cfg.Observer; a.observed {
		starting = true
		d.tell.observe(func() { obs.OnStart(a.ev, a.n, a.wait) })
		starting = false
	}
	a.unhold()
	a.execute(&d.cfg, d.exec, &d.clk)
	ended = true
	return d.settleAttemptLock(c, &a, ob, rn)
}

// awaitToken waits, in a Sync-mode caller, for the rate-limiter token of
// c's inline attempt a, which found none held (begin), and reports whether
// it came (inlineToken). Until then c counts as queued, as a call waiting
// in the queue for a worker's token does; once it comes, c is counted in
// flight, its first start is recorded — the wait for the token was queue
// wait, which Observer.OnStart is told, as Stats.QueueWait is — and its
// place under its tenant's MaxQueued is kept for the observer's OnStart
// (holdPlace). It is called without the lock, and takes it itself.
func (d *Dispatcher[K, T]) awaitToken(c *call[K, T], a *attempt[K, T], ob *outbox[K, T]) bool {
	if !a.inlineToken(d.cfg.RateLimit, &d.tell) {
		return false
	}
	d.mu.Lock()
	d.tokenCame(c, a)
	a.token = true
	if c.exec.firstStart < 0 {
		d.firstStart(c, d.clk.now())
		a.wait = time.Duration(c.exec.firstStart - c.enq)
	}
	d.holdPlace(c, a, ob)
	d.mu.Unlock()
	return true
}

// tokenCame counts c, whose inline attempt a waited for its token, in
// flight rather than queued (begin): its token came, or (called as the
// attempt ends) never will, and endAttempt counts the attempt's end.
func (d *Dispatcher[K, T]) tokenCame(c *call[K, T], a *attempt[K, T]) {
	a.awaiting = false
	d.awaiting--
	d.running++
	c.tag.ten.queued--
	c.tag.ten.inflight++
}

// holdPlace keeps c's place under its tenant's MaxQueued, which begin
// gave up, while user code that is not c's runs before c's attempt
// begins: the earlier outcomes ob holds, and the observer's OnStart. If
// that code ends the goroutine, c goes back to the queue (endAttempt) —
// into the place it held, which a submission meanwhile could not take.
// The place is let go without the lock as the attempt begins (unhold).
func (d *Dispatcher[K, T]) holdPlace(c *call[K, T], a *attempt[K, T], ob *outbox[K, T]) {
	t := c.tag.ten
	if t.cfg.MaxQueued > 0 && (d.cfg.Observer != nil || len(ob.hooks) > 0 || len(ob.notes) > 0) {
		t.held.Add(1)
		a.held = t
	}
}

// settleAttemptLock ends the attempt's contexts and records its end. It is
// called without the lock, and returns with it held, and the clock reading
// the attempt ended at.
//
// The call's context is cancelled (cause ErrAttemptEnded, unless the call
// ended before) before AttemptTimeout's is stopped, so that a context exec
// derived or kept reports the same cause.
func (d *Dispatcher[K, T]) settleAttemptLock(c *call[K, T], a *attempt[K, T], ob *outbox[K, T], rn *runner) int64 {
	a.callCtx.Cancel(ErrAttemptEnded, false)
	if a.stop != nil {
		a.stop()
	}
	if rn.onWorker {
		ob.stock() // outside the lock: the Result its call's tickets read
		rn.stock()
	}
	d.mu.Lock()
	// Load the table slot of c's key, which the end of c releases, as the
	// section starts, so that its miss (if a long execution let the hint
	// of begin go) overlaps the section's first steps rather than being
	// taken at the release. The next call's lines are not loaded here:
	// prefetchCall asked for them as the call before it was taken, and
	// loading them again with the lock held cost more than it saved
	// (BENCHMARKS.md, "Cold lines asked for ahead").
	d.warmed = d.lanes.line(c.lane.hash)
	if rn.onWorker {
		d.gate.running--
		if c.is(fLow) {
			d.gate.low--
			c.mark(fLow, false)
		}
		if !a.ran {
			// No execution (c went back to the queue untouched, or ended
			// before exec: the no-op test, the before-retry hook): the
			// token the worker took for it is held for the next one.
			d.gate.tokens.Unspend()
		}
	} else {
		d.owned.drop(rn.id)
		d.wake.kick()
		if a.awaiting {
			d.tokenCame(c, a) // it never came: the call's context ended, or the limiter ended the goroutine
		}
		if a.token && !a.ran {
			d.gate.tokens.Unspend() // held for the next execution, as a worker's is
		}
	}
	if a.end == 0 {
		a.end = d.clk.now()
	}
	d.endAttempt(c, a, ob, a.end)
	return a.end
}

// begin marks c running, counts its execution, and returns its attempt
// (newAttempt). An inline attempt under a rate limit spends a token the
// workers left, if any (tokens.Tokens.Take); else it awaits its own
// (awaitToken), and is counted in flight, and has its first start, only
// once it comes.
func (d *Dispatcher[K, T]) begin(c *call[K, T], now int64, rn *runner) attempt[K, T] {
	if rn.onWorker {
		d.gate.running++
		if c.is(fLow) {
			d.gate.low++
		}
	} else {
		c.mark(fLow, false) // inline executions are their callers' own
		d.owned.add(rn.id)  // Close waits for this execution
	}
	// Each execution its own record, and context: never reused.
	rn.stock() // a worker's is ready: only an inline runner allocates here
	e := rn.spare
	rn.spare = nil
	if last := c.exec; last != nil {
		e.sofar = last.sofar
	}
	c.exec = e
	if c.is(fProbe) {
		d.gate.breaker.StartProbe(rn.id)
	}
	l := c.lane
	// The end of the attempt releases l's table slot under the lock
	// (settleAttemptLock); asked for now, its miss overlaps the execution.
	d.lanes.hint(l.hash)
	l.running = c
	if l.pending == c {
		l.pending = nil
	}
	c.enter(csRunning)
	token := !rn.onWorker && d.cfg.RateLimit != nil && d.gate.tokens.Take(now)
	awaiting := !rn.onWorker && d.cfg.RateLimit != nil && !token
	if awaiting {
		d.awaiting++ // queued until its token comes (awaitToken)
	} else {
		if e.firstStart < 0 {
			d.firstStart(c, now)
		}
		d.running++
		c.tag.ten.queued--
		c.tag.ten.inflight++
	}
	a := c.newAttempt(e, now, &d.clk, !rn.onWorker, d.cfg.Observer != nil)
	a.token, a.awaiting = token, awaiting
	return a
}

// firstStart records the first execution of c, at now: its queue wait,
// and a first attempt for the retry budget.
func (d *Dispatcher[K, T]) firstStart(c *call[K, T], now int64) {
	c.exec.firstStart = now
	wait := time.Duration(max(now-c.enq, 0))
	d.queueWait.Observe(now, wait)
	if d.fallback != nil {
		d.fallback.Waited(now, wait)
	}
	d.budget.first(now)
}
