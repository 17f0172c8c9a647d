package dispatch_test

// The reference model for FuzzQueueModel: the dispatcher's contract with one
// worker, written with plain slices and maps, stepped by the harness
// alongside the real Dispatcher.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/coalescer/dispatch"
)

// Where a model call is.
const (
	fmSucc    = iota // waiting for its key's in-flight call (or just created)
	fmReady          // in the ready set
	fmDelayed        // waiting out a retry backoff
	fmRunning        // in flight
	fmEnded
)

type fmSlot struct {
	key       int
	gen       uint64
	run, next *fmCall
}

// fmTenant is a tenant (TenantConfig) as the model sees it: its quota,
// its stride, and its place in the pick across tenants (queue.pick).
type fmTenant struct {
	name      string
	maxQueued int    // TenantConfig.MaxQueued; 0: none
	stride    uint64 // 2³²/Weight
	pass      uint64 // lowest is picked first among tenants at one level
	active    bool   // has ready calls, and so a place in fzModel.active

	admitted, rejected, dropped uint64
}

type fmCall struct {
	slot      *fmSlot
	ten       *fmTenant
	val       int64
	gen       uint64
	seq       uint64
	idem      string
	droppable bool
	tickets   []*fmTicket
	nff       int
	ffPrio    int
	ffEnq     int64
	ffDL      int64
	ffForever bool
	// ffAt and ffDseq are the fire-and-forget aggregate's entry in the
	// deadline index (0: none): ffAt lags behind ffDL when later posts
	// extended it, and the clock then indexes it anew (a new ffDseq).
	ffAt      int64
	ffDseq    uint64
	prio      int
	enq       int64
	joined    int
	attempts  int
	where     int
	notBefore int64
	retrying  bool // a previous attempt failed and is to be retried
	orphan    bool
	endState  dispatch.State
	probe     bool   // started by a half-open breaker
	label     string // Config.Label's, with labels on
}

func (c *fmCall) live() int { return len(c.tickets) + c.nff }

type fmTicket struct {
	key      int
	call     *fmCall
	prio     int
	enq      int64
	deadline int64
	dseq     uint64 // its entry in the deadline index: order among equal deadlines
	ctxLive  bool   // its context can still be cancelled by the test
	done     bool
	state    dispatch.State
	val      int64
	waiters  int
	attempts int
	class    string // error class, see fzErrClass
	cause    error  // a cause the error must also match
	// With an exec that honours its context, a waiter whose deadline is also
	// the execution's may be settled by the clock (as modelled) or by the
	// worker that saw exec return at the same instant, which counts the
	// attempt and its rebuilt value first. Both are correct.
	hasAlt     bool
	altVal     int64
	altAttempt int
}

type fzStart struct {
	key      int
	val      int64
	deadline int64 // of the execution context; 0: none
}

type fzHookRec struct {
	key      int
	state    dispatch.State
	val      int64
	attempts int
	waiters  int
	class    string
}

func (h fzHookRec) String() string {
	return fmt.Sprintf("{k%d %v val=%d attempts=%d waiters=%d err=%s}", h.key, h.state, h.val, h.attempts, h.waiters, h.class)
}

// fzOutcome is how one execution (or attempt to start one) came out.
type fzOutcome struct {
	ran      bool
	skipped  bool
	done     bool // before-retry hook: already took effect
	hookErr  bool // before-retry hook failed
	result   int  // fzOK, ... when ran
	rebuilt  bool
	val      int64 // the value run, when rebuilt
	ctxEnded bool  // exec returned because its context ended
}

type fzModel struct {
	cfg      fzConfig
	now      int64
	slots    map[int]*fmSlot
	queue    []*fmCall // ready and delayed calls
	running  *fmCall
	runVal   int64 // the value the running attempt executes
	runDL    int64 // the running attempt's context deadline
	runOut   fzOutcome
	seq      uint64
	tickets  int
	liveFF   int
	calls    int
	closing  bool
	stopped  bool
	closeErr error

	submitted, rejected, coalesced, executions, staleExecs, retries, alreadyDone uint64

	// Tenants, and the pick among them: active lists the tenants with
	// ready calls; vpass is the pass of the tenant picked last.
	tenants []*fmTenant
	active  []*fmTenant
	vpass   uint64
	dseq    uint64 // the deadline index's tie-break counter

	refused map[dispatch.Bound]uint64 // Stats.Backpressure
	shedBy  map[dispatch.Bound]uint64 // Stats.Shed

	// notes are the rules the input exercised (fzEv...), in order; the
	// seeds' test checks them.
	notes []string

	br        dispatch.Circuit
	consec    int   // retryable failures in a row
	openUntil int64 // while open
	probes    int   // probes in flight while half-open

	outcomes map[dispatch.State]uint64
	callsBy  map[dispatch.State]uint64
	starts   []fzStart
	hooks    []fzHookRec
}

func newFzModel(cfg fzConfig) *fzModel {
	m := &fzModel{cfg: cfg, slots: map[int]*fmSlot{}, outcomes: map[dispatch.State]uint64{}, callsBy: map[dispatch.State]uint64{},
		refused: map[dispatch.Bound]uint64{}, shedBy: map[dispatch.Bound]uint64{}}
	for st := dispatch.StateSucceeded; st <= dispatch.StateClosed; st++ {
		m.outcomes[st], m.callsBy[st] = 0, 0 // Stats reports every state
	}
	for _, b := range fzBounds {
		m.refused[b], m.shedBy[b] = 0, 0 // and every bound
	}
	n := 1
	if cfg.tenants {
		n = len(fzTenantNames)
	}
	for i := range n {
		t := &fmTenant{name: fzTenantNames[i], stride: 1 << 32}
		if cfg.tenants {
			t.maxQueued, t.stride = cfg.quota[i], (1<<32)/uint64(cfg.weight[i])
		}
		m.tenants = append(m.tenants, t)
	}
	return m
}

var fzBounds = [...]dispatch.Bound{dispatch.BoundCapacity, dispatch.BoundWaiters, dispatch.BoundQuota}

