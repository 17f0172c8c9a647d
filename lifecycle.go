package dispatch

import (
	"errors"

	"fmt"
	"github.com/coalescer/dispatch/internal/execctx"
	"strconv"
	"time"
)

// This file is a call's lifecycle: the per-key lane, the calls in it, their
// waiters, and every move between states. Everything here runs under the
// dispatcher's lock.
//
// A lane holds at most two calls: the one running and the one pending.
// Every state change of a call goes through enter, which holds it to the
// table below (transitions); tests run with the check on, so a move the
// table does not list is a bug that fails them.
//
//	state        lane pointer  where the call waits
//	csNew        —             nowhere: being admitted
//	csReady      pending       the ready index (queue.go)
//	csDelayed    pending       the delay index, until its retry backoff ends
//	csBehind     pending       nowhere: behind lane.running, its successor
//	csTaken      either        nowhere, still counted queued: taken from the
//	                           ready index to start (popFrom → begin), or
//	                           on its way back after an attempt (requeue)
//	csRunning    running       in a worker, or in a Sync-mode caller
//	csEnded      running       nowhere: its attempt ended, the verdict follows
//	csFinished   —             gone: told, counted, off the lane
//
// One exception: a retry whose merge with the successor that arrived during
// its attempt was refused waits csReady or csDelayed while it stays
// lane.running, so that the successor keeps waiting behind it.
//
// The moves, and where they happen:
//
//	csNew → csReady                admit (admit.go): a free lane
//	csNew → csBehind               admit: the key's call is running
//	csBehind → csReady             promote: the running call finished
//	csReady → csTaken              queue.popFrom: a worker takes it; runInline:
//	                               a Sync-mode caller
//	csTaken → csRunning            begin (worker.go)
//	csRunning → csEnded            endAttempt (worker.go)
//	csEnded → csTaken              requeue (retry.go): a retry, or a worker
//	                               that exited before the attempt began
//	csTaken → csReady/csDelayed    place (retry.go): back in the queue
//	csDelayed → csReady            queue.promote, when the backoff ends
//	csReady → csReady              re-indexed: adopt (coalesce.go) moved it
//	csDelayed → csDelayed            to another tenant
//	csDelayed → csReady            restart (coalesce.go): ReplacePending
//	                               dropped its backoff
//	any but csRunning → csFinished finish; a running call loses its waiters
//	                               by being orphaned (its context cancelled)
//	                               and finishes when its exec returns
//
// Three verbs end things:
//
//   - settle: one waiter — a ticket, or the aggregate of a call's posts —
//     gets its outcome and leaves its call.
//   - finish: a call whose waiters are gone ends: it leaves the lane and
//     the indexes, is counted and reported to the completion hook and the
//     observer, and its successor becomes ready.
//   - release: a lane with no call left is forgotten, and kept for reuse.
//
// What they tell (tickets, hooks, observer events) goes into an outbox,
// delivered once the lock is released (deliver.go).

// callState says where a call is; see the table above.
type callState uint8

const (
	csNew callState = iota
	csBehind
	csReady
	csDelayed
	csTaken
	csRunning
	csEnded
	csFinished
	nCallStates
)

var callStateNames = [nCallStates]string{"new", "behind", "ready", "delayed", "taken", "running", "ended", "finished"}

func (s callState) String() string {
	if s < nCallStates {
		return callStateNames[s]
	}
	return "callState(" + strconv.Itoa(int(s)) + ")"
}

// transitions is the lifecycle: transitions[from] has bit 1<<to set for
// each move the table above lists.
var transitions = [nCallStates]uint16{
	csNew:      1<<csReady | 1<<csBehind,
	csBehind:   1<<csReady | 1<<csFinished,
	csReady:    1<<csTaken | 1<<csReady | 1<<csFinished,
	csDelayed:  1<<csReady | 1<<csDelayed | 1<<csFinished,
	csTaken:    1<<csRunning | 1<<csReady | 1<<csDelayed | 1<<csFinished,
	csRunning:  1 << csEnded,
	csEnded:    1<<csTaken | 1<<csFinished,
	csFinished: 0,
}

