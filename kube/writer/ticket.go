package writer

import (
	"context"

	"github.com/coalescer/dispatch"
	"k8s.io/apimachinery/pkg/types"
)

// Result is the outcome of one desire (from Ticket.Wait), or of one
// write, which may have served several merged desires (Options.OnDone).
type Result[O Object] struct {
	UID types.UID
	// Namespace and Name are the object's, as given to Set: with them
	// OnDone can requeue it, whatever the outcome (Object is nil for most
	// that did not land).
	Namespace, Name string
	// Object is the newest object the writer had when the desire ended:
	// the server's answer to the last write, or the object as the writer
	// found it (read, or given to Set) when nothing more needed writing,
	// if that is newer; nil if the desire did not run to its end
	// (Canceled, Expired, Dropped, Closed, Stale) or the object was never
	// read.
	Object O
	// Writes counts the write requests the server accepted for it: 0 when
	// nothing needed writing.
	Writes int
	// Outcome says how it ended: State (Succeeded; Skipped when nothing
	// needed writing; Failed, with Err — ErrGone, ErrReplaced, the API's
	// error; Canceled, Expired, Dropped, Closed), Attempts, queue wait.
	dispatch.Outcome
}

// resultOf is r as a writer's Result. The op's fields are read only once
// its call has ended (final states, or always for the completion hook):
// a waiter that left early may hear while the write still runs.
func resultOf[O Object](r dispatch.Result[types.UID, *op[O]], callEnded bool) Result[O] {
	out := Result[O]{UID: r.Key, Outcome: r.Outcome}
	if p := r.Call; p != nil { // p.obj is never written once p is queued
		out.Namespace, out.Name = p.obj.GetNamespace(), p.obj.GetName()
	}
	switch r.State {
	case dispatch.StateSucceeded, dispatch.StateSkipped, dispatch.StateFailed:
		callEnded = true
	}
	if p := r.Call; p != nil && callEnded {
		out.Writes = p.writes
		switch r.State {
		case dispatch.StateSucceeded, dispatch.StateSkipped, dispatch.StateFailed:
			out.Object = p.out // it ran to its end
		}
	}
	return out
}

// Ticket is the handle on one desire's outcome (Writer.Submit), as a
// rate.Reservation is on a token. It is safe for concurrent use; its zero
// value is not usable.
type Ticket[O Object] struct {
	t   *dispatch.Ticket[types.UID, *op[O]]
	now Result[O] // if t is nil: decided at Submit
}

// skippedTicket is the ticket of a desire that changes nothing.
func skippedTicket[O Object](p *op[O]) *Ticket[O] {
	return &Ticket[O]{now: Result[O]{UID: p.uid, Namespace: p.obj.GetNamespace(), Name: p.obj.GetName(), Object: p.out, Outcome: dispatch.Outcome{State: dispatch.StateSkipped, Waiters: 1}}}
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel closed once the outcome is known.
func (t *Ticket[O]) Done() <-chan struct{} {
	if t.t == nil {
		return closed
	}
	return t.t.Done()
}

// Wait returns the outcome and its Err once known. If ctx ends first, it
// returns a zero Result and ctx's error, and the desire stays live (Cancel
// leaves).
func (t *Ticket[O]) Wait(ctx context.Context) (Result[O], error) {
	if t.t == nil {
		return t.now, nil
	}
	r, err := t.t.Wait(ctx)
	if r.State == 0 {
		return Result[O]{}, err
	}
	return resultOf(r, false), err
}

// Result returns the outcome and true once Done is closed, else false.
func (t *Ticket[O]) Result() (Result[O], bool) {
	if t.t == nil {
		return t.now, true
	}
	r, ok := t.t.Result()
	if !ok {
		return Result[O]{}, false
	}
	return resultOf(r, false), true
}

// Cancel ends this desire Canceled, unless it has ended. The write goes on
// for other desires merged into it; without any, it is dropped if not yet
// sent, and its request is cancelled if in flight.
func (t *Ticket[O]) Cancel() {
	if t.t != nil {
		t.t.Cancel()
	}
}