// The rules an input can exercise, as the model notes them.
const (
	fzEvFollowSkip          = "follow: skipped"
	fzEvFollowRefuse        = "follow: refused"
	fzEvFollowPanic         = "follow: panicked"
	fzEvFollowAlone         = "follow: rewritten, the successor"
	fzEvFollowMerged        = "follow: rewritten, merged into the pending call"
	fzEvSupersedeInFlight   = "supersede while in flight: follow not asked"
	fzEvMoot                = "moot: a new key's call skipped"
	fzEvMootPanic           = "moot: panicked"
	fzEvAdoptOutrank        = "adopt: outranked"
	fzEvAdoptReplace        = "adopt: replaced"
	fzEvAdoptOutrankEvict   = "adopt: outranked, quota evicted"
	fzEvAdoptOutrankRefuse  = "adopt: outranked, quota refused"
	fzEvAdoptReplaceEvict   = "adopt: replaced, quota evicted"
	fzEvAdoptReplaceRefuse  = "adopt: replaced, quota refused"
	fzEvQuotaNewEvict       = "quota: a new call evicted"
	fzEvQuotaNewRefuse      = "quota: a new call refused"
	fzEvQuotaRetryEvict     = "quota: a retry evicted"
	fzEvQuotaRetryGiveUp    = "quota: a retry gave up"
	fzEvPickLevel           = "pick: tenants told apart by level"
	fzEvPickPass            = "pick: tenants at one level told apart by pass"
	fzEvPickOrder           = "pick: tenants at one level and pass told apart by their calls' order"
	fzEvCapacityEvict       = "capacity: evicted"
	fzEvAdoptOnRetryAbsorb  = "adopt: a retry absorbed a more urgent successor"
	fzEvAdoptOnRetryReplace = "adopt: a retry replaced by its successor"
)

func (m *fzModel) note(ev string) { m.notes = append(m.notes, ev) }

// fzAll is an error the model expects: one that matches each of its
// errors — errors.Is, or for a *dispatch.BackpressureError its Bound, or
// for fzPanicIn a *dispatch.PanicError of that callback.
type fzAll []error

func (e fzAll) Error() string {
	var s []string
	for _, err := range e {
		s = append(s, err.Error())
	}
	return strings.Join(s, " + ")
}

// fzPanicIn is the *dispatch.PanicError of a callback, as the model
// expects it.
type fzPanicIn string

func (p fzPanicIn) Error() string { return "a panic in " + string(p) }

// refuse is a refusal for bound b, counted.
func (m *fzModel) refuse(b dispatch.Bound) error {
	m.refused[b]++
	return fzAll{dispatch.ErrBackpressure, &dispatch.BackpressureError{Bound: b}}
}

func (m *fzModel) maxWaiters() int {
	if m.cfg.maxWaiters > 0 {
		return m.cfg.maxWaiters
	}
	return m.cfg.capacity * 4 /* Config.MaxWaiters: 0 means 4 × Capacity */
}

func (m *fzModel) noop(v int64) bool { return m.cfg.noop && v%5 == 0 }

// label is the label a submission of value v gives its call.
func (m *fzModel) label(v int64) string {
	if !m.cfg.labels {
		return ""
	}
	return fzLabel(v)
}

// labels counts the live calls by label, as Stats.Labels does; nil without
// labels.
func (m *fzModel) labels() map[string]int {
	if !m.cfg.labels {
		return nil
	}
	n := map[string]int{}
	for _, c := range m.liveCalls() {
		n[c.label]++
	}
	return n
}

// width is the band width: Config.AgingBand, however wide.
func (m *fzModel) width() int64 { return int64(m.cfg.band) }

// aging is the aging interval in ns: Config.Aging, or its default.
func (m *fzModel) aging() int64 {
	if m.cfg.aging == 0 {
		return int64(time.Second)
	}
	return int64(m.cfg.aging)
}

// place is a call's place in the ready order by the contract, with big
// integers, so that it shares nothing with the implementation: its band
// floor(prio / width), and its virtual time within the band, enqueue −
// (prio − band×width)×aging.
func (m *fzModel) place(prio int, enq int64) (band, vt *big.Int) {
	w := big.NewInt(m.width())
	band, off := new(big.Int), new(big.Int)
	band.DivMod(big.NewInt(int64(prio)), w, off) // Euclidean: off ≥ 0
	vt = new(big.Int).Mul(off, big.NewInt(m.aging()))
	return band, vt.Sub(big.NewInt(enq), vt)
}

// before reports whether a runs before b in the ready order: the higher
// band first, whatever the ages; within a band the lower virtual time;
// then arrival.
func (m *fzModel) before(aPrio int, aEnq int64, aSeq uint64, bPrio int, bEnq int64, bSeq uint64) bool {
	ab, av := m.place(aPrio, aEnq)
	bb, bv := m.place(bPrio, bEnq)
	if c := ab.Cmp(bb); c != 0 {
		return c > 0
	}
	if c := av.Cmp(bv); c != 0 {
		return c < 0
	}
	return aSeq < bSeq
}

func (m *fzModel) less(a, b *fmCall) bool {
	return m.before(a.prio, a.enq, a.seq, b.prio, b.enq, b.seq)
}

// push makes c, which is in no index, ready.
func (m *fzModel) push(c *fmCall) {
	c.where = fmReady
	m.queue = append(m.queue, c)
	m.activate(c.ten)
}

// unqueue takes c out of the ready and delayed calls.
func (m *fzModel) unqueue(c *fmCall) {
	if i := slices.Index(m.queue, c); i >= 0 {
		m.queue = slices.Delete(m.queue, i, i+1)
		if c.where == fmReady {
			m.deactivate(c.ten)
		}
	}
}

// activate gives t a place in the pick if it has none: at the end, and
// at the pass of the tenant picked last if it is behind it, so that it
// cannot claim the turns it did not use while it had nothing ready.
func (m *fzModel) activate(t *fmTenant) {
	if t.active {
		return
	}
	t.active = true
	t.pass = max(t.pass, m.vpass)
	m.active = append(m.active, t)
}

// deactivate takes t out of the pick if it has no ready call left: the
// last tenant takes its place.
func (m *fzModel) deactivate(t *fmTenant) {
	if !t.active || m.hasReady(t) {
		return
	}
	i, last := slices.Index(m.active, t), len(m.active)-1
	m.active[i] = m.active[last]
	m.active = m.active[:last]
	t.active = false
}

func (m *fzModel) hasReady(t *fmTenant) bool {
	for _, c := range m.queue {
		if c.where == fmReady && c.ten == t {
			return true
		}
	}
	return false
}

// bestOf is t's ready call that runs first.
func (m *fzModel) bestOf(t *fmTenant) *fmCall {
	var best *fmCall
	for _, c := range m.queue {
		if c.where == fmReady && c.ten == t && (best == nil || m.less(c, best)) {
			best = c
		}
	}
	return best
}

// level is a ready call's level now, as the pick across tenants compares
// it: its band, then its offset in the band plus one per aging interval
// waited; with bands of one priority, the band alone.
func (m *fzModel) level(c *fmCall) (band, lift *big.Int) {
	band, off := new(big.Int).DivMod(big.NewInt(int64(c.prio)), big.NewInt(m.width()), new(big.Int))
	if m.width() == 1 {
		return band, new(big.Int)
	}
	if m.now < c.enq {
		panic("fzModel: a call enqueued in the future")
	}
	return band, off.Add(off, new(big.Int).Div(big.NewInt(m.now-c.enq), big.NewInt(m.aging())))
}

