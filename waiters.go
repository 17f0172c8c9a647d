package dispatch

import (
	"github.com/google/btree"

	"github.com/coalescer/dispatch/internal/due"
)

// This file is waiter bookkeeping: how a submission's waiter joins a call
// and leaves it, the index of waiters' deadlines, and the outcomes they
// are settled with. A waiter is a Ticket, or the aggregate of a call's
// fire-and-forget submissions (its posts). The Dispatcher's lock guards
// all of it; nothing here calls user code.

// waiters are the live waiters of every call, guarded by the Dispatcher's
// lock.
type waiters[K comparable, T any] struct {
	tickets int // live tickets
	posts   int // fire-and-forget submissions without an outcome
	// deadlines holds the waiters with a deadline, by deadline; the clock
	// expires them. Each is also a time in the due list.
	deadlines *btree.BTreeG[*waiter[K, T]]
	dseq      uint64 // tie-break among equal deadlines
	// sweeping defers removals from deadlines to the end of a sweep, which
	// counts them in swept.
	sweeping bool
	swept    int
	due      *due.List
	lists    listPool[K, T]
	outcomes stateCounts // per submission, by terminal state
}

func newWaiters[K comparable, T any](dl *due.List) waiters[K, T] {
	return waiters[K, T]{deadlines: btree.NewG(btreeDegree, deadlineLess[K, T]), due: dl}
}

func deadlineLess[K comparable, T any](a, b *waiter[K, T]) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.dseq < b.dseq
}

// lateness says whether a waiter whose deadline has passed still gets the
// outcome it is settled with.
type lateness uint8

const (
	// onTime: every waiter gets the outcome (a cancellation, a drop...).
	onTime lateness = iota
	// expireLate: a waiter past its deadline gets Expired instead, so that a
	// result arriving after a waiter's deadline is never delivered to it as
	// success.
	expireLate
)

// join adds a submission to c: the ticket t, or a fire-and-forget one if t
// is nil. It keeps c's effective priority and enqueue time (the highest and
// the earliest of its live waiters) and so its place in q's ready order.
func (w *waiters[K, T]) join(q *queue[K, T], c *call[K, T], t *Ticket[K, T], prio int, now, deadline int64) {
	first := c.live() == 0
	c.joined++
	if t != nil {
		t.c, t.prio, t.enq = c, prio, now
		w.attach(c, t)
		if deadline == 0 {
			c.nForever++
		}
		w.tickets++
		t.state = tsLive
		if deadline != 0 { // then t.x.w.deadline is deadline (newTicket)
			w.addDeadline(&t.x.w, deadline)
		}
	} else {
		w.addPosts(c, 1, prio, now, deadline, deadline == 0)
		w.posts++
	}
	if first {
		c.prio, c.enq = prio, now
		return
	}
	q.rekey(c, max(c.prio, prio), min(c.enq, now))
}

// addPosts folds n fire-and-forget submissions — highest priority prio,
// earliest enqueue enq, latest deadline deadline, forever if any had none —
// into c's posts aggregate, keeping its place in the deadline index.
func (w *waiters[K, T]) addPosts(c *call[K, T], n, prio int, enq, deadline int64, forever bool) {
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
		w.removeDeadline(p)
	case p.at == 0:
		w.addDeadline(p, p.deadline)
	}
}

