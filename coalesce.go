package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// This file holds the per-key state: a slot per tracked key, at most two
// calls per slot (one in flight, one pending), and the waiters each call
// serves. All of it is guarded by the Dispatcher's lock.

// callState says which index, if any, holds a call.
type callState uint8

const (
	csIdle    callState = iota // in no index: a successor waiting for its key's in-flight call, or just popped
	csReady                    // in the ready index
	csDelayed                  // in the delay index
	csRunning                  // in flight
)

// slot is the lane of one key. run is the call in flight (nil if none);
// next is the pending call (nil if none): ready, delayed, or idle as the
// successor of run. The first call lives inside the slot, so tracking a new
// key costs at most one allocation (none when a released slot is reused);
// a slot is released when both are nil.
type slot[K comparable, T any] struct {
	key   K
	gen   uint64 // newest generation seen for the key
	run   *call[K, T]
	next  *call[K, T]
	first call[K, T]
}

// newCall returns a zeroed call: the slot's own cell if it is free (neither
// run nor next), else a new one — only a successor behind an in-flight call
// needs that second allocation.
func (s *slot[K, T]) newCall() *call[K, T] {
	c := &s.first
	if c == s.run || c == s.next {
		c = new(call[K, T])
	}
	*c = call[K, T]{s: s, firstStart: -1}
	c.ff.c = c
	return c
}

// call is one logical operation on a key: the merge of every submission
// that coalesced into it. The fields a coalescing Post touches come first,
// so that it reads as few cache lines as possible.
type call[K comparable, T any] struct {
	s     *slot[K, T]
	val   T
	state callState
	// droppable is set while every submission in the call was droppable.
	droppable bool
	inShed    bool // in the queue's shed index
	// ffForever is set when a fire-and-forget submission had no deadline:
	// the ff waiter then never expires.
	ffForever bool
	// orphan is set when an in-flight call loses its last waiter; its
	// execution's result is then reported as Stale, never as success.
	orphan   bool
	probe    bool         // admitted by a half-open breaker
	endState State        // why it was orphaned
	prio     int          // effective priority: max over live waiters
	enq      int64        // effective enqueue time: min over live waiters
	nt       int          // tickets in the list
	nff      int          // fire-and-forget submissions
	joined   int          // submissions served, for Result.Waiters
	ff       waiter[K, T] // all fire-and-forget submissions, as one waiter

	gen       uint64
	idem      string
	seq       uint64 // arrival order: FIFO among equals
	rev       uint64 // bumped by every merge and Amend, so Amend can tell the value changed
	ten       *tenant[K, T]
	label     string // Config.Label's label, for the observer and Stats.Labels
	k1        int64  // ready-index sort key (see queue.sortKey)
	k2        int64
	notBefore int64         // delay-index key
	head      *waiter[K, T] // tickets, a doubly linked list

	attempts   int
	firstStart int64 // -1 until the first execution
	runTime    time.Duration
	cancel     context.CancelCauseFunc
	lastErr    error // set while the call waits to be retried
}

func (c *call[K, T]) live() int { return c.nt + c.nff }

// waiter is one Ticket, or the aggregate of a call's fire-and-forget
// submissions (t == nil).
type waiter[K comparable, T any] struct {
	prio     int
	enq      int64
	deadline int64 // 0: none
	// at is the waiter's key in the deadline index (0: not indexed). For a
	// ticket it equals deadline. For the fire-and-forget aggregate it may lag
	// behind a deadline that later submissions extended; the clock then
	// re-indexes instead of expiring, which keeps a coalescing Post free of
	// index work.
	at         int64
	dseq       uint64
	c          *call[K, T]
	t          *Ticket[K, T]
	prev, next *waiter[K, T]
}

// join adds a submission to c: the ticket t, or a fire-and-forget one if t
// is nil. It keeps c's effective priority and enqueue time (the highest and
// the earliest of its live waiters) and its place in the ready index.
func (d *Dispatcher[K, T]) join(c *call[K, T], t *Ticket[K, T], prio int, now, deadline int64) {
	first := c.live() == 0
	c.joined++
	if t != nil {
		w := &t.w
		w.c, w.prio, w.enq, w.deadline = c, prio, now, deadline
		w.prev, w.next = nil, c.head
		if c.head != nil {
			c.head.prev = w
		}
		c.head = w
		c.nt++
		d.tickets++
		t.state = tsLive
		if deadline != 0 {
			d.q.addDeadline(w, deadline)
			d.armTimer(deadline)
		}
	} else {
		d.addFF(c, 1, prio, now, deadline, deadline == 0)
		d.liveFF++
	}
	if first {
		c.prio, c.enq = prio, now
		return
	}
	d.q.rekey(c, max(c.prio, prio), min(c.enq, now))
}

