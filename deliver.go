package dispatch

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// This file is telling — outcomes reach waiters, the completion hook and
// the observer outside every lock, after the dispatcher's own bookkeeping is
// final — and the containment of user code: whatever a callback does (see
// the package documentation), the dispatcher finishes its own work first.

// ticketState is a Ticket's lifecycle, guarded by the Dispatcher's lock.
type ticketState uint8

const (
	tsNew  ticketState = iota // created, not yet admitted
	tsLive                    // waiting on a call, or ended through its share (Ticket.ended)
	tsDone                    // outcome recorded (or never admitted)
)

// outbox collects what must be told once the lock is released: tickets to
// close, completion-hook results and observer events. Telling consumes it
// front to back (nh and nn count what is told), so that a callback that
// ends its goroutine leaves the rest to be told by the goroutine's exit
// path.
type outbox[K comparable, T any] struct {
	tickets []*Ticket[K, T]
	shares  []*share[K, T] // outcomes recorded for their riders, to tell
	hooks   []Result[K, T]
	notes   notes
	nh, nn  int
	wake    bool // an idle worker is to be woken, once the lock is released
	// spare is a Result made outside the lock (stock) for the next ticket
	// outcome recorded under it (newResult), so that a worker ending a
	// call with tickets does not allocate while holding the lock.
	spare *Result[K, T]
}

// stock makes ob's spare Result if it has none. A worker calls it before
// it takes the lock to end an attempt; once made, a spare waits for a call
// with tickets, so that Post traffic allocates nothing.
func (ob *outbox[K, T]) stock() {
	if ob.spare == nil {
		ob.spare = new(Result[K, T])
	}
}

// newResult returns a heap copy of res, in ob's spare if it has one.
func (ob *outbox[K, T]) newResult(res Result[K, T]) *Result[K, T] {
	r := ob.spare
	if r != nil {
		ob.spare = nil
	} else {
		r = new(Result[K, T])
	}
	*r = res
	return r
}

// notes are observer events to tell once the lock is released.
type notes []note

// note is one observer event. The events of every call (its end) and the
// frequent ones (a retry, a drop, a submission run inline) are values, so
// that an observer costs no allocation per call; the rare ones (a change of
// mode, circuit or limit) are a closure.
type note struct {
	kind      noteKind
	coalesced bool // noteSubmit
	b         Bound
	e         Event
	o         Outcome       // noteFinish
	n         int           // noteRetry: the attempt that failed
	delay     time.Duration // noteRetry
	err       error         // noteRetry
	f         func()        // noteFunc
}

type noteKind uint8

const (
	noteFunc noteKind = iota
	noteFinish
	noteRetry
	noteDrop
	noteSubmit
	noteCoalesce
)

// add queues the observer event f.
func (ns *notes) add(f func()) { *ns = append(*ns, note{kind: noteFunc, f: f}) }

// tell tells obs of the event.
func (n *note) tell(obs Observer) {
	switch n.kind {
	case noteFinish:
		obs.OnFinish(n.e, n.o)
	case noteRetry:
		obs.OnRetry(n.e, n.n, n.delay, n.err)
	case noteDrop:
		obs.OnDrop(n.e, n.b)
	case noteSubmit:
		obs.OnSubmit(n.e, n.coalesced)
	case noteCoalesce:
		obs.OnCoalesce(n.e)
	default:
		n.f()
	}
}

// empty reports whether ob has nothing to tell.
func (ob *outbox[K, T]) empty() bool {
	return len(ob.tickets) == 0 && len(ob.shares) == 0 && len(ob.hooks) == 0 && len(ob.notes) == 0
}

// teller tells what outboxes hold, outside every lock, and counts the
// panics of the callbacks it contains. It needs no lock.
type teller[K comparable, T any] struct {
	onDone    func(Result[K, T]) // Config.OnDone
	obs       Observer           // Config.Observer
	workers   *sync.Cond         // where idle workers wait (wakes.cond)
	panics    atomic.Uint64      // contained panics of hooks, observers and labels
	lastPanic atomic.Pointer[PanicError]
}

// deliver wakes a worker if ob says so, and tells everything in ob, in
// order: tickets (tellWaiters), then hooks, then observer events; a panic
// in a hook or an observer method is contained and counted. It must be
// called without the lock, and leaves ob empty for reuse.
func (tl *teller[K, T]) deliver(ob *outbox[K, T]) {
	tl.tellWaiters(ob)
	// If a callback ends this goroutine, tell the rest on its way out.
	rest := func(pe *PanicError) {
		tl.contain(pe)
		tl.deliver(ob)
	}
	for ob.nh < len(ob.hooks) {
		r := ob.hooks[ob.nh]
		ob.hooks[ob.nh] = Result[K, T]{}
		ob.nh++
		pe, _ := guard(callbackOnDone, func() error { tl.onDone(r); return nil }, rest)
		tl.contain(pe)
	}
	ob.hooks, ob.nh = ob.hooks[:0], 0
	for ob.nn < len(ob.notes) {
		n := ob.notes[ob.nn]
		ob.notes[ob.nn] = note{}
		ob.nn++
		pe, _ := guard(callbackObserver, func() error { n.tell(tl.obs); return nil }, rest)
		tl.contain(pe)
	}
	ob.notes, ob.nn = ob.notes[:0], 0
}

