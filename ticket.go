package dispatch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// Ticket is the caller's handle on one submission, as a rate.Reservation is
// on a token: it hears its outcome exactly once. It is safe for concurrent
// use; only Dispatcher.Submit makes one, and its zero value is not usable.
type Ticket[K comparable, T any] struct {
	d *Dispatcher[K, T]
	// c is the call the ticket is on. A rider keeps it after the call ended
	// (nothing visits it to clear it): read it only while the ticket has
	// not ended. Guarded by d.mu.
	c *call[K, T]
	// share is the shared outcome the ticket rides, or nil. It is set when
	// the ticket joins its call, before Submit returns it, and never
	// changes: a ticket that joined before its call had a share is visited
	// instead. So it is read without the lock.
	share *share[K, T]
	// r is the ticket's own outcome, recorded under d.mu before it is told:
	// a visited ticket's (shared with the other tickets its call's end
	// visited on time), or that of a rider that left its share (Cancel),
	// which is then its own. A rider that ends with its share never gets
	// one, so for a rider r != nil says it left; see outcome.
	r *Result[K, T]
	// x holds what only a ticket with a deadline or a context to watch
	// needs; it is nil for a plain ticket, which keeps the ticket small.
	x *ticketWatch[K, T]
	// done holds the Done channel (a chan struct{}). It is made on the first
	// call to Done, so a caller that never waits on a ticket (it learns
	// outcomes from the completion hook) does not pay for one; once the
	// outcome is told, it holds closedDone.
	done atomic.Value
	prio int   // the submission's priority
	enq  int64 // when it joined, on the dispatcher's clock
	// idx is its position in its call's list, -1 in call.one. (2³¹ live
	// tickets on one call would take 160 GiB.)
	idx   int32
	state ticketState // guarded by d.mu
	// inline is set for a submission made in Sync mode, whose submitter
	// runs its call or waits for it. Guarded by d.mu.
	inline bool
}

// ticketWatch is the part of a Ticket that only one with a deadline or a
// context needs. It is allocated with the ticket (watchedTicket).
type ticketWatch[K comparable, T any] struct {
	t        *Ticket[K, T]
	deadline int64 // 0: none
	// at and seq are its key in the deadline index of tickets: at is the
	// deadline while it is indexed, 0 while not; seq breaks ties.
	at   int64
	seq  uint64
	stop func() bool // unregisters the context.AfterFunc, if any
}

// watchedTicket is a Ticket with its ticketWatch, in one allocation.
type watchedTicket[K comparable, T any] struct {
	t Ticket[K, T]
	x ticketWatch[K, T]
}

// newTicket makes the ticket of a submission to d; deadline (0: none) and
// watch (its context can end) say whether it needs a ticketWatch. A plain
// ticket is one small allocation; a watched one, one larger.
func newTicket[K comparable, T any](d *Dispatcher[K, T], deadline int64, watch bool) *Ticket[K, T] {
	if deadline == 0 && !watch {
		return &Ticket[K, T]{d: d}
	}
	b := &watchedTicket[K, T]{}
	t := &b.t
	t.d, t.x = d, &b.x
	b.x.t, b.x.deadline = t, deadline
	return t
}

// stopWatch unregisters t's context watch, if it has one. It runs without
// the lock.
func (t *Ticket[K, T]) stopWatch() {
	if t.x != nil && t.x.stop != nil {
		t.x.stop()
	}
}

// share is the outcome of a call, recorded once for every ticket that
// rides it. Under d.mu the dispatcher records res and sets ended; once the
// lock is released, deliver closes the Done channels of the riders that
// made one and then sets told. A ticket reads res once told is set, or
// once its own Done channel is closed.
type share[K comparable, T any] struct {
	res   Result[K, T]
	ended bool // guarded by d.mu: res is final
	told  atomic.Bool
	mu    sync.Mutex
	// sealed is set when deliver tells the outcome; watch lists the riders
	// whose Done channel was made before that, to be closed then.
	sealed bool
	watch  []*Ticket[K, T]
	// next chains the shares of calls that a retry absorbed (absorb):
	// their riders end with this call.
	next *share[K, T]
}

// shareMin is how many plain tickets (no deadline, no context watch) a
// call gathers before they share its outcome. A plain ticket that joins
// while fewer than shareMin-1 others wait to be visited is visited too;
// once that many wait, the call makes its share, and every later plain
// ticket rides it. The share is one allocation, not worth it for a few.
const shareMin = 4

