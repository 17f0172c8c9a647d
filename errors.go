package dispatch

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. A refused submission's error, and the error of every
// outcome but a Failed one, matches one of them with [errors.Is] (a
// refusal for a done context also matches the context's error); the typed
// errors below carry the details. A Failed outcome's error is the call's
// own: the API's error, a *RetryError wrapping it or a *PanicError. New's
// and SetMode's errors for bad arguments name the argument and match none.
var (
	// ErrBackpressure reports that a submission was refused because the
	// dispatcher is full. Nothing was enqueued; the caller decides whether to
	// wait, shed the work itself, or take the synchronous path.
	ErrBackpressure = errors.New("dispatch: backpressure")

	// ErrClosed reports a submission after Close, or a call that Close ended
	// before it could run.
	ErrClosed = errors.New("dispatch: closed")

	// ErrDropped reports a call that was shed under load. Its waiters learn
	// the bound from the wrapping error.
	ErrDropped = errors.New("dispatch: dropped")

	// ErrExpired reports a waiter whose deadline passed before the call
	// finished, or a submission whose deadline had already passed.
	ErrExpired = errors.New("dispatch: deadline expired")

	// ErrCanceled reports a waiter that left: its ticket was cancelled, its
	// context was cancelled, or Cancel was called for its key. The cause, if
	// any, is wrapped.
	ErrCanceled = errors.New("dispatch: canceled")

	// ErrStale reports a submission or waiter of an older generation than the
	// key's newest, and an execution that finished after its call had been
	// cancelled, superseded or expired.
	ErrStale = errors.New("dispatch: stale")

	// ErrCircuitOpen reports a submission refused because the circuit
	// breaker is open (BreakerPolicy.RefuseDroppable).
	ErrCircuitOpen = errors.New("dispatch: circuit open")

	// ErrMergeRejected reports a submission that could not be coalesced into
	// the pending call for its key: the merge function refused it (its error
	// is wrapped), or the two carry different idempotency keys.
	ErrMergeRejected = errors.New("dispatch: merge rejected")

	// ErrFallback is the error of a queued call that a switch to Sync mode
	// cancelled (CancelQueued): its waiters end Canceled with an error
	// matching ErrFallback, which tells the caller to run the call on the
	// synchronous path itself.
	ErrFallback = errors.New("dispatch: switched to synchronous mode; take the synchronous path")
)

// SkipIncoming is what Config.Merge returns (or wraps) to say that the
// pending call makes the incoming submission moot — a status patch arriving
// while the pod's deletion is pending, say. The incoming submission is
// accepted and ends Skipped at once, without waiting for the pending call;
// the pending call is left as it was. It is a signal, not a failure: no
// caller ever receives it as an error.
//
//lint:ignore ST1012 a signal from Merge, like fs.SkipDir, never an error a caller receives
var SkipIncoming = errors.New("dispatch: skip incoming call")

// ReplacePending is what Config.Merge returns (or wraps), with the
// incoming call, to say that the incoming call is a different operation
// that replaces the pending one — a deletion replacing a pending binding,
// say. The call then starts fresh as the incoming one: no attempts, no
// backoff (a retry waiting out its backoff becomes ready at once), no last
// error for the before-retry hook, and it runs in the tenant and under the
// label of the incoming submission. Every waiter of the pending call waits
// for the new one and shares its outcome. Like SkipIncoming it is a
// signal: no caller ever receives it as an error.
//
//lint:ignore ST1012 a signal from Merge, like fs.SkipDir, never an error a caller receives
var ReplacePending = errors.New("dispatch: replace pending call")

// Bound names a limit that refused a submission or shed a queued call. Its
// values are a fixed set, safe as a metric label.
type Bound string

// The bounds.
const (
	// BoundCapacity is Config.Capacity: tracked keys.
	BoundCapacity Bound = "capacity"
	// BoundWaiters is Config.MaxWaiters: live tickets.
	BoundWaiters Bound = "waiters"
	// BoundQuota is a tenant's TenantConfig.MaxQueued.
	BoundQuota Bound = "quota"
)

// BackpressureError is the error a refused submission gets. It matches
// [ErrBackpressure].
type BackpressureError struct {
	// Bound says which limit was hit.
	Bound Bound
	// Depth is the number of tracked keys when the submission was refused.
	Depth int
}

func (e *BackpressureError) Error() string {
	return fmt.Sprintf("dispatch: backpressure: %s (depth %d)", e.Bound, e.Depth)
}

// Is reports whether target is [ErrBackpressure].
func (e *BackpressureError) Is(target error) bool { return target == ErrBackpressure }

// The reasons a call is not retried (RetryError.Reason).
const (
	giveUpPermanent   = "permanent"    // the classifier judged the error permanent
	giveUpAttempts    = "attempts"     // Retry.MaxAttempts executions were made
	giveUpDeadline    = "deadline"     // the next attempt could not start before the deadline
	giveUpBudget      = "budget"       // the retry budget was spent
	giveUpRecompute   = "recompute"    // ClassRecompute, and no BeforeRetry hook to rebuild the call
	giveUpBeforeRetry = "before_retry" // the BeforeRetry hook returned an error
	giveUpQuota       = "quota"        // no room under the tenant's MaxQueued to wait in
	giveUpPanic       = "panic"        // exec panicked: Failed with the *PanicError itself
)

