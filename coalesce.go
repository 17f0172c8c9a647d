package dispatch

import (
	"errors"
	"fmt"
)

// This file is coalescing: how a submission joins a call, how a call's
// value absorbs another, and how a pending call is amended.

// join adds a submission to c: the ticket t, or a fire-and-forget one if t
// is nil. It keeps c's effective priority and enqueue time (the highest and
// the earliest of its live waiters) and its place in the ready index.
func (d *Dispatcher[K, T]) join(c *call[K, T], t *Ticket[K, T], prio int, now, deadline int64) {
	first := c.live() == 0
	c.joined++
	if t != nil {
		t.c, t.prio, t.enq = c, prio, now
		d.attach(c, t)
		if deadline == 0 {
			c.nForever++
		}
		d.liveTickets++
		t.state = tsLive
		if deadline != 0 { // then t.x.w.deadline is deadline (newTicket)
			d.q.addDeadline(&t.x.w, deadline)
		}
	} else {
		d.addPosts(c, 1, prio, now, deadline, deadline == 0)
		d.livePosts++
	}
	if first {
		c.prio, c.enq = prio, now
		return
	}
	d.q.rekey(c, max(c.prio, prio), min(c.enq, now))
}

// addPosts folds n fire-and-forget submissions — highest priority prio,
// earliest enqueue enq, latest deadline deadline, forever if any had none —
// into c's posts aggregate, keeping its place in the deadline index.
func (d *Dispatcher[K, T]) addPosts(c *call[K, T], n, prio int, enq, deadline int64, forever bool) {
	p := &c.posts
	if c.nPosts == 0 {
		p.prio, p.enq, p.deadline = prio, enq, deadline
	} else {
		p.prio = max(p.prio, prio)
		p.enq = min(p.enq, enq)
		p.deadline = max(p.deadline, deadline)
	}
	c.nPosts += n
	switch {
	case c.postsForever:
	case forever:
		c.postsForever = true
		d.q.removeDeadline(p)
	case p.at == 0:
		d.q.addDeadline(p, p.deadline)
	}
}

// attach puts ticket t, which is joining c and has not been returned to
// its submitter yet, in c's lists. A call's first ticket waits in c.one; a
// plain ticket rides c's share, which the call makes when shareMin-1
// plain tickets are already waiting to be visited.
func (d *Dispatcher[K, T]) attach(c *call[K, T], t *Ticket[K, T]) {
	if c.one == nil && c.more == nil && (c.share == nil || t.watched()) {
		t.idx = -1
		c.one = t
		return
	}
	tl := d.lists(c)
	if !t.watched() {
		if c.share == nil && tl.plain >= shareMin-1 {
			c.share = new(share[K, T])
		}
		if c.share != nil {
			t.share = c.share // before Submit returns t: see Ticket.share
			tl.addRider(t)
			return
		}
	}
	tl.addVisit(t)
}

// lists returns c's ticket lists, taking them from the free list (or
// making them) for c's second ticket; the first moves there from c.one.
func (d *Dispatcher[K, T]) lists(c *call[K, T]) *ticketLists[K, T] {
	if c.more != nil {
		return c.more
	}
	tl := popFree(&d.freeLists)
	if tl == nil {
		tl = new(ticketLists[K, T])
	}
	c.more = tl
	if t := c.one; t != nil {
		c.one = nil
		tl.addVisit(t)
	}
	return tl
}

// addRider appends t, whose share is set, to the call's riders.
func (tl *ticketLists[K, T]) addRider(t *Ticket[K, T]) {
	t.idx = int32(len(tl.riders))
	tl.riders = append(tl.riders, t)
}

// addVisit appends t to the tickets visited when the call ends.
func (tl *ticketLists[K, T]) addVisit(t *Ticket[K, T]) {
	t.idx = int32(len(tl.visit))
	tl.visit = append(tl.visit, t)
	if !t.watched() {
		tl.plain++
	}
}

// detach takes ticket t off its call without settling it. A rider's
// outcome is then its own, recorded in t.r by settle, under the same lock
// (see Ticket.outcome).
func (d *Dispatcher[K, T]) detach(t *Ticket[K, T]) {
	c := t.c
	switch {
	case t.idx < 0:
		c.one = nil
	case t.share != nil:
		c.more.riders = removeAt(c.more.riders, t.idx)
	default:
		c.more.visit = removeAt(c.more.visit, t.idx)
		if !t.watched() {
			c.more.plain--
		}
	}
	t.c = nil
	if t.deadline() == 0 {
		c.nForever--
	}
	d.liveTickets--
	d.unindex(t)
}

// unindex takes ticket t out of the deadline index, if it is there.
func (d *Dispatcher[K, T]) unindex(t *Ticket[K, T]) {
	if t.x != nil {
		d.q.removeDeadline(&t.x.w)
	}
}