// pick is the tenant whose best ready call runs next, and that call: the
// highest level; among tenants at one level, the lowest pass; then the
// call that comes first in the ready order (arrival).
func (m *fzModel) pick() (*fmTenant, *fmCall) {
	if len(m.active) == 1 {
		return m.active[0], m.bestOf(m.active[0])
	}
	var bt *fmTenant
	var bc *fmCall
	var bb, bl *big.Int
	for _, t := range m.active {
		c := m.bestOf(t)
		b, l := m.level(c)
		switch {
		case bt == nil:
		case b.Cmp(bb) != 0 || l.Cmp(bl) != 0:
			m.note(fzEvPickLevel)
			if b.Cmp(bb) < 0 || b.Cmp(bb) == 0 && l.Cmp(bl) < 0 {
				continue
			}
		case t.pass != bt.pass:
			m.note(fzEvPickPass)
			if t.pass > bt.pass {
				continue
			}
		default:
			m.note(fzEvPickOrder)
			if !m.less(c, bc) {
				continue
			}
		}
		bt, bc, bb, bl = t, c, b, l
	}
	return bt, bc
}

// queued counts t's calls waiting to run (Stats.Tenants[t].Queued, what
// TenantConfig.MaxQueued caps): queued, backing off, waiting behind their
// key's running call.
func (m *fzModel) queued(t *fmTenant) int {
	n := 0
	for _, c := range m.liveCalls() {
		if c.ten == t && (c.where == fmSucc || c.where == fmReady || c.where == fmDelayed) {
			n++
		}
	}
	return n
}

// overQuota reports whether one more queued call of t would exceed its
// MaxQueued, counting freed calls about to leave.
func (m *fzModel) overQuota(t *fmTenant, freed int) bool {
	return t.maxQueued > 0 && m.queued(t)-freed >= t.maxQueued
}

// worst is the call to evict for a newcomer that would sit at (prio, enq,
// seq): among the droppable calls queued, backing off or waiting behind
// their key's running call — of tenant t only, unless t is nil: then
// alone in their lane, so that evicting one frees a key — other than
// except and also, the one that would run last, if the newcomer would
// run before it.
func (m *fzModel) worst(t *fmTenant, prio int, enq int64, seq uint64, except, also *fmCall) *fmCall {
	var w *fmCall
	consider := func(c *fmCall) {
		if !c.droppable || c == except || c == also || t != nil && c.ten != t || t == nil && c.slot.run != nil {
			return
		}
		if w == nil || m.less(w, c) {
			w = c
		}
	}
	for _, c := range m.queue {
		consider(c)
	}
	if t != nil {
		for _, sl := range m.slots {
			if n := sl.next; n != nil && n.where == fmSucc && sl.run != nil {
				consider(n)
			}
		}
	}
	if w == nil || !m.before(prio, enq, seq, w.prio, w.enq, w.seq) {
		return nil
	}
	return w
}

// shed drops queued call c to make room under bound b.
func (m *fzModel) shed(c *fmCall, b dispatch.Bound) {
	m.shedBy[b]++
	c.ten.dropped++
	m.settleAll(c, dispatch.StateDropped, "dropped", nil, false)
	m.endCall(c, dispatch.StateDropped, "dropped")
	m.releaseSlot(c.slot)
}

// adopt moves c to tenant t: out of its tenant's ready calls, if it is
// ready, into t's.
func (m *fzModel) adopt(c *fmCall, t *fmTenant) {
	if c.ten == t {
		return
	}
	old := c.ten
	c.ten = t
	if c.where == fmReady {
		m.deactivate(old)
		m.activate(t)
	}
}

func (m *fzModel) count(where int) int {
	n := 0
	for _, c := range m.queue {
		if c.where == where {
			n++
		}
	}
	return n
}

func (m *fzModel) successors() int {
	n := 0
	for _, s := range m.slots {
		for _, c := range [2]*fmCall{s.run, s.next} {
			if c != nil && c.where == fmSucc {
				n++
			}
		}
	}
	return n
}

// submit is Submit (mt != nil) or Post (mt == nil). early is why it is
// refused before admission (a done context, a deadline already passed), if
// it is.
func (m *fzModel) submit(op fzOp, val int64, deadline int64, early error, mt *fmTicket) error {
	m.submitted++
	ten := m.tenants[op.tenant]
	err := early
	if err == nil {
		err = m.admit(op, ten, val, deadline, mt)
	}
	if err != nil {
		m.rejected++
		ten.rejected++
	} else {
		ten.admitted++
	}
	return err
}

// admit places a submission of tenant ten, or returns why it cannot. Every
// refusal is decided before anything changes.
func (m *fzModel) admit(op fzOp, ten *fmTenant, val int64, deadline int64, mt *fmTicket) error {
	if m.closing {
		return dispatch.ErrClosed
	}
	// The label is the submission's as made: Follow's rewrite keeps it.
	label := m.label(val)
	s := m.slots[op.key]
	if s == nil {
		return m.admitNewKey(op, ten, val, label, deadline, mt)
	}
	if op.gen < s.gen {
		return dispatch.ErrStale
	}
	supersede := op.gen > s.gen
	if s.run != nil && supersede && m.cfg.follow {
		m.note(fzEvSupersedeInFlight)
	}
	if r := s.run; r != nil && r.where == fmRunning && !r.orphan && !supersede && m.cfg.follow {
		// Config.Follow, asked when the key's call is in flight and not
		// cancelled, superseded or expired: not for a retry back in the
		// queue that could not absorb its successor.
		v, err := m.follow(s.run.val, val, s.next != nil)
		switch {
		case errors.Is(err, dispatch.SkipIncoming):
			m.note(fzEvFollowSkip)
			m.skipIncoming(val, mt)
			return nil
		case err != nil:
			return err
		case s.next != nil:
			m.note(fzEvFollowMerged)
		default:
			m.note(fzEvFollowAlone)
		}
		val = v
	}
	// Config.MaxWaiters bounds live tickets: one that Follow skipped, or
	// the merge skips (admitInto), is never live; a supersede ends the
	// tickets of the key's calls first.
	if mt != nil && !supersede && s.next == nil && m.tickets >= m.maxWaiters() {
		return m.refuse(dispatch.BoundWaiters)
	}
	if mt != nil && supersede {
		ended := 0
		for _, c := range [2]*fmCall{s.next, s.run} {
			if c != nil && !c.orphan {
				ended += len(c.tickets)
			}
		}
		if m.tickets-ended >= m.maxWaiters() {
			return m.refuse(dispatch.BoundWaiters)
		}
	}
	// A submission that makes a new call — it supersedes, or nothing is
	// pending — needs room under its tenant's quota: the superseded
	// calls of its own tenant that wait (the pending one, and a retry
	// waiting as the running one) leave, else its worst droppable call
	// (not a superseded one) goes if the newcomer runs before it.
	var quotaVictim *fmCall
	if supersede || s.next == nil {
		freed := 0
		var ended [2]*fmCall
		if supersede {
			ended = [2]*fmCall{s.next, s.run}
			for _, c := range ended {
				if c != nil && c.ten == ten && c.where != fmRunning {
					freed++
				}
			}
		}
		if m.overQuota(ten, freed) {
			if quotaVictim = m.worst(ten, op.prio, m.now, m.seq+1, ended[0], ended[1]); quotaVictim == nil {
				m.note(fzEvQuotaNewRefuse)
				return m.refuse(dispatch.BoundQuota)
			}
		}
	}
	if supersede {
		s.gen = op.gen
		for _, c := range [2]*fmCall{s.next, s.run} {
			if c != nil && !c.orphan {
				m.settleAll(c, dispatch.StateStale, "stale", nil, false)
				m.endCall(c, dispatch.StateStale, "stale")
			}
		}
	}
	if c := s.next; c != nil {
		return m.admitInto(c, op, ten, val, label, deadline, mt)
	}
	if quotaVictim != nil {
		m.note(fzEvQuotaNewEvict)
		m.shed(quotaVictim, dispatch.BoundQuota)
	}
	c := m.newCall(s, val, op, ten, label)
	m.join(c, mt, op.prio, deadline)
	if s.run == nil {
		m.push(c)
	}
	return nil
}

