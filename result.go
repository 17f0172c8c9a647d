package dispatch

import (
	"strconv"
	"time"
)

// State is the terminal state of a submission. Every accepted submission ends
// in exactly one State.
type State uint8

// The terminal states. The zero State is not a terminal state: a Result with
// State 0 has not been delivered.
const (
	// StateSucceeded: the call ran and exec returned nil.
	StateSucceeded State = iota + 1
	// StateSkipped: the call was not run because it would change nothing: the
	// no-op test said so (Config.NoOp, also after Amend), or the merge
	// function found the pending call made it moot (SkipIncoming). StateSkipped
	// counts as success.
	StateSkipped
	// StateFailed: exec returned an error (or panicked) that was not retried, or
	// retries were exhausted. Result.Err holds the error.
	StateFailed
	// StateCanceled: the waiter left (ticket or context cancelled) or Cancel was
	// called for the key.
	StateCanceled
	// StateExpired: the waiter's deadline passed before the call finished.
	StateExpired
	// StateDropped: the call was shed under load.
	StateDropped
	// StateStale: the waiter's generation was superseded by a newer one, or (for
	// the completion hook) an execution finished after its call had lost all
	// its waiters. A StateStale execution may have taken effect; it is reported
	// for audit and never as success.
	StateStale
	// StateClosed: the dispatcher was closed before the call could finish.
	StateClosed

	numStates = int(StateClosed) + 1
)

var stateNames = [...]string{"", "succeeded", "skipped", "failed", "canceled", "expired", "dropped", "stale", "closed"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "state_" + strconv.Itoa(int(s))
}

// OK reports whether s counts as success: Succeeded or Skipped.
func (s State) OK() bool { return s == StateSucceeded || s == StateSkipped }

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