// removeAt removes list[i] by moving the last ticket into its place.
func removeAt[K comparable, T any](list []*Ticket[K, T], i int32) []*Ticket[K, T] {
	last := int32(len(list) - 1)
	if i != last {
		m := list[last]
		list[i], m.idx = m, i
	}
	list[last] = nil
	return list[:last]
}

// eachTicket calls f for every live ticket of c.
func (c *call[K, T]) eachTicket(f func(*Ticket[K, T])) {
	if c.one != nil {
		f(c.one)
	}
	if tl := c.more; tl != nil {
		for _, t := range tl.visit {
			f(t)
		}
		for _, t := range tl.riders {
			f(t)
		}
	}
}

// adopt gives queued call c the tenant and label of a submission that
// raises its priority: a merged call is counted, capped and labelled as
// its most urgent submission — a binding that replaces a pending status
// patch runs as a binding. The caller then joins the submission.
func (d *Dispatcher[K, T]) adopt(c *call[K, T], ten *tenant[K, T], label string) {
	if d.labels != nil && label != c.label {
		d.labels[c.label]--
		if d.labels[c.label] == 0 {
			delete(d.labels, c.label)
		}
		d.labels[label]++
	}
	c.label = label
	if ten == c.ten {
		return
	}
	old, state := c.ten, c.state
	d.q.remove(c) // from the old tenant's indexes
	old.queued--
	c.ten = ten
	ten.queued++
	d.keep(ten)
	switch state {
	case csReady:
		d.q.push(c)
	case csDelayed:
		d.q.delay(c, c.notBefore)
	}
	d.forgetIdle(old)
}

// reprioritize re-derives c's effective priority and enqueue time after a
// waiter left: a call's priority falls again when the waiter that raised it
// goes. It scans the remaining waiters, which is O(waiters of c).
func (d *Dispatcher[K, T]) reprioritize(c *call[K, T]) {
	if c.live() == 0 {
		return
	}
	prio, enq, seen := 0, int64(0), false
	if c.nPosts > 0 {
		prio, enq, seen = c.posts.prio, c.posts.enq, true
	}
	c.eachTicket(func(t *Ticket[K, T]) {
		if !seen {
			prio, enq, seen = t.prio, t.enq, true
			return
		}
		prio = max(prio, t.prio)
		enq = min(enq, t.enq)
	})
	d.q.rekey(c, prio, enq)
}

// coalesce merges an incoming submission's call value into the pending call
// c. On error c is untouched; SkipIncoming means the merge function found
// the incoming call has nothing to add. ReplacePending means c's value is
// now the incoming call's, a new operation: the caller restarts c.
//
// The merge function runs under the lock. If it ends the goroutine
// (runtime.Goexit), onExit runs — with the lock held, on the way out of
// the goroutine — and must finish the caller's work and release the lock:
// the one place where a lock is released other than by the function that
// took it, since the goroutine never returns to that function.
func (d *Dispatcher[K, T]) coalesce(c *call[K, T], val T, idem string, onExit func(*PanicError)) error {
	if idem != "" && c.idem != "" && idem != c.idem {
		return errRejectIdemKey
	}
	var replace error
	if merge := d.cfg.Merge; merge != nil {
		var v T
		_, err := guard(callbackMerge, func() (err error) { v, err = merge(c.val, val); return err }, onExit)
		switch {
		case err == nil:
		case errors.Is(err, SkipIncoming):
			return SkipIncoming
		case errors.Is(err, ReplacePending):
			replace = ReplacePending
		default:
			return fmt.Errorf("%w: %w", ErrMergeRejected, err)
		}
		val = v
	}
	c.val = val
	c.rev++
	if idem != "" { // without one, c.idem is not even read
		c.idem = idem // equal to c.idem, or c.idem was empty
	}
	return replace
}

// restart makes queued call c, whose value was just replaced by another
// operation (ReplacePending), start fresh: no attempts, last error or run
// time carried over, its queue wait measured anew, and a retry's backoff
// dropped. It keeps its place in line (its waiters' enqueue times).
func (d *Dispatcher[K, T]) restart(c *call[K, T]) {
	c.attempts, c.lastErr, c.runTime, c.firstStart = 0, nil, 0, -1
	if c.state == csDelayed {
		d.q.remove(c)
		d.q.push(c)
		d.wakeWorker()
	}
}

// skipIncoming ends an accepted submission at once as Skipped: the merge
// function found that the key's pending call makes it moot. It joins no
// call, so no completion hook fires for it.
func (d *Dispatcher[K, T]) skipIncoming(key K, val T, t *Ticket[K, T], ob *outbox[K, T]) {
	d.totals.coalesced++
	d.totals.outcomes[StateSkipped]++
	if t == nil {
		return
	}
	t.r = &Result[K, T]{Key: key, Call: val, Outcome: Outcome{State: StateSkipped, Waiters: 1}}
	t.state = tsDone
	ob.tickets = append(ob.tickets, t)
}

