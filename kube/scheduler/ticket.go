package scheduler

import (
	"context"
	"runtime/debug"

	"github.com/coalescer/dispatch"
)

// Result is how one Add ended.
type Result struct {
	// Err is what the call's OnFinish channel is sent: nil on success, an
	// error matching fwk.ErrCallSkipped or fwk.ErrCallOverwritten when the
	// call was not run for those reasons, the error its last Execute
	// returned, unchanged, when it failed, or an error matching one of
	// dispatch's sentinels (ErrExpired, ErrBackpressure, ErrClosed, …) when
	// the dispatcher ended or refused it. A call whose execution returned
	// after its deadline passed or Close ended it gets what that Execute
	// returned — nil if it took effect — as upstream's dispatcher sends
	// it; its Outcome's State is then dispatch.StateStale.
	Err error
	// Outcome is the dispatcher's account of the call this Add ran as:
	// its terminal state, attempts, queue wait and run time. A call that
	// never reached a worker's queue has at most its State: Skipped for
	// one skipped at Add, and none (the zero Outcome) for one refused, or
	// overwritten by a later call (whose outcome it then is not).
	Outcome dispatch.Outcome
}

// Ticket is the caller's handle on one Submit: the lossless form of
// OnFinish. Its outcome is recorded once and kept, so it can be read at
// any time, however late. It is safe for concurrent use.
type Ticket struct {
	done chan struct{}
	res  Result
}

// Done returns a channel that is closed when the outcome is known.
func (t *Ticket) Done() <-chan struct{} { return t.done }

// Wait returns the outcome once it is known, or ctx's error if ctx ends
// first (the call goes on).
func (t *Ticket) Wait(ctx context.Context) (Result, error) {
	select {
	case <-t.done:
		return t.res, nil
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// Result returns the outcome and true once it is known, and false before.
func (t *Ticket) Result() (Result, bool) {
	select {
	case <-t.done:
		return t.res, true
	default:
		return Result{}, false
	}
}

// tell delivers e's outcome, once: to its ticket, kept, and to its OnFinish
// channel with upstream's non-blocking send. It reports whether this was
// the first telling. A send that panics (on a channel its caller closed) is
// recovered and reported as an internal error, as a panic in Execute is, so
// that the calls told after e, in the same step, are told too; and it is
// counted with the core's callback panics (Stats).
func (d *Dispatcher) tell(e *entry, err error, o dispatch.Outcome) bool {
	if admission(e.seen.Or(uint32(aTold)))&aTold != 0 {
		return false
	}
	if t := e.ticket; t != nil {
		t.res = Result{Err: err, Outcome: o}
		close(t.done)
	}
	if e.onFinish != nil {
		defer func() {
			if v := recover(); v != nil {
				pe := &dispatch.PanicError{Callback: "on_finish", Value: v, Stack: debug.Stack()}
				d.panics.add(d.core, pe)
				logErr(d.log(), pe, "Sending an API call's result on its OnFinish channel panicked", "callType", e.typ, "uid", e.call.UID())
			}
		}()
		select {
		case e.onFinish <- err:
		default:
		}
	}
	return true
}
