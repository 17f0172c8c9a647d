package dispatch

import (
	"context"
	"slices"
)

// This file is Close: the end of a dispatcher.

// Close shuts the dispatcher down. It stops admission at once (submissions
// get ErrClosed), runs what is queued, by priority, until nothing is left
// or ctx ends, then ends whatever remains with Closed: queued calls are
// removed, running ones have their context cancelled. It returns after
// every goroutine the dispatcher started has exited, every execution — on
// a worker or inline in a Sync-mode caller — has returned, and every
// Sync-mode caller has told, on its own goroutine, what its submission
// caused: its observer events, its call's outcome (an exec that ignores
// its context, or a callback blocked on one of those goroutines, holds
// Close up): nil if everything drained, else ctx's error. So once Close
// has returned, no completion hook or observer event of a call runs any
// more; a method called meanwhile or after still tells, on its caller's
// goroutine before it returns, what it caused itself (Observer.OnSubmit
// or OnReject, the outcome of a call Cancel ended). Close is idempotent
// and safe to call concurrently. Called from a callback on a goroutine
// Close would wait for (exec, a completion hook, an observer method — on
// a worker, or in a Sync-mode caller for its own call), it ends whatever
// remains with Closed at once and returns ErrReentrant; the dispatcher's
// goroutines exit as their callbacks return.
func (d *Dispatcher[K, T]) Close(ctx context.Context) error {
	if d.closeReentrant() {
		d.stop()
		return ErrReentrant
	}
	d.mu.Lock()
	d.drain.begin(d.lanes.Len())
	d.mu.Unlock()

	var err error
	select {
	case <-d.drain.done:
	default:
		select {
		case <-d.drain.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	d.stop()
	d.wg.Wait()
	d.mu.Lock()
	// Calls running inline, Sync-mode callers telling their outcomes, and
	// outcomes on their way to the notifier from goroutines Close does not
	// own (a Submit context's watch).
	for d.running > 0 || len(d.callers) > 0 || d.drain.handing > 0 {
		ch := d.wake.kicked()
		d.mu.Unlock()
		<-ch
		d.mu.Lock()
	}
	// What reached the notifier after it exited is told here, so that no
	// hook is lost and none runs after Close returns.
	var ob outbox[K, T]
	ob, d.notify = d.notify, ob
	d.mu.Unlock()
	d.tell.deliver(&ob)
	return err
}

// stop ends every call left with Closed and tells the goroutines to exit.
// It takes the lock itself.
func (d *Dispatcher[K, T]) stop() {
	var ob outbox[K, T]
	d.mu.Lock()
	d.drain.begin(d.lanes.Len())
	if !d.stopped {
		d.stopped = true
		now := d.clk.now()
		lanes := slices.AppendSeq(make([]*lane[K, T], 0, d.lanes.Len()), d.lanes.all()) // endLane releases lanes
		d.waiters.sweep(func() {
			for _, l := range lanes {
				d.endLane(l, StateClosed, ErrClosed, now, withRunning, &ob)
			}
		})
		d.gate.tokens.Release(now) // no call is left to spend it
		d.baseCancel(ErrClosed)
		close(d.stopCh)
		d.wake.workers()
		d.notifyCond.Broadcast()
		d.fetchCond.Broadcast()
	}
	d.mu.Unlock()
	d.tell.deliver(&ob)
}
