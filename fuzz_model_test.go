package dispatch_test

// The reference model for FuzzQueueModel: the dispatcher's contract with one
// worker, written with plain slices and maps, stepped by the harness
// alongside the real Dispatcher.

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
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

type fmCall struct {
	slot      *fmSlot
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
	ctxLive  bool // its context can still be cancelled by the test
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
	m := &fzModel{cfg: cfg, slots: map[int]*fmSlot{}, outcomes: map[dispatch.State]uint64{}, callsBy: map[dispatch.State]uint64{}}
	for st := dispatch.StateSucceeded; st <= dispatch.StateClosed; st++ {
		m.outcomes[st], m.callsBy[st] = 0, 0 // Stats reports every state
	}
	return m
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

// width is the band width the dispatcher works with: Config.AgingBand,
// narrowed so that a band spans at most 2⁶² ns of aging, as its docs say.
func (m *fzModel) width() int64 {
	return min(int64(m.cfg.band), (1<<62)/m.aging()+1)
}

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

func (m *fzModel) push(c *fmCall) {
	c.where = fmReady
	m.queue = append(m.queue, c)
}

func (m *fzModel) unqueue(c *fmCall) {
	if i := slices.Index(m.queue, c); i >= 0 {
		m.queue = slices.Delete(m.queue, i, i+1)
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
	err := early
	if err == nil {
		err = m.admit(op, val, deadline, mt)
	}
	if err != nil {
		m.rejected++
	}
	return err
}

func (m *fzModel) admit(op fzOp, val int64, deadline int64, mt *fmTicket) error {
	if m.closing {
		return dispatch.ErrClosed
	}
	s := m.slots[op.key]
	if s == nil {
		var victim *fmCall
		if len(m.slots) >= m.cfg.capacity {
			// §3: a new key evicts the worst droppable pending call if
			// that call is worse than the newcomer, else is refused.
			victim = m.victim(op.prio)
			if victim == nil {
				return dispatch.ErrBackpressure
			}
		}
		if mt != nil && m.tickets >= m.maxWaiters() {
			return dispatch.ErrBackpressure
		}
		if op.drop && m.cfg.breaker && m.cfg.brRefuse && m.br == dispatch.CircuitOpen {
			return dispatch.ErrCircuitOpen
		}
		if victim != nil {
			m.settleAll(victim, dispatch.StateDropped, "dropped", nil, false)
			m.endCall(victim, dispatch.StateDropped, "dropped")
			m.releaseSlot(victim.slot)
		}
		s = &fmSlot{key: op.key, gen: op.gen}
		m.slots[op.key] = s
		c := m.newCall(s, val, op)
		m.join(c, mt, op.prio, deadline)
		m.push(c)
		return nil
	}
	if op.gen < s.gen {
		return dispatch.ErrStale
	}
	if mt != nil && m.tickets >= m.maxWaiters() {
		return dispatch.ErrBackpressure
	}
	if op.gen > s.gen {
		s.gen = op.gen
		for _, c := range [2]*fmCall{s.next, s.run} {
			if c != nil && !c.orphan {
				m.settleAll(c, dispatch.StateStale, "stale", nil, false)
				m.endCall(c, dispatch.StateStale, "stale")
			}
		}
	}
	if c := s.next; c != nil {
		replaced := false
		switch m.coalesce(c, val, op.idem) {
		case fmReplaced:
			replaced = true
		case fmRefused:
			return dispatch.ErrMergeRejected
		case fmSkipped:
			// The pending call makes this submission moot: it ends
			// Skipped at once, alone, and the pending call is left as it
			// was (no waiter, priority, deadline or label of this one).
			m.coalesced++
			m.outcomes[dispatch.StateSkipped]++
			if mt != nil {
				mt.done, mt.state, mt.val, mt.waiters, mt.attempts, mt.class = true, dispatch.StateSkipped, val, 1, 0, "nil"
			}
			return nil
		}
		c.droppable = c.droppable && op.drop
		// A submission that raises the call's priority brings its label,
		// and so does one that replaces the call.
		if replaced {
			m.restart(c)
		}
		if replaced || op.prio > c.prio {
			c.label = m.label(val)
		}
		m.join(c, mt, op.prio, deadline)
		m.coalesced++
		return nil
	}
	c := m.newCall(s, val, op)
	m.join(c, mt, op.prio, deadline)
	if s.run == nil {
		m.push(c)
	}
	return nil
}

// victim is the droppable pending call that would run last, if the
// newcomer (priority prio, arriving now) would run before it.
func (m *fzModel) victim(prio int) *fmCall {
	var worst *fmCall
	for _, c := range m.queue {
		if !c.droppable || c.slot.run != nil {
			continue
		}
		if worst == nil || m.less(worst, c) {
			worst = c
		}
	}
	if worst == nil || !m.before(prio, m.now, m.seq+1, worst.prio, worst.enq, worst.seq) {
		return nil
	}
	return worst
}

func (m *fzModel) newCall(s *fmSlot, val int64, op fzOp) *fmCall {
	m.calls++
	m.seq++
	c := &fmCall{slot: s, val: val, gen: op.gen, seq: m.seq, idem: op.idem, droppable: op.drop, where: fmSucc, label: m.label(val)}
	s.next = c
	return c
}

// What coalescing a value into a call did.
const (
	fmMerged   = iota
	fmRefused  // idempotency keys differ, or the merge function refused
	fmSkipped  // the merge function returned SkipIncoming
	fmReplaced // the merge function returned ReplacePending
)

// coalesce merges val into c, or reports why not and leaves c as it was.
func (m *fzModel) coalesce(c *fmCall, val int64, idem string) int {
	if idem != "" && c.idem != "" && idem != c.idem {
		return fmRefused
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
		if deadline == 0 {
			c.ffForever = true
		}
		c.nff++
		m.liveFF++
	}
	if first {
		c.prio, c.enq = prio, m.now
		return
	}
	c.prio, c.enq = max(c.prio, prio), min(c.enq, m.now)
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
		c.nff, c.ffForever = 0, false
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

// expire ends every waiter whose deadline is at or before now.
func (m *fzModel) expire() {
	for _, c := range m.liveCalls() {
		for _, t := range slices.Clone(c.tickets) {
			if t.deadline != 0 && t.deadline <= m.now {
				m.leave(t, dispatch.StateExpired, "expired", nil)
			}
		}
		if c.nff > 0 && !c.ffForever && c.ffDL <= m.now {
			m.outcomes[dispatch.StateExpired] += uint64(c.nff)
			m.liveFF -= c.nff
			c.nff = 0
			if c.live() == 0 {
				m.endCall(c, dispatch.StateExpired, "expired")
				m.releaseSlot(c.slot)
			} else {
				m.reprioritize(c)
			}
		}
	}
}

func (m *fzModel) promote() {
	for _, c := range m.queue {
		if c.where == fmDelayed && c.notBefore <= m.now {
			c.where = fmReady
		}
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
		if c.nff > 0 && !c.ffForever {
			at(c.ffDL)
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
		var best *fmCall
		for _, c := range m.queue {
			if c.where == fmReady && (best == nil || m.less(c, best)) {
				best = c
			}
		}
		if best == nil {
			return
		}
		probe := m.br != dispatch.CircuitClosed
		if m.cfg.breaker && !m.admits() {
			return
		}
		c := best
		c.probe = probe
		m.unqueue(c)
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
		m.end(c, dispatch.StateFailed, "retry:before-retry:before", out.ran)
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
		notBefore, reason := m.retryAt(c, out)
		if reason == "" {
			m.requeue(c, notBefore)
			return
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

func (m *fzModel) retryAt(c *fmCall, out fzOutcome) (int64, string) {
	var delay int64
	switch {
	case out.result == fzPerm || out.result == fzPanic:
		return 0, "permanent"
	case out.result == fzRecompute && !m.cfg.before:
		return 0, "recompute"
	case c.attempts >= m.cfg.maxAttempts:
		return 0, "attempts"
	case out.result == fzRecompute:
	default:
		delay = int64(fzBackoff) << (c.attempts - 1)
		delay = min(delay, int64(fzMaxBackoff))
	}
	notBefore := m.now + delay
	if dl := m.execDeadline(c); dl != 0 && notBefore >= dl {
		return 0, "deadline"
	}
	return notBefore, ""
}

func (m *fzModel) requeue(c *fmCall, notBefore int64) {
	s := c.slot
	m.retries++
	c.retrying = true
	c.where = fmSucc
	if n := s.next; n != nil {
		switch m.coalesce(c, n.val, n.idem) {
		case fmMerged:
			m.absorb(c, n)
			s.run, s.next = nil, c
		case fmReplaced:
			// The successor is another operation: the retry becomes it,
			// from its first attempt, at once, with its label.
			m.restart(c)
			notBefore = m.now
			label := n.label
			m.absorb(c, n)
			c.label = label
			s.run, s.next = nil, c
		}
		// Refused, or moot: the retry stays the key's running call, and
		// its successor waits behind it, to run after it.
	} else {
		s.run, s.next = nil, c
	}
	if notBefore <= m.now {
		m.push(c)
		return
	}
	c.where, c.notBefore = fmDelayed, notBefore
	m.queue = append(m.queue, c)
}

// restart is ReplacePending's effect on a queued call: no attempts, no
// retry pending (so no before-retry hook), and no backoff left to wait.
func (m *fzModel) restart(c *fmCall) {
	c.attempts, c.retrying = 0, false
	if c.where == fmDelayed {
		c.where, c.notBefore = fmReady, 0
	}
}

func (m *fzModel) absorb(c, n *fmCall) {
	// A more urgent successor brings its label, as a submission does.
	if n.prio > c.prio {
		c.label = n.label
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
		c.ffForever = c.ffForever || n.ffForever
	}
	c.joined += n.joined
	c.droppable = c.droppable && n.droppable
	m.coalesced += uint64(n.joined)
	n.tickets, n.nff = nil, 0
	n.where = fmEnded
	m.calls--
	m.reprioritize(c)
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
