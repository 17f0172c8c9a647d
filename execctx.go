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
// and when the attempt ends — so it needs no parent, no timer and no
// goroutine, and costs no allocation in the steady state: a worker reuses
// the context of its previous execution if nobody looked at it.
//
// It is a full context.Context: Done, Err, Deadline and Value behave as a
// context.WithCancelCause's would, context.Cause reports the dispatcher's
// cause, and contexts derived from it (WithTimeout, AfterFunc, ...)
// register with its AfterFunc method rather than start a goroutine each.

// execCtx is one execution's context. Its fields are guarded by mu, except
// done's fast path and seen, which are atomic.
type execCtx struct {
	mu   sync.Mutex
	done atomic.Value // chan struct{}: made by the first Done; closedCh if cancelled first
	// seen is set by any method: someone holds the context, so it is never
	// reused for another execution.
	seen     atomic.Bool
	err      error
	cause    error
	causeCtx context.Context // a cancelled context.WithCancelCause carrying cause, for context.Cause
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

// noCh is what a reused context's done holds until a Done call makes its
// channel (an atomic.Value cannot go back to holding nothing).
var noCh chan struct{}

var _ context.Context = (*execCtx)(nil)

// reusable reports whether ctx may serve another execution: nobody ever
// called a method of it, and it carries nothing (no deadline, no value)
// that a holder could later read.
func (ctx *execCtx) reusable() bool {
	return ctx != nil && !ctx.seen.Load() && ctx.idem == "" && ctx.deadline.IsZero()
}

// reset readies a reusable ctx for its next execution.
func (ctx *execCtx) reset() {
	ctx.mu.Lock()
	ctx.err, ctx.cause, ctx.causeCtx = nil, nil, nil
	ctx.done.Store(noCh)
	ctx.mu.Unlock()
}

func (ctx *execCtx) look() {
	if !ctx.seen.Load() {
		ctx.seen.Store(true)
	}
}

// Deadline returns the latest deadline of the call's waiters, if each of
// them has one.
func (ctx *execCtx) Deadline() (time.Time, bool) {
	ctx.look()
	return ctx.deadline, !ctx.deadline.IsZero()
}

// Done returns a channel closed when the execution is cancelled.
func (ctx *execCtx) Done() <-chan struct{} {
	ctx.look()
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
	ctx.look()
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	return ctx.err
}

// Value returns the idempotency key for idemKey{}; for context.Cause's own
// key, once cancelled with a cause, the context that carries it; nil for
// anything else.
func (ctx *execCtx) Value(key any) any {
	ctx.look()
	if _, ok := key.(idemKey); ok {
		if ctx.idem == "" {
			return nil
		}
		return ctx.idem
	}
	ctx.mu.Lock()
	cc := ctx.causeCtx
	ctx.mu.Unlock()
	if cc != nil {
		return cc.Value(key)
	}
	return nil
}

// AfterFunc arranges for f to run in its own goroutine once ctx is
// cancelled, as context.AfterFunc does; the context package uses it to tie
// derived contexts to this one without a goroutine each.
func (ctx *execCtx) AfterFunc(f func()) (stop func() bool) {
	ctx.look()
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

// cancel ends ctx with cause; nil means the attempt is over. A cause
// matching ErrExpired makes Err context.DeadlineExceeded. Only the first
// call has an effect.
func (ctx *execCtx) cancel(cause error) {
	ctx.mu.Lock()
	if ctx.err != nil {
		ctx.mu.Unlock()
		return
	}
	ctx.err = context.Canceled
	if cause != nil {
		if errors.Is(cause, ErrExpired) {
			ctx.err = context.DeadlineExceeded
		}
		cc, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		ctx.cause, ctx.causeCtx = cause, cc
	}
	if ch, _ := ctx.done.Load().(chan struct{}); ch != nil {
		close(ch)
	} else {
		ctx.done.Store(closedCh)
	}
	afters := ctx.afters
	ctx.afters = nil
	for _, a := range afters {
		if !a.stopped {
			a.stopped = true
			go a.f()
		}
	}
	ctx.mu.Unlock()
}

// ctxSpare is a worker's reusable execution context.
type ctxSpare struct {
	ctx *execCtx // the context of the worker's last execution
}

// take returns an execution context without a deadline or a value: the
// spare's, if it can be reused, else a new one, which becomes the spare.
// A nil spare (an inline execution) always makes a new one.
func (s *ctxSpare) take() *execCtx {
	if s == nil {
		return new(execCtx)
	}
	if s.ctx.reusable() {
		s.ctx.reset()
		return s.ctx
	}
	s.ctx = new(execCtx)
	return s.ctx
}
