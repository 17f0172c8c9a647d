package dispatch

import (
	"strconv"
	"time"
)

// State is how a submission ended: every accepted submission ends in
// exactly one. The zero State means no outcome yet. Each state but
// Succeeded, Skipped and Failed has its sentinel error (ErrCanceled, ...).
type State uint8

// The states.
const (
	StateSucceeded State = iota + 1
	// StateSkipped: not run, since it would change nothing (Config.NoOp,
	// SkipIncoming), or run and found so (exec returned SkipCall); a
	// success.
	StateSkipped
	StateFailed // exec's error (or panic) was not retried, or retries ran out
	StateCanceled
	StateExpired
	StateDropped
	// StateStale: superseded by a newer generation, or (for OnDone) an
	// execution that finished after its call lost its waiters: it may have
	// taken effect, and is never reported as success.
	StateStale
	StateClosed

	numStates = int(StateClosed) + 1
)

var stateNames = [...]string{"", "succeeded", "skipped", "failed", "canceled", "expired", "dropped", "stale", "closed"}

func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "state_" + strconv.Itoa(int(s))
}

// OK reports whether s counts as success: Succeeded or Skipped.
func (s State) OK() bool { return s == StateSucceeded || s == StateSkipped }

// Outcome is a Result without the key and the call, for the Observer.
//
// Attempts counts the executions that had ended when the outcome was
// decided — returned, and their error judged (Config.Classify) — and
// RunTime sums exec's time over them: a waiter that leaves while one runs
// or is judged (Cancel, its context or its deadline) is not told of that
// one — Attempts is 0 while the first runs, though it may yet take effect
// for the call's other waiters, or as a Stale execution (Config.OnDone) —
// and its QueueWait runs to the first execution's start. The call's end
// is told every execution.
//
// QueueWait is the call's: from the earliest enqueue among its live
// waiters to its first execution, or to the end. A submission that joins a
// queued call is told that wait, not its own; a waiter that leaves no
// longer counts as the call's earliest.
type Outcome struct {
	State State
	// Err is nil for a success; for Failed, exec's error, a *PanicError or
	// a *RetryError; else it matches the state's sentinel.
	Err       error
	Attempts  int           // executions that had returned
	Waiters   int           // submissions the call served, posts included
	QueueWait time.Duration // the call's: from enqueue to the first execution, or the end
	RunTime   time.Duration // exec's time, summed over those executions
}

// Result is the outcome of one submission or, for OnDone, of one call.
type Result[K comparable, T any] struct {
	Key  K
	Call T // as last executed (merged), or as it stood if it never ran
	Outcome
}