// admitNewKey places a submission for a key without calls.
func (m *fzModel) admitNewKey(op fzOp, ten *fmTenant, val int64, label string, deadline int64, mt *fmTicket) error {
	// Config.Moot (fzMoot, with follow on) is asked first: a moot call is
	// not made, and needs no room.
	if m.cfg.follow {
		switch {
		case val%29 == 0:
			m.note(fzEvMootPanic)
			return fzPanicIn("moot")
		case val%23 == 0:
			m.note(fzEvMoot)
			m.outcomes[dispatch.StateSkipped]++
			if mt != nil {
				mt.done, mt.state, mt.val, mt.waiters, mt.attempts, mt.class = true, dispatch.StateSkipped, val, 1, 0, "nil"
			}
			return nil
		}
	}
	if mt != nil && m.tickets >= m.maxWaiters() {
		return m.refuse(dispatch.BoundWaiters)
	}
	// Over its tenant's quota, a newcomer evicts the tenant's worst
	// droppable call if it would run before it; at capacity, unless that
	// one was alone in its lane and so frees a key, the worst droppable
	// call of all (§3).
	var quotaVictim, capVictim *fmCall
	if m.overQuota(ten, 0) {
		if quotaVictim = m.worst(ten, op.prio, m.now, m.seq+1, nil, nil); quotaVictim == nil {
			m.note(fzEvQuotaNewRefuse)
			return m.refuse(dispatch.BoundQuota)
		}
	}
	if (quotaVictim == nil || quotaVictim.slot.run != nil) && len(m.slots) >= m.cfg.capacity {
		if capVictim = m.worst(nil, op.prio, m.now, m.seq+1, nil, nil); capVictim == nil {
			return m.refuse(dispatch.BoundCapacity)
		}
	}
	if op.drop && m.cfg.breaker && m.cfg.brRefuse && m.circuitAsFound() == dispatch.CircuitOpen {
		return dispatch.ErrCircuitOpen
	}
	if quotaVictim != nil {
		m.note(fzEvQuotaNewEvict)
		m.shed(quotaVictim, dispatch.BoundQuota)
	}
	if capVictim != nil {
		m.note(fzEvCapacityEvict)
		m.shed(capVictim, dispatch.BoundCapacity)
	}
	s := &fmSlot{key: op.key, gen: op.gen}
	m.slots[op.key] = s
	c := m.newCall(s, val, op, ten, label)
	m.join(c, mt, op.prio, deadline)
	m.push(c)
	return nil
}

// admitInto coalesces a submission of tenant ten into the pending call c.
// One that takes c over from another tenant — it outranks c, or replaces
// it — moves c into ten (adopt), and needs room for it under ten's quota
// (roomToAdopt): decided before the merge when it outranks c, after it
// when the merge replaces c, which a refusal then leaves as it was.
func (m *fzModel) admitInto(c *fmCall, op fzOp, ten *fmTenant, val int64, label string, deadline int64, mt *fmTicket) error {
	moves := ten != c.ten && ten.maxQueued > 0
	var victim *fmCall
	if moves && op.prio > c.prio {
		v, err := m.roomToAdopt(c, ten, op.prio)
		if err != nil {
			m.note(fzEvAdoptOutrankRefuse)
			return err
		}
		if victim = v; v != nil {
			m.note(fzEvAdoptOutrankEvict)
		}
	}
	was, wasIdem := c.val, c.idem
	merged := m.coalesce(c, val, op.idem)
	if full := mt != nil && m.tickets >= m.maxWaiters(); full && (merged == fmMerged || merged == fmReplaced) {
		c.val, c.idem = was, wasIdem // the merge's result is dropped
		return m.refuse(dispatch.BoundWaiters)
	}
	replaced := false
	switch merged {
	case fmReplaced:
		if moves && op.prio <= c.prio {
			v, err := m.roomToAdopt(c, ten, op.prio)
			if err != nil {
				m.note(fzEvAdoptReplaceRefuse)
				c.val, c.idem = was, wasIdem
				return err
			}
			if victim = v; v != nil {
				m.note(fzEvAdoptReplaceEvict)
			}
		}
		m.restart(c)
		replaced = true
	case fmConflict:
		return dispatch.ErrMergeRejected
	case fmRefused:
		return fzAll{dispatch.ErrMergeRejected, errFuzzMerge}
	case fmSkipped:
		// The pending call makes this submission moot: it ends Skipped at
		// once, alone, and the pending call is left as it was (no waiter,
		// priority, deadline, label or tenant of this one, nothing evicted).
		m.skipIncoming(val, mt)
		return nil
	}
	c.droppable = c.droppable && op.drop
	if victim != nil {
		m.shed(victim, dispatch.BoundQuota)
	}
	// A submission that raises the call's priority brings its label and
	// tenant, and so does one that replaces the call.
	if replaced || op.prio > c.prio {
		c.label = label
		switch {
		case ten == c.ten:
		case replaced:
			m.note(fzEvAdoptReplace)
		default:
			m.note(fzEvAdoptOutrank)
		}
		m.adopt(c, ten)
	}
	m.join(c, mt, op.prio, deadline)
	m.coalesced++
	return nil
}

