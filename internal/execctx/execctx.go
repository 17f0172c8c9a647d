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
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// IdemKey is the Value key under which a Ctx holds its idempotency key.
type IdemKey struct{}

// Ctx is one execution's context. Every execution makes one, so it holds
// only what each needs — 40 bytes on a 64-bit platform — and what only
// some use (an idempotency key, AfterFunc registrations, a cause other
// than Ended, the cause's carrier) is made on first use. Its owner may
// embed it in a record of its own, one allocation per execution for both
// (Init). Its fields are guarded by mu, except done once made (see Done);
// deadline is set by New or Init and never changes.
type Ctx struct {
	mu       sync.Mutex
	made     atomic.Uint32 // 1 once done holds the Done channel for good
	state    uint8         // live, canceled or expired
	ended    bool          // cancelled with Ended as its cause
	done     chan struct{} // made by the first Done; closedCh if cancelled first
	deadline int64         // Unix nanoseconds; 0: none
	x        *extra
}

// extra is what only some executions use.
type extra struct {
	idem     string
	afters   []*afterFunc
	cause    error           // the cause it was cancelled with, unless that was Ended (Ctx.ended)
	causeCtx context.Context // once cancelled and asked: a cancelled context.WithCancelCause carrying the cause, for context.Cause
}

// Ended is the cause most contexts are cancelled with: their owner's
// "the attempt ended". A Ctx cancelled with it records one bit; any other
// cause is kept with what only some executions use. The owner sets it
// once, before it makes any Ctx (its package's init).
var Ended error

const (
	live uint8 = iota
	canceled
	expired
)

// afterFunc is one registration of AfterFunc, at afters[i] while it
// waits.
type afterFunc struct {
	f       func()
	i       int
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
// IdemKey{} is idem ("" reads as nil). The deadline keeps its wall-clock
// reading only, within the years 1678 to 2262 that Unix nanoseconds hold:
// a later one reads as the last instant they hold, an earlier one as the
// first, so that a far deadline never reads as one long past.
func New(deadline time.Time, idem string) *Ctx {
	ctx := &Ctx{}
	ctx.Init(deadline, idem)
	return ctx
}

// Init makes ctx, a zero Ctx its owner embeds in a record of its own,
// what New would return. It is called once, before ctx is shared: a Ctx
// is never reused.
func (ctx *Ctx) Init(deadline time.Time, idem string) {
	if !deadline.IsZero() {
		ctx.deadline = unixNano(deadline)
	}
	if idem != "" {
		ctx.x = &extra{idem: idem}
	}
}

// Unix nanoseconds' range, as times.
var (
	lastNano  = time.Unix(0, math.MaxInt64)
	firstNano = time.Unix(0, math.MinInt64)
)

// unixNano is t in Unix nanoseconds, saturated to their range (UnixNano
// wraps around outside it), and never 0, which means no deadline.
func unixNano(t time.Time) int64 {
	switch {
	case t.After(lastNano):
		return math.MaxInt64
	case t.Before(firstNano):
		return math.MinInt64
	}
	if n := t.UnixNano(); n != 0 {
		return n
	}
	return -1 // the Unix epoch, long past: a nanosecond earlier
}

// more returns ctx's extra, making it; ctx.mu is held.
func (ctx *Ctx) more() *extra {
	if ctx.x == nil {
		ctx.x = &extra{}
	}
	return ctx.x
}

// Deadline returns the deadline New or Init was given, if any.
func (ctx *Ctx) Deadline() (time.Time, bool) {
	if ctx.deadline == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ctx.deadline), true
}

// Done returns a channel closed when the context is cancelled. Once made
// (or set to closedCh), the channel never changes: made's store publishes
// it, so a load that sees made needs no lock.
func (ctx *Ctx) Done() <-chan struct{} {
	if ctx.made.Load() != 0 {
		return ctx.done
	}
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	if ctx.done == nil {
		ctx.done = make(chan struct{})
		ctx.made.Store(1)
	}
	return ctx.done
}

