package dispatch

import "fmt"

// This file is admission: whether a submission is accepted, which call it
// joins or makes, and what it displaces. A refused submission leaves the
// dispatcher as it was: every refusal and every victim is decided before
// anything changes.

// admit places a submission, or returns why it cannot. h is key's hash
// (laneTable.hash, taken before the lock). t is nil for a
// fire-and-forget submission. now is the clock reading, or 0 to have admit
// read it only if it needs it. coalesced reports that the submission joined
// (or was skipped by) an existing pending call.
func (d *Dispatcher[K, T]) admit(key K, h uint64, val T, o *SubmitOptions, now, deadline int64, t *Ticket[K, T], ten *tenant[K, T], label string, ob *outbox[K, T]) (coalesced bool, err error) {
	if d.closing {
		return false, ErrClosed
	}
	l := d.lanes.get(key, h)
	now = d.admitTime(l, t, o, now, deadline)
	if l == nil {
		return false, d.admitNewKey(key, h, val, o, now, deadline, t, ten, label, ob)
	}
	if o.Generation < l.gen {
		return false, errRejectStale // before any bound: it would never be accepted
	}
	if t != nil && d.liveTickets >= d.cfg.MaxWaiters {
		return false, d.refuse(BoundWaiters)
	}
	supersede := o.Generation > l.gen
	var quotaVictim *call[K, T]
	if supersede || l.pending == nil {
		// This submission makes a new call for the key: it needs quota.
		freed := 0
		if supersede && l.pending != nil && l.pending.ten == ten {
			freed = 1
		}
		if ten.overQuota(freed) {
			order := d.q.orderOf(o.Priority, now)
			if quotaVictim = worst(ten.shed, order, d.seq+1, l.pending); quotaVictim == nil {
				return false, d.refuse(BoundQuota)
			}
		}
	}
	if supersede {
		l.gen = o.Generation
		d.endLane(l, StateStale, fmt.Errorf("%w: superseded by generation %d", ErrStale, o.Generation), now, withRunning, ob)
		if !l.tracked {
			// The lane held only a queued call, and went with it.
			l = d.newLane(key, h, o.Generation)
		}
	}
	if c := l.pending; c != nil {
		err := d.coalesce(c, val, o.IdempotencyKey, func(*PanicError) {
			// The merge function ended the submitting goroutine: nothing
			// was admitted, but what supersede ended is told.
			d.mu.Unlock()
			if t != nil {
				t.stopWatch()
			}
			d.deliver(ob)
		})
		replaced := false
		switch err {
		case nil:
		case ReplacePending:
			d.restart(c)
			replaced = true
		case SkipIncoming:
			d.skipIncoming(key, val, t, ob)
			return true, nil
		default:
			return false, err
		}
		if !o.Droppable {
			c.droppable = false
			d.q.unshed(c)
		}
		if (replaced || o.Priority > c.prio) && (ten != c.ten || label != c.label) {
			d.adopt(c, ten, label)
		}
		d.join(c, t, o.Priority, now, deadline)
		d.totals.coalesced++
		return true, nil
	}
	if quotaVictim != nil {
		d.shed(quotaVictim, BoundQuota, now, ob)
		d.keep(ten)
	}
	// This call is the running call's successor: it enters the ready index
	// when that one finishes, with the enqueue time it has now.
	c := d.newCall(l, val, o, ten, label)
	d.join(c, t, o.Priority, now, deadline)
	if l.running == nil {
		// A newer generation just removed the key's only call.
		d.q.push(c)
		d.wakeWorkerAsync(ob)
	}
	return false, nil
}

// admitNewKey places a submission for a key without a lane.
func (d *Dispatcher[K, T]) admitNewKey(key K, h uint64, val T, o *SubmitOptions, now, deadline int64, t *Ticket[K, T], ten *tenant[K, T], label string, ob *outbox[K, T]) error {
	if t != nil && d.liveTickets >= d.cfg.MaxWaiters {
		return d.refuse(BoundWaiters)
	}
	order := d.q.orderOf(o.Priority, now)
	var quotaVictim, capVictim *call[K, T]
	if ten.overQuota(0) {
		if quotaVictim = worst(ten.shed, order, d.seq+1, nil); quotaVictim == nil {
			return d.refuse(BoundQuota)
		}
	}
	// A quota victim is alone in its lane, so evicting it frees a key.
	if quotaVictim == nil && d.lanes.Len() >= d.cfg.Capacity {
		if capVictim = worst(d.q.shed, order, d.seq+1, nil); capVictim == nil {
			return d.refuse(BoundCapacity)
		}
	}
	if o.Droppable && d.breaker != nil && d.cfg.Breaker.RefuseDroppable && d.breaker.state == CircuitOpen {
		return ErrCircuitOpen
	}
	if quotaVictim != nil {
		d.shed(quotaVictim, BoundQuota, now, ob)
	}
	if capVictim != nil {
		d.shed(capVictim, BoundCapacity, now, ob)
	}
	if quotaVictim != nil || capVictim != nil {
		d.keep(ten)
	}
	if !d.started {
		d.start()
	}
	l := d.newLane(key, h, o.Generation)
	c := d.newCall(l, val, o, ten, label)
	d.join(c, t, o.Priority, now, deadline)
	d.q.push(c)
	d.wakeWorkerAsync(ob)
	if d.fallback != nil {
		d.wakeFallback(now)
	}
	return nil
}

