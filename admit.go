package dispatch

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/due"
)

// This file is admission: whether a submission is accepted, which call it
// joins or makes, and what it displaces. A refused submission leaves the
// dispatcher as it was: every refusal and every victim is decided before
// anything changes.

// submission is one Submit or Post on its way in: what admission needs,
// gathered before the lock.
type submission[K comparable, T any] struct {
	key      K
	h        uint64 // key's hash (laneTable.hash)
	val      T
	o        SubmitOptions
	now      int64 // the clock reading, or 0: admit reads it only if it needs it
	deadline int64
	t        *Ticket[K, T] // nil for a fire-and-forget submission
	ten      *tenant[K, T]
	label    string
}

// admit places submission s, whose key's lane is l (nil if it has none),
// or returns why it cannot. coalesced reports that s joined (or was
// skipped by) an existing pending call.
func (d *Dispatcher[K, T]) admit(l *lane[K, T], s *submission[K, T], ob *outbox[K, T]) (coalesced bool, err error) {
	if d.drain.closing {
		return false, ErrClosed
	}
	s.now = d.admitTime(l, s.t, &s.o, s.now, s.deadline)
	if l == nil {
		return false, d.admitNewKey(s, ob)
	}
	if s.o.Generation < l.gen {
		return false, errRejectStale // before any bound: it would never be accepted
	}
	supersede := s.o.Generation > l.gen
	if skip, err := d.follow(l, s, supersede, ob); err != nil || skip {
		if skip {
			d.totals.coalesced++
			d.waiters.skip(s.key, s.val, s.t, ob)
		}
		return skip, err
	}
	// A ticket Follow, Merge or Moot skips is never live: the bound is
	// asked once none did (a merge's, in admitInto, after the merge). A
	// supersede ends the lane's tickets first: their places are s's too.
	if d.waitersFull(s) && (supersede && d.waiters.tickets-endedTickets(l) >= d.cfg.MaxWaiters || !supersede && l.pending == nil) {
		return false, d.totals.refuse(BoundWaiters, d.lanes.Len())
	}
	quotaVictim, err := d.quotaForCall(l, s, supersede)
	if err != nil {
		return false, err
	}
	if supersede {
		l = d.supersede(l, s, ob)
	}
	if c := l.pending; c != nil {
		return d.admitInto(c, s, ob)
	}
	if quotaVictim != nil {
		d.shed(quotaVictim, BoundQuota, s.now, ob)
		d.tenants.keep(s.ten)
	}
	d.admitBehind(l, s, ob)
	return false, nil
}

// waitersFull reports whether submission s brings a ticket that
// Config.MaxWaiters leaves no room for, were it to wait on a call. One that
// Follow, Merge or Moot skips ends at once and is never live, so each of
// them is asked first.
func (d *Dispatcher[K, T]) waitersFull(s *submission[K, T]) bool {
	return s.t != nil && d.waiters.tickets >= d.cfg.MaxWaiters
}

// endedTickets counts the live tickets of lane l's calls that a supersede
// ends (endLane).
func endedTickets[K comparable, T any](l *lane[K, T]) int {
	n := 0
	for _, c := range [2]*call[K, T]{l.pending, l.running} {
		if c != nil && !c.orphaned() {
			n += c.tickets()
		}
	}
	return n
}

// quotaForCall decides whether submission s, for a key that has lane l,
// fits its tenant's quota: if it makes a new call (it supersedes, or l has
// no pending call) and the tenant is at its quota, it displaces the
// tenant's worst droppable call (returned, not yet shed) or is refused.
func (d *Dispatcher[K, T]) quotaForCall(l *lane[K, T], s *submission[K, T], supersede bool) (*call[K, T], error) {
	if !supersede && l.pending != nil {
		return nil, nil // s coalesces
	}
	// A supersede ends the lane's calls, and frees the places of those
	// that wait: the pending one, and a retry that waits as the running
	// one (requeue). Neither is a victim: it is ended anyway.
	var ended [2]*call[K, T]
	freed := 0
	if supersede {
		ended = [2]*call[K, T]{l.pending, l.running}
		for _, c := range ended {
			if c != nil && c.tag.ten == s.ten && c.state != csRunning {
				freed++
			}
		}
	}
	if !s.ten.overQuota(freed) {
		return nil, nil
	}
	order := d.q.of(s.o.Priority, s.now)
	if v := worst(s.ten.victims, order, d.seq+1, ended[0], ended[1]); v != nil {
		return v, nil
	}
	return nil, d.totals.refuse(BoundQuota, d.lanes.Len())
}

