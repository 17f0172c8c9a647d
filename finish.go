package dispatch

// This file is how waiters and calls end. Three verbs end things:
//
//   - settle (waiters.go): one waiter — a ticket, or the aggregate of a
//     call's posts — gets its outcome and leaves its call.
//   - finish: a call whose waiters are gone ends: it leaves the lane and
//     the indexes, is counted and reported to the completion hook and the
//     observer, and its successor becomes ready.
//   - release (lanes.go): a lane with no call left is forgotten, and kept
//     for reuse.
//
// What they tell (tickets, hooks, observer events) goes into an outbox,
// delivered once the lock is released (deliver.go).

import (
	"errors"
	"slices"

	"github.com/coalescer/dispatch/internal/due"
)

// leave ends ticket t alone with st: it was cancelled (Ticket.Cancel), and
// what that ends is told on the caller's goroutine. If t was its call's
// last waiter, the call finishes.
func (d *Dispatcher[K, T]) leave(t *Ticket[K, T], st State, err error) {
	var ob outbox[K, T]
	d.mu.Lock()
	d.leaveLocked(t, st, err, &ob)
	d.mu.Unlock()
	d.tell.deliver(&ob)
}

// leaveLocked is leave under the lock.
func (d *Dispatcher[K, T]) leaveLocked(t *Ticket[K, T], st State, err error, ob *outbox[K, T]) {
	switch {
	case t.state == tsNew: // Submit has not admitted it yet; it will see this and refuse
		t.state = tsDone
	case !t.ended():
		d.dismiss(t, st, err, d.clk.now(), ob)
	}
}

// leaveAside is leave for a goroutine that must run no user code (a
// Submit context's AfterFunc, which Close cannot wait for): it takes the
// lock, tells the tickets, and hands the hooks and observer events to the
// notifier (handOverUnlock).
func (d *Dispatcher[K, T]) leaveAside(t *Ticket[K, T], st State, err error) {
	var ob outbox[K, T]
	d.mu.Lock()
	d.leaveLocked(t, st, err, &ob)
	d.handOverUnlock(&ob)
}

