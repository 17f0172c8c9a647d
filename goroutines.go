package dispatch

import (
	"context"
	"time"
)

// This file is the dispatcher's own lifecycle: the goroutines it starts,
// and Close, which stops them. Every goroutine has an owner that waits for
// it: d.wg, which Close waits on.

// start launches the workers and the clock. It runs once, on the first
// submission: a Dispatcher that is never used starts nothing.
func (d *Dispatcher[K, T]) start() {
	d.started = true
	d.timer = time.NewTimer(time.Hour)
	d.timer.Stop()
	d.wg.Add(d.cfg.Workers + 1)
	for range d.cfg.Workers {
		go d.worker()
	}
	go d.clock()
	if d.fallback != nil {
		d.fallback.next = d.now() + d.fallback.calls.Step()
		d.armTimer(d.fallback.next)
	}
}

// Close shuts the dispatcher down. It stops admission at once (submissions
// get ErrClosed), keeps running what is queued, by priority, until nothing is
// left or ctx ends, then ends whatever remains with Closed: queued calls are
// removed and running ones have their context cancelled. It returns after
// every goroutine the dispatcher started has exited, which includes waiting
// for running exec calls to return. It returns nil if everything drained,
// or ctx's error if something had to be ended. Close is idempotent and safe
// to call concurrently.
func (d *Dispatcher[K, T]) Close(ctx context.Context) error {
	d.mu.Lock()
	if !d.closing {
		d.closing = true
		if len(d.lanes) == 0 && !d.drainedClosed {
			d.drainedClosed = true
			close(d.drained)
		}
	}
	d.mu.Unlock()

	var err error
	select {
	case <-d.drained:
	default:
		select {
		case <-d.drained:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}

	var ob outbox[K, T]
	d.mu.Lock()
	if !d.stopped {
		d.stopped = true
		now := d.now()
		for _, l := range d.lanes {
			d.endLane(l, Closed, ErrClosed, now, withRunning, &ob)
		}
		d.baseCancel(ErrClosed)
		close(d.stopCh)
		d.cond.Broadcast()
	}
	d.mu.Unlock()
	d.deliver(&ob)
	d.wg.Wait()
	return err
}
