// Package execctx is the context one execution of a call runs under. Its
// owner cancels it itself — when the call loses its last waiter, when its
// waiters' deadline passes, when the owner closes, and when the attempt
// ends — so it needs no parent, no timer and no goroutine. Each execution
// gets its own, never reused: a context exec hands to work that outlives it
// stays done, with its own execution's cause.
//
// A Ctx is a full context.Context: Done, Err, Deadline and Value behave as
// a context.WithCancelCause's would, context.Cause reports the cause it
// was cancelled with, and contexts derived from it (WithTimeout,
// AfterFunc, ...) register with its AfterFunc method rather than start a
// goroutine each.
//
// A Ctx is safe for concurrent use.
package execctx

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// IdemKey is the Value key under which a Ctx holds its idempotency key.
type IdemKey struct{}

// Ctx is one execution's context. Its fields are guarded by mu, except
// done's fast path, which is atomic; deadline and idem are set by New and
// never change.
type Ctx struct {
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

var _ context.Context = (*Ctx)(nil)

// New returns a live context with deadline (zero: none) whose Value for
// IdemKey{} is idem ("" reads as nil).
func New(deadline time.Time, idem string) *Ctx {
	return &Ctx{deadline: deadline, idem: idem}
}

// Deadline returns the deadline New was given, if any.
func (ctx *Ctx) Deadline() (time.Time, bool) {
	return ctx.deadline, !ctx.deadline.IsZero()
}

// Done returns a channel closed when the context is cancelled.
func (ctx *Ctx) Done() <-chan struct{} {
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
// context.DeadlineExceeded if it was cancelled as expired, else
// context.Canceled.
func (ctx *Ctx) Err() error {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	return ctx.err
}

// Value returns the idempotency key for IdemKey{}; once cancelled, for any
// other key, what a cancelled context.WithCancelCause carrying the cause
// returns (so context.Cause reports it); nil for anything else.
func (ctx *Ctx) Value(key any) any {
	if _, ok := key.(IdemKey); ok {
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
func (ctx *Ctx) AfterFunc(f func()) (stop func() bool) {
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

// Cancel ends ctx with cause; expired makes Err context.DeadlineExceeded,
// else context.Canceled. Only the first call has an effect; it runs the
// AfterFunc registrations after releasing the context's lock.
func (ctx *Ctx) Cancel(cause error, expired bool) {
	ctx.mu.Lock()
	if ctx.err != nil {
		ctx.mu.Unlock()
		return
	}
	ctx.err = context.Canceled
	if expired {
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