// absorb moves every waiter of the successor n into c (whose value already
// holds the merge of both) and forgets n, which was never queued. If n is
// the more urgent, c takes its tenant and label, as any merged call does.
func (d *Dispatcher[K, T]) absorb(c, n *call[K, T]) {
	if n.prio > c.prio && (n.ten != c.ten || n.label != c.label) {
		d.adopt(c, n.ten, n.label)
	}
	// n's tickets move to c as they are: a rider keeps its share, which c
	// now tells (chained after c's own), and the rest are visited.
	n.eachTicket(func(t *Ticket[K, T]) {
		t.c = c
		tl := d.lists(c)
		if t.share != nil {
			tl.addRider(t)
			return
		}
		tl.addVisit(t)
	})
	if s := n.share; s != nil {
		p := &c.share
		for *p != nil {
			p = &(*p).next
		}
		*p = s
	}
	c.nForever += n.nForever
	if n.nPosts > 0 {
		d.q.removeDeadline(&n.posts)
		d.addPosts(c, n.nPosts, n.posts.prio, n.posts.enq, n.posts.deadline, n.postsForever)
	}
	c.joined += n.joined
	c.droppable = c.droppable && n.droppable
	d.totals.coalesced += uint64(n.joined)
	d.keepLists(n)
	n.share, n.nForever, n.nPosts = nil, 0, 0
	n.ten.queued--
	d.forgetIdle(n.ten)
	d.untrack(n)
	d.reprioritize(c)
}

// Amend rewrites the pending call of key: the one that has not started —
// queued, waiting out a retry's backoff, or waiting behind the key's
// running call. It answers "what will this key look like once its pending
// write lands?" and lets the caller refresh that write against newer state
// (kube-scheduler's SyncObject does both).
//
// f gets the pending call and returns it rewritten, or an error to leave it
// as it was (Amend then returns that error). f runs under the dispatcher's
// lock, like Config.Merge: it must be fast, and must not block or call the
// Dispatcher; a panic in f leaves the call as it was and is returned as a
// *PanicError. If Config.NoOp then reports that the rewritten call would
// change nothing, the call ends Skipped for every waiter, and the
// completion hook fires — unless a call for key is in flight, which may
// change what the test judged against: the call's own test before it
// starts then decides. The no-op test runs outside the lock; if the call
// changed meanwhile (a submission coalesced into it, or it started), it is
// left to run.
//
// Amend reports whether key had a pending call. A running call is never
// rewritten: it may be taking effect already.
func (d *Dispatcher[K, T]) Amend(key K, f func(pending T) (T, error)) (bool, error) {
	return d.amend(key, false, func(v T, _ bool) (T, error) { return f(v) })
}

// AmendNewest is Amend for key's newest call: the pending one, or, if none
// is pending, the one in flight. f learns whether a call for key is in
// flight. The call in flight is never rewritten — f's result is then
// dropped — but f may read it, and update what the call value keeps for
// itself (an adapter refreshing its view of the object, as upstream's
// SyncObject does). It reports whether key had a call to show f.
func (d *Dispatcher[K, T]) AmendNewest(key K, f func(newest T, inFlight bool) (T, error)) (bool, error) {
	return d.amend(key, true, f)
}

// amend is Amend (newest false) and AmendNewest. It takes the lock itself.
func (d *Dispatcher[K, T]) amend(key K, newest bool, f func(T, bool) (T, error)) (bool, error) {
	d.mu.Lock()
	l := d.lanes.lookup(key)
	if l == nil || l.pending == nil && (!newest || l.running == nil) {
		d.mu.Unlock()
		return false, nil
	}
	unlock := func(*PanicError) { d.mu.Unlock() }
	inFlight := l.running != nil
	c := l.pending
	if c == nil { // the newest call is in flight: shown, never rewritten
		_, err := guard(callbackAmend, func() (err error) { _, err = f(l.running.val, true); return err }, unlock)
		d.mu.Unlock()
		return true, err
	}
	var v T
	_, err := guard(callbackAmend, func() (err error) { v, err = f(c.val, inFlight); return err }, unlock)
	if err != nil {
		d.mu.Unlock()
		return true, err
	}
	c.val = v
	c.rev++
	seq, rev := c.seq, c.rev
	d.mu.Unlock()
	if d.cfg.NoOp == nil || inFlight {
		return true, nil
	}
	var noop bool
	if pe, _ := guard(callbackNoOp, func() error { noop = d.cfg.NoOp(key, v); return nil }, nil); pe != nil || !noop {
		if pe != nil {
			return true, pe
		}
		return true, nil
	}
	var ob outbox[K, T]
	d.mu.Lock()
	if l := d.lanes.lookup(key); l != nil && l.pending != nil && l.pending.seq == seq && l.pending.rev == rev {
		c := l.pending
		now := d.now()
		d.settleAll(c, StateSkipped, nil, now, onTime, &ob)
		d.finish(c, StateSkipped, nil, now, &ob)
	}
	d.mu.Unlock()
	d.deliver(&ob)
	return true, nil
}
