package dispatch

import (
	"math"

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
	// The waiters with a deadline, in two indexes by deadline: calls'
	// posts aggregates (by posts.at, then arrival), and tickets (by at,
	// then tseq). The clock expires them, the earliest of both first. Each
	// is also a time in the due list.
	postsDue   postsDue[K, T]
	ticketsDue *btree.BTreeG[*ticketWatch[K, T]]
	tseq       uint64 // tie-break among tickets' equal deadlines
	// sweeping defers removals from the deadline indexes to the end of a
	// sweep, which counts them in swept, and the additions in sweepAdds.
	sweeping     bool
	sweptPosts   int
	sweptTickets int
	sweepAdds    int
	due          *due.List
	lists        listPool[K, T]
	outcomes     stateCounts // per submission, by terminal state
}

func newWaiters[K comparable, T any](dl *due.List) waiters[K, T] {
	return waiters[K, T]{postsDue: newPostsDue[K, T](), ticketsDue: btree.NewG(btreeDegree, ticketDueLess[K, T]), due: dl}
}

func ticketDueLess[K comparable, T any](a, b *ticketWatch[K, T]) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
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
//
// The busiest case, a hot key written again, is told apart first: a
// fire-and-forget submission, no more urgent and no earlier than c,
// joining posts that wait alone (not fPostsApart: c's priority and
// enqueue time are theirs) and never expire (fPostsForever, which also
// means that c has posts; their deadline is then read by nothing, and the
// submission's own changes nothing). Nothing moves in any index, and only
// the counts change (TestJoinShortCase).
func (w *waiters[K, T]) join(q *queue[K, T], c *call[K, T], t *Ticket[K, T], prio int, now, deadline int64) {
	if t == nil && w.joinPosts(c, prio, now) {
		return
	}
	w.joinAny(q, c, t, prio, now, deadline)
}

// joinPosts is join's short case for a fire-and-forget submission: it
// joins it and reports true if the case applies, and otherwise changes
// nothing. It is small enough to be inlined where a hot key is re-posted
// (postInto): a count about to pass 32 bits, which only 2³² submissions
// into one call reach, is left to joinAny's split32 too.
func (w *waiters[K, T]) joinPosts(c *call[K, T], prio int, now int64) bool {
	if c.flags&(fPostsForever|fPostsApart) != fPostsForever || prio > c.prio || now < c.enq ||
		c.nPosts == math.MaxUint32 || c.joined == math.MaxUint32 {
		return false
	}
	c.nPosts++
	c.joined++
	w.posts++
	return true
}

