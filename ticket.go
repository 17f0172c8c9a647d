package dispatch

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"
)

// State is the terminal state of a submission. Every accepted submission ends
// in exactly one State.
type State uint8

// The terminal states. The zero State is not a terminal state: a Result with
// State 0 has not been delivered.
const (
	// Succeeded: the call ran and exec returned nil.
	Succeeded State = iota + 1
	// Skipped: the no-op test found the call would change nothing, so it was
	// not run. Skipped counts as success.
	Skipped
	// Failed: exec returned an error (or panicked) that was not retried, or
	// retries were exhausted. Result.Err holds the error.
	Failed
	// Canceled: the waiter left (ticket or context cancelled) or Cancel was
	// called for the key.
	Canceled
	// Expired: the waiter's deadline passed before the call finished.
	Expired
	// Dropped: the call was shed under load.
	Dropped
	// Stale: the waiter's generation was superseded by a newer one, or (for
	// the completion hook) an execution finished after its call had lost all
	// its waiters. A Stale execution may have taken effect; it is reported
	// for audit and never as success.
	Stale
	// Closed: the dispatcher was closed before the call could finish.
	Closed

	numStates = int(Closed) + 1
)

var stateNames = [...]string{"", "Succeeded", "Skipped", "Failed", "Canceled", "Expired", "Dropped", "Stale", "Closed"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// OK reports whether s counts as success: Succeeded or Skipped.
func (s State) OK() bool { return s == Succeeded || s == Skipped }

// Outcome is how a submission or a call ended: everything of a Result but
// the key and the call value, which the Observer (not typed by K and T)
// receives too.
type Outcome struct {
	// State is the terminal state.
	State State
	// Err is nil for Succeeded and Skipped, and otherwise an error matching
	// the state's sentinel (ErrCanceled, ErrExpired, ...) or, for Failed, the
	// error exec returned (a *PanicError if it panicked) or a *RetryError
	// saying why it was not retried.
	Err error
	// Attempts counts executions of the call (API attempts), not
	// submissions.
	Attempts int
	// Waiters is the number of submissions the call served, counting
	// fire-and-forget ones.
	Waiters int
	// QueueWait is the time from the call's enqueue time to its first
	// execution, or to its end if it never ran.
	QueueWait time.Duration
	// RunTime is the time spent in exec, summed over attempts.
	RunTime time.Duration
}

// Result is the outcome of one submission, or, for the completion hook, of
// one call (which may have coalesced many submissions).
type Result[K comparable, T any] struct {
	// Key is the call's key.
	Key K
	// Call is the value as executed (after merging), or as it stood when the
	// call ended without running.
	Call T
	Outcome
}

// StateCounts counts submissions or calls by terminal state, indexed by
// State (index 0 is unused).
type StateCounts [numStates]uint64

// Total is the sum over every state.
func (c *StateCounts) Total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

// Ticket is the caller's handle on one submission. It is safe for concurrent
// use. A Ticket is only obtained from [Dispatcher.Submit]; its zero value is
// not usable.
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
