package dispatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/coalescer/dispatch/internal/execctx"
)

// Sentinel errors. A refusal, and every outcome's error but a Failed one,
// matches one with [errors.Is] (a refusal for a done context also matches
// the context's error). New's and SetMode's errors for bad arguments match
// none.
var (
	// ErrBackpressure: full (see BackpressureError); nothing was enqueued.
	ErrBackpressure = errors.New("dispatch: backpressure")
	// ErrClosed: a submission after Close, or a call Close ended.
	ErrClosed = errors.New("dispatch: closed")
	// ErrDropped: a call shed under load; the wrapping error names the bound.
	ErrDropped = errors.New("dispatch: dropped")
	// ErrExpired: the waiter's deadline passed before its call finished.
	ErrExpired = errors.New("dispatch: deadline expired")
	// ErrCanceled: the waiter left (its ticket, its ctx, Dispatcher.Cancel),
	// wrapping the cause, if any.
	ErrCanceled = errors.New("dispatch: canceled")
	// ErrStale: an older generation than the key's newest (see StateStale).
	ErrStale = errors.New("dispatch: stale")
	// ErrCircuitOpen: see BreakerPolicy.RefuseDroppable.
	ErrCircuitOpen = errors.New("dispatch: circuit open")
	// ErrMergeRejected: Merge refused (its error is wrapped), or the
	// idempotency keys differ.
	ErrMergeRejected = errors.New("dispatch: merge rejected")
	// ErrFallback: a switch to ModeSync ended the queued call
	// (RolloutPolicy.CancelQueued, or SetMode's ctx ended before the
	// workers drained it); run it on the synchronous path yourself.
	ErrFallback = errors.New("dispatch: switched to synchronous mode; take the synchronous path")
	// ErrAttemptEnded is the context.Cause of an execution's context once
	// exec returned, if nothing ended it earlier; never an outcome's error.
	ErrAttemptEnded = errors.New("dispatch: attempt ended")
)

// An execution's context records ErrAttemptEnded, its usual cause, in a
// bit rather than a word of its own.
func init() { execctx.Ended = ErrAttemptEnded }

// SkipIncoming, returned (or wrapped) by Config.Merge, says the pending call
// makes the incoming submission moot (a status patch behind the pod's
// pending deletion): it ends Skipped at once, and the pending call is left
// as it was. No caller ever receives it as an error.
//
//lint:ignore ST1012 a signal from Merge, like fs.SkipDir, never an error a caller receives
var SkipIncoming = errors.New("dispatch: skip incoming call")

// ReplacePending, returned (or wrapped) by Config.Merge with the incoming
// call, says the incoming call is another operation that replaces the
// pending one (a deletion replacing a binding). The call starts fresh, with
// no attempts, backoff or last error, in the incoming submission's tenant
// and label; the pending call's waiters share its outcome. No caller ever
// receives it as an error.
//
//lint:ignore ST1012 a signal from Merge, like fs.SkipDir, never an error a caller receives
var ReplacePending = errors.New("dispatch: replace pending call")

// SkipCall, returned (or wrapped) by an ExecFunc, says the execution found
// that the call would change nothing, and did nothing: the call ends
// Skipped, as Config.NoOp would have ended it before it ran, and is not
// retried. It is for a test that needs the execution's context — one that
// reads the server, or runs code that may block — which Config.NoOp, run
// without one, must not do. No caller ever receives it as an error.
//
//lint:ignore ST1012 a signal from exec, like fs.SkipDir, never an error a caller receives
var SkipCall = errors.New("dispatch: skip call")

// Bound names a limit that refused a submission or shed a queued call,
// from a fixed set: safe as a metric label.
type Bound string

const (
	BoundCapacity Bound = "capacity" // Config.Capacity
	BoundWaiters  Bound = "waiters"  // Config.MaxWaiters
	BoundQuota    Bound = "quota"    // TenantConfig.MaxQueued
)

// BackpressureError is a submission's refusal for a full dispatcher.
type BackpressureError struct {
	Bound Bound
	Depth int // tracked keys at the refusal
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
// judged. It unwraps to the last execution's error.
type RetryError struct {
	Attempts int   // executions made
	Last     error // the last execution's error, or BeforeRetry's
	// Reason is "permanent", "attempts" (RetryPolicy.MaxAttempts),
	// "deadline" (no time for another attempt), "budget", "recompute" (no
	// BeforeRetry), "before_retry" (its error) or "quota" (no room under
	// TenantConfig.MaxQueued to wait in).
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
	callbackFollow      = "follow"
	callbackMoot        = "moot"
	callbackRateLimit   = "rate_limit"
)

// PanicError is the error of a callback that panicked or exited its
// goroutine; the dispatcher recovered and went on (see the package
// documentation, "Callbacks").
type PanicError struct {
	// Callback is "exec", "merge", "follow", "moot", "no_op", "label",
	// "on_done", "classify", "before_retry", "observer", "amend" or
	// "rate_limit" (the RateLimiter).
	Callback string
	Value    any // what was passed to panic, or ErrGoexit (runtime.Goexit)
	Stack    []byte
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

// ErrReentrant reports a call from a callback that would wait for its own
// goroutine: a Sync-mode submission for the key this goroutine executes, or
// from the breaker's half-open probe (refused), or Close or SetMode (which
// take effect, and return without waiting for themselves).
var ErrReentrant = errors.New("dispatch: called from a callback; cannot wait for its own goroutine")

// Preallocated rejection errors for the hot paths: a refusal there must not
// allocate either.
var (
	errRejectStale   = fmt.Errorf("%w: generation is older than the key's newest", ErrStale)
	errRejectPast    = fmt.Errorf("%w: deadline already passed", ErrExpired)
	errTimeoutPast   = fmt.Errorf("%w: SubmitOptions.Timeout is negative: the deadline already passed", ErrExpired)
	errCtxPast       = fmt.Errorf("%w: %w", ErrExpired, context.DeadlineExceeded)
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

// ctxErr is the error for a submission whose context is already done: it
// matches ErrExpired or ErrCanceled, the context's error, and its cause.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		if cause == nil || cause == err {
			return errCtxPast
		}
		return fmt.Errorf("%w: %w", errCtxPast, cause)
	}
	if cause == nil || cause == err {
		return canceledErr(err)
	}
	return fmt.Errorf("%w: %w (%w)", ErrCanceled, cause, err)
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

// fieldErr is the error for a Config field out of range.
func fieldErr(field string, v any, why string) error {
	return fmt.Errorf("dispatch: Config.%s: %v %s", field, v, why)
}
