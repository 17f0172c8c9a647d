package dispatch

import "sync"

// wakes wakes whoever waits for the dispatcher: idle workers for a ready
// call, and callers waiting for its state to change. Guarded by the
// Dispatcher's lock, which is cond's.
type wakes struct {
	cond   sync.Cond     // idle workers wait here for ready calls
	idle   int           // workers waiting on cond
	kickCh chan struct{} // closed and cleared on every state change; see kick
}

// worker wakes one idle worker, if any, for a call that became ready.
func (w *wakes) worker() {
	if w.idle > 0 {
		w.cond.Signal()
	}
}

// workerLater has deliver wake an idle worker (*wake: the outbox's flag)
// for a call that just became ready, unless inline (Sync mode) callers
// run calls now (async false). The wake comes after the lock is released,
// so that the worker it wakes does not find the lock still held by the
// submitter.
func (w *wakes) workerLater(wake *bool, async bool) {
	if async && w.idle > 0 {
		*wake = true
	}
}

// workers wakes every idle worker.
func (w *wakes) workers() { w.cond.Broadcast() }

// idleWait is a worker's wait for a call: it releases the lock meanwhile.
func (w *wakes) idleWait() {
	w.idle++
	w.cond.Wait()
	w.idle--
}

// kick wakes whoever waits for the dispatcher's state to change: callers
// running calls inline (Sync mode) and SetMode draining the queue.
func (w *wakes) kick() {
	if w.kickCh != nil {
		close(w.kickCh)
		w.kickCh = nil
	}
}

// kicked returns a channel closed at the next state change.
func (w *wakes) kicked() <-chan struct{} {
	if w.kickCh == nil {
		w.kickCh = make(chan struct{})
	}
	return w.kickCh
}
