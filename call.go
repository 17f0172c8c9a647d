package dispatch

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"time"

	"github.com/coalescer/dispatch/internal/band"
)

// This file is a call's own data — the per-key lane, the calls in it,
// their waiters, their place in the ready order — and every move between
// a call's states. Nothing here is a Dispatcher method: the Dispatcher's
// lock guards all of it.
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
//	csReady → csTaken              queue.popFrom: a worker takes it; runInlineUnlock:
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
// The package's tests turn it on (call_test.go); a production
// build skips the table lookup on this hot path, trusting the tests.
var checkTransitions bool

// onTransition, if set (by a test), sees every move.
var onTransition func(from, to callState)

// enter moves c to state s: the one place a call's state changes. It is
// small enough to be inlined (an execution enters three states under the
// lock); the check is a call of its own.
func (c *call[K, T]) enter(s callState) {
	if checkTransitions {
		c.checkEnter(s)
	}
	c.state = s
}

// checkEnter is enter's check, when checkTransitions is set.
func (c *call[K, T]) checkEnter(s callState) {
	if transitions[c.state]&(1<<s) == 0 {
		// Under the lock: crash, so the bug ends the test run loudly
		// rather than hang it.
		crash(fmt.Sprintf("a call moved %v → %v, which its lifecycle forbids", c.state, s))
	}
	if onTransition != nil {
		onTransition(c.state, s)
	}
}

// lane is the state of one key. The first call lives inside the lane, so
// tracking a new key costs at most an eighth of an allocation (lanePool),
// none when a released lane is reused.
type lane[K comparable, T any] struct {
	key     K
	gen     uint64 // newest generation seen for the key
	hash    uint64 // key's hash, for d.lanes
	running *call[K, T]
	pending *call[K, T]
	first   call[K, T]
}

// freshCall returns a zeroed call: the lane's own cell if it is free, else
// a new one — only a successor behind a running call needs that allocation.
func (l *lane[K, T]) freshCall() *call[K, T] {
	c := &l.first
	if c == l.running || c == l.pending {
		c = new(call[K, T])
	}
	*c = call[K, T]{lane: l}
	return c
}

// call is one logical operation on a key: the merge of every submission
// that coalesced into it. The fields a coalescing Post touches come first,
// so that it reads as few cache lines as possible.
type call[K comparable, T any] struct {
	lane  *lane[K, T]
	val   T
	state callState
	flags callFlags
	// endState is set (never 0) when a running call loses its last waiter:
	// how they left. The call is then orphaned: its execution's result is
	// reported Stale, never as success.
	endState State
	// run is the number of the FIFO run holding it, if ready in one: its
	// tenant's ready index's runs[run-1] (ready.go); 0 if none.
	run uint8
	// nForever counts its tickets without a deadline. Each is an object of
	// its own, so 2³² of them would not fit in memory.
	nForever uint32
	prio     int    // effective priority: max over live waiters
	enq      int64  // effective enqueue time: min over live waiters
	seq      uint64 // arrival order: FIFO among equals
	// nPosts counts its fire-and-forget submissions and joined the
	// submissions it served (Result.Waiters), 32 bits each: the rare part
	// carries what passes 2³²−1 (split32). Neither is 0 while its count
	// is not.
	nPosts uint32
	joined uint32
	posts  postsWaiter // every fire-and-forget submission, as one waiter

	tag *callTag[K, T] // its tenant and label
	// pos is where it waits, by its state: while csReady in a FIFO run,
	// its position in the run; while csDelayed, the time before which it
	// may not run (notBefore), its key in the delay index. No call is in
	// both, so one word serves both.
	pos int64
	// one is its lone live ticket. Once a second joins, all of them wait
	// in ticket lists instead (lists): a lone ticket needs no lists, nor a
	// share.
	one *Ticket[K, T]

	// exec is its running or last execution, nil before the first: what
	// only a call that has started needs lives there (execution).
	exec *execution
	// rare holds what few calls have (callRare). It is made on first use
	// and dropped with the call.
	rare *callRare[K, T]
}

