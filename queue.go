package dispatch

import (
	"github.com/google/btree"

	"github.com/coalescer/dispatch/internal/band"
	"github.com/coalescer/dispatch/internal/due"
)

// queue holds the ordered indexes the dispatcher schedules from, and the
// scheduling order across tenants. It is a plain data structure: the
// Dispatcher's lock guards it, and it never calls user code.
//
//   - ready: calls that may run now, one index per tenant (tenant.ready,
//     ready.go), each in ready order: effective priority with aging, then
//     arrival. A worker takes the best of the tenants' best (pick).
//   - delayed: calls that may not run before a time (retry backoff), by that
//     time. The clock moves them to ready when it comes.
//   - victims: the calls that may be shed (evicted) when the dispatcher is
//     full (victims.go).
//
// Each is a B-tree, or (ready, victims) a B-tree beside runs of the calls
// that arrived in order, so insert, remove and re-key are O(log n) at
// worst, and no index keeps a timer, goroutine or context per entry: the
// clock's one timer, armed for the earliest entry of delayed and of the
// waiters' deadlines (waiters.go), drives both (see clock.go).
type queue[K comparable, T any] struct {
	orderer     // the ready order's band width and aging
	nready  int // ready calls over all tenants
	active  []*tenant[K, T]
	vpass   uint64 // pass of the tenant picked last
	delayed *btree.BTreeG[*call[K, T]]
	// victims holds the calls that may be shed when the dispatcher is
	// full: droppable, queued (ready or delayed), and alone in their lane,
	// so that evicting one frees a key. It is in ready order; its maximum
	// is the worst call: lowest effective priority, then newest
	// (victims.go).
	victims victimIndex[K, T]
	// due is the dispatcher's due list: an entry of delayed is also a time
	// the clock must act at.
	due *due.List
}

// btreeDegree was chosen by BenchmarkSubmit: wider nodes cost more to shift
// on insert, narrower ones more levels of cache misses. With 32-byte
// entries, 16, 32 and 64 are within a few percent of each other; 32 was
// ahead at 1e5 and 1e6 queued.
const btreeDegree = 32

func newQueue[K comparable, T any](aging, band int64) queue[K, T] {
	return queue[K, T]{
		orderer: newOrderer(band, aging),
		delayed: btree.NewG(btreeDegree, delayedLess[K, T]),
		victims: newVictimIndex[K, T](),
	}
}

func delayedLess[K comparable, T any](a, b *call[K, T]) bool {
	if a.pos != b.pos {
		return a.pos < b.pos
	}
	return a.seq < b.seq
}

// push makes c ready.
func (q *queue[K, T]) push(c *call[K, T]) {
	q.unmarkVictim(c)
	t := c.tag.ten
	t.ready.insert(c, entryOf(q.orderer, c))
	q.nready++
	if t.active < 0 {
		q.activate(t)
	}
	c.enter(csReady)
	q.markVictim(c)
}

// delay makes c wait until notBefore.
func (q *queue[K, T]) delay(c *call[K, T], notBefore int64) {
	q.unmarkVictim(c)
	c.pos = notBefore
	q.delayed.ReplaceOrInsert(c)
	q.due.Set(due.Promote, notBefore)
	c.enter(csDelayed)
	q.markVictim(c)
}

// schedule queues c again (a retry): ready if notBefore has come, else
// delayed until it. It reports whether c is ready, for a worker to be
// woken.
func (q *queue[K, T]) schedule(c *call[K, T], notBefore, now int64) bool {
	if notBefore <= now {
		q.push(c)
		return true
	}
	q.delay(c, notBefore)
	return false
}

// remove takes c out of whichever index holds it, if any.
func (q *queue[K, T]) remove(c *call[K, T]) {
	switch c.state {
	case csReady:
		t := c.tag.ten
		t.ready.delete(c, q.orderer)
		q.nready--
		if t.ready.Len() == 0 {
			q.deactivate(t)
		}
	case csDelayed:
		q.delayed.Delete(c)
	}
	q.unmarkVictim(c)
}

