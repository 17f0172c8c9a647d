package dispatch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the context an execution runs under. The dispatcher owns
// it and cancels it itself — when the call loses its last waiter, when its
// waiters' deadline passes (the clock expires them), when Close ends it,
// and when the attempt ends (cause ErrAttemptEnded) — so it needs no
// parent, no timer and no goroutine. Each execution gets its own, never
// reused: a context exec hands to work that outlives it stays done, with
// its own execution's cause.
//
// It is a full context.Context: Done, Err, Deadline and Value behave as a
// context.WithCancelCause's would, context.Cause reports the dispatcher's
// cause, and contexts derived from it (WithTimeout, AfterFunc, ...)
// register with its AfterFunc method rather than start a goroutine each.

// execCtx is one execution's context. Its fields are guarded by mu, except
// done's fast path, which is atomic; deadline and idem are set before exec
// sees it and never change.
type execCtx struct {
	mu       sync.Mutex
	done     atomic.Value // chan struct{}: made by the first Done; closedCh if cancelled first
	err      error
	cause    error
	causeCtx context.Context // once cancelled and asked: a cancelled context.WithCancelCause carrying cause, for context.Cause
	deadline time.Time       // zero: none
	idem     string
	afters   []*afterFunc
}

// afterFunc is one registration of AfterFunc.
type afterFunc struct {
	f       func()
	stopped bool
}

// closedCh is the Done channel of a context cancelled before anyone asked
// for its channel.
var closedCh = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

var _ context.Context = (*execCtx)(nil)

// Deadline returns the latest deadline of the call's waiters, if each of
// them has one.
func (ctx *execCtx) Deadline() (time.Time, bool) {
	return ctx.deadline, !ctx.deadline.IsZero()
}

// Done returns a channel closed when the execution is cancelled.
func (ctx *execCtx) Done() <-chan struct{} {
	if ch, _ := ctx.done.Load().(chan struct{}); ch != nil {
		return ch
	}
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	if ch, _ := ctx.done.Load().(chan struct{}); ch != nil {
		return ch
	}
	ch := make(chan struct{})
	ctx.done.Store(ch)
	return ch
}

// Err returns nil until the context is cancelled; then
// context.DeadlineExceeded if the waiters' deadline passed, else
// context.Canceled.
func (ctx *execCtx) Err() error {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	return ctx.err
}

// Value returns the idempotency key for idemKey{}; once cancelled, for any
// other key, what a cancelled context.WithCancelCause carrying the cause
// returns (so context.Cause reports it); nil for anything else.
func (ctx *execCtx) Value(key any) any {
	if _, ok := key.(idemKey); ok {
		if ctx.idem == "" {
			return nil
		}
		return ctx.idem
	}
	ctx.mu.Lock()
	if ctx.err == nil {
		ctx.mu.Unlock()
		return nil
	}
	if ctx.causeCtx == nil {
		cc, cancel := context.WithCancelCause(context.Background())
		cancel(ctx.cause)
		ctx.causeCtx = cc
	}
	cc := ctx.causeCtx
	ctx.mu.Unlock()
	return cc.Value(key)
}

// AfterFunc arranges for f to run once ctx is cancelled; the context
// package uses it to tie derived contexts to this one without a goroutine
// each. f runs on the goroutine that cancels ctx, after ctx is done — the
// context package registers only its own short cancel functions here, and
// context.AfterFunc wraps a caller's f in a goroutine of its own — or, if
// ctx is already done, in a new goroutine (the context package may call
// AfterFunc holding a lock that f takes).
func (ctx *execCtx) AfterFunc(f func()) (stop func() bool) {
	ctx.mu.Lock()
	if ctx.err != nil {
		ctx.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	ctx.afters = append(ctx.afters, a)
	ctx.mu.Unlock()
	return func() bool {
		ctx.mu.Lock()
		defer ctx.mu.Unlock()
		if a.stopped {
			return false
		}
		a.stopped = true
		return true
	}
}

// cancel ends ctx with cause: ErrAttemptEnded when exec has returned, or
// why the call ended before that (ErrCanceled, ErrStale, ErrClosed,
// ErrExpired...). A cause matching ErrExpired makes Err
// context.DeadlineExceeded, any other context.Canceled. Only the first call
// has an effect; it runs the AfterFunc registrations after releasing mu.
func (ctx *execCtx) cancel(cause error) {
	ctx.mu.Lock()
	if ctx.err != nil {
		ctx.mu.Unlock()
		return
	}
	ctx.err = context.Canceled
	if cause != ErrAttemptEnded && errors.Is(cause, ErrExpired) { // the usual cause needs no walk
		ctx.err = context.DeadlineExceeded
	}
	ctx.cause = cause // causeCtx is made when asked for (Value)
	if ch, _ := ctx.done.Load().(chan struct{}); ch != nil {
		close(ch)
	} else {
		ctx.done.Store(closedCh)
	}
	afters := ctx.afters
	ctx.afters = nil
	var run []func()
	for _, a := range afters {
		if !a.stopped {
			a.stopped = true
			run = append(run, a.f)
		}
	}
	ctx.mu.Unlock()
	for _, f := range run {
		f()
	}
}
