package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
)

// Ticket is the caller's handle on one submission, as a rate.Reservation is
// on a token. It is safe for concurrent use. A Ticket is only obtained from
// [Dispatcher.Submit]; its zero value is not usable.
//
// A ticket that neither carries a deadline nor watches a context (its
// ctx's Done is nil) shares its outcome with the other such tickets of its
// call, from the fourth on: the call's end records one outcome for them
// all and does not visit them, so that the time a call's end holds the
// dispatcher's lock does not grow with the tickets it served. A ticket
// that leaves on its own (Cancel), and one that the call's end visits (the
// first three, or one with a deadline to expire or a context to stop
// watching), has its outcome recorded in the ticket. Either way each
// ticket hears exactly once, and Result reports an outcome only once Done
// is closed.
type Ticket[K comparable, T any] struct {
	w waiter[K, T]
	d *Dispatcher[K, T]
	// done holds the Done channel (a chan struct{}). It is made on the first
	// call to Done, so a caller that never waits on a ticket (it learns
	// outcomes from the completion hook) does not pay for one; once the
	// outcome is told, it holds closedDone.
	done atomic.Value
	// share is the shared outcome the ticket rides, or nil. It is set when
	// the ticket joins its call, before Submit returns it, and never
	// changes: a ticket that joined before its call had a share is visited
	// instead. So it is read without the lock.
	share *share[K, T]
	stop  func() bool // unregisters the context.AfterFunc, if any
	// own is set, under d.mu, when a rider leaves its share (Cancel): its
	// outcome is then its own, in res.
	own   atomic.Bool
	state ticketState // guarded by d.mu
	res   Result[K, T]
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
func (s *share[K, T]) watchDone(t *Ticket[K, T]) {
	s.mu.Lock()
	if !s.sealed {
		s.watch = append(s.watch, t)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	t.tell()
}

// tellAll closes the Done channel of every rider that made one, then marks
// the outcome told. deliver calls it without d.mu, after ended was set.
func (s *share[K, T]) tellAll() {
	s.mu.Lock()
	s.sealed = true
	ws := s.watch
	s.watch = nil
	s.mu.Unlock()
	for _, t := range ws {
		t.tell()
	}
	s.told.Store(true)
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
	if t.outcome() != nil {
		return closedDone
	}
	ch := make(chan struct{})
	if !t.done.CompareAndSwap(nil, ch) {
		return t.done.Load().(chan struct{}) // told meanwhile: closedDone
	}
	// A rider's outcome is told without visiting it: register the channel
	// with the share. (If t has left the share, its own telling closes the
	// channel, and whichever comes second finds it closed.)
	if t.share != nil {
		t.share.watchDone(t)
	}
	return ch
}

// outcome returns t's outcome once it is known, else nil. A rider's
// outcome is its share's unless it left the share (own); every other
// ticket's is in the ticket.
func (t *Ticket[K, T]) outcome() *Result[K, T] {
	s := t.share
	ch, _ := t.done.Load().(chan struct{})
	if ch == closedDone {
		if s != nil && !t.own.Load() {
			return &s.res // closed by tellAll, after res was recorded
		}
		return &t.res
	}
	// Told through the share. A rider that left set own before the share
	// could end, so reading own after told sees it.
	if s != nil && ch == nil && s.told.Load() && !t.own.Load() {
		return &s.res
	}
	// A channel made by a Done racing with the telling is closed by that
	// Done at once (watchDone): until then the outcome is not told here.
	return nil
}

// ended reports, under d.mu, whether t's outcome is recorded: settled on
// its own, or through the share it rides.
func (t *Ticket[K, T]) ended() bool {
	return t.state == tsDone || t.share != nil && t.share.ended
}

// watched reports whether t must be visited when its call ends: it has a
// deadline to take out of the deadline index, or a context to stop
// watching. Such a ticket never rides a share.
func (t *Ticket[K, T]) watched() bool { return t.w.deadline != 0 || t.stop != nil }

// tell marks the outcome told and closes the Done channel, if one was made
// and is not closed yet. The result must be recorded before.
func (t *Ticket[K, T]) tell() {
	if ch, _ := t.done.Swap(closedDone).(chan struct{}); ch != nil && ch != closedDone {
		close(ch)
	}
}

// Wait blocks until the outcome is known or ctx is done. It returns the
// result and result.Err; if ctx ends first it returns a zero Result and
// ctx's error, and the submission stays live (use Cancel to leave).
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

// Result returns the outcome and true once Done is closed, or a zero Result
// and false before.
func (t *Ticket[K, T]) Result() (Result[K, T], bool) {
	if r := t.outcome(); r != nil {
		return *r, true
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