// notBefore is the time before which c, delayed, may not run (call.pos).
func (c *call[K, T]) notBefore() int64 { return c.pos }

// callFlags are a call's yes-or-no facts, a bit each, so that they share
// a word with its state and tallies.
type callFlags uint8

const (
	// fDroppable is set while every submission in the call was droppable.
	fDroppable callFlags = 1 << iota
	fVictim              // in the queue's victims index
	// fPostsForever is set when a fire-and-forget submission had no
	// deadline: the posts aggregate then never expires.
	fPostsForever
	fProbe // admitted by a half-open breaker
	// fCheckProbe is set when the start check would have refused it and
	// let it start to learn whether the server sped up (internal/startcheck).
	fCheckProbe
	fLow // running on a worker below the reservation's priority
	// fPostsApart is set while the priority and enqueue time of the posts
	// aggregate are kept in rare, apart from the call's own (postsOrder).
	fPostsApart
	// fPostsRun is set while the posts aggregate is indexed in the run of
	// the deadline index rather than its B-tree (postsDue).
	fPostsRun
)

// is reports whether c has flag f.
func (c *call[K, T]) is(f callFlags) bool { return c.flags&f != 0 }

// mark sets c's flag f to on.
func (c *call[K, T]) mark(f callFlags, on bool) {
	if on {
		c.flags |= f
	} else {
		c.flags &^= f
	}
}

// callRare is the part of a call that few calls need (call.rare): a call
// that needs none of it — one that only posts, or only one ticket waits
// on — holds one word for it (80 bytes, TestLaneSizeDoc), and a call that
// needs one of them pays one allocation for them all.
type callRare[K comparable, T any] struct {
	idem    string
	lastErr error // set while the call waits to be retried
	// lists holds the live tickets once a second one joins (call.one).
	lists *ticketLists[K, T]
	// postsPrio and postsEnq are the posts aggregate's priority and
	// enqueue time while fPostsApart is set: while the posts wait alone,
	// the call's own priority and enqueue time are theirs.
	postsPrio int
	postsEnq  int64
	// amends counts the Amends that rewrote the call, so that one can tell
	// whether another rewrote it while its no-op test ran (amendMark);
	// counted only with Config.NoOp, the one thing that asks.
	amends uint64
	// morePosts and moreJoined are the parts of call.nPosts and
	// call.joined that passed 32 bits (split32).
	morePosts, moreJoined int
}

// rareOf returns c's rare part, making it on first use.
func (c *call[K, T]) rareOf() *callRare[K, T] {
	if c.rare == nil {
		c.rare = new(callRare[K, T])
	}
	return c.rare
}

// lists returns c's ticket lists, or nil while it has at most one ticket.
func (c *call[K, T]) lists() *ticketLists[K, T] {
	if c.rare == nil {
		return nil
	}
	return c.rare.lists
}

// postsOrder returns the priority and enqueue time of c's posts aggregate
// (meaningful while c.nPosts > 0). While the posts are c's only waiters
// they are c's own priority and enqueue time, so the aggregate keeps no
// copy; once a ticket joins them they are kept apart (separatePosts).
func (c *call[K, T]) postsOrder() (int, int64) {
	if c.is(fPostsApart) {
		return c.rare.postsPrio, c.rare.postsEnq
	}
	return c.prio, c.enq
}

// separatePosts keeps the posts aggregate's priority and enqueue time apart
// from c's own, before a ticket joins posts that waited alone: from then on
// a waiter's arrival or departure moves c's own, and the aggregate's must
// stay as they were.
func (c *call[K, T]) separatePosts() {
	if c.nPosts > 0 && !c.is(fPostsApart) {
		c.postsApart(c.prio, c.enq)
	}
}