// checkTransitions makes enter crash the process (crash, deliver.go) on a
// move transitions does not list.
// The package's tests turn it on (lifecycle_check_test.go); a production
// build skips the table lookup on this hot path, trusting the tests.
var checkTransitions bool

// onTransition, if set (by a test), sees every move.
var onTransition func(from, to callState)

// enter moves c to state s: the one place a call's state changes.
func (c *call[K, T]) enter(s callState) {
	if checkTransitions {
		if transitions[c.state]&(1<<s) == 0 {
			// Under the lock: crash, so the bug ends the test run loudly
			// rather than hang it.
			crash(fmt.Sprintf("a call moved %v → %v, which its lifecycle forbids", c.state, s))
		}
		if onTransition != nil {
			onTransition(c.state, s)
		}
	}
	c.state = s
}

// lane is the state of one key. The first call lives inside the lane, so
// tracking a new key costs at most an eighth of an allocation (laneSlab),
// none when a released lane is reused.
type lane[K comparable, T any] struct {
	key     K
	gen     uint64 // newest generation seen for the key
	hash    uint64 // key's hash, for d.lanes
	tracked bool   // d.lanes maps key to this lane
	running *call[K, T]
	pending *call[K, T]
	first   call[K, T]
}

// newCall returns a zeroed call: the lane's own cell if it is free, else a
// new one — only a successor behind a running call needs that allocation.
func (l *lane[K, T]) newCall() *call[K, T] {
	c := &l.first
	if c == l.running || c == l.pending {
		c = new(call[K, T])
	}
	*c = call[K, T]{lane: l, firstStart: -1}
	c.posts.c = c
	return c
}

// call is one logical operation on a key: the merge of every submission
// that coalesced into it. The fields a coalescing Post touches come first,
// so that it reads as few cache lines as possible.
type call[K comparable, T any] struct {
	lane  *lane[K, T]
	val   T
	state callState
	// droppable is set while every submission in the call was droppable.
	droppable bool
	inShed    bool // in the queue's shed index
	// postsForever is set when a fire-and-forget submission had no
	// deadline: the posts aggregate then never expires.
	postsForever bool
	// orphan is set when a running call loses its last waiter; its
	// execution's result is then reported Stale, never as success.
	orphan bool
	probe  bool // admitted by a half-open breaker
	// checkProbe is set when the start check would have refused it and let
	// it start to learn whether the server sped up (internal/startcheck).
	checkProbe bool
	low        bool         // running on a worker below the reservation's priority
	endState   State        // why it was orphaned
	prio       int          // effective priority: max over live waiters
	enq        int64        // effective enqueue time: min over live waiters
	nForever   int          // tickets without a deadline
	nPosts     int          // fire-and-forget submissions
	joined     int          // submissions served, for Result.Waiters
	posts      waiter[K, T] // every fire-and-forget submission, as one waiter

	runner    uint64 // goroutine id of its last execution
	idem      string
	seq       uint64 // arrival order: FIFO among equals
	rev       uint64 // bumped by every merge and Amend, so Amend can tell the value changed
	ten       *tenant[K, T]
	label     string         // Config.Label's label, for the observer and Stats.Labels
	order     orderKey       // its place in the ready order (queue.go)
	run       *fifoRun[K, T] // the FIFO run holding it, if ready in one (ready.go)
	runPos    int            // its position in that run
	notBefore int64          // its place in the delay index
	// The live tickets: the first in one, or all of them in more once a
	// second joins (a lone ticket needs no lists). share is the outcome
	// its riders share, with any absorbed calls' chained after it.
	one   *Ticket[K, T]
	more  *ticketLists[K, T]
	share *share[K, T]

	attempts   int
	firstStart int64 // -1 until the first execution
	runTime    time.Duration
	ctx        *execctx.Ctx // its running attempt's context
	lastErr    error        // set while the call waits to be retried
}

func (c *call[K, T]) live() int { return c.tickets() + c.nPosts }

// tickets counts c's live tickets.
func (c *call[K, T]) tickets() int {
	n := 0
	if c.one != nil {
		n = 1
	}
	if tl := c.more; tl != nil {
		n += len(tl.visit) + len(tl.riders)
	}
	return n
}

