package dispatch

import "runtime/debug"

// This file is telling: outcomes reach waiters, the completion hook and the
// observer outside every lock, after the dispatcher's own bookkeeping is
// final. Whatever changes state under the lock collects what it must tell
// in an outbox; whoever held the lock delivers it once released.

// ticketState is a Ticket's lifecycle, guarded by the Dispatcher's lock.
type ticketState uint8

const (
	tsNew  ticketState = iota // created, not yet admitted
	tsLive                    // waiting on a call
	tsDone                    // outcome recorded (or never admitted)
)

// outbox collects what must be told once the lock is released: tickets to
// close, completion-hook results and observer events.
type outbox[K comparable, T any] struct {
	tickets []*Ticket[K, T]
	hooks   []Result[K, T]
	notes   notes
}

// notes are observer events to run once the lock is released.
type notes []func()

// deliver tells everything in ob, in order: tickets, hooks, observer
// events. It must be called without the lock, and leaves ob empty for
// reuse.
func (d *Dispatcher[K, T]) deliver(ob *outbox[K, T]) {
	for i, t := range ob.tickets {
		if t.stop != nil {
			t.stop()
		}
		t.tell()
		ob.tickets[i] = nil
	}
	ob.tickets = ob.tickets[:0]
	for i := range ob.hooks {
		d.cfg.OnDone(ob.hooks[i])
		ob.hooks[i] = Result[K, T]{}
	}
	ob.hooks = ob.hooks[:0]
	for i, f := range ob.notes {
		f()
		ob.notes[i] = nil
	}
	ob.notes = ob.notes[:0]
}

// empty reports whether ob has nothing to tell.
func (ob *outbox[K, T]) empty() bool {
	return len(ob.tickets) == 0 && len(ob.hooks) == 0 && len(ob.notes) == 0
}

// safeCall runs f, turning a panic into a *PanicError. It needs no lock.
func safeCall(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return f()
}