// dismiss is leave under the lock, at now.
func (d *Dispatcher[K, T]) dismiss(t *Ticket[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	c := t.c
	d.waiters.settle(t, c, st, err, now, ob)
	if !c.waited() {
		d.finish(c, st, err, now, ob)
		return
	}
	d.q.reprioritize(c)
}

// finish ends call c, which has no waiter left, with st. A call still
// running is only orphaned: its context is cancelled with err, and it
// finishes when its attempt ends (endAttempt), since its execution may be
// taking effect. Any other call leaves its index and its lane, is counted
// and reported, and lets its successor run; the lane is released if that
// leaves it empty.
func (d *Dispatcher[K, T]) finish(c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	switch c.state {
	case csRunning:
		if !c.orphaned() {
			c.endState = st
			c.exec.ctx.Cancel(err, errors.Is(err, ErrExpired))
		}
		return
	case csEnded: // its attempt has already left the tenant's counts
	default:
		d.q.remove(c)
		c.tag.ten.queued--
	}
	c.enter(csFinished)
	// Its ticket lists, if its tickets left one by one, are empty: keep
	// them for reuse, as settleAll does.
	d.waiters.lists.keep(c)
	d.report(c, st, err, now, ob)
	d.tenants.forgetIdle(c.tag.ten)
	l := c.lane
	if l.pending == c {
		l.pending = nil
	} else {
		l.running = nil
		if n := l.pending; n != nil && n.state == csBehind {
			// Its successor is ready now, with the enqueue time it had
			// when it arrived.
			d.q.push(n)
			d.wake.worker()
		}
	}
	if released, sparse := d.lanes.release(l, now); released {
		if sparse {
			d.due.Set(due.Shrink, now+shrinkAfter)
		}
		d.drain.left(d.lanes.Len())
	}
	d.wake.kick()
}

// report counts a finished call and queues its completion hook and
// observer event.
func (d *Dispatcher[K, T]) report(c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	d.calls.remove(c.tag)
	d.handover.ended(c.seq)
	d.totals.calls[st]++
	if d.fallback != nil {
		d.fallback.Finished(now, st == StateFailed)
	}
	if d.cfg.OnDone == nil && d.cfg.Observer == nil {
		return
	}
	r := c.result(st, err, now)
	if d.cfg.OnDone != nil {
		ob.hooks = append(ob.hooks, r)
	}
	if d.cfg.Observer != nil {
		ob.notes = append(ob.notes, note{kind: noteFinish, e: c.event(), o: r.Outcome})
	}
}

// scope says which calls of a lane endLane ends.
type scope uint8

const (
	queuedOnly  scope = iota // the pending call; a running one goes on
	withRunning              // the running call too: its context is cancelled
)

// endLane settles every waiter of l's calls in sc with st and finishes the
// calls. It reports whether it ended any.
func (d *Dispatcher[K, T]) endLane(l *lane[K, T], st State, err error, now int64, sc scope, ob *outbox[K, T]) bool {
	ended := false
	for _, c := range [2]*call[K, T]{l.pending, l.running} {
		if c != nil && !c.orphaned() && (sc == withRunning || c.state != csRunning) {
			ended = true
			d.waiters.settleAll(c, st, err, now, onTime, ob)
			d.finish(c, st, err, now, ob)
		}
	}
	return ended
}

// shed drops queued call c to make room under bound b: every waiter gets
// Dropped.
func (d *Dispatcher[K, T]) shed(c *call[K, T], b Bound, now int64, ob *outbox[K, T]) {
	err := errDroppedCapacity
	if b == BoundQuota {
		err = errDroppedQuota
	}
	d.totals.shed[b.index()]++
	c.tag.ten.st.Dropped++
	if d.cfg.Observer != nil {
		ob.notes = append(ob.notes, note{kind: noteDrop, e: c.event(), b: b})
	}
	d.waiters.settleAll(c, StateDropped, err, now, onTime, ob)
	d.finish(c, StateDropped, err, now, ob)
}

// conclude tells c's waiters the outcome st and finishes c. A waiter whose
// deadline passed meanwhile gets Expired instead; if every waiter did, an
// execution that ran is reported Stale. An orphaned call has no waiter
// left (st is how they left: c.endState): it finishes with st, or Stale if
// exec ran.
func (d *Dispatcher[K, T]) conclude(c *call[K, T], a *attempt[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	switch {
	case !c.orphaned() && d.waiters.settleAll(c, st, err, now, expireLate, ob):
	case a.ran:
		d.totals.staleExecutions++
		st, err = StateStale, staleErr(StateStale, err)
	case c.orphaned():
		err = staleErr(st, err)
	default:
		st, err = StateExpired, ErrExpired
	}
	d.finish(c, st, err, now, ob)
}

// drain is Close's drain: whether admission has stopped, the channel that
// tells Close that nothing is left to run, and the outcomes on their way to
// the notifier. Guarded by the Dispatcher's lock.
type drain struct {
	closing bool          // admission has stopped
	done    chan struct{} // closed when closing finds nothing left to run
	told    bool          // done is closed
	// handing counts the goroutines between ending calls and handing
	// their hooks and observer events to the notifier (handOverUnlock).
	// Close waits for them: they may be goroutines it does not own.
	handing int
}

// begin stops admission; keys is how many are tracked.
func (dr *drain) begin(keys int) {
	if !dr.closing {
		dr.closing = true
		dr.left(keys)
	}
}

// left tells Close, once closing, that nothing is left when keys is 0.
func (dr *drain) left(keys int) {
	if dr.closing && keys == 0 && !dr.told {
		dr.told = true
		close(dr.done)
	}
}

// handovers (SetMode, mode.go) are what the switches to Sync mode that a
// SetMode still waits for left to the workers: for each, the calls that
// arrived before it, whose arrival numbers (call.seq) are at most upTo,
// and how many of them have not ended. Each SetMode's drain waits for its
// own calls alone, and cancels only those: every call made after its
// switch is a Sync-mode caller's, which the caller runs or waits for
// itself, or a later switch's, which that switch's drain waits for.
type handovers struct {
	waits []*handover // one per SetMode waiting for its drain
}

// handover is one switch's share of handovers.
type handover struct {
	upTo uint64
	left int
}

// ended counts the end of a call that arrived as seq. With no SetMode
// waiting (the usual case) it is one length check.
func (h *handovers) ended(seq uint64) {
	for _, w := range h.waits {
		if seq <= w.upTo {
			w.left--
		}
	}
}

// await registers a drain of the calls that arrived up to upTo, live
// of them (every live call, at a switch), for one SetMode to wait for.
func (h *handovers) await(upTo uint64, live int) *handover {
	w := &handover{upTo: upTo, left: live}
	h.waits = append(h.waits, w)
	return w
}

// done forgets w, whose SetMode no longer waits.
func (h *handovers) done(w *handover) {
	h.waits = slices.DeleteFunc(h.waits, func(x *handover) bool { return x == w })
}