// ticketLists holds the live tickets of a call that has more than one, in
// no order; a ticket's idx is its position in its list. Lists are kept
// for reuse when their call ends (keepLists).
type ticketLists[K comparable, T any] struct {
	// riders ride a share (Ticket.share): the call's end does not visit
	// them.
	riders []*Ticket[K, T]
	// visit holds the tickets the call's end visits: those with a deadline
	// or a context watch, and plain ones that joined before the share was
	// made. plain counts the latter.
	visit []*Ticket[K, T]
	plain int
}

// waiter is one Ticket, or the aggregate of a call's fire-and-forget
// submissions (t == nil).
type waiter[K comparable, T any] struct {
	prio     int
	enq      int64
	deadline int64 // 0: none
	// at is the waiter's key in the deadline index (0: not indexed). For a
	// ticket it equals deadline. For the posts aggregate it may lag behind a
	// deadline that later submissions extended; the clock then re-indexes
	// instead of expiring, which keeps a coalescing Post free of index work.
	at   int64
	dseq uint64
	c    *call[K, T]   // the posts aggregate's call (a ticket's is t.c)
	t    *Ticket[K, T] // the ticket, or nil for the posts aggregate
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

// settle gives ticket t the outcome st and takes it off its call c. The
// caller then finishes c if it has no waiter left, or reprioritizes it.
func (d *Dispatcher[K, T]) settle(t *Ticket[K, T], c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	d.detach(t)
	d.told(t, ob.newResult(d.result(c, st, err, now)), ob)
}

// told records ticket t's outcome r, taken off its call, for ob to tell. r
// is not changed afterwards; tickets told the same outcome share it.
func (d *Dispatcher[K, T]) told(t *Ticket[K, T], r *Result[K, T], ob *outbox[K, T]) {
	t.r = r
	t.state = tsDone
	d.totals.outcomes[r.State]++
	ob.tickets = append(ob.tickets, t)
}

// settleAll settles every waiter of c with st (see lateness). It reports
// whether any waiter got st. The result is built once. Riders are not
// visited: their share records the outcome for them all, so that the work
// under the lock does not grow with them. Only the other tickets — those
// with a deadline or a context, and the few plain ones that joined before
// the share was made — are visited.
func (d *Dispatcher[K, T]) settleAll(c *call[K, T], st State, err error, now int64, late lateness, ob *outbox[K, T]) bool {
	served := false
	n := c.tickets()
	var res Result[K, T]
	if n > 0 {
		res = d.result(c, st, err, now)
	}
	// The visited tickets told res share one copy of it: the share's, if
	// the call has one, else one made for the first of them (a worker's
	// was made before it took the lock: outbox.stock). Those that expired
	// late share another.
	var onTime, expired *Result[K, T]
	for s := c.share; s != nil; s = s.next {
		s.res, s.ended = res, true
		ob.shares = append(ob.shares, s)
		if onTime == nil {
			onTime = &s.res
		}
	}
	c.share = nil
	visit := func(t *Ticket[K, T]) {
		t.c = nil
		d.unindex(t)
		if dl := t.deadline(); late == expireLate && dl != 0 && dl <= now {
			if expired == nil {
				expired = ob.newResult(d.result(c, StateExpired, ErrExpired, now))
			}
			d.told(t, expired, ob)
			return
		}
		served = true
		if onTime == nil {
			onTime = ob.newResult(res)
		}
		d.told(t, onTime, ob)
	}
	if c.one != nil {
		visit(c.one)
		c.one = nil
	}
	if tl := c.more; tl != nil {
		if len(tl.riders) > 0 {
			served = true
			d.totals.outcomes[st] += uint64(len(tl.riders))
		}
		for _, t := range tl.visit {
			visit(t)
		}
		d.keepLists(c)
	}
	d.liveTickets -= n
	c.nForever = 0
	if c.nPosts > 0 {
		pst := st
		if late == expireLate && !c.postsForever && c.posts.deadline <= now {
			pst = StateExpired
		} else {
			served = true
		}
		d.settlePosts(c, pst)
	}
	return served
}

// settlePosts gives every fire-and-forget submission of c the outcome st.
// Nobody is told: their outcome reaches Stats, and the completion hook when
// the call finishes.
func (d *Dispatcher[K, T]) settlePosts(c *call[K, T], st State) {
	d.totals.outcomes[st] += uint64(c.nPosts)
	d.livePosts -= c.nPosts
	c.nPosts, c.postsForever = 0, false
	d.q.removeDeadline(&c.posts)
}

// leave ends ticket t alone with st: its ticket was cancelled, its context
// ended, or its deadline passed. If it was its call's last waiter, the call
// finishes. It takes the lock itself.
func (d *Dispatcher[K, T]) leave(t *Ticket[K, T], st State, err error) {
	var ob outbox[K, T]
	d.mu.Lock()
	switch {
	case t.state == tsNew: // Submit has not admitted it yet; it will see this and refuse
		t.state = tsDone
	case !t.ended():
		d.leaveLocked(t, st, err, d.now(), &ob)
	}
	d.mu.Unlock()
	d.deliver(&ob)
}

func (d *Dispatcher[K, T]) leaveLocked(t *Ticket[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	c := t.c
	d.settle(t, c, st, err, now, ob)
	if c.live() == 0 {
		d.finish(c, st, err, now, ob)
		return
	}
	d.reprioritize(c)
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
		if !c.orphan {
			c.orphan, c.endState = true, st
			c.ctx.Cancel(err, errors.Is(err, ErrExpired))
		}
		return
	case csEnded: // its attempt has already left the tenant's counts
	default:
		d.q.remove(c)
		c.ten.queued--
	}
	c.enter(csFinished)
	// Its ticket lists, if its tickets left one by one, are empty: keep
	// them for reuse, as settleAll does.
	d.keepLists(c)
	d.report(c, st, err, now, ob)
	d.forgetIdle(c.ten)
	l := c.lane
	if l.pending == c {
		l.pending = nil
	} else {
		l.running = nil
		d.promote(l)
	}
	d.release(l)
	d.kick()
}

// promote makes the successor of l's finished call ready, with the enqueue
// time it had when it arrived.
func (d *Dispatcher[K, T]) promote(l *lane[K, T]) {
	if n := l.pending; n != nil && n.state == csBehind {
		d.q.push(n)
		d.wakeWorker()
	}
}

// report counts a finished call and queues its completion hook and
// observer event.
func (d *Dispatcher[K, T]) report(c *call[K, T], st State, err error, now int64, ob *outbox[K, T]) {
	d.untrack(c)
	d.totals.calls[st]++
	if d.fallback != nil {
		d.fallback.Finished(now, st == StateFailed)
	}
	if d.cfg.OnDone == nil && d.cfg.Observer == nil {
		return
	}
	r := d.result(c, st, err, now)
	if d.cfg.OnDone != nil {
		ob.hooks = append(ob.hooks, r)
	}
	if obs := d.cfg.Observer; obs != nil {
		e, o := c.event(), r.Outcome
		ob.notes = append(ob.notes, func() { obs.OnFinish(e, o) })
	}
}

// untrack drops a call that is gone from the live counts.
func (d *Dispatcher[K, T]) untrack(c *call[K, T]) {
	d.liveCalls--
	if d.labels != nil {
		if d.labels[c.label]--; d.labels[c.label] == 0 {
			delete(d.labels, c.label)
		}
	}
}

// maxFreeLanes bounds the free list of released lanes. Reusing a lane
// spares a new key its one allocation (and the garbage collector the work
// of freeing it), so that a dispatcher whose keys come and go allocates
// nothing per key in the steady state. The bound caps what a burst of
// finished keys leaves behind at 4096 lanes: about 1.7 MB with small keys
// and values (a lane is 416 bytes with string keys and int values, more
// for a large K or T).
const maxFreeLanes = 4096

// maxFreeLists and maxFreeListCap bound the ticket lists kept for reuse:
// a call that gathers many tickets grows its lists by doubling, and a key
// that is hot again and again would allocate that growth each time.
const (
	maxFreeLists   = 64
	maxFreeListCap = 4096
)

// keepLists takes c's ticket lists, cleared, and keeps them for a later
// call unless enough are kept already; a list grown beyond
// maxFreeListCap is dropped.
func (d *Dispatcher[K, T]) keepLists(c *call[K, T]) {
	tl := c.more
	if tl == nil {
		return
	}
	c.more = nil
	if len(d.freeLists) >= maxFreeLists {
		return
	}
	tl.riders = reuse(tl.riders)
	tl.visit = reuse(tl.visit)
	tl.plain = 0
	d.freeLists = append(d.freeLists, tl)
}

// reuse clears l for reuse, or drops it if it is too large to keep.
func reuse[K comparable, T any](l []*Ticket[K, T]) []*Ticket[K, T] {
	if cap(l) > maxFreeListCap {
		return nil
	}
	clear(l)
	return l[:0]
}

// popFree takes the last entry off a free list, or returns nil if it is
// empty.
func popFree[E any](free *[]*E) *E {
	n := len(*free)
	if n == 0 {
		return nil
	}
	e := (*free)[n-1]
	(*free)[n-1] = nil
	*free = (*free)[:n-1]
	return e
}

// newLane returns a lane for key, tracked under it: reused from the free
// list if it can be, else carved from the current slab.
func (d *Dispatcher[K, T]) newLane(key K, h uint64, gen uint64) *lane[K, T] {
	l := popFree(&d.freeLanes)
	if l == nil {
		if len(d.laneSlab) == 0 {
			d.laneSlab = make([]lane[K, T], laneSlab)
		}
		l = &d.laneSlab[0]
		d.laneSlab = d.laneSlab[1:]
	}
	l.key, l.hash, l.gen, l.tracked = key, h, gen, true
	d.lanes.put(l)
	return l
}

// laneSlab is how many lanes one allocation makes when the free list is
// empty: new keys then cost an eighth of an allocation each. A slab's
// memory is freed when none of its lanes is in use or on the free list,
// so a few long-lived keys can hold up to 8× their own lanes' memory.
const laneSlab = 8

// release forgets l's key if l has no call left, and keeps l for reuse.
// Nothing refers to a released lane or its calls by then: every waiter has
// been settled, every index has let go of its calls, and no execution runs
// one.
func (d *Dispatcher[K, T]) release(l *lane[K, T]) {
	if l.running != nil || l.pending != nil || !l.tracked {
		return
	}
	d.lanes.del(l) // no hashing: the lane keeps its key's hash
	l.tracked = false
	if len(d.freeLanes) < maxFreeLanes {
		*l = lane[K, T]{} // let go of the key, the value and the tenant
		d.freeLanes = append(d.freeLanes, l)
	}
	if d.closing && d.lanes.Len() == 0 && !d.drainedClosed {
		d.drainedClosed = true
		close(d.drained)
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
		if c != nil && !c.orphan && (sc == withRunning || c.state != csRunning) {
			ended = true
			d.settleAll(c, st, err, now, onTime, ob)
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
	c.ten.st.Dropped++
	if obs := d.cfg.Observer; obs != nil {
		e := c.event()
		ob.notes = append(ob.notes, func() { obs.OnDrop(e, b) })
	}
	d.settleAll(c, StateDropped, err, now, onTime, ob)
	d.finish(c, StateDropped, err, now, ob)
}

// result is what a waiter or the completion hook is told about c.
func (d *Dispatcher[K, T]) result(c *call[K, T], st State, err error, now int64) Result[K, T] {
	wait := now - c.enq
	if c.firstStart >= 0 {
		wait = c.firstStart - c.enq
	}
	return Result[K, T]{Key: c.lane.key, Call: c.val, Outcome: Outcome{
		State:     st,
		Err:       err,
		Attempts:  c.attempts,
		Waiters:   c.joined,
		QueueWait: time.Duration(max(wait, 0)),
		RunTime:   c.runTime,
	}}
}

// event describes c for the observer.
func (c *call[K, T]) event() Event {
	return Event{Label: c.label, Tenant: c.ten.name}
}
