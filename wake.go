package dispatch

// This file wakes whoever waits for the dispatcher: idle workers for a
// ready call, and callers waiting for its state to change.

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

// wakeWorker wakes one idle worker, if any, for a call that became ready.
func (d *Dispatcher[K, T]) wakeWorker() {
	if d.idleWorkers > 0 {
		d.cond.Signal()
	}
}

// wakeWorkerAsync has deliver wake an idle worker for a call that just
// became ready, unless inline (Sync mode) callers run calls now. The wake
// comes after the lock is released, so that the worker it wakes does not
// find the lock still held by the submitter.
func (d *Dispatcher[K, T]) wakeWorkerAsync(ob *outbox[K, T]) {
	if d.mode == ModeAsync && d.idleWorkers > 0 {
		ob.wake = true
	}
}