// admitInto coalesces submission s into its key's pending call c.
//
// A submission of another tenant that takes c over — by outranking it, or
// by replacing it (ReplacePending) — moves c into its own tenant (adopt),
// which must have room for it under its MaxQueued as for a new call
// (roomToAdopt). When it outranks c that is decided before the merge; when
// the merge replaces c, after it, and a refusal then restores c's value:
// the merge's result is dropped, as Config.Merge says.
func (d *Dispatcher[K, T]) admitInto(c *call[K, T], s *submission[K, T], ob *outbox[K, T]) (coalesced bool, err error) {
	t := s.t // not s, which would then escape to the heap
	moves := s.ten != c.tag.ten && s.ten.cfg.MaxQueued > 0
	var victim *call[K, T]
	if moves && s.o.Priority > c.prio {
		if victim, err = d.roomToAdopt(c, s); err != nil {
			return false, err
		}
	}
	full := d.waitersFull(s)
	var was callValue[T] // restored if a bound refuses s after the merge
	if moves || full {
		was = c.value()
	}
	_, err = c.merge(s.val, s.o.IdempotencyKey, d.cfg.Merge, exitAdmitUnlock(d, t, ob)) // a panic is the error
	switch err {
	case nil, ReplacePending:
	case SkipIncoming:
		d.totals.coalesced++
		d.waiters.skip(s.key, s.val, s.t, ob)
		return true, nil
	default:
		return false, err
	}
	if full { // s's ticket would be live: Config.MaxWaiters refuses it
		c.setValue(was)
		return false, d.totals.refuse(BoundWaiters, d.lanes.Len())
	}
	replaced := err == ReplacePending
	if replaced {
		if moves && s.o.Priority <= c.prio {
			if victim, err = d.roomToAdopt(c, s); err != nil {
				c.setValue(was)
				return false, err
			}
		}
		d.restart(c)
	}
	d.joinMerged(c, s, victim, replaced, ob)
	return true, nil
}

// joinMerged joins submission s to c, into which its value was merged
// (replaced: it replaced c's), after it shed victim to make room: c takes
// s's tenant and label if s is the more urgent or the replacement.
func (d *Dispatcher[K, T]) joinMerged(c *call[K, T], s *submission[K, T], victim *call[K, T], replaced bool, ob *outbox[K, T]) {
	if !s.o.Droppable {
		d.q.pin(c)
	}
	if victim != nil {
		d.shed(victim, BoundQuota, s.now, ob)
		d.tenants.keep(s.ten)
	}
	ten, prio := c.tag.ten, c.prio
	if (replaced || s.o.Priority > c.prio) && (s.ten != c.tag.ten || s.label != c.tag.label) {
		d.adopt(c, s.ten, s.label)
	}
	d.waiters.join(&d.q, c, s.t, s.o.Priority, s.now, s.deadline)
	d.totals.coalesced++
	if mayStartNow(c, ten, prio) {
		d.wake.workerLater(&ob.wake, d.mode == ModeAsync)
	}
}

// mayStartNow reports whether ready call c, of tenant ten and priority
// prio before a submission joined it, may now start where no worker could
// take it before: it became urgent (the reservation), or moved to another
// tenant (its in-flight cap). A worker that found every call it could take
// held back went idle, and nothing else would wake it until an execution
// ends.
func mayStartNow[K comparable, T any](c *call[K, T], ten *tenant[K, T], prio int) bool {
	return c.state == csReady && (c.tag.ten != ten || c.prio > prio)
}