// markVictim puts c in the victims indexes if it may be shed: if it is
// droppable and queued, its tenant's (TenantConfig.MaxQueued), and if it
// is also alone in its lane, so that evicting it frees a key, the
// dispatcher's (Config.Capacity).
func (q *queue[K, T]) markVictim(c *call[K, T]) {
	if !c.is(fDroppable) || c.is(fVictim) || c.state != csReady && c.state != csDelayed && c.state != csBehind {
		return
	}
	alone := c.state != csBehind && c.lane.running == nil
	if !alone && c.tag.ten.victims == nil {
		return
	}
	e := entryOf(q.orderer, c)
	if alone {
		q.victims.insert(e)
	}
	if c.tag.ten.victims != nil {
		c.tag.ten.victims.ReplaceOrInsert(e)
	}
	c.mark(fVictim, true)
}

// pin makes c not droppable, for a submission that must not be dropped
// joining it.
func (q *queue[K, T]) pin(c *call[K, T]) {
	c.mark(fDroppable, false)
	q.unmarkVictim(c)
}

// unmarkVictim takes c out of the victims indexes; call it before c's
// priority or enqueue time changes, or when c stops being evictable. A
// call only its tenant's index holds is not found in the dispatcher's,
// which then changes nothing.
func (q *queue[K, T]) unmarkVictim(c *call[K, T]) {
	if c.is(fVictim) {
		e := entryOf(q.orderer, c)
		q.victims.delete(e)
		if c.tag.ten.victims != nil {
			c.tag.ten.victims.Delete(e)
		}
		c.mark(fVictim, false)
	}
}

// worst returns the call of a tenant's victims index idx to evict for a
// newcomer that would sit at (order, seq): the worst one other than except
// and also (each may be nil), if it is worse than the newcomer.
func worst[K comparable, T any](idx *btree.BTreeG[entry[K, T]], order orderKey, seq uint64, except, also *call[K, T]) *call[K, T] {
	var w entry[K, T]
	idx.Descend(func(x entry[K, T]) bool {
		if x.c == except || x.c == also {
			return true
		}
		w = x
		return false
	})
	if w.c == nil || !readyLess(entry[K, T]{order, seq, nil}, w) {
		return nil
	}
	return w.c
}

// rekey sets c's effective priority and enqueue time, moving it in the
// indexes that hold it by its order (ready, victims). They find their
// entries by the priority and enqueue time they were made with, so c
// leaves them first and comes back with its new ones — even if its order
// stays the same, for a FIFO run holds the calls of one priority.
func (q *queue[K, T]) rekey(c *call[K, T], prio int, enq int64) {
	if prio == c.prio && enq == c.enq {
		return
	}
	isVictim := c.is(fVictim)
	q.unmarkVictim(c)
	ready := c.state == csReady
	if ready {
		c.tag.ten.ready.delete(c, q.orderer)
	}
	c.prio, c.enq = prio, enq
	if ready {
		c.tag.ten.ready.insert(c, entryOf(q.orderer, c))
	}
	if isVictim {
		q.markVictim(c)
	}
}

// reprioritize re-derives c's effective priority and enqueue time after a
// waiter left: a call's priority falls again when the waiter that raised it
// goes. It scans the remaining waiters, which is O(waiters of c).
func (q *queue[K, T]) reprioritize(c *call[K, T]) {
	if !c.waited() {
		return
	}
	prio, enq, seen := 0, int64(0), false
	if c.nPosts > 0 {
		prio, enq = c.postsOrder()
		seen = true
	}
	c.eachTicket(func(t *Ticket[K, T]) {
		if !seen {
			prio, enq, seen = t.prio, t.enq, true
			return
		}
		prio = max(prio, t.prio)
		enq = min(enq, t.enq)
	})
	q.rekey(c, prio, enq)
}

// promote moves every delayed call whose time has come to ready and returns
// how many it moved.
func (q *queue[K, T]) promote(now int64) int {
	n := 0
	for {
		c, ok := q.delayed.Min()
		if !ok || c.notBefore() > now {
			return n
		}
		q.delayed.DeleteMin()
		q.push(c)
		n++
	}
}