// postsApart keeps prio and enq as the posts aggregate's priority and
// enqueue time, apart from c's own.
func (c *call[K, T]) postsApart(prio int, enq int64) {
	r := c.rareOf()
	r.postsPrio, r.postsEnq = prio, enq
	c.mark(fPostsApart, true)
}

// idem returns c's idempotency key, or "".
func (c *call[K, T]) idem() string {
	if c.rare == nil {
		return ""
	}
	return c.rare.idem
}

// setIdem sets c's idempotency key; an empty one makes nothing.
func (c *call[K, T]) setIdem(idem string) {
	if c.rare != nil || idem != "" {
		c.rareOf().idem = idem
	}
}

// lastErr returns the error of c's last attempt while c waits to be
// retried, or nil.
func (c *call[K, T]) lastErr() error {
	if c.rare == nil {
		return nil
	}
	return c.rare.lastErr
}

// setLastErr sets the error lastErr returns; nil makes nothing.
func (c *call[K, T]) setLastErr(err error) {
	if c.rare != nil || err != nil {
		c.rareOf().lastErr = err
	}
}

// attempts is the number of executions c has made.
func (c *call[K, T]) attempts() int {
	if c.exec == nil {
		return 0
	}
	return c.exec.attempts
}

// orphaned reports whether c, running, lost its last waiter (endState).
func (c *call[K, T]) orphaned() bool { return c.endState != 0 }

// waited reports whether any waiter of c is live.
func (c *call[K, T]) waited() bool { return c.nPosts > 0 || c.tickets() > 0 }

// split32 adds n ≥ 0 to the count lo kept in 32 bits. Past 2³²−1 it keeps
// 2³¹ in 32 bits, so that they stay non-zero, and returns the rest to
// carry into the call's rare part. A count gets there only after 2³¹
// submissions coalesced into one call, so the hot path pays one compare.
func split32(lo uint32, n int) (uint32, int) {
	v := uint64(lo) + uint64(n)
	if v <= math.MaxUint32 {
		return uint32(v), 0
	}
	return 1 << 31, int(v - 1<<31)
}

// countPosts adds n fire-and-forget submissions to c's count of them.
func (c *call[K, T]) countPosts(n int) {
	var more int
	if c.nPosts, more = split32(c.nPosts, n); more != 0 {
		c.rareOf().morePosts += more
	}
}

// uncountPosts sets c's count of fire-and-forget submissions to 0, and
// clears the flags of their aggregate: fPostsForever and fPostsApart are
// set only while c has posts.
func (c *call[K, T]) uncountPosts() {
	c.nPosts = 0
	c.mark(fPostsForever|fPostsApart, false)
	if r := c.rare; r != nil {
		r.morePosts = 0
	}
}

// countJoined adds n submissions to those c served.
func (c *call[K, T]) countJoined(n int) {
	var more int
	if c.joined, more = split32(c.joined, n); more != 0 {
		c.rareOf().moreJoined += more
	}
}

// postCount returns how many fire-and-forget submissions c holds.
func (c *call[K, T]) postCount() int {
	n := int(c.nPosts)
	if r := c.rare; r != nil {
		n += r.morePosts
	}
	return n
}

// joinedCount returns how many submissions c served.
func (c *call[K, T]) joinedCount() int {
	n := int(c.joined)
	if r := c.rare; r != nil {
		n += r.moreJoined
	}
	return n
}

// tickets counts c's live tickets.
func (c *call[K, T]) tickets() int {
	n := 0
	if c.one != nil {
		n = 1
	}
	if tl := c.lists(); tl != nil {
		n += len(tl.visit) + len(tl.riders)
	}
	return n
}

// eachTicket calls f for every live ticket of c.
func (c *call[K, T]) eachTicket(f func(*Ticket[K, T])) {
	if c.one != nil {
		f(c.one)
	}
	if tl := c.lists(); tl != nil {
		for _, t := range tl.visit {
			f(t)
		}
		for _, t := range tl.riders {
			f(t)
		}
	}
}