// postInto is admission's short way for a Post without a deadline, whose
// key's lane l has a pending call: if fire-and-forget submissions already
// wait on that call, and nothing is left to decide, it joins the Post to
// it and reports true. Nothing is left to decide when the dispatcher is
// not closing; no Merge is set, so the value is replaced; the Post carries
// no idempotency key; it is of the lane's generation; no Follow is to be
// asked (none is set, or nothing runs); and the call's tenant and label
// are the Post's, so no tenant adopts it and no quota is asked. admit
// would then do what this does, and deliver nothing: the time saved is
// the deciding (BenchmarkEndToEnd's seq-dup90). Otherwise it changes
// nothing and reports false, and admit decides. now is the clock reading
// Post took, or 0: then the posts' own enqueue time stands in for it, as
// in admitTime.
func (d *Dispatcher[K, T]) postInto(l *lane[K, T], val T, o *SubmitOptions, ten *tenant[K, T], label string, now int64) bool {
	if d.drain.closing || d.cfg.Merge != nil || o.IdempotencyKey != "" || o.Generation != l.gen || (l.running != nil && d.cfg.Follow != nil) {
		return false
	}
	c := l.pending
	if c.nPosts == 0 || c.tag.ten != ten || !sameLabel(c.tag.label, label) {
		return false
	}
	if now == 0 {
		_, now = c.postsOrder()
	}
	d.guess.learn(false)
	c.val = val
	if !o.Droppable && c.is(fDroppable) { // a victim is droppable too (markVictim)
		d.q.pin(c)
	}
	// join's two steps for a post, spelled out: join itself is not
	// inlined, and its short case (joinPosts) is.
	prio := c.prio
	if !d.waiters.joinPosts(c, o.Priority, now) {
		d.waiters.joinAny(&d.q, c, nil, o.Priority, now, 0)
	}
	d.totals.coalesced++
	if mayStartNow(c, ten, prio) {
		d.wake.worker()
	}
	return true
}

// sameLabel is a == b, where the usual label, none, is told without a
// call to compare bytes.
func sameLabel(a, b string) bool {
	return len(a) == len(b) && (len(a) == 0 || a == b)
}

// supersede ends every call of lane l for submission s of a newer
// generation, and returns the lane s goes on in: l, or a new one if l
// held only a queued call and went with it.
func (d *Dispatcher[K, T]) supersede(l *lane[K, T], s *submission[K, T], ob *outbox[K, T]) *lane[K, T] {
	l.gen = s.o.Generation
	d.endLane(l, StateStale, fmt.Errorf("%w: superseded by generation %d", ErrStale, s.o.Generation), s.now, withRunning, ob)
	d.tenants.keep(s.ten) // the ended call may have been its last: forgotten
	// Released, if it has no call left (laneTable.release).
	if l.running == nil && l.pending == nil {
		l = d.lanes.add(s.key, s.h, s.o.Generation)
	}
	return l
}

// follow asks Config.Follow, if set, about submission s, made while the
// call of its key's lane l may be in flight (not asked for a supersede): it
// reports whether s is skipped, or why it is refused; otherwise s.val is
// now Follow's result.
func (d *Dispatcher[K, T]) follow(l *lane[K, T], s *submission[K, T], supersede bool, ob *outbox[K, T]) (skip bool, err error) {
	r := l.running
	if r == nil || r.state != csRunning || r.orphaned() || supersede || d.cfg.Follow == nil {
		return false, nil
	}
	running, incoming, pending := r.val, s.val, l.pending != nil
	var v T
	_, err = guard(callbackFollow, func() (err error) {
		v, err = d.cfg.Follow(running, incoming, pending)
		skip = err != nil && errors.Is(err, SkipIncoming) // its Is is user code too
		return err
	}, exitAdmitUnlock(d, s.t, ob))
	switch {
	case err == nil:
		s.val = v
		return false, nil
	case skip:
		return true, nil
	}
	return false, fmt.Errorf("%w: %w", ErrMergeRejected, err)
}