// roomToAdopt decides whether ten has room for the pending call c that a
// submission of priority prio takes over: none needed, a victim (ten's
// worst droppable call, if c as the submission leaves it runs before it),
// or a refusal.
func (m *fzModel) roomToAdopt(c *fmCall, ten *fmTenant, prio int) (*fmCall, error) {
	if !m.overQuota(ten, 0) {
		return nil, nil
	}
	if v := m.worst(ten, max(c.prio, prio), min(c.enq, m.now), c.seq, c, nil); v != nil {
		return v, nil
	}
	return nil, m.refuse(dispatch.BoundQuota)
}

// skipIncoming ends an accepted submission Skipped at once, alone: a
// merge or Follow found it moot. It joins no call.
func (m *fzModel) skipIncoming(val int64, mt *fmTicket) {
	m.coalesced++
	m.outcomes[dispatch.StateSkipped]++
	if mt != nil {
		mt.done, mt.state, mt.val, mt.waiters, mt.attempts, mt.class = true, dispatch.StateSkipped, val, 1, 0, "nil"
	}
}

// follow is fzFollow by the contract: it returns the value to go on with,
// SkipIncoming, or the refusal the submission gets.
func (m *fzModel) follow(running, incoming int64, pending bool) (int64, error) {
	switch {
	case incoming%9 == 0:
		return 0, dispatch.SkipIncoming
	case incoming%13 == 0:
		m.note(fzEvFollowRefuse)
		return 0, fzAll{dispatch.ErrMergeRejected, errFuzzFollow}
	case incoming%17 == 0 && pending:
		m.note(fzEvFollowPanic)
		return 0, fzAll{dispatch.ErrMergeRejected, fzPanicIn("follow")}
	case pending:
		return incoming + 10000*(running%100), nil
	}
	return incoming + 100*(running%100), nil
}

func (m *fzModel) newCall(s *fmSlot, val int64, op fzOp, ten *fmTenant, label string) *fmCall {
	m.calls++
	m.seq++
	c := &fmCall{slot: s, ten: ten, val: val, gen: op.gen, seq: m.seq, idem: op.idem, droppable: op.drop, where: fmSucc, label: label}
	s.next = c
	return c
}

// What coalescing a value into a call did.
const (
	fmMerged   = iota
	fmConflict // idempotency keys differ
	fmRefused  // the merge function refused
	fmSkipped  // the merge function returned SkipIncoming
	fmReplaced // the merge function returned ReplacePending
)

// coalesce merges val into c, or reports why not and leaves c as it was.
func (m *fzModel) coalesce(c *fmCall, val int64, idem string) int {
	if idem != "" && c.idem != "" && idem != c.idem {
		return fmConflict
	}
	switch m.cfg.merge {
	case 1:
		val += c.val
	case 3:
		if val%4 == 0 {
			return fmSkipped
		}
		if val%7 == 0 {
			// Another operation: it replaces the pending call's value and
			// the call starts over (restart).
			c.val = val
			if c.idem == "" {
				c.idem = idem
			}
			return fmReplaced
		}
		fallthrough
	case 2:
		if val%3 == 0 {
			return fmRefused
		}
		val += c.val
	}
	c.val = val
	if c.idem == "" {
		c.idem = idem
	}
	return fmMerged
}

func (m *fzModel) join(c *fmCall, mt *fmTicket, prio int, deadline int64) {
	first := c.live() == 0
	c.joined++
	if mt != nil {
		mt.call, mt.prio, mt.enq, mt.deadline = c, prio, m.now, deadline
		if deadline != 0 {
			m.dseq++
			mt.dseq = m.dseq
		}
		c.tickets = append(c.tickets, mt)
		m.tickets++
	} else {
		if c.nff == 0 {
			c.ffPrio, c.ffEnq, c.ffDL = prio, m.now, deadline
		} else {
			c.ffPrio = max(c.ffPrio, prio)
			c.ffEnq = min(c.ffEnq, m.now)
			c.ffDL = max(c.ffDL, deadline)
		}
		c.nff++
		m.liveFF++
		m.indexPosts(c, deadline == 0)
	}
	if first {
		c.prio, c.enq = prio, m.now
		return
	}
	c.prio, c.enq = max(c.prio, prio), min(c.enq, m.now)
}

// indexPosts keeps c's fire-and-forget aggregate in the deadline index
// after posts joined it (forever: one of them had no deadline): it is
// indexed when it first has a deadline, and left where it is when a later
// post extends it.
func (m *fzModel) indexPosts(c *fmCall, forever bool) {
	switch {
	case c.ffForever:
	case forever:
		c.ffForever, c.ffAt = true, 0
	case c.ffAt == 0:
		m.dseq++
		c.ffAt, c.ffDseq = c.ffDL, m.dseq
	}
}

func (m *fzModel) reprioritize(c *fmCall) {
	if c.live() == 0 {
		return
	}
	seen := false
	if c.nff > 0 {
		c.prio, c.enq, seen = c.ffPrio, c.ffEnq, true
	}
	for _, t := range c.tickets {
		if !seen {
			c.prio, c.enq, seen = t.prio, t.enq, true
			continue
		}
		c.prio, c.enq = max(c.prio, t.prio), min(c.enq, t.enq)
	}
}

func (m *fzModel) settle(t *fmTicket, c *fmCall, st dispatch.State, class string, cause error) {
	t.done, t.call = true, nil
	t.state, t.val, t.waiters, t.attempts, t.class, t.cause = st, c.val, c.joined, c.attempts, class, cause
	m.outcomes[st]++
}

// settleAll ends every live waiter of c with st (or Expired, with expire,
// for a waiter whose deadline passed) and reports whether any got st.
func (m *fzModel) settleAll(c *fmCall, st dispatch.State, class string, cause error, expire bool) bool {
	served := false
	for _, t := range c.tickets {
		if expire && t.deadline != 0 && t.deadline <= m.now {
			m.settle(t, c, dispatch.StateExpired, "expired", nil)
			continue
		}
		served = true
		m.settle(t, c, st, class, cause)
	}
	m.tickets -= len(c.tickets)
	c.tickets = nil
	if c.nff > 0 {
		wst := st
		if expire && !c.ffForever && c.ffDL <= m.now {
			wst = dispatch.StateExpired
		} else {
			served = true
		}
		m.outcomes[wst] += uint64(c.nff)
		m.liveFF -= c.nff
		c.nff, c.ffForever, c.ffAt = 0, false, 0
	}
	return served
}

