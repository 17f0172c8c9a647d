package dispatch

import (
	"context"
)

// Close shuts the dispatcher down. It stops admission at once (submissions
// get ErrClosed), keeps running what is queued, by priority, until nothing is
// left or ctx ends, then ends whatever remains with Closed: queued calls are
// removed and in-flight ones have their context cancelled. It returns after
// every goroutine the dispatcher started has exited, which includes waiting
// for in-flight exec calls to return. It returns nil if everything drained,
// or ctx's error if something had to be ended. Close is idempotent and safe
// to call concurrently.
func (d *Dispatcher[K, T]) Close(ctx context.Context) error {
	d.mu.Lock()
	if !d.closing {
		d.closing = true
		if len(d.slots) == 0 && !d.drainedClosed {
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
		for _, s := range d.slots {
			d.endKey(s, Closed, ErrClosed, now, true, &ob)
			d.releaseSlot(s)
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