// moot asks Config.Moot about submission s, for a key that has no call:
// a moot one ends Skipped here, and a panic in Moot refuses it.
func (d *Dispatcher[K, T]) moot(s *submission[K, T], ob *outbox[K, T]) (bool, error) {
	key, val := s.key, s.val
	var moot bool
	pe, _ := guard(callbackMoot, func() error {
		moot = d.cfg.Moot(key, val)
		return nil
	}, exitAdmitUnlock(d, s.t, ob))
	if pe != nil {
		return false, pe
	}
	if moot {
		d.waiters.skip(key, val, s.t, ob)
	}
	return moot, nil
}

// exitAdmitUnlock is what runs when a callback of admission (Merge, Follow,
// Moot) ends the submitting goroutine: nothing was admitted, but what a
// supersede ended is told. It runs with the lock held and releases it.
func exitAdmitUnlock[K comparable, T any](d *Dispatcher[K, T], t *Ticket[K, T], ob *outbox[K, T]) func(*PanicError) {
	return func(*PanicError) {
		d.mu.Unlock()
		if t != nil {
			t.stopWatch()
		}
		d.tell.deliver(ob)
	}
}

// roomToAdopt decides whether submission s's tenant has room under its
// MaxQueued for the pending call c that s takes over: nothing to do, the
// tenant's worst droppable queued call to evict (returned, not yet shed)
// if c, as s would leave it, runs before it, or a refusal. It changes
// nothing.
func (d *Dispatcher[K, T]) roomToAdopt(c *call[K, T], s *submission[K, T]) (*call[K, T], error) {
	if !s.ten.overQuota(0) {
		return nil, nil
	}
	order := d.q.of(max(c.prio, s.o.Priority), min(c.enq, s.now))
	if v := worst(s.ten.victims, order, c.seq, c, nil); v != nil {
		return v, nil
	}
	return nil, d.totals.refuse(BoundQuota, d.lanes.Len())
}

// admitBehind makes s the pending call of lane l, which has none: the
// running call's successor, which enters the ready index when that one
// finishes, with the enqueue time it has now — or, if a newer generation
// just removed the key's only call, ready at once.
func (d *Dispatcher[K, T]) admitBehind(l *lane[K, T], s *submission[K, T], ob *outbox[K, T]) {
	c := d.newPending(l, s.val, &s.o, s.ten, s.label)
	d.waiters.joinAny(&d.q, c, s.t, s.o.Priority, s.now, s.deadline) // a new call: nothing to shorten
	if l.running == nil {
		d.q.push(c)
		d.wake.workerLater(&ob.wake, d.mode == ModeAsync)
		return
	}
	c.enter(csBehind)
	d.q.markVictim(c) // under its tenant's quota
}

// admitNewKey places a submission for a key without a lane.
func (d *Dispatcher[K, T]) admitNewKey(s *submission[K, T], ob *outbox[K, T]) error {
	if d.cfg.Moot != nil {
		if moot, err := d.moot(s, ob); err != nil || moot {
			return err
		}
	}
	if d.waitersFull(s) {
		return d.totals.refuse(BoundWaiters, d.lanes.Len())
	}
	quotaVictim, capVictim, err := d.roomForKey(s)
	if err != nil {
		return err
	}
	if s.o.Droppable && d.gate.breaker != nil && d.cfg.Breaker.RefuseDroppable && d.gate.breaker.StateAt(s.now) == breaker.Open {
		return ErrCircuitOpen
	}
	if quotaVictim != nil {
		d.shed(quotaVictim, BoundQuota, s.now, ob)
	}
	if capVictim != nil {
		d.shed(capVictim, BoundCapacity, s.now, ob)
	}
	if quotaVictim != nil || capVictim != nil {
		d.tenants.keep(s.ten)
	}
	if !d.started {
		d.launch()
	}
	l := d.lanes.add(s.key, s.h, s.o.Generation)
	c := d.newPending(l, s.val, &s.o, s.ten, s.label)
	d.waiters.joinAny(&d.q, c, s.t, s.o.Priority, s.now, s.deadline) // a new call: nothing to shorten
	d.q.push(c)
	d.wake.workerLater(&ob.wake, d.mode == ModeAsync)
	if f := d.fallback; f != nil {
		if at, ok := f.Wake(s.now); ok { // a call to watch: the check resumes
			d.due.Set(due.Check, at)
		}
	}
	return nil
}