func (m *fzModel) hook(c *fmCall, st dispatch.State, class string) {
	m.callsBy[st]++
	m.hooks = append(m.hooks, fzHookRec{key: c.slot.key, state: st, val: c.val, attempts: c.attempts, waiters: c.joined, class: class})
}

// endCall ends a call that has no live waiters left: an in-flight one is
// orphaned (its execution will be reported when it returns), any other is
// removed and reported.
func (m *fzModel) endCall(c *fmCall, st dispatch.State, class string) {
	if c.where == fmRunning {
		if !c.orphan {
			c.orphan, c.endState = true, st
		}
		return
	}
	m.unqueue(c)
	s := c.slot
	if s.next == c {
		s.next = nil
	} else {
		// A retry waiting in the queue that could not absorb its
		// successor: the successor's turn has come.
		s.run = nil
		if n := s.next; n != nil && n.where == fmSucc {
			m.push(n)
		}
	}
	c.where = fmEnded
	m.calls--
	m.hook(c, st, class)
}

func (m *fzModel) releaseSlot(s *fmSlot) {
	if s.run != nil || s.next != nil {
		return
	}
	if m.slots[s.key] == s {
		delete(m.slots, s.key)
	}
	if m.closing && len(m.slots) == 0 {
		m.stopped = true
	}
}

func (m *fzModel) leave(t *fmTicket, st dispatch.State, class string, cause error) {
	if t.done {
		return
	}
	c := t.call
	i := slices.Index(c.tickets, t)
	c.tickets = slices.Delete(c.tickets, i, i+1)
	m.tickets--
	m.settle(t, c, st, class, cause)
	if st == dispatch.StateExpired && m.cfg.honour && c.where == fmRunning && m.runDL == m.now {
		t.hasAlt, t.altVal, t.altAttempt = true, c.val, c.attempts+1
		if m.runOut.rebuilt {
			t.altVal = m.runVal
		}
	}
	if c.live() == 0 {
		m.endCall(c, st, class)
		m.releaseSlot(c.slot)
		return
	}
	m.reprioritize(c)
}

func (m *fzModel) cancelKey(key int, cause error) bool {
	s := m.slots[key]
	if s == nil {
		return false
	}
	found := false
	for _, c := range [2]*fmCall{s.next, s.run} {
		if c != nil && !c.orphan {
			found = true
			m.settleAll(c, dispatch.StateCanceled, "canceled", cause, false)
			m.endCall(c, dispatch.StateCanceled, "canceled")
		}
	}
	m.releaseSlot(s)
	return found
}