// joinAny is join for any submission; a new call, which has no waiter,
// is joined here directly.
func (w *waiters[K, T]) joinAny(q *queue[K, T], c *call[K, T], t *Ticket[K, T], prio int, now, deadline int64) {
	first := !c.waited()
	c.countJoined(1)
	if t != nil {
		t.c, t.prio, t.enq = c, prio, now
		w.attach(c, t)
		if deadline == 0 {
			c.nForever++
		}
		w.tickets++
		t.state = tsLive
		if deadline != 0 { // then t.x.deadline is deadline (newTicket)
			w.addTicketDue(t.x)
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
// into c's posts aggregate, keeping its place in the deadline index. The
// caller then sets c's own priority and enqueue time, which are the
// aggregate's while the posts wait alone (postsOrder).
func (w *waiters[K, T]) addPosts(c *call[K, T], n, prio int, enq, deadline int64, forever bool) {
	p := &c.posts
	if c.nPosts == 0 {
		p.deadline = deadline
		if c.tickets() > 0 {
			c.postsApart(prio, enq)
		}
	} else {
		p.deadline = max(p.deadline, deadline)
		if c.is(fPostsApart) {
			r := c.rare
			r.postsPrio, r.postsEnq = max(r.postsPrio, prio), min(r.postsEnq, enq)
		}
	}
	c.countPosts(n)
	switch {
	case c.is(fPostsForever):
	case forever:
		c.mark(fPostsForever, true)
		w.removePostsDue(c)
	case p.at == 0:
		w.addPostsDue(c, p.deadline)
	}
}

// attach puts ticket t, which is joining c and has not been returned to
// its submitter yet, in c's lists. A call's first ticket waits in c.one; a
// plain ticket rides c's share, which the call makes when shareMin-1
// plain tickets are already waiting to be visited.
func (w *waiters[K, T]) attach(c *call[K, T], t *Ticket[K, T]) {
	c.separatePosts()
	if c.one == nil && c.lists() == nil {
		t.idx = -1
		c.one = t
		return
	}
	tl := w.listsOf(c)
	if !t.watched() {
		if tl.share == nil && tl.plain >= shareMin-1 {
			tl.share = new(share[K, T])
		}
		if tl.share != nil {
			t.share = tl.share // before Submit returns t: see Ticket.share
			tl.addRider(t)
			return
		}
	}
	tl.addVisit(t)
}

// listsOf returns c's ticket lists, taking them from the pool for c's
// second ticket; the first moves there from c.one.
func (w *waiters[K, T]) listsOf(c *call[K, T]) *ticketLists[K, T] {
	if tl := c.lists(); tl != nil {
		return tl
	}
	tl := w.lists.get()
	c.rareOf().lists = tl
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
		tl := c.rare.lists
		tl.riders = removeAt(tl.riders, t.idx)
	default:
		tl := c.rare.lists
		tl.visit = removeAt(tl.visit, t.idx)
		if !t.watched() {
			tl.plain--
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
// and the rest are visited. The caller then re-derives c's priority and
// enqueue time from its waiters (reprioritize), so c's posts aggregate is
// kept apart from them first: c, a retry, has a live waiter, so after this
// its posts, if any, are apart.
func (w *waiters[K, T]) absorb(c, n *call[K, T]) {
	c.separatePosts()
	n.eachTicket(func(t *Ticket[K, T]) {
		t.c = c
		tl := w.listsOf(c)
		if t.share != nil {
			tl.addRider(t)
			return
		}
		tl.addVisit(t)
	})
	if s := n.share(); s != nil {
		p := &w.listsOf(c).share // c's, even if no ticket came with it
		for *p != nil {
			p = &(*p).next
		}
		*p = s
	}
	c.nForever += n.nForever
	if n.nPosts > 0 {
		prio, enq := n.postsOrder()
		w.removePostsDue(n)
		w.addPosts(c, n.postCount(), prio, enq, n.posts.deadline, n.is(fPostsForever))
	}
	c.countJoined(n.joinedCount())
	w.lists.keep(n)
	n.nForever = 0
	n.uncountPosts()
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
	if tl := c.lists(); tl != nil {
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
		if late == expireLate && !c.is(fPostsForever) && c.posts.deadline <= now {
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
	for s := c.share(); s != nil; s = s.next {
		s.res, s.ended = res, true
		ob.shares = append(ob.shares, s)
		if first == nil {
			first = &s.res
		}
	}
	if tl := c.lists(); tl != nil {
		tl.share = nil
	}
	return first
}

// settlePosts gives every fire-and-forget submission of c the outcome st.
// Nobody is told: their outcome reaches Stats, and the completion hook when
// the call finishes.
func (w *waiters[K, T]) settlePosts(c *call[K, T], st State) {
	n := c.postCount()
	w.outcomes[st] += uint64(n)
	w.posts -= n
	c.uncountPosts()
	w.removePostsDue(c)
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
	if x := t.x; x != nil && x.at != 0 {
		if w.sweeping {
			w.sweptTickets++
		} else {
			w.ticketsDue.Delete(x)
		}
		x.at = 0
	}
}

// addTicketDue indexes x at its deadline (> 0).
func (w *waiters[K, T]) addTicketDue(x *ticketWatch[K, T]) {
	w.tseq++
	x.at, x.seq = x.deadline, w.tseq
	if w.sweeping {
		w.sweepAdds++
	}
	w.ticketsDue.ReplaceOrInsert(x)
	w.due.Set(due.Expire, x.at)
}

// addPostsDue indexes c's posts aggregate at time at (> 0).
func (w *waiters[K, T]) addPostsDue(c *call[K, T], at int64) {
	c.posts.at = at
	if w.sweeping {
		w.sweepAdds++
	}
	w.postsDue.add(c)
	w.due.Set(due.Expire, at)
}

// removePostsDue takes c's posts aggregate out of the deadline index if it
// is there. During a sweep it only marks it out of the B-tree (leaving the
// run costs no search).
func (w *waiters[K, T]) removePostsDue(c *call[K, T]) {
	if c.posts.at == 0 {
		return
	}
	if w.sweeping && !c.is(fPostsRun) {
		w.sweptPosts++
	} else {
		w.postsDue.remove(c)
	}
	c.posts.at = 0
}

// sweep runs end, which takes waiters out of the deadline indexes, and
// then takes them out in one step: end's removals only mark each waiter
// out, and an index is then emptied at once if end marked every waiter it
// holds, or else rebuilt from those it did not. Close ends every call at
// once so: a million removals from an index cost seconds, a pointer chase
// per comparison.
//
// While end runs the indexes' order is broken (marked waiters' keys are
// zeroed in place): end may add and remove deadlines, but must not read
// the indexes (nextDue, popDue).
func (w *waiters[K, T]) sweep(end func()) {
	w.sweeping, w.sweptPosts, w.sweptTickets, w.sweepAdds = true, 0, 0, 0
	end()
	w.sweeping = false
	w.postsDue.tree = rebuilt(w.postsDue.tree, w.sweptPosts, w.sweepAdds, postsDueLess[K, T], func(c *call[K, T]) bool { return c.posts.at != 0 && !c.is(fPostsRun) })
	w.ticketsDue = rebuilt(w.ticketsDue, w.sweptTickets, w.sweepAdds, ticketDueLess[K, T], func(x *ticketWatch[K, T]) bool { return x.at != 0 })
}

// rebuilt returns idx without its swept elements, those not kept: idx as
// it is if none was swept, emptied if every element was and none added
// (an element swept and added again may have replaced itself, leaving the
// count of elements no guide), else a new index of the kept ones.
func rebuilt[E any](idx *btree.BTreeG[E], swept, adds int, less btree.LessFunc[E], kept func(E) bool) *btree.BTreeG[E] {
	switch {
	case swept == 0:
		return idx
	case swept == idx.Len() && adds == 0:
		idx.Clear(false)
		return idx
	}
	left := btree.NewG(btreeDegree, less)
	idx.Ascend(func(e E) bool { // walks every node, whatever their keys
		if kept(e) {
			left.ReplaceOrInsert(e)
		}
		return true
	})
	return left
}

// earliest returns the earliest waiter in the deadline indexes: a call's
// posts aggregate (c) or a ticket's watch (x), the other nil; both nil if
// the indexes are empty. At equal times the posts come first.
func (w *waiters[K, T]) earliest() (c *call[K, T], x *ticketWatch[K, T]) {
	pc, okc := w.postsDue.min()
	tx, okt := w.ticketsDue.Min()
	switch {
	case okc && (!okt || pc.posts.at <= tx.at):
		return pc, nil
	case okt:
		return nil, tx
	}
	return nil, nil
}

// anyDue reports whether the deadline indexes hold anything: a worker
// asks before it expires what is due (expireDue), which the usual backlog,
// without deadlines, never needs.
func (w *waiters[K, T]) anyDue() bool { return w.postsDue.Len()+w.ticketsDue.Len() > 0 }

// nextDue returns the earliest time in the deadline indexes, if any.
func (w *waiters[K, T]) nextDue() (int64, bool) {
	c, x := w.earliest()
	switch {
	case c != nil:
		return c.posts.at, true
	case x != nil:
		return x.at, true
	}
	return 0, false
}

// popDue removes the earliest waiter in the deadline indexes if its
// indexed time is at or before now, and returns it: a call's posts
// aggregate (c), or a ticket (t). Both are nil if none is due.
func (w *waiters[K, T]) popDue(now int64) (c *call[K, T], t *Ticket[K, T]) {
	c, x := w.earliest()
	switch {
	case c != nil && c.posts.at <= now:
		w.postsDue.removeMin(c)
		c.posts.at = 0
		return c, nil
	case x != nil && x.at <= now:
		w.ticketsDue.DeleteMin()
		x.at = 0
		return nil, x.t
	}
	return nil, nil
}