// roomForKey finds what a new key's submission s displaces: the worst
// droppable call of its tenant if the tenant is over its quota, and the
// worst droppable call of all if the dispatcher is at Capacity, unless the
// first goes alone in its lane and so frees a key. It changes nothing;
// err is the refusal if not all can go. s's place in the ready
// order, which a victim must come after, is computed only when a bound is
// reached: most new keys reach none.
func (d *Dispatcher[K, T]) roomForKey(s *submission[K, T]) (quotaVictim, capVictim *call[K, T], err error) {
	if s.ten.overQuota(0) {
		if quotaVictim = worst(s.ten.victims, d.q.of(s.o.Priority, s.now), d.seq+1, nil, nil); quotaVictim == nil {
			return nil, nil, d.totals.refuse(BoundQuota, d.lanes.Len())
		}
		if quotaVictim.lane.running == nil {
			return quotaVictim, nil, nil // alone in its lane: evicting it frees a key
		}
	}
	if d.lanes.Len() >= d.cfg.Capacity {
		if capVictim = d.q.victims.worst(d.q.of(s.o.Priority, s.now), d.seq+1); capVictim == nil {
			return nil, nil, d.totals.refuse(BoundCapacity, d.lanes.Len())
		}
	}
	return quotaVictim, capVictim, nil
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
// (clockGuess); one with a deadline reads it before the lock regardless,
// so it says nothing about whether Post's guess pays.
func (d *Dispatcher[K, T]) admitTime(l *lane[K, T], t *Ticket[K, T], o *SubmitOptions, now, deadline int64) int64 {
	if t != nil {
		return now // Submit reads the clock before the lock
	}
	var standIn int64 // 0: the clock is needed (no time on the clock is 0)
	if deadline == 0 && l != nil && o.Generation == l.gen {
		if c := l.pending; c != nil && c.nPosts > 0 {
			_, standIn = c.postsOrder()
		}
	}
	if deadline == 0 {
		d.guess.learn(standIn == 0)
	}
	switch {
	case now != 0:
		return now
	case standIn != 0:
		return standIn
	}
	return d.clk.now()
}

// clockGuess is Post's guess, read without the lock, that admission will
// need the clock: if so, Post reads it before taking the lock, as Submit
// does, so that the read is not part of the time the lock is held. needs,
// under the lock, is the recent evidence (learn).
type clockGuess struct {
	pre   atomic.Bool
	needs uint8
}

// learn records whether the admission of a Post without a deadline needed
// the clock, and keeps the guess to what recent Posts needed. needs rises
// with each Post that needed the clock and falls with each that did not,
// between 0 and 3; the guess turns on at 3 and off at 0. So traffic of new
// keys turns it on after three Posts, a hot key re-posted turns it off
// after three, and a mix of the two does not flip it with every other
// Post. A wrong guess costs a clock read outside the lock (on) or one under
// it (off), never a wrong time.
//
// The guess is stored only as needs reaches 3 or 0, once per flip. So
// learn is small enough for the compiler to inline into the busiest path
// (postInto), where a hot key re-posted finds needs at 0: one comparison.
func (g *clockGuess) learn(needed bool) {
	switch {
	case needed && g.needs < 3:
		if g.needs++; g.needs == 3 {
			g.pre.Store(true)
		}
	case !needed && g.needs > 0:
		if g.needs--; g.needs == 0 {
			g.pre.Store(false)
		}
	}
}

// newCall makes the pending call of l.
func (d *Dispatcher[K, T]) newPending(l *lane[K, T], val T, o *SubmitOptions, ten *tenant[K, T], label string) *call[K, T] {
	c := l.freshCall()
	c.tag = d.calls.add(ten, label)
	d.seq++
	ten.queued++
	c.val, c.seq = val, d.seq
	c.mark(fDroppable, o.Droppable)
	c.setIdem(o.IdempotencyKey)
	l.pending = c
	return c
}
