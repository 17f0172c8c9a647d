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
	d.wg.Add(d.workers + 1)
	for range d.workers {
		go d.worker()
	}
	go d.clock()
}

// wakeWorker wakes one idle worker, if any, for a call that became ready.
func (d *Dispatcher[K, T]) wakeWorker() {
	if d.idle > 0 {
		d.cond.Signal()
	}
}

// worker runs ready calls until Close ends the dispatcher. It holds the lock
// except while it tells waiters and while exec runs.
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
		c := d.q.popReady()
		if c == nil {
			if len(ob.tickets) > 0 || len(ob.hooks) > 0 {
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
		ctx := d.begin(c, now)
		d.mu.Unlock()
		d.deliver(&ob)

		err, ran, skipped, runTime := d.execute(ctx, c)
		c.cancel(nil) // release the context's resources

		d.mu.Lock()
		d.finish(c, err, ran, skipped, runTime, &ob)
	}
	d.mu.Unlock()
	d.deliver(&ob)
}

// begin marks c in flight and derives its execution context: cancelled
// when c loses its waiters or the dispatcher closes, with the latest
// deadline of c's live waiters (none if any waiter has none).
func (d *Dispatcher[K, T]) begin(c *call[K, T], now int64) context.Context {
	s := c.s
	s.run, s.next = c, nil
	c.state = csRunning
	if c.firstStart < 0 {
		c.firstStart = now
	}
	d.running++
	ctx, cancel := context.WithCancelCause(d.base)
	c.cancel = cancel
	if dl := c.execDeadline(); dl != 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, d.epoch.Add(time.Duration(dl)))
		c.cancel = func(cause error) { cancel(cause); stop() }
	}
	return ctx
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

// execute runs c outside the lock: the no-op test, a rate-limiter token,
// then exec. Panics in user code become errors. ran reports whether exec
// was called.
func (d *Dispatcher[K, T]) execute(ctx context.Context, c *call[K, T]) (err error, ran, skipped bool, runTime time.Duration) {
	key, val := c.s.key, c.val // stable: merges go to the slot's next call
	if d.noop != nil {
		var isNoop bool
		err = safeCall(func() error { isNoop = d.noop(key, val); return nil })
		if err != nil {
			return err, false, false, 0
		}
		if isNoop {
			return nil, false, true, 0
		}
	}
	if d.limiter != nil {
		if err := d.limiter.Wait(ctx); err != nil {
			return fmt.Errorf("dispatch: rate limiter: %w", err), false, false, 0
		}
	}
	start := time.Now()
	err = safeCall(func() error { return d.exec(ctx, key, val) })
	return err, true, false, time.Since(start)
}

// finish records the end of c's execution and tells its waiters. A call
// orphaned meanwhile (cancelled, superseded, expired, closed) is reported
// Stale if exec ran — the side effect may have happened, but nobody is told
// it succeeded. The key's successor, if any, becomes ready with its original
// enqueue time.
func (d *Dispatcher[K, T]) finish(c *call[K, T], err error, ran, skipped bool, runTime time.Duration, ob *outbox[K, T]) {
	now := d.now()
	d.running--
	d.calls--
	c.runTime += runTime
	if ran {
		c.attempts++
		d.st.executions++
	}
	switch {
	case c.orphan:
		st := c.endState
		if ran {
			st = Stale
			d.st.staleExecutions++
		}
		d.hook(c, st, staleErr(st, err), now, ob)
	default:
		st := Succeeded
		switch {
		case skipped:
			st = Skipped
		case err != nil:
			st = Failed
		}
		if d.settleAll(c, st, err, now, true, ob) {
			d.hook(c, st, err, now, ob)
		} else if ran {
			// Every waiter expired while exec ran: the result is stale.
			d.st.staleExecutions++
			d.hook(c, Stale, staleErr(Stale, err), now, ob)
		} else {
			d.hook(c, Expired, ErrExpired, now, ob)
		}
	}
	s := c.s
	s.run = nil
	c.state = csIdle
	if n := s.next; n != nil && n.state == csIdle {
		d.q.push(n)
		d.wakeWorker()
	}
	d.releaseSlot(s)
}

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