// Err returns nil until the context is cancelled; then
// context.DeadlineExceeded if it was cancelled as expired, else
// context.Canceled.
func (ctx *Ctx) Err() error {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	return ctx.err()
}

// err is Err with ctx.mu held.
func (ctx *Ctx) err() error {
	switch ctx.state {
	case canceled:
		return context.Canceled
	case expired:
		return context.DeadlineExceeded
	}
	return nil
}

// Value returns the idempotency key for IdemKey{}; once cancelled, for any
// other key, what a cancelled context.WithCancelCause carrying the cause
// returns (so context.Cause reports it); nil for anything else.
func (ctx *Ctx) Value(key any) any {
	ctx.mu.Lock()
	if _, ok := key.(IdemKey); ok {
		defer ctx.mu.Unlock()
		if ctx.x == nil || ctx.x.idem == "" {
			return nil
		}
		return ctx.x.idem
	}
	if ctx.state == live {
		ctx.mu.Unlock()
		return nil
	}
	x := ctx.more()
	if x.causeCtx == nil {
		cc, cancel := context.WithCancelCause(context.Background())
		cancel(ctx.cause())
		x.causeCtx = cc
	}
	cc := x.causeCtx
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
	if ctx.state != live {
		ctx.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	x := ctx.more()
	a := &afterFunc{f: f, i: len(x.afters)}
	x.afters = append(x.afters, a)
	ctx.mu.Unlock()
	return func() bool {
		ctx.mu.Lock()
		defer ctx.mu.Unlock()
		if a.stopped {
			return false
		}
		a.stopped = true
		x.drop(a)
		return true
	}
}

// drop takes stopped registration a out of afters, so that neither it nor
// what its f holds (a derived context, cancelled and let go) stays
// reachable until ctx is cancelled, however many a long execution
// derives: the order of afters is of no account, so the last takes a's
// place. Once a quarter full, the slice shrinks by half, so that a burst of
// derived contexts does not leave its peak behind. ctx.mu is held.
func (x *extra) drop(a *afterFunc) {
	last := len(x.afters) - 1
	if a.i != last {
		x.afters[a.i] = x.afters[last]
		x.afters[a.i].i = a.i
	}
	x.afters[last] = nil
	x.afters = x.afters[:last]
	if c := cap(x.afters); c > 32 && last <= c/4 {
		x.afters = append(make([]*afterFunc, 0, c/2), x.afters...)
	}
}

// Cancel ends ctx with cause; expire makes Err context.DeadlineExceeded,
// else context.Canceled. Only the first call has an effect; it runs the
// AfterFunc registrations after releasing the context's lock.
func (ctx *Ctx) Cancel(cause error, expire bool) {
	ctx.mu.Lock()
	if ctx.state != live {
		ctx.mu.Unlock()
		return
	}
	ctx.state = canceled
	if expire {
		ctx.state = expired
	}
	// The carrier for context.Cause is made when asked for (Value).
	switch {
	case cause == nil: // context.Canceled, as context.WithCancelCause's
	case cause == Ended:
		ctx.ended = true
	default:
		ctx.more().cause = cause
	}
	if ctx.done != nil {
		close(ctx.done)
	} else {
		ctx.done = closedCh
		ctx.made.Store(1)
	}
	var run []func()
	if x := ctx.x; x != nil {
		afters := x.afters
		x.afters = nil
		for _, a := range afters { // each still waits: stop drops its own
			a.stopped = true
			run = append(run, a.f)
		}
	}
	ctx.mu.Unlock()
	for _, f := range run {
		f()
	}
}

// cause is the cause ctx was cancelled with, nil if none or live; ctx.mu
// is held.
func (ctx *Ctx) cause() error {
	if ctx.ended {
		return Ended
	}
	if ctx.x != nil {
		return ctx.x.cause
	}
	return nil
}