// execDeadline is the latest deadline among c's live waiters, or 0 if any
// of them has none.
func (c *call[K, T]) execDeadline() int64 {
	if c.nForever > 0 {
		return 0 // without walking the tickets, whose memory is cold
	}
	var dl int64
	if c.nPosts > 0 {
		if c.is(fPostsForever) {
			return 0
		}
		dl = c.posts.deadline
	}
	c.eachTicket(func(t *Ticket[K, T]) { dl = max(dl, t.deadline()) }) // none is 0: nForever counts those
	return dl
}

// event describes c for the observer.
func (c *call[K, T]) event() Event {
	return Event{Label: c.tag.label, Tenant: c.tag.ten.name}
}

// result is what a waiter or the completion hook is told about c.
func (c *call[K, T]) result(st State, err error, now int64) Result[K, T] {
	wait := now - c.enq
	var tl sofar
	if c.exec != nil {
		tl = c.exec.sofar
		if tl.firstStart >= 0 {
			wait = tl.firstStart - c.enq
		}
	}
	return Result[K, T]{Key: c.lane.key, Call: c.val, Outcome: Outcome{
		State:     st,
		Err:       err,
		Attempts:  tl.attempts,
		Waiters:   c.joinedCount(),
		QueueWait: time.Duration(max(wait, 0)),
		RunTime:   tl.runTime,
	}}
}

// ticketLists holds the live tickets of a call that has more than one, in
// no order; a ticket's idx is its position in its list. Lists are kept
// for reuse when their call ends (listPool).
type ticketLists[K comparable, T any] struct {
	// riders ride a share (Ticket.share): the call's end does not visit
	// them.
	riders []*Ticket[K, T]
	// visit holds the tickets the call's end visits: those with a deadline
	// or a context watch, and plain ones that joined before the share was
	// made. plain counts the latter.
	visit []*Ticket[K, T]
	plain int
	// share is the outcome the riders share, with any absorbed calls'
	// chained after it, or nil: only a call with lists has one.
	share *share[K, T]
}

// share returns c's share, or nil.
func (c *call[K, T]) share() *share[K, T] {
	if tl := c.lists(); tl != nil {
		return tl.share
	}
	return nil
}

// postsWaiter is the aggregate of a call's fire-and-forget submissions,
// which wait as one waiter: the highest priority, earliest enqueue time
// and latest deadline among them.
type postsWaiter struct {
	// Its priority and enqueue time are the call's, or apart (postsOrder).
	deadline int64 // 0: none
	// at is its call's key in the deadline index of posts (0: not
	// indexed). It may lag behind a deadline that later submissions
	// extended; the clock then re-indexes instead of expiring, which keeps
	// a coalescing Post free of index work.
	at int64
}

// orderKey is a call's place in the ready order, lower first: a 128-bit
// unsigned number, hi then lo, that folds the call's band and its virtual
// time within the band into one (orderer.base). It is exact for every int
// priority, every band width and every aging interval: nothing saturates
// or is narrowed, so a band boundary is where the user put it. It assumes
// only that enqueue times are within ±2⁶² ns (maxEnq), which the
// dispatcher's clock is (146 years after New).
type orderKey struct{ hi, lo uint64 }

func (a orderKey) less(b orderKey) bool {
	if a.hi != b.hi {
		return a.hi < b.hi
	}
	return a.lo < b.lo
}

// plus returns k + d; the caller keeps the sum below 2¹²⁸.
func (k orderKey) plus(d uint64) orderKey {
	lo, carry := bits.Add64(k.lo, d, 0)
	return orderKey{k.hi + carry, lo}
}

// minus returns k − d; the caller keeps it non-negative.
func (k orderKey) minus(d uint64) orderKey {
	lo, borrow := bits.Sub64(k.lo, d, 0)
	return orderKey{k.hi - borrow, lo}
}

// maxEnq bounds the enqueue times an order is computed for: |enq| ≤ maxEnq.
const maxEnq = 1 << 62