// level is a ready call's effective priority at now: its band, and its
// lift within the band — its offset there plus one per aging interval
// waited, floor((now − enq) / aging), exact: the offset and the intervals
// are each below 2⁶³. A call enqueued after now (its clock read raced
// the one of now) has not waited. With strict priority (bands of width 1)
// the lift is 0.
type level struct {
	band int64
	lift uint64
}

func (a level) less(b level) bool {
	if a.band != b.band {
		return a.band < b.band
	}
	return a.lift < b.lift
}

func (q *queue[K, T]) level(c *call[K, T], now int64) level {
	b, off := band.Of(int64(c.prio), q.band)
	if q.band == 1 {
		return level{b, 0}
	}
	return level{b, uint64(off) + uint64(max(now-c.enq, 0)/q.aging)}
}

// pick chooses the tenant whose best ready call runs next: the highest
// effective level wins; among tenants whose best calls are at the same level,
// the one with the lowest stride pass (so workers are shared in proportion to
// weights); at equal passes, the one whose best call comes first in the
// ready order (arrival), never the tenants' order in active, which
// deactivate shuffles. Tenants at their in-flight cap are passed over, and
// bank no more share for it than their cap's worth of picks. It returns nil
// if no tenant may run.
func (q *queue[K, T]) pick(now int64) *tenant[K, T] {
	if len(q.active) == 1 {
		if t := q.active[0]; !t.capped() {
			return t
		}
		return nil
	}
	var best *tenant[K, T]
	var bestLvl level
	var bestE entry[K, T]
	for _, t := range q.active {
		if t.capped() {
			// Passed over, it keeps the lead that takes back the workers
			// its own executions free as they end, and banks no more: its
			// pass trails the current one by at most a pick per execution
			// its cap allows, so that a cap lifted or raised does not give
			// it every worker until its pass catches up with the others'.
			if floor := q.vpass - uint64(min(t.cfg.MaxInFlight, maxWorkers))*t.stride; passBefore(t.pass, floor) {
				t.pass = floor
			}
			continue
		}
		e := t.ready.min()
		lvl := q.level(e.c, now)
		if best == nil || bestLvl.less(lvl) || lvl == bestLvl &&
			(passBefore(t.pass, best.pass) || t.pass == best.pass && readyLess(e, bestE)) {
			best, bestLvl, bestE = t, lvl, e
		}
	}
	return best
}

// popFrom removes and returns t's best ready call, charging t one stride.
// The caller starts it (begin).
func (q *queue[K, T]) popFrom(t *tenant[K, T]) *call[K, T] {
	c := t.ready.popMin()
	q.nready--
	if t.ready.Len() == 0 {
		q.deactivate(t)
	}
	q.vpass = t.pass
	t.pass += t.stride
	c.enter(csTaken)
	q.unmarkVictim(c)
	return c
}

// passBefore reports whether pass a comes before pass b. Passes grow by up
// to 2³² a pick and wrap around 2⁶⁴ after as few as 2³² picks; compared
// as a difference, they keep their order across the wrap while they are
// within 2⁶³ of each other (2³¹ picks of a weight-1 tenant).
func passBefore(a, b uint64) bool { return int64(a-b) < 0 }

// activate adds t to the tenants with ready calls. A tenant returning from
// idle starts at the current pass, so it cannot claim the service it did
// not use while idle.
func (q *queue[K, T]) activate(t *tenant[K, T]) {
	if passBefore(t.pass, q.vpass) {
		t.pass = q.vpass
	}
	t.active = len(q.active)
	q.active = append(q.active, t)
}

func (q *queue[K, T]) deactivate(t *tenant[K, T]) {
	last := q.active[len(q.active)-1]
	q.active[t.active] = last
	last.active = t.active
	q.active[len(q.active)-1] = nil
	q.active = q.active[:len(q.active)-1]
	t.active = -1
}