// tellWaiters wakes a worker if ob says so and tells ob's tickets and
// shares, leaving the hooks and observer events. It runs no user code, but
// for the function that unregisters a ticket's watch from a Submit context
// with an AfterFunc method of its own (see context.AfterFunc). It must be
// called without the lock.
func (tl *teller[K, T]) tellWaiters(ob *outbox[K, T]) {
	if ob.wake {
		ob.wake = false
		tl.workers.Signal()
	}
	for i, t := range ob.tickets {
		t.stopWatch()
		t.tell()
		ob.tickets[i] = nil
	}
	ob.tickets = ob.tickets[:0]
	for i, s := range ob.shares {
		s.tellAll()
		ob.shares[i] = nil
	}
	ob.shares = ob.shares[:0]
}

// guard runs f, user code of kind cb, and returns f's error. A panic in f
// is recovered and returned as panicked (err is then panicked too; the
// order of the results puts panicked first, as the more urgent of the two).
// runtime.Goexit in f cannot be stopped: onExit, if set, runs first with a
// *PanicError of Value ErrGoexit, to finish the work f interrupted, and then
// the goroutine ends. guard needs no lock; if the caller holds one across f,
// onExit must release it.
func guard(cb string, f func() error, onExit func(*PanicError)) (panicked *PanicError, err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			panicked = &PanicError{Callback: cb, Value: r, Stack: debug.Stack()}
			err = panicked
			return
		}
		if onExit != nil {
			onExit(&PanicError{Callback: cb, Value: ErrGoexit, Stack: debug.Stack()})
		}
	}()
	err = f()
	returned = true
	return nil, err
}

// crash ends the process on a panic in the dispatcher's own code — never
// user code, which guard contains — on one of its goroutines or during an
// execution. The lock may be held and the state half changed: a deferred
// handler that took the lock would deadlock, and a caller that recovered
// would leave every other goroutine hanging on it, silently. So the panic
// is raised again on a new goroutine, where no recover can stop it, with
// the stack of the original.
func crash(r any) {
	msg := fmt.Sprintf("dispatch: internal panic, the process cannot go on safely: %v\n\n%s", r, debug.Stack())
	go panic(msg)
	select {}
}

// testHookUnderLock, if set, runs under the lock as an attempt ends: tests
// use it to panic where only a bug in the dispatcher could.
var testHookUnderLock func()

// contain counts a contained panic of a callback whose failure has nowhere
// else to go (a hook, an observer method, a label): Stats reports it. It
// needs no lock.
func (tl *teller[K, T]) contain(pe *PanicError) {
	if pe != nil {
		tl.panics.Add(1)
		tl.lastPanic.Store(pe)
	}
}

// observe runs one observer method outside the lock, contained. If it
// ends the goroutine, it is counted on the way out; the caller's own
// deferred work finishes what it interrupted.
func (tl *teller[K, T]) observe(f func()) {
	pe, _ := guard(callbackObserver, func() error { f(); return nil }, tl.contain)
	tl.contain(pe)
}

// submitted tells the observer of an accepted or refused submission.
func (tl *teller[K, T]) submitted(label string, o *SubmitOptions, coalesced bool, err error) {
	obs := tl.obs
	if obs == nil {
		return
	}
	e := Event{Label: label, Tenant: o.Tenant}
	if err != nil {
		tl.observe(func() { obs.OnReject(e, err) })
		return
	}
	tl.observe(func() { obs.OnSubmit(e, coalesced) })
}

// handOverUnlock ends a critical section of a goroutine that must run no
// user code, and releases the lock: the clock, which a slow callback would
// make late, or the goroutine context.AfterFunc starts for a Submit
// context, which Close cannot wait for. It tells ob's waiters itself, and
// only then hands ob's hooks and observer events to the notifier, since a
// hook must find its call's waiters told (Config.OnDone). Until they are
// handed over, drain.handing holds Close, which tells whatever reaches the
// notifier after it has exited.
func (d *Dispatcher[K, T]) handOverUnlock(ob *outbox[K, T]) {
	switch {
	case len(ob.hooks) == 0 && len(ob.notes) == 0:
		d.mu.Unlock()
	case len(ob.tickets) == 0 && len(ob.shares) == 0:
		ob.handOff(&d.notify)
		d.notifyCond.Signal()
		d.mu.Unlock()
	default:
		d.drain.handing++
		d.mu.Unlock()
		defer d.handOff(ob) // even if a context's stop function ends the goroutine
	}
	d.tell.tellWaiters(ob)
}

// handOff hands ob's hooks and observer events, whose waiters
// handOverUnlock has told, to the notifier. It takes the lock itself.
func (d *Dispatcher[K, T]) handOff(ob *outbox[K, T]) {
	d.mu.Lock()
	ob.handOff(&d.notify)
	d.notifyCond.Signal()
	if d.drain.handed() {
		d.wake.kick() // Close waits for it
	}
	d.mu.Unlock()
}

// handOff moves ob's hooks and observer events to to, the notifier's
// outbox, leaving ob's tickets to the caller.
func (ob *outbox[K, T]) handOff(to *outbox[K, T]) {
	to.hooks = append(to.hooks, ob.hooks...)
	to.notes = append(to.notes, ob.notes...)
	clear(ob.hooks)
	clear(ob.notes)
	ob.hooks, ob.notes = ob.hooks[:0], ob.notes[:0]
}

// handed records that one handOverUnlock has handed over what it held,
// and reports whether Close is to be told that none is left.
func (dr *drain) handed() bool {
	dr.handing--
	return dr.handing == 0 && dr.closing
}