// watchDone registers rider t, whose Done channel was just made, to have it
// closed when the outcome is told — or closes it now, if it has been.
//
// Every ticket has exactly one teller (see tell). A rider that left its
// share before the share ended (t.r is set) is told by the dispatcher, as
// any ticket with its own outcome; the share tells only the others. t.r is
// read here only once the share is sealed, which happens after it ended,
// and so after any leave: s.mu orders it.
func (s *share[K, T]) watchDone(t *Ticket[K, T]) {
	s.mu.Lock()
	if !s.sealed {
		s.watch = append(s.watch, t)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	t.tellRider()
}

// tellAll closes the Done channel of every rider that made one and did not
// leave (see watchDone), then marks the outcome told. deliver calls it
// without d.mu, after ended was set.
func (s *share[K, T]) tellAll() {
	s.mu.Lock()
	s.sealed = true
	ws := s.watch
	s.watch = nil
	s.mu.Unlock()
	for _, t := range ws {
		t.tellRider()
	}
	s.told.Store(true)
}

// tellRider tells rider t its share's outcome, unless t left the share:
// the dispatcher then tells it its own, and a ticket has one teller (see
// tell). Its callers read t.r only once the share is sealed (watchDone).
func (t *Ticket[K, T]) tellRider() {
	if t.r == nil {
		t.tell()
	}
}

// closedDone is the Done channel of every ticket whose outcome was told
// before anyone asked for its channel.
var closedDone = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Done returns a channel closed once the outcome is known.
func (t *Ticket[K, T]) Done() <-chan struct{} {
	if ch, ok := t.done.Load().(chan struct{}); ok {
		return ch
	}
	if t.outcome() != nil {
		return closedDone
	}
	ch := make(chan struct{})
	if !t.done.CompareAndSwap(nil, ch) {
		// Another Done made the channel first, or t was told meanwhile
		// (closedDone).
		return t.done.Load().(chan struct{})
	}
	// A rider's outcome is told without visiting it: register the channel
	// with the share. (If t has left the share, the dispatcher tells its
	// own outcome and closes the channel; watchDone leaves it alone.)
	if t.share != nil {
		t.share.watchDone(t)
	}
	return ch
}

// outcome returns t's outcome once it is known, else nil. A rider's
// outcome is its share's unless it left the share (then r is set); every
// other ticket's is r.
//
// The outcome is known exactly when the Done channel is closed: done holds
// closedDone, or the channel Done made, closed (tell closes it before it
// publishes closedDone). So Result agrees with every Done channel handed
// out, and a waiter woken by one always finds the outcome.
//
// r is read without the lock, and only after an acquire (the Done channel
// closed, or the share told) that follows every write to it: a rider
// leaves, and sets r, only before its share ends (leave does nothing to an
// ended ticket), and its share is told only after it ended.
func (t *Ticket[K, T]) outcome() *Result[K, T] {
	s := t.share
	ch, _ := t.done.Load().(chan struct{})
	closed := ch == closedDone
	if !closed && ch != nil {
		select {
		case <-ch:
			closed = true // tell is between closing it and publishing closedDone
		default:
		}
	}
	if closed {
		if s != nil && t.r == nil {
			return &s.res // closed by tellAll, after res was recorded
		}
		return t.r
	}
	// Told through the share, unless t left it first: its own outcome is
	// then told by closing its channel.
	if s != nil && ch == nil && s.told.Load() && t.r == nil {
		return &s.res
	}
	// A channel made by a Done racing with the telling is closed by that
	// Done at once (watchDone): until then the outcome is not told here.
	return nil
}

// tell marks the outcome told and closes the Done channel, if one was made.
// The result must be recorded before. It closes the channel first and only
// then publishes closedDone, so that Result never reports an outcome while
// a channel that Done handed out is still open; outcome takes the closed
// channel itself as told, so that a waiter it wakes finds the outcome even
// before closedDone is published. That order needs one teller per ticket
// (see watchDone): two would both close the channel. Done only ever
// replaces nil, so once the channel is made, nobody but the teller changes
// done.
func (t *Ticket[K, T]) tell() {
	if t.done.CompareAndSwap(nil, closedDone) {
		return // nobody asked for a channel
	}
	if ch := t.done.Load().(chan struct{}); ch != closedDone {
		close(ch)
		t.done.Store(closedDone)
	}
}

// Wait returns the result and its Err once known; if ctx ends first, a
// zero Result and ctx's error, and the submission stays live (Cancel
// leaves).
func (t *Ticket[K, T]) Wait(ctx context.Context) (Result[K, T], error) {
	if r := t.outcome(); r != nil {
		return *r, r.Err
	}
	select {
	case <-t.Done():
		r := t.outcome()
		return *r, r.Err
	case <-ctx.Done():
		return Result[K, T]{}, ctx.Err()
	}
}

// Result returns the outcome and true once Done is closed, else false.
func (t *Ticket[K, T]) Result() (Result[K, T], bool) {
	if r := t.outcome(); r != nil {
		return *r, true
	}
	return Result[K, T]{}, false
}

// ctxDone is the AfterFunc of t's Submit context: the waiter leaves. It
// runs on a goroutine that context.AfterFunc started and Close cannot wait
// for, so the hooks and observer events of the call it may end go to the
// notifier (handOverUnlock).
func (t *Ticket[K, T]) ctxDone(ctx context.Context) {
	st, err := StateExpired, ErrExpired
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		st, err = StateCanceled, canceledErr(context.Cause(ctx))
	}
	t.d.leaveAside(t, st, err)
}

// Cancel ends this submission Canceled, unless it has ended. The call goes
// on for its other waiters; without any, a pending call is removed and a
// running call's context is cancelled.
func (t *Ticket[K, T]) Cancel() {
	t.d.leave(t, StateCanceled, ErrCanceled)
}