// sinceMinEnq is enq's distance from −maxEnq, exact in [0, 2⁶³].
func sinceMinEnq(enq int64) uint64 { return uint64(enq) + maxEnq }

// orderer computes ready orders: a call's band first, higher bands first,
// then its virtual time within the band, enq − off×aging, off being its
// priority's offset in the band, so that a call gains one level per aging
// interval it waits over the calls of its band and never passes a call of
// a higher band. One static key orders calls of every age: nothing is
// re-sorted as time passes. A call's order is not kept in the call: it is
// computed from its effective priority and enqueue time, which change only
// as the call is re-keyed (queue.rekey), so an index finds the entry it
// holds again.
//
// Virtual time needs up to 127 bits (off and aging each up to 2⁶³), and the
// band 64, but not both at once: a band of width w leaves 2⁶⁴/w bands, so
// the key is (top − band)×span + (virtual time − its least), span being
// the virtual times one band holds, which fits in 128 bits for every width
// and aging.
type orderer struct {
	band, aging int64
	top         int64    // the highest band, MaxInt64 / band
	span        orderKey // (band − 1)×aging + 2⁶³ + 1: virtual times in a band
}

func newOrderer(width, aging int64) orderer {
	hi, lo := bits.Mul64(uint64(width-1), uint64(aging))
	return orderer{
		band: width, aging: aging,
		top:  math.MaxInt64 / width,
		span: orderKey{hi, lo}.plus(1<<63 + 1),
	}
}

// base returns the order of a call of priority prio enqueued at −maxEnq;
// the order at enq is base(prio).plus(sinceMinEnq(enq)).
func (o orderer) base(prio int) orderKey {
	b, off := band.Of(int64(prio), o.band)
	down := uint64(o.top) - uint64(b) // bands above b's, < 2⁶⁴
	hi, lo := bits.Mul64(down, o.span.lo)
	hi += down * o.span.hi
	// The levels the priority is below the band's top one, in virtual
	// time: a lower offset runs later, as a later arrival does.
	lhi, llo := bits.Mul64(uint64(o.band-1-off), uint64(o.aging))
	lo, carry := bits.Add64(lo, llo, 0)
	return orderKey{hi + lhi + carry, lo}
}

// of computes the ready order of a call with effective priority prio and
// enqueue time enq.
func (o orderer) of(prio int, enq int64) orderKey {
	return o.base(prio).plus(sinceMinEnq(enq))
}

// entry is a call's place in a ready-ordered index (a tenant's ready index,
// or a victims index). The order is held in the entry itself, so that a B-tree
// search compares within its nodes and never follows a pointer to a call:
// at depth, that is the difference between reading a node's cache lines and
// missing the cache once per comparison.
type entry[K comparable, T any] struct {
	order orderKey
	seq   uint64
	c     *call[K, T]
}

// entryOf returns c's entry in a ready-ordered index.
func entryOf[K comparable, T any](o orderer, c *call[K, T]) entry[K, T] {
	return entry[K, T]{o.of(c.prio, c.enq), c.seq, c}
}

// deadline returns t's deadline on the dispatcher's clock, 0 if none.
func (t *Ticket[K, T]) deadline() int64 {
	if t.x == nil {
		return 0
	}
	return t.x.deadline
}

// ended reports, under d.mu, whether t's outcome is recorded: settled on
// its own, or through the share it rides.
func (t *Ticket[K, T]) ended() bool {
	return t.state == tsDone || t.share != nil && t.share.ended
}

// watched reports whether t must be visited when its call ends: it has a
// deadline to take out of the deadline index, or a context to stop
// watching. Such a ticket never rides a share.
func (t *Ticket[K, T]) watched() bool { return t.x != nil }

func readyLess[K comparable, T any](a, b entry[K, T]) bool {
	if a.order != b.order {
		return a.order.less(b.order)
	}
	return a.seq < b.seq
}
