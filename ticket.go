package dispatch

import (
	"context"
	"sync/atomic"
)

// Ticket is the caller's handle on one submission, as a rate.Reservation is
// on a token. It is safe for concurrent use. A Ticket is only obtained from
// [Dispatcher.Submit]; its zero value is not usable.
type Ticket[K comparable, T any] struct {
	w waiter[K, T]
	d *Dispatcher[K, T]
	// done holds the Done channel (a chan struct{}). It is made on the first
	// call to Done, so a caller that never waits on a ticket (it learns
	// outcomes from the completion hook) does not pay for one; once the
	// outcome is told, it holds closedDone.
	done  atomic.Value
	stop  func() bool // unregisters the context.AfterFunc, if any
	state ticketState // guarded by d.mu
	res   Result[K, T]
}

// closedDone is the Done channel of every ticket whose outcome was told
// before anyone asked for its channel.
var closedDone = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Done returns a channel that is closed when the submission's outcome is
// known. After that, Wait returns at once. The channel is made on the
// first call (one small allocation), not by Submit.
func (t *Ticket[K, T]) Done() <-chan struct{} {
	if ch, ok := t.done.Load().(chan struct{}); ok {
		return ch
	}
	if ch := make(chan struct{}); t.done.CompareAndSwap(nil, ch) {
		return ch
	}
	return t.done.Load().(chan struct{}) // told meanwhile: closedDone
}

// told reports whether the outcome has been told: Done is closed.
func (t *Ticket[K, T]) told() bool {
	ch, _ := t.done.Load().(chan struct{})
	return ch == closedDone
}

// tell marks the outcome told and closes the Done channel, if one was made.
// The result must be recorded before.
func (t *Ticket[K, T]) tell() {
	if ch, _ := t.done.Swap(closedDone).(chan struct{}); ch != nil {
		close(ch)
	}
}

// Wait blocks until the outcome is known or ctx is done. It returns the
// result and result.Err; if ctx ends first it returns a zero Result and
// ctx's error, and the submission stays live (use Cancel to leave).
func (t *Ticket[K, T]) Wait(ctx context.Context) (Result[K, T], error) {
	if t.told() {
		return t.res, t.res.Err
	}
	select {
	case <-t.Done():
		return t.res, t.res.Err
	case <-ctx.Done():
		return Result[K, T]{}, ctx.Err()
	}
}

// Result returns the outcome and true once Done is closed, or a zero Result
// and false before.
func (t *Ticket[K, T]) Result() (Result[K, T], bool) {
	if t.told() {
		return t.res, true
	}
	return Result[K, T]{}, false
}

// Cancel withdraws this submission only: its outcome becomes Canceled. The
// call itself goes on for its other waiters; if this was the last one, a
// pending call is removed and an in-flight call's context is cancelled.
// Cancel after the outcome is known does nothing.
func (t *Ticket[K, T]) Cancel() {
	t.d.leave(t, Canceled, ErrCanceled)
}