// RetryError is the error of a call that failed for good after it was
// judged. It unwraps to the last execution's error, and matches ErrExpired
// when the call's deadline stopped the retries.
type RetryError struct {
	// Attempts is the number of executions made.
	Attempts int
	// Last is the last execution's error (or the before-retry hook's).
	Last error
	// Reason says why the call was not retried (further), from a fixed
	// set: "permanent" (judged so), "attempts" (Retry.MaxAttempts made),
	// "deadline" (the next attempt could not start in time), "budget" (the
	// retry budget was spent), "recompute" (ClassRecompute without a
	// BeforeRetry hook), "before_retry" (the hook failed), "quota" (no
	// room under the tenant's MaxQueued to wait in).
	Reason string
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("dispatch: failed after %d attempt(s) (%s): %v", e.Attempts, e.Reason, e.Last)
}

// Unwrap returns the last error.
func (e *RetryError) Unwrap() error { return e.Last }

// Is matches ErrExpired for Reason "deadline".
func (e *RetryError) Is(target error) bool {
	return target == ErrExpired && e.Reason == giveUpDeadline
}

// The callbacks a PanicError can name.
const (
	callbackExec        = "exec"
	callbackMerge       = "merge"
	callbackNoOp        = "no_op"
	callbackLabel       = "label"
	callbackOnDone      = "on_done"
	callbackClassify    = "classify"
	callbackBeforeRetry = "before_retry"
	callbackObserver    = "observer"
	callbackAmend       = "amend"
)

// PanicError is the error of a callback that panicked or exited its
// goroutine: the dispatcher recovered, finished what the callback
// interrupted, and went on. A call whose exec, no-op test, before-retry hook
// or classifier panicked ends Failed with this error and is never retried,
// since a half-done side effect must not be repeated.
type PanicError struct {
	// Callback says whose code it was: "exec", "merge", "no_op", "label",
	// "on_done", "classify", "before_retry", "observer" or "amend".
	Callback string
	// Value is what was passed to panic, or ErrGoexit if the callback called
	// runtime.Goexit (as t.FailNow does).
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("dispatch: %s panicked: %v\n\n%s", e.Callback, e.Value, e.Stack)
}

// Unwrap returns the panic value if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// ErrGoexit is the PanicError.Value of a callback that called
// runtime.Goexit.
var ErrGoexit = errors.New("dispatch: callback exited its goroutine (runtime.Goexit)")

// ErrReentrant reports a call made from a callback that would have to wait
// for the goroutine running that very callback: a Sync-mode Submit or Post
// for the key whose call this goroutine is executing, or any Sync-mode
// submission from the execution of the circuit breaker's half-open probe
// (refused; nothing was enqueued); or the wait of Close or SetMode, which
// take effect but return at once instead of waiting for themselves.
var ErrReentrant = errors.New("dispatch: called from a callback; cannot wait for its own goroutine")

// Preallocated rejection errors for the hot paths: a refusal there must not
// allocate either.
var (
	errRejectStale   = fmt.Errorf("%w: generation is older than the key's newest", ErrStale)
	errRejectPast    = fmt.Errorf("%w: deadline already passed", ErrExpired)
	errRejectIdemKey = fmt.Errorf("%w: pending call has a different idempotency key", ErrMergeRejected)

	errDroppedCapacity  = fmt.Errorf("%w: capacity: evicted for a better call", ErrDropped)
	errDroppedQuota     = fmt.Errorf("%w: quota: evicted for a better call of the same tenant", ErrDropped)
	errFallbackCanceled = fmt.Errorf("%w: %w", ErrCanceled, ErrFallback)
	errUnfinishable     = fmt.Errorf("%w: not started: its deadline was closer than its label's usual execution time", ErrExpired)
)

// canceledErr wraps cause, if any, so that it matches ErrCanceled and cause.
func canceledErr(cause error) error {
	if cause == nil || errors.Is(cause, ErrCanceled) {
		if cause == nil {
			return ErrCanceled
		}
		return cause
	}
	return fmt.Errorf("%w: %w", ErrCanceled, cause)
}

// ctxErr is the error for a submission whose context is already done.
func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errRejectPast
	}
	return canceledErr(context.Cause(ctx))
}

// stateErr is the sentinel for a terminal state that is not success or
// failure.
func stateErr(st State) error {
	switch st {
	case StateCanceled:
		return ErrCanceled
	case StateExpired:
		return ErrExpired
	case StateDropped:
		return ErrDropped
	case StateStale:
		return ErrStale
	case StateClosed:
		return ErrClosed
	}
	return nil
}

// staleErr is the completion hook's error for a call that ended in st after
// losing its waiters; execErr is what exec returned, kept for audit.
func staleErr(st State, execErr error) error {
	if st != StateStale {
		return stateErr(st)
	}
	if execErr != nil {
		return fmt.Errorf("%w: execution finished after its waiters left: %w", ErrStale, execErr)
	}
	return fmt.Errorf("%w: execution succeeded after its waiters left", ErrStale)
}