// addFF folds n fire-and-forget submissions — highest priority prio,
// earliest enqueue enq, latest deadline deadline, forever if any had none —
// into c's aggregate waiter, keeping its place in the deadline index.
func (d *Dispatcher[K, T]) addFF(c *call[K, T], n, prio int, enq, deadline int64, forever bool) {
	ff := &c.ff
	if c.nff == 0 {
		ff.prio, ff.enq, ff.deadline = prio, enq, deadline
	} else {
		ff.prio = max(ff.prio, prio)
		ff.enq = min(ff.enq, enq)
		ff.deadline = max(ff.deadline, deadline)
	}
	c.nff += n
	switch {
	case c.ffForever:
	case forever:
		c.ffForever = true
		d.q.removeDeadline(ff)
	case ff.at == 0:
		d.q.addDeadline(ff, ff.deadline)
		d.armTimer(ff.deadline)
	}
}

// detach removes ticket t from its call without settling it. The caller
// re-derives the call's priority (reprioritize) if the call goes on.
func (d *Dispatcher[K, T]) detach(t *Ticket[K, T]) {
	w := &t.w
	c := w.c
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		c.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	}
	w.prev, w.next, w.c = nil, nil, nil
	c.nt--
	d.tickets--
	d.q.removeDeadline(w)
}

// reprioritize re-derives c's effective priority and enqueue time after a
// waiter left: a call's priority falls again when the waiter that raised it
// goes. It scans the remaining waiters, which is O(waiters of c).
func (d *Dispatcher[K, T]) reprioritize(c *call[K, T]) {
	if c.live() == 0 {
		return
	}
	prio, enq, seen := 0, int64(0), false
	if c.nff > 0 {
		prio, enq, seen = c.ff.prio, c.ff.enq, true
	}
	for w := c.head; w != nil; w = w.next {
		if !seen {
			prio, enq, seen = w.prio, w.enq, true
			continue
		}
		prio = max(prio, w.prio)
		enq = min(enq, w.enq)
	}
	d.q.rekey(c, prio, enq)
}

// coalesce merges an incoming submission's call value into the pending call
// c. On error c is untouched; SkipIncoming means the merge function found
// the incoming call has nothing to add.
func (d *Dispatcher[K, T]) coalesce(c *call[K, T], val T, idem string) error {
	if idem != "" && c.idem != "" && idem != c.idem {
		return errRejectIdemKey
	}
	if d.cfg.Merge != nil {
		v, err := d.safeMerge(c.val, val)
		if err != nil {
			if errors.Is(err, SkipIncoming) {
				return SkipIncoming
			}
			return fmt.Errorf("%w: %w", ErrMergeRejected, err)
		}
		val = v
	}
	c.val = val
	c.rev++
	if idem != "" { // without one, c.idem is not even read
		c.idem = idem // equal to c.idem, or c.idem was empty
	}
	return nil
}

// safeMerge runs the user's merge function, turning a panic into an error
// so that it cannot leave the dispatcher's lock held.
func (d *Dispatcher[K, T]) safeMerge(pending, incoming T) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("merge panicked: %v", r)
		}
	}()
	return d.cfg.Merge(pending, incoming)
}

// Amend rewrites the pending call of key: the one that has not started —
// queued, waiting out a retry's backoff, or waiting behind the key's
// in-flight call. It answers "what will this key look like once its pending
// write lands?" and lets the caller refresh that write against newer state
// (kube-scheduler's SyncObject does both).
//
// f gets the pending call and returns it rewritten, or an error to leave it
// as it was (Amend then returns that error). f runs under the dispatcher's
// lock, like Config.Merge: it must be fast, and must not block or call the
// Dispatcher; a panic in f leaves the call as it was and is returned as a
// *PanicError. If Config.NoOp then reports that the rewritten call would
// change nothing, the call ends Skipped for every waiter, and the
// completion hook fires. The no-op test runs outside the lock; if the call
// changed meanwhile (a submission coalesced into it, or it started), it is
// left to run.
//
// Amend reports whether key had a pending call. An in-flight call is never
// rewritten: it may be taking effect already.
func (d *Dispatcher[K, T]) Amend(key K, f func(pending T) (T, error)) (bool, error) {
	d.mu.Lock()
	s := d.slots[key]
	if s == nil || s.next == nil || s.next.state == csRunning {
		d.mu.Unlock()
		return false, nil
	}
	c := s.next
	v, err := d.safeAmend(f, c.val)
	if err != nil {
		d.mu.Unlock()
		return true, err
	}
	c.val = v
	c.rev++
	seq, rev := c.seq, c.rev
	d.mu.Unlock()
	if d.cfg.NoOp == nil {
		return true, nil
	}
	var noop bool
	if err := safeCall(func() error { noop = d.cfg.NoOp(key, v); return nil }); err != nil || !noop {
		return true, err
	}
	var ob outbox[K, T]
	d.mu.Lock()
	if s := d.slots[key]; s != nil && s.next != nil && s.next.seq == seq && s.next.rev == rev && s.next.state != csRunning && s.next.live() > 0 {
		c := s.next
		now := d.now()
		d.settleAll(c, Skipped, nil, now, false, &ob)
		d.endCall(c, Skipped, nil, now, &ob)
		d.releaseSlot(c.s)
	}
	d.mu.Unlock()
	d.deliver(&ob)
	return true, nil
}

// safeAmend runs Amend's f, turning a panic into a *PanicError so that it
// cannot leave the dispatcher's lock held.
func (d *Dispatcher[K, T]) safeAmend(f func(T) (T, error), pending T) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return f(pending)
}