// calls lists every live call, in a fixed order.
func (m *fzModel) liveCalls() []*fmCall {
	var out []*fmCall
	for k := range fzKeys {
		if s := m.slots[k]; s != nil {
			for _, c := range [2]*fmCall{s.next, s.run} {
				if c != nil && !slices.Contains(out, c) {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// expire ends every waiter whose deadline is at or before now, in the
// order of the deadline index: by deadline, then by when each entry was
// indexed. (With tenants the order matters: a call that leaves the ready
// set, or a successor that enters it, moves its tenant in the pick's
// active list.) A fire-and-forget aggregate whose deadline later posts
// extended is indexed anew instead.
func (m *fzModel) expire() {
	for {
		var t *fmTicket
		var agg *fmCall
		var at int64
		var dseq uint64
		earlier := func(a int64, d uint64) bool {
			return a != 0 && a <= m.now && (t == nil && agg == nil || a < at || a == at && d < dseq)
		}
		for _, c := range m.liveCalls() {
			for _, tk := range c.tickets {
				if earlier(tk.deadline, tk.dseq) {
					t, agg, at, dseq = tk, nil, tk.deadline, tk.dseq
				}
			}
			if c.nff > 0 && earlier(c.ffAt, c.ffDseq) {
				t, agg, at, dseq = nil, c, c.ffAt, c.ffDseq
			}
		}
		switch {
		case t != nil:
			m.leave(t, dispatch.StateExpired, "expired", nil)
			continue
		case agg == nil:
			return
		}
		c := agg
		c.ffAt = 0
		if c.ffDL > m.now {
			m.dseq++
			c.ffAt, c.ffDseq = c.ffDL, m.dseq
			continue
		}
		m.outcomes[dispatch.StateExpired] += uint64(c.nff)
		m.liveFF -= c.nff
		c.nff, c.ffForever = 0, false
		if c.live() == 0 {
			m.endCall(c, dispatch.StateExpired, "expired")
			m.releaseSlot(c.slot)
		} else {
			m.reprioritize(c)
		}
	}
}

// promote makes ready the calls whose backoff has ended, by the time it
// ended, then by arrival.
func (m *fzModel) promote() {
	var due []*fmCall
	for _, c := range m.queue {
		if c.where == fmDelayed && c.notBefore <= m.now {
			due = append(due, c)
		}
	}
	slices.SortFunc(due, func(a, b *fmCall) int {
		return cmp.Or(cmp.Compare(a.notBefore, b.notBefore), cmp.Compare(a.seq, b.seq))
	})
	for _, c := range due {
		c.where = fmReady
		m.activate(c.ten)
	}
}

// nextEvent is the earliest deadline or end of backoff, or 0.
func (m *fzModel) nextEvent() int64 {
	next := int64(0)
	at := func(t int64) {
		if t != 0 && (next == 0 || t < next) {
			next = t
		}
	}
	for _, c := range m.liveCalls() {
		for _, t := range c.tickets {
			at(t.deadline)
		}
		if c.nff > 0 {
			at(c.ffAt) // the clock acts when the index says, if only to re-index
		}
		if c.where == fmDelayed {
			at(c.notBefore)
		}
	}
	if m.br == dispatch.CircuitOpen && m.openUntil > m.now {
		at(m.openUntil)
	}
	return next
}

// advance moves the clock to target, acting at every deadline and end of
// backoff on the way, as the dispatcher's timer does.
func (m *fzModel) advance(target int64) {
	for {
		next := m.nextEvent()
		if next == 0 || next > target {
			break
		}
		m.now = next
		m.expire()
		m.promote()
		m.work()
	}
	m.now = target
	m.work()
}

func (m *fzModel) execDeadline(c *fmCall) int64 {
	var dl int64
	if c.nff > 0 {
		if c.ffForever {
			return 0
		}
		dl = c.ffDL
	}
	for _, t := range c.tickets {
		if t.deadline == 0 {
			return 0
		}
		dl = max(dl, t.deadline)
	}
	return dl
}

// work is the one worker: it finishes an orphaned execution that honours
// its context, and starts the best ready call while it is idle.
func (m *fzModel) work() {
	for {
		if c := m.running; c != nil {
			if c.orphan && m.cfg.honour {
				out := m.runOut
				out.ran, out.ctxEnded = true, true
				m.finish(c, out)
				continue
			}
			return
		}
		if m.stopped {
			return
		}
		t, c := m.pick()
		if c == nil {
			return
		}
		probe := m.br != dispatch.CircuitClosed
		if m.cfg.breaker && !m.admits() {
			return
		}
		c.probe = probe
		m.unqueue(c)
		m.vpass = t.pass
		t.pass += t.stride
		s := c.slot
		s.run = c
		if s.next == c {
			s.next = nil
		}
		c.where = fmRunning
		m.running = c
		val := c.val
		out := fzOutcome{}
		if c.retrying && m.cfg.before {
			switch {
			case val%7 == 0:
				out.done = true
			case val%11 == 0:
				out.hookErr = true
			default:
				val += 1000
				out.rebuilt, out.val = true, val
			}
		}
		if !out.done && !out.hookErr && m.noop(val) {
			out.skipped = true
		}
		if out.done || out.hookErr || out.skipped {
			m.finish(c, out)
			continue
		}
		m.runVal, m.runOut, m.runDL = val, out, m.execDeadline(c)
		m.starts = append(m.starts, fzStart{key: s.key, val: val, deadline: m.runDL})
		return
	}
}

// release ends the running execution with result.
func (m *fzModel) release(result int) {
	out := m.runOut
	out.ran, out.result = true, result
	m.finish(m.running, out)
}

func fzFailClass(result int, reason string) string {
	if result == fzPanic {
		return "panic"
	}
	base := [...]string{"nil", "perm", "retryable", "panic", "recompute"}[result]
	return "retry:" + reason + ":" + base
}

func (m *fzModel) finish(c *fmCall, out fzOutcome) {
	if m.running == c {
		m.running = nil
	}
	if out.rebuilt {
		c.val = out.val
	}
	if out.ran {
		c.attempts++
		m.executions++
	}
	if m.cfg.breaker {
		// Only executions that say something about the API's health count:
		// successes and retryable failures of calls that still had waiters.
		counted := out.ran && !c.orphan && !out.ctxEnded && (out.result == fzOK || out.result == fzRetry)
		m.record(c.probe, counted, out.result != fzOK)
		c.probe = false
	}
	s := c.slot
	switch {
	case c.orphan:
		st, class := c.endState, fzStateClass(c.endState)
		if out.ran {
			st, class = dispatch.StateStale, "stale"
			m.staleExecs++
		}
		m.hook(c, st, class)
	case out.hookErr:
		m.end(c, dispatch.StateFailed, "retry:before_retry:before", out.ran)
	case out.done:
		m.alreadyDone++
		m.end(c, dispatch.StateSucceeded, "nil", out.ran)
	case out.skipped:
		m.end(c, dispatch.StateSkipped, "nil", out.ran)
	case out.ctxEnded:
		panic("fzModel: an execution ended by its context must be orphaned")
	case out.result == fzOK:
		m.end(c, dispatch.StateSucceeded, "nil", out.ran)
	default:
		notBefore, reason, merge := m.retryAt(c, out)
		if reason == "" {
			if m.requeue(c, notBefore, merge) {
				return
			}
			m.note(fzEvQuotaRetryGiveUp)
			reason = "quota"
		}
		m.end(c, dispatch.StateFailed, fzFailClass(out.result, reason), out.ran)
	}
	m.calls--
	s.run = nil
	c.where = fmEnded
	if n := s.next; n != nil && n.where == fmSucc {
		m.push(n)
	}
	m.releaseSlot(s)
}

func (m *fzModel) end(c *fmCall, st dispatch.State, class string, ran bool) {
	switch {
	case m.settleAll(c, st, class, nil, true):
		m.hook(c, st, class)
	case ran:
		m.staleExecs++
		m.hook(c, dispatch.StateStale, "stale")
	default:
		m.hook(c, dispatch.StateExpired, "expired")
	}
}

// retryAt returns when c, whose attempt ended with out, runs again, or why
// it gives up; merge: it has room under its tenant's quota only in the
// place of its successor, which must merge into it (requeue).
func (m *fzModel) retryAt(c *fmCall, out fzOutcome) (int64, string, bool) {
	var delay int64
	switch {
	case out.result == fzPerm || out.result == fzPanic:
		return 0, "permanent", false
	case out.result == fzRecompute && !m.cfg.before:
		return 0, "recompute", false
	case c.attempts >= m.cfg.maxAttempts:
		return 0, "attempts", false
	case out.result == fzRecompute:
	default:
		delay = int64(fzBackoff) << (c.attempts - 1)
		delay = min(delay, int64(fzMaxBackoff))
	}
	notBefore := m.now + delay
	if dl := m.execDeadline(c); dl != 0 && notBefore >= dl {
		return 0, "deadline", false
	}
	// To wait again the call needs room under its tenant's quota: its
	// successor's place, if the successor merges into it and is of the
	// same tenant or takes it over; else it evicts the tenant's worst
	// droppable call if it runs before it.
	if m.overQuota(c.ten, 0) {
		if c.slot.next != nil && !m.overQuota(c.ten, 1) {
			return notBefore, "", true
		}
		v := m.worst(c.ten, c.prio, c.enq, c.seq, c.slot.next, nil)
		if v == nil {
			m.note(fzEvQuotaRetryGiveUp)
			return 0, "quota", false
		}
		m.note(fzEvQuotaRetryEvict)
		m.shed(v, dispatch.BoundQuota)
	}
	return notBefore, "", false
}

// requeue sends c back to wait, and reports whether it did: not if merge
// is set and its successor does not merge into it, or merges but leaves it
// in its tenant beside another tenant's successor.
func (m *fzModel) requeue(c *fmCall, notBefore int64, merge bool) bool {
	s := c.slot
	if n := s.next; n != nil {
		val, idem := c.val, c.idem
		res := m.coalesce(c, n.val, n.idem)
		if merge && (res != fmMerged && res != fmReplaced || res == fmMerged && n.ten != c.ten && n.prio <= c.prio) {
			c.val, c.idem = val, idem
			return false
		}
		m.retries++
		c.retrying = true
		c.where = fmSucc
		switch res {
		case fmMerged:
			m.absorb(c, n)
			s.run, s.next = nil, c
		case fmReplaced:
			// The successor is another operation: the retry becomes it,
			// from its first attempt, at once, with its label and tenant.
			m.restart(c)
			notBefore = m.now
			label, ten := n.label, n.ten
			m.absorb(c, n)
			c.label = label
			if ten != c.ten {
				m.note(fzEvAdoptOnRetryReplace)
			}
			m.adopt(c, ten)
			s.run, s.next = nil, c
		}
		// Refused, or moot: the retry stays the key's running call, and
		// its successor waits behind it, to run after it.
	} else {
		m.retries++
		c.retrying = true
		c.where = fmSucc
		s.run, s.next = nil, c
	}
	if notBefore <= m.now {
		m.push(c)
		return true
	}
	c.where, c.notBefore = fmDelayed, notBefore
	m.queue = append(m.queue, c)
	return true
}

// restart is ReplacePending's effect on a queued call: no attempts, no
// retry pending (so no before-retry hook), and no backoff left to wait.
func (m *fzModel) restart(c *fmCall) {
	c.attempts, c.retrying = 0, false
	if c.where == fmDelayed {
		c.where, c.notBefore = fmReady, 0
		m.activate(c.ten)
	}
}

func (m *fzModel) absorb(c, n *fmCall) {
	// A more urgent successor brings its label and tenant, as a
	// submission does.
	if n.prio > c.prio {
		c.label = n.label
		if n.ten != c.ten {
			m.note(fzEvAdoptOnRetryAbsorb)
		}
		m.adopt(c, n.ten)
	}
	for _, t := range n.tickets {
		t.call = c
	}
	c.tickets = append(c.tickets, n.tickets...)
	if n.nff > 0 {
		if c.nff == 0 {
			c.ffPrio, c.ffEnq, c.ffDL = n.ffPrio, n.ffEnq, n.ffDL
		} else {
			c.ffPrio = max(c.ffPrio, n.ffPrio)
			c.ffEnq = min(c.ffEnq, n.ffEnq)
			c.ffDL = max(c.ffDL, n.ffDL)
		}
		c.nff += n.nff
		m.indexPosts(c, n.ffForever)
		n.ffAt = 0
	}
	c.joined += n.joined
	c.droppable = c.droppable && n.droppable
	if n.joined > 0 {
		m.coalesced++ // n's first submission; the others were counted as they joined n
	}
	n.tickets, n.nff = nil, 0
	n.where = fmEnded
	m.calls--
	m.reprioritize(c)
}

// circuitAsFound is the breaker's state as the next call finds it
// (Stats.Circuit): half-open once an open circuit's cool-down is over,
// though it moves there only as a call starts (admits).
func (m *fzModel) circuitAsFound() dispatch.Circuit {
	if m.br == dispatch.CircuitOpen && m.now >= m.openUntil {
		return dispatch.CircuitHalfOpen
	}
	return m.br
}

// admits is the breaker's gate for starting an execution.
func (m *fzModel) admits() bool {
	switch m.br {
	case dispatch.CircuitOpen:
		if m.now < m.openUntil {
			return false
		}
		m.br = dispatch.CircuitHalfOpen
		fallthrough
	case dispatch.CircuitHalfOpen:
		if m.probes >= 1 {
			return false
		}
		m.probes++
	}
	return true
}

func (m *fzModel) record(probe, counted, failed bool) {
	if probe && m.probes > 0 {
		m.probes--
	}
	if !counted {
		return
	}
	if !failed {
		m.consec = 0
		if m.br == dispatch.CircuitHalfOpen {
			m.br, m.probes = dispatch.CircuitClosed, 0
		}
		return
	}
	m.consec++
	if m.br == dispatch.CircuitHalfOpen || (m.br == dispatch.CircuitClosed && m.consec >= m.cfg.brFailures) {
		m.br, m.openUntil, m.consec = dispatch.CircuitOpen, m.now+int64(fzCooldown), 0
	}
}

func (m *fzModel) close() {
	m.closing = true
	if len(m.slots) == 0 {
		m.stopped = true
	}
}

// abort is Close's context ending before everything drained.
func (m *fzModel) abort() {
	if !m.closing || m.stopped {
		return
	}
	m.stopped = true
	m.closeErr = context.Canceled
	for k := range fzKeys {
		s := m.slots[k]
		if s == nil {
			continue
		}
		for _, c := range [2]*fmCall{s.next, s.run} {
			if c != nil && !c.orphan {
				m.settleAll(c, dispatch.StateClosed, "closed", nil, false)
				m.endCall(c, dispatch.StateClosed, "closed")
			}
		}
		m.releaseSlot(s)
	}
}

func (m *fzModel) closeReturned() bool { return m.stopped && m.running == nil }

// consistent checks the model against itself: a tenant is in the active
// list, once, exactly while it has ready calls, and no tenant is over its
// quota.
func (m *fzModel) consistent() error {
	for _, t := range m.tenants {
		n := 0
		for _, a := range m.active {
			if a == t {
				n++
			}
		}
		if want := m.hasReady(t); t.active != want || n != map[bool]int{false: 0, true: 1}[want] {
			return fmt.Errorf("tenant %q: active %v, %d times in the active list, has ready calls %v", t.name, t.active, n, want)
		}
		if q := m.queued(t); t.maxQueued > 0 && q > t.maxQueued {
			return fmt.Errorf("tenant %q: %d calls queued, over its quota %d", t.name, q, t.maxQueued)
		}
	}
	return nil
}

func fzStateClass(st dispatch.State) string {
	switch st {
	case dispatch.StateSucceeded, dispatch.StateSkipped:
		return "nil"
	case dispatch.StateCanceled:
		return "canceled"
	case dispatch.StateExpired:
		return "expired"
	case dispatch.StateDropped:
		return "dropped"
	case dispatch.StateStale:
		return "stale"
	case dispatch.StateClosed:
		return "closed"
	}
	return "?"
}

// fzErrClass describes a real error the way the model does.
func fzErrClass(err error) string {
	if err == nil {
		return "nil"
	}
	switch {
	case errors.Is(err, dispatch.ErrStale):
		return "stale"
	case errors.Is(err, dispatch.ErrClosed):
		return "closed"
	case errors.Is(err, dispatch.ErrCanceled):
		return "canceled"
	case errors.Is(err, dispatch.ErrDropped):
		return "dropped"
	}
	var re *dispatch.RetryError
	if errors.As(err, &re) {
		return "retry:" + string(re.Reason) + ":" + fzErrClass(re.Last)
	}
	var pe *dispatch.PanicError
	switch {
	case errors.Is(err, dispatch.ErrExpired):
		return "expired"
	case errors.As(err, &pe):
		return "panic"
	case errors.Is(err, errFuzzPerm):
		return "perm"
	case errors.Is(err, errFuzzRetry):
		return "retryable"
	case errors.Is(err, errFuzzRecompute):
		return "recompute"
	case errors.Is(err, errFuzzBefore):
		return "before"
	}
	return "other(" + err.Error() + ")"
}