// attach puts ticket t, which is joining c and has not been returned to
// its submitter yet, in c's lists. A call's first ticket waits in c.one; a
// plain ticket rides c's share, which the call makes when shareMin-1
// plain tickets are already waiting to be visited.
func (w *waiters[K, T]) attach(c *call[K, T], t *Ticket[K, T]) {
	if c.one == nil && c.more == nil && (c.share == nil || t.watched()) {
		t.idx = -1
		c.one = t
		return
	}
	tl := w.listsOf(c)
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

// listsOf returns c's ticket lists, taking them from the pool for c's
// second ticket; the first moves there from c.one.
func (w *waiters[K, T]) listsOf(c *call[K, T]) *ticketLists[K, T] {
	if c.more != nil {
		return c.more
	}
	tl := w.lists.get()
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
func (w *waiters[K, T]) detach(t *Ticket[K, T]) {
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
	w.tickets--
	w.unindex(t)
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

// absorb moves every waiter of the successor n into c, n's tickets as they
// are: a rider keeps its share, which c now tells (chained after c's own),
// and the rest are visited.
func (w *waiters[K, T]) absorb(c, n *call[K, T]) {
	n.eachTicket(func(t *Ticket[K, T]) {
		t.c = c
		tl := w.listsOf(c)
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
		w.removeDeadline(&n.posts)
		w.addPosts(c, n.nPosts, n.posts.prio, n.posts.enq, n.posts.deadline, n.postsForever)
	}
	c.joined += n.joined
	w.lists.keep(n)
	n.share, n.nForever, n.nPosts = nil, 0, 0
}

// settle gives ticket t the outcome st and takes it off its call c. The
// caller then finishes c if it has no waiter left, or reprioritizes it.
func (w *waiters[K, T]) settle(t *Ticket[K, T], c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	w.detach(t)
	w.told(t, ob.newResult(c.result(st, err, now)), ob)
}

// told records ticket t's outcome r, taken off its call, for ob to tell. r
// is not changed afterwards; tickets told the same outcome share it.
func (w *waiters[K, T]) told(t *Ticket[K, T], r *Result[K, T], ob *outbox[K, T]) {
	t.r = r
	t.state = tsDone
	w.outcomes[r.State]++
	ob.tickets = append(ob.tickets, t)
}

// settleAll settles every waiter of c with st (see lateness). It reports
// whether any waiter got st. The result is built once. Riders are not
// visited: their share records the outcome for them all, so that the work
// under the lock does not grow with them. Only the other tickets — those
// with a deadline or a context, and the few plain ones that joined before
// the share was made — are visited.
func (w *waiters[K, T]) settleAll(c *call[K, T], st State, err error, now int64, late lateness, ob *outbox[K, T]) bool {
	n := c.tickets()
	oc := sharedOutcome[K, T]{now: now, late: late}
	if n > 0 {
		oc.res = c.result(st, err, now)
	}
	// The visited tickets told res share one copy of it: the share's, if
	// the call has one, else one made for the first of them (a worker's
	// was made before it took the lock: outbox.stock). Those that expired
	// late share another.
	oc.onTime = c.tellShares(oc.res, ob)
	if c.one != nil {
		w.visit(c.one, c, &oc, ob)
		c.one = nil
	}
	if tl := c.more; tl != nil {
		if len(tl.riders) > 0 {
			oc.served = true
			w.outcomes[st] += uint64(len(tl.riders))
		}
		for _, t := range tl.visit {
			w.visit(t, c, &oc, ob)
		}
		w.lists.keep(c)
	}
	w.tickets -= n
	c.nForever = 0
	if c.nPosts > 0 {
		pst := st
		if late == expireLate && !c.postsForever && c.posts.deadline <= now {
			pst = StateExpired
		} else {
			oc.served = true
		}
		w.settlePosts(c, pst)
	}
	return oc.served
}

// sharedOutcome is the outcome of a call's end as its visited tickets are
// told it (settleAll): res, in one copy for those on time and one for
// those expired late.
type sharedOutcome[K comparable, T any] struct {
	res             Result[K, T]
	onTime, expired *Result[K, T]
	now             int64
	late            lateness
	served          bool // a waiter got res
}

// visit tells ticket t of call c its share of oc.
func (w *waiters[K, T]) visit(t *Ticket[K, T], c *call[K, T], oc *sharedOutcome[K, T], ob *outbox[K, T]) {
	t.c = nil
	w.unindex(t)
	if dl := t.deadline(); oc.late == expireLate && dl != 0 && dl <= oc.now {
		if oc.expired == nil {
			oc.expired = ob.newResult(c.result(StateExpired, ErrExpired, oc.now))
		}
		w.told(t, oc.expired, ob)
		return
	}
	oc.served = true
	if oc.onTime == nil {
		oc.onTime = ob.newResult(oc.res)
	}
	w.told(t, oc.onTime, ob)
}

// tellShares records res as the outcome of c's shares (its own, and those
// of the calls it absorbed), for ob to tell their riders, and returns the
// first share's copy of it, or nil if c has no share.
func (c *call[K, T]) tellShares(res Result[K, T], ob *outbox[K, T]) *Result[K, T] {
	var first *Result[K, T]
	for s := c.share; s != nil; s = s.next {
		s.res, s.ended = res, true
		ob.shares = append(ob.shares, s)
		if first == nil {
			first = &s.res
		}
	}
	c.share = nil
	return first
}

// settlePosts gives every fire-and-forget submission of c the outcome st.
// Nobody is told: their outcome reaches Stats, and the completion hook when
// the call finishes.
func (w *waiters[K, T]) settlePosts(c *call[K, T], st State) {
	w.outcomes[st] += uint64(c.nPosts)
	w.posts -= c.nPosts
	c.nPosts, c.postsForever = 0, false
	w.removeDeadline(&c.posts)
}

// skip ends an accepted submission at once as Skipped: the merge function
// found that the key's pending call makes it moot. It joins no call, so no
// completion hook fires for it.
func (w *waiters[K, T]) skip(key K, val T, t *Ticket[K, T], ob *outbox[K, T]) {
	w.outcomes[StateSkipped]++
	if t == nil {
		return
	}
	t.r = &Result[K, T]{Key: key, Call: val, Outcome: Outcome{State: StateSkipped, Waiters: 1}}
	t.state = tsDone
	ob.tickets = append(ob.tickets, t)
}

// unindex takes ticket t out of the deadline index, if it is there.
func (w *waiters[K, T]) unindex(t *Ticket[K, T]) {
	if t.x != nil {
		w.removeDeadline(&t.x.w)
	}
}

// addDeadline indexes wt at time at (> 0).
func (w *waiters[K, T]) addDeadline(wt *waiter[K, T], at int64) {
	w.dseq++
	wt.at, wt.dseq = at, w.dseq
	w.deadlines.ReplaceOrInsert(wt)
	w.due.Set(due.Expire, at)
}

// removeDeadline takes wt out of the deadline index if it is there.
// During a sweep it only marks wt out.
func (w *waiters[K, T]) removeDeadline(wt *waiter[K, T]) {
	if wt.at == 0 {
		return
	}
	if w.sweeping {
		w.swept++
	} else {
		w.deadlines.Delete(wt)
	}
	wt.at = 0
}

// sweep runs end, which takes waiters out of the deadline index, and then
// takes them out in one step: end's removals only mark each waiter out,
// and the index is then emptied at once if end marked every waiter it
// holds, or else rebuilt from those it did not. Close ends every call at
// once so: a million removals from the index cost seconds, a pointer
// chase per comparison.
//
// While end runs the index's order is broken (marked waiters' keys are
// zeroed in place): end may add and remove deadlines, but must not read
// the index (Min, popDeadline).
func (w *waiters[K, T]) sweep(end func()) {
	w.sweeping, w.swept = true, 0
	end()
	w.sweeping = false
	if w.swept == w.deadlines.Len() {
		w.deadlines.Clear(false)
		return
	}
	left := btree.NewG(btreeDegree, deadlineLess[K, T])
	w.deadlines.Ascend(func(wt *waiter[K, T]) bool { // walks every node, whatever their keys
		if wt.at != 0 {
			left.ReplaceOrInsert(wt)
		}
		return true
	})
	w.deadlines = left
}

// popDeadline removes and returns the earliest waiter whose indexed time is
// at or before now, or nil.
func (w *waiters[K, T]) popDeadline(now int64) *waiter[K, T] {
	wt, ok := w.deadlines.Min()
	if !ok || wt.at > now {
		return nil
	}
	w.deadlines.DeleteMin()
	wt.at = 0
	return wt
}