// wakeWorkerAsync has deliver wake an idle worker for a call that just
// became ready, unless inline (Sync mode) callers run calls now. The wake
// comes after the lock is released, so that the worker it wakes does not
// find the lock still held by the submitter.
func (d *Dispatcher[K, T]) wakeWorkerAsync(ob *outbox[K, T]) {
	if d.mode == ModeAsync && d.idleWorkers > 0 {
		ob.wake = true
	}
}

// admitTime returns the time admit works with: now, if the submitter read
// the clock before the lock; else a reading taken here, or a time that
// stands in for one. A fire-and-forget submission without a deadline that
// coalesces into a call already holding fire-and-forget submissions does
// not need the clock: its enqueue time matters only if it is earlier than
// the aggregate's (which is at or before the clock, and at or after the
// call's), so the aggregate's own enqueue time stands in for it and leaves
// every minimum as it is. That spares the busiest path — a hot key
// re-posted — a clock read. For a fire-and-forget submission without a
// deadline, admitTime also records whether the clock was needed
// (learnClock); one with a deadline reads it before the lock regardless,
// so it says nothing about whether Post's guess pays.
func (d *Dispatcher[K, T]) admitTime(l *lane[K, T], t *Ticket[K, T], o *SubmitOptions, now, deadline int64) int64 {
	if t != nil {
		return now // Submit reads the clock before the lock
	}
	var standIn int64 // 0: the clock is needed (no time on the clock is 0)
	if deadline == 0 && l != nil && o.Generation == l.gen {
		if c := l.pending; c != nil && c.nPosts > 0 {
			standIn = c.posts.enq
		}
	}
	if deadline == 0 {
		d.learnClock(standIn == 0)
	}
	switch {
	case now != 0:
		return now
	case standIn != 0:
		return standIn
	}
	return d.now()
}

// learnClock records whether the admission of a Post without a deadline
// needed the clock, and
// keeps preClock, Post's guess before the lock, to what recent Posts
// needed. clockNeeds rises with each Post that needed the clock and falls
// with each that did not, between 0 and 3; the guess turns on at 3 and off
// at 0. So traffic of new keys turns it on after three Posts, a hot key
// re-posted turns it off after three, and a mix of the two does not flip
// it with every other Post. A wrong guess costs a clock read outside the
// lock (on) or one under it (off), never a wrong time.
func (d *Dispatcher[K, T]) learnClock(needed bool) {
	switch {
	case needed && d.clockNeeds < 3:
		d.clockNeeds++
	case !needed && d.clockNeeds > 0:
		d.clockNeeds--
	}
	switch guess := d.preClock.Load(); {
	case d.clockNeeds == 3 && !guess:
		d.preClock.Store(true)
	case d.clockNeeds == 0 && guess:
		d.preClock.Store(false)
	}
}

// refuse counts and returns a backpressure refusal.
func (d *Dispatcher[K, T]) refuse(b Bound) error {
	d.totals.refused[b.index()]++
	return &BackpressureError{Bound: b, Depth: d.lanes.Len()}
}

// newCall makes the pending call of l.
func (d *Dispatcher[K, T]) newCall(l *lane[K, T], val T, o *SubmitOptions, ten *tenant[K, T], label string) *call[K, T] {
	c := l.newCall()
	d.liveCalls++
	c.label = label
	if d.labels != nil {
		d.labels[label]++
	}
	d.seq++
	ten.queued++
	c.ten = ten
	c.val, c.gen, c.seq, c.idem, c.droppable = val, o.Generation, d.seq, o.IdempotencyKey, o.Droppable
	l.pending = c
	return c
}

// count records a submission's admission or refusal.
func (d *Dispatcher[K, T]) count(ten *tenant[K, T], err error) {
	d.totals.submitted++
	if err != nil {
		d.totals.rejected++
		ten.st.Rejected++
		d.forgetIdle(ten)
		return
	}
	ten.st.Admitted++
}
