package dispatch

// FuzzQueueModel runs a decoded sequence of operations against the real
// Dispatcher and against fzModel, a reference written with plain slices and
// maps, and compares them after every step.
//
// The Dispatcher runs with one worker inside a testing/synctest bubble, and
// exec blocks until the test releases it, so every step is deterministic:
// after synctest.Wait the worker is either idle or blocked in exec, the
// clock goroutine is asleep, and virtual time only moves when an "advance"
// step sleeps. What is compared after each step:
//
//   - which calls the worker started, in order: key, value as executed and
//     the execution context's deadline;
//   - every ticket: whether its outcome is known, and then its State, Call,
//     Waiters, Attempts and error class (and the cancel cause, if any); an
//     outcome, once known, must never change;
//   - the completion hook's results since the last step, as a multiset;
//   - Stats (every gauge and counter) and the conservation law;
//   - Pending for every key, what Cancel(key) reports, what Submit and Post
//     return, and when and with what Close returns.
//
// The model covers: per-key one in-flight and one pending call, successors,
// coalescing (replace, sum, or a sum that refuses some values via
// Config.Merge), idempotency-key conflicts, priority with aging as virtual time
// (enqueue − priority×aging, saturating) then FIFO, strict priority when
// aging is 0, re-derivation of a call's priority and enqueue time when a
// waiter leaves, generations (stale rejection, supersession), deadlines from
// SubmitOptions and from the Submit context (the fire-and-forget aggregate
// with its shared latest deadline), the execution context's deadline,
// Ticket.Cancel, context cancellation with a cause, Cancel(key, cause),
// capacity and waiter bounds, shedding of droppable pending calls, the
// no-op test, the completion hook,
// retries (Retry, Permanent, Recompute, panics; exponential backoff without
// jitter in the delay index; attempt limit; the deadline bound; a successor
// absorbed into a retry), the before-retry hook (rebuild, already done,
// failure), the circuit breaker (consecutive retryable failures trip it, a
// cool-down, one half-open probe, refusal of droppable new keys while open),
// stale executions (exec that honours or ignores its context), Close that
// drains and Close whose context ends.
//
// Shedding follows Config.Capacity and BreakerPolicy.RefuseDroppable: when
// the key capacity is full, a new key looks at the droppable pending calls
// (queued or backing off, whose key has nothing in flight) and takes the
// one that would run last; if the newcomer would run before it, that call
// is removed, its waiters end Dropped and the hook sees Dropped, and the
// newcomer is admitted; otherwise the newcomer is refused with
// ErrBackpressure. The waiter bound and the breaker's refusal of droppable
// work are checked before anything is evicted: a refused submission
// changes nothing.
//
// It leaves out, on purpose: more than one worker (ordering would no longer
// be deterministic), jittered backoff and the retry budget (random or
// windowed; the budget is disabled), the breaker's failure-ratio rule (it
// is set to +Inf), the rate limiter, tenants (every call is in the default
// tenant; quotas, in-flight caps and weights are tenant_test.go's), Sync
// mode, SetMode and the fallback policy (mode_test.go's), Amend, a merge
// that returns SkipIncoming, labels and the observer, and QueueWait/RunTime
// values (only checked to be non-negative).
//
// The seeds (fzSeeds, and the inputs under testdata/fuzz/FuzzQueueModel
// that fuzzing once found) run as ordinary subtests under go test;
// go test -run '^$' -fuzz FuzzQueueModel . looks for new ones.
// DISPATCH_FUZZ_TRACE=1 logs every input's operations.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var (
	errFuzzPerm      = errors.New("fuzz: permanent failure")
	errFuzzRetry     = errors.New("fuzz: retryable failure")
	errFuzzRecompute = errors.New("fuzz: conflict, recompute")
	errFuzzBefore    = errors.New("fuzz: before-retry hook failed")
	errFuzzMerge     = errors.New("fuzz: merge refused")
)

const (
	fzKeys       = 4
	fzMaxOps     = 64
	fzBackoff    = time.Millisecond
	fzMaxBackoff = 4 * time.Millisecond
	fzCooldown   = 3 * time.Millisecond
)

func FuzzQueueModel(f *testing.F) {
	for _, s := range fzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		synctest.Test(t, func(t *testing.T) { fzRun(t, data) })
	})
}

// fzSeeds are hand-written cases, encoded with fzEncode (the inverse of the
// decoder) so that they read as what they do.
var fzSeeds = [][]byte{
	// Replace merge: posts coalesce into the pending call while another key
	// runs; a ticket joins them.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzPostOp(1, 0), fzPostOp(0, 0), fzPostOp(0, 0), fzSubmitOp(0, 1),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Sum merge, priorities and aging: a low-priority call ages past newer
	// high-priority ones.
	fzEncode(fzConfig{merge: 1, aging: time.Millisecond, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 2), fzAdvanceOp(10*time.Millisecond),
		fzSubmitOp(3, 3), fzSubmitOp(1, 1),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Strict priority with extreme priorities.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, math.MinInt), fzSubmitOp(2, math.MaxInt), fzSubmitOp(3, math.MaxInt-1),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Deadlines: a pending call, an in-flight call and a ctx deadline
	// expire; fire-and-forget posts share the latest deadline.
	fzEncode(fzConfig{honour: true, aging: time.Millisecond, capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzDeadline(time.Millisecond)),
		fzWith(fzSubmitOp(1, 0), fzDeadline(2*time.Millisecond)),
		fzWith(fzSubmitOp(1, 1), fzCtx(fzCtxDeadline, time.Millisecond)),
		fzWith(fzPostOp(2, 0), fzDeadline(3*time.Millisecond)),
		fzWith(fzPostOp(2, 0), fzDeadline(5*time.Millisecond)),
		fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond),
		fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Fire-and-forget posts extend their shared deadline: the clock
	// re-indexes the aggregate instead of expiring it early.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzSubmitOp(1, 0),
		fzWith(fzPostOp(0, 0), fzDeadline(time.Millisecond)),
		fzWith(fzPostOp(0, 0), fzDeadline(3*time.Millisecond)),
		fzWith(fzSubmitOp(0, 0), fzDeadline(2*time.Millisecond)),
		fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond),
		fzFinishOp(fzOK)),
	// Idempotency keys: equal ones coalesce, different ones are refused.
	fzEncode(fzConfig{merge: 1, capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzIdem("x")), fzSubmitOp(0, 0), fzWith(fzPostOp(0, 0), fzIdem("x")),
		fzWith(fzSubmitOp(0, 0), fzIdem("y")), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Generations: a newer one supersedes the in-flight call and its
	// successor; an older one is stale.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzGen(1), fzCtx(fzCtxCancelable, 0)),
		fzWith(fzSubmitOp(0, 0), fzGen(1)),
		fzWith(fzSubmitOp(0, 0), fzGen(2)),
		fzWith(fzSubmitOp(0, 0), fzGen(0)),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Cancellation: a ctx with a cause, Ticket.Cancel, Cancel(key).
	fzEncode(fzConfig{honour: true, capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzCtx(fzCtxCancelable, 0)),
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(1, 0),
		fzOp{kind: fzCtxCancel, idx: 0}, fzOp{kind: fzTicketCancel, idx: 2},
		fzOp{kind: fzCancelKey, key: 0}, fzOp{kind: fzCancelKey, key: 0},
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Retries: a retryable failure absorbs the successor, backs off, and
	// runs out of attempts; then permanent, panic, recompute.
	fzEncode(fzConfig{merge: 1, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(0, 0), fzFinishOp(fzRetry),
		fzAdvanceOp(time.Millisecond), fzFinishOp(fzRetry), fzAdvanceOp(2*time.Millisecond), fzFinishOp(fzRetry),
		fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzSubmitOp(3, 0),
		fzFinishOp(fzPerm), fzFinishOp(fzPanic), fzFinishOp(fzRecompute)),
	// The before-retry hook and the no-op test.
	fzEncode(fzConfig{noop: true, before: true, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzSubmitOp(3, 0), fzSubmitOp(0, 0),
		fzFinishOp(fzRetry), fzAdvanceOp(time.Millisecond), fzFinishOp(fzRecompute), fzFinishOp(fzRetry),
		fzAdvanceOp(time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Capacity and waiter bounds.
	fzEncode(fzConfig{capacity: 2, maxWaiters: 2, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzPostOp(2, 0), fzSubmitOp(1, 0),
		fzPostOp(1, 0), fzFinishOp(fzOK), fzSubmitOp(2, 0), fzFinishOp(fzOK)),
	// Shedding: a droppable pending call makes room for a better newcomer.
	fzEncode(fzConfig{capacity: 2, maxAttempts: 1},
		fzSubmitOp(0, 0), fzWith(fzPostOp(1, 0), fzDrop()), fzSubmitOp(2, 2),
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// A droppable newcomer refused by the open breaker must not evict
	// anything on its way out.
	fzEncode(fzConfig{capacity: 2, maxAttempts: 1, breaker: true, brFailures: 1, brRefuse: true},
		fzSubmitOp(0, 0), fzWith(fzSubmitOp(1, 0), fzDrop()), fzFinishOp(fzRetry),
		fzPostOp(2, 0), fzWith(fzPostOp(3, 5), fzDrop()), fzAdvanceOp(3*time.Millisecond),
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// The breaker trips, cools down, probes, and closes again.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 2, breaker: true, brFailures: 2},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzFinishOp(fzRetry), fzFinishOp(fzRetry),
		fzSubmitOp(3, 0), fzAdvanceOp(time.Millisecond), fzAdvanceOp(2*time.Millisecond), fzFinishOp(fzRetry),
		fzAdvanceOp(3*time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// A deadline already passed when the clock still reads its origin.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzDeadline(0)), fzWith(fzPostOp(1, 0), fzDeadline(-time.Millisecond)),
		fzAdvanceOp(time.Millisecond)),
	// Close drains, then its context ends while an exec ignores its own.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzOp{kind: fzClose}, fzSubmitOp(2, 0),
		fzFinishOp(fzOK), fzOp{kind: fzCloseAbort}, fzFinishOp(fzOK)),
	// A refusing merge and a retry: the successor cannot be absorbed and
	// waits behind the retry, whose waiter then leaves.
	fzEncode(fzConfig{merge: 2, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(0, 0), fzFinishOp(fzRetry),
		fzOp{kind: fzTicketCancel, idx: 0}, fzFinishOp(fzOK), fzFinishOp(fzOK)),
}

// Seed builders.

func fzSubmitOp(key, prio int) fzOp { return fzOp{kind: fzSubmit, key: key, prio: prio} }
func fzPostOp(key, prio int) fzOp   { return fzOp{kind: fzPost, key: key, prio: prio} }
func fzFinishOp(result int) fzOp    { return fzOp{kind: fzFinish, result: result} }
func fzAdvanceOp(d time.Duration) fzOp {
	return fzOp{kind: fzAdvance, dur: d}
}

func fzWith(op fzOp, mods ...func(*fzOp)) fzOp {
	for _, f := range mods {
		f(&op)
	}
	return op
}

func fzDeadline(d time.Duration) func(*fzOp) {
	return func(op *fzOp) { op.hasDL, op.dl = true, d }
}
func fzGen(g uint64) func(*fzOp)  { return func(op *fzOp) { op.gen = g } }
func fzDrop() func(*fzOp)         { return func(op *fzOp) { op.drop = true } }
func fzIdem(k string) func(*fzOp) { return func(op *fzOp) { op.idem = k } }
func fzCtx(kind int, dl time.Duration) func(*fzOp) {
	return func(op *fzOp) { op.ctxKind, op.ctxDL = kind, dl }
}

// fzEncode is the inverse of the decoder, for seeds.
func fzEncode(cfg fzConfig, ops ...fzOp) []byte {
	bit := func(b bool, n uint) byte {
		if b {
			return 1 << n
		}
		return 0
	}
	a := byte(cfg.merge) | bit(cfg.honour, 2) | bit(cfg.noop, 3) | bit(cfg.before, 4) | bit(cfg.drainClose, 5) |
		byte(slices.Index(fzAgings[:], cfg.aging))<<6
	b := byte(cfg.capacity-1) | byte(cfg.maxWaiters)<<2
	if cfg.capacity == 64 {
		b = 0x80 | byte(cfg.maxWaiters)<<2
	}
	c := byte(cfg.maxAttempts-1) | bit(cfg.breaker, 2) | bit(cfg.brRefuse, 4)
	if cfg.breaker {
		c |= byte(cfg.brFailures-1) << 3
	}
	out := []byte{a, b, c}
	must := func(i int, what string) byte {
		if i < 0 {
			panic("fzEncode: no encoding for " + what)
		}
		return byte(i)
	}
	for _, op := range ops {
		out = append(out, must(slices.Index(fzKindOf[:], op.kind), "kind"))
		switch op.kind {
		case fzSubmit, fzPost:
			dl := must(slices.Index(fzOffsets[:], op.dl), "deadline") | bit(op.hasDL, 3)
			if !op.hasDL {
				dl = 0
			}
			out = append(out,
				byte(op.key)|must(slices.Index(fzPrios[:], op.prio), "priority")<<2,
				byte(op.gen)|must(slices.Index([]string{"", "x", "y"}, op.idem), "idem")<<2|bit(op.drop, 7),
				dl)
			if op.kind == fzSubmit {
				c := [...]byte{0, 4, 6, 7}[op.ctxKind]
				if op.ctxKind == fzCtxDeadline {
					c |= must(slices.Index(fzOffsets[:], op.ctxDL), "ctx deadline") << 3
				}
				out = append(out, c)
			}
		case fzTicketCancel, fzCtxCancel:
			out = append(out, byte(op.idx))
		case fzCancelKey:
			out = append(out, byte(op.key))
		case fzAdvance:
			out = append(out, must(slices.Index(fzDurs[:], op.dur), "duration"))
		case fzFinish:
			out = append(out, must(slices.Index(fzResultOf[:], op.result), "result"))
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Decoding.

type fzReader struct {
	b []byte
	i int
}

func (r *fzReader) more() bool { return r.i < len(r.b) }

func (r *fzReader) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

type fzConfig struct {
	merge       int // 0 replace, 1 sum, 2 sum that refuses incoming multiples of 3
	honour      bool
	noop        bool // values divisible by 5 are no-ops
	before      bool // Config.BeforeRetry
	drainClose  bool // the final Close drains (else its context ends at once)
	aging       time.Duration
	capacity    int
	maxWaiters  int // 0: default
	maxAttempts int
	breaker     bool // Config.Breaker: consecutive-failure rule only, one probe
	brFailures  int  // BreakerPolicy.ConsecutiveFailures
	brRefuse    bool // BreakerPolicy.RefuseDroppable
}

func (c fzConfig) String() string {
	s := fmt.Sprintf("merge=%d honour=%v noop=%v before=%v drainClose=%v aging=%v capacity=%d maxWaiters=%d maxAttempts=%d",
		c.merge, c.honour, c.noop, c.before, c.drainClose, c.aging, c.capacity, c.maxWaiters, c.maxAttempts)
	if c.breaker {
		s += fmt.Sprintf(" breaker(failures=%d refuseDroppable=%v)", c.brFailures, c.brRefuse)
	}
	return s
}

var fzAgings = [4]time.Duration{0, time.Millisecond, 3 * time.Millisecond, time.Second}

func fzDecodeConfig(r *fzReader) fzConfig {
	a, b, c := r.next(), r.next(), r.next()
	cfg := fzConfig{
		merge:       int(a % 3),
		honour:      a&0x04 != 0,
		noop:        a&0x08 != 0,
		before:      a&0x10 != 0,
		drainClose:  a&0x20 != 0,
		aging:       fzAgings[a>>6],
		capacity:    1 + int(b%4),
		maxAttempts: 1 + int(c&3)%3,
		breaker:     c&0x04 != 0,
		brFailures:  1 + int(c>>3)&1,
		brRefuse:    c&0x10 != 0,
	}
	if b&0x80 != 0 {
		cfg.capacity = 64
	}
	if m := int(b>>2) & 7; m >= 1 && m <= 6 {
		cfg.maxWaiters = m
	}
	return cfg
}

const (
	fzSubmit = iota
	fzPost
	fzTicketCancel
	fzCtxCancel
	fzCancelKey
	fzAdvance
	fzFinish
	fzClose
	fzCloseAbort
)

var fzKindOf = [32]int{
	fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit,
	fzPost, fzPost, fzPost, fzPost, fzPost,
	fzTicketCancel, fzTicketCancel, fzCtxCancel, fzCancelKey,
	fzAdvance, fzAdvance, fzAdvance, fzAdvance,
	fzFinish, fzFinish, fzFinish, fzFinish, fzFinish, fzFinish, fzFinish,
	fzClose, fzCloseAbort, fzSubmit, fzSubmit,
}

// How a released exec ends.
const (
	fzOK = iota
	fzPerm
	fzRetry
	fzPanic
	fzRecompute
)

var fzResultOf = [8]int{fzOK, fzOK, fzOK, fzPerm, fzRetry, fzRetry, fzPanic, fzRecompute}
var fzResultName = [...]string{"ok", "permanent", "retryable", "panic", "recompute"}

// Submit context kinds.
const (
	fzCtxBackground = iota
	fzCtxCancelable
	fzCtxDeadline
	fzCtxDone
)

var fzPrios = [16]int{0, 0, 0, 0, 1, 1, 2, 3, 5, -1, -3, 10, 1000, math.MaxInt, math.MinInt, math.MaxInt - 1}

var fzOffsets = [8]time.Duration{-time.Millisecond, 0, 500 * time.Microsecond, time.Millisecond,
	2 * time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond, 2 * time.Second}

var fzDurs = [8]time.Duration{500 * time.Microsecond, time.Millisecond, time.Millisecond, 2 * time.Millisecond,
	3 * time.Millisecond, 4 * time.Millisecond, 10 * time.Millisecond, 1500 * time.Millisecond}

type fzOp struct {
	kind    int
	key     int
	prio    int
	gen     uint64
	idem    string
	drop    bool
	hasDL   bool
	dl      time.Duration // offset from now
	ctxKind int
	ctxDL   time.Duration // offset from now
	idx     int
	dur     time.Duration
	result  int
}

func fzDecodeOp(r *fzReader) fzOp {
	op := fzOp{kind: fzKindOf[r.next()%32]}
	switch op.kind {
	case fzSubmit, fzPost:
		k, g, dl := r.next(), r.next(), r.next()
		op.key = int(k % fzKeys)
		op.prio = fzPrios[(k>>2)&15]
		op.gen = uint64(g&3) % 3
		op.idem = [3]string{"", "x", "y"}[((g>>2)&3)%3]
		op.drop = g&0x80 != 0
		op.hasDL = dl&8 != 0
		op.dl = fzOffsets[dl&7]
		if op.kind == fzSubmit {
			c := r.next()
			op.ctxKind = [8]int{0, 0, 0, 0, fzCtxCancelable, fzCtxCancelable, fzCtxDeadline, fzCtxDone}[c%8]
			op.ctxDL = fzOffsets[(c>>3)&7]
		}
	case fzTicketCancel, fzCtxCancel:
		op.idx = int(r.next())
	case fzCancelKey:
		op.key = int(r.next() % fzKeys)
	case fzAdvance:
		op.dur = fzDurs[r.next()%8]
	case fzFinish:
		op.result = fzResultOf[r.next()%8]
	}
	return op
}

func (op fzOp) String() string {
	switch op.kind {
	case fzSubmit, fzPost:
		name := "Submit"
		if op.kind == fzPost {
			name = "Post"
		}
		s := fmt.Sprintf("%s(k%d prio=%d gen=%d", name, op.key, op.prio, op.gen)
		if op.idem != "" {
			s += " idem=" + op.idem
		}
		if op.drop {
			s += " droppable"
		}
		if op.hasDL {
			s += fmt.Sprintf(" deadline=now%+v", op.dl)
		}
		if op.kind == fzSubmit {
			s += " ctx=" + [...]string{"background", "cancelable", "deadline", "done"}[op.ctxKind]
			if op.ctxKind == fzCtxDeadline {
				s += fmt.Sprintf("(now%+v)", op.ctxDL)
			}
		}
		return s + ")"
	case fzTicketCancel:
		return fmt.Sprintf("Ticket.Cancel(#%d)", op.idx)
	case fzCtxCancel:
		return fmt.Sprintf("cancel ctx of ticket #%d", op.idx)
	case fzCancelKey:
		return fmt.Sprintf("Cancel(k%d)", op.key)
	case fzAdvance:
		return fmt.Sprintf("advance %v", op.dur)
	case fzFinish:
		return "finish running exec: " + fzResultName[op.result]
	case fzClose:
		return "Close (in background)"
	case fzCloseAbort:
		return "end Close's context"
	}
	return "?"
}

// ---------------------------------------------------------------------------
// The reference model.

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
	endState  State
	probe     bool // started by a half-open breaker
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
	state    State
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
	state    State
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

	br        BreakerState
	consec    int   // retryable failures in a row
	openUntil int64 // while open
	probes    int   // probes in flight while half-open

	outcomes [numStates]uint64
	callsBy  [numStates]uint64
	starts   []fzStart
	hooks    []fzHookRec
}

func newFzModel(cfg fzConfig) *fzModel {
	return &fzModel{cfg: cfg, slots: map[int]*fmSlot{}}
}

func (m *fzModel) maxWaiters() int {
	if m.cfg.maxWaiters > 0 {
		return m.cfg.maxWaiters
	}
	return m.cfg.capacity * DefaultWaitersPerKey
}

func (m *fzModel) noop(v int64) bool { return m.cfg.noop && v%5 == 0 }

// vt is enqueue time − priority×aging, saturated to int64, computed with
// big integers so that it shares nothing with the implementation's
// saturating arithmetic.
func (m *fzModel) vt(prio int, enq int64) int64 {
	v := new(big.Int).Mul(big.NewInt(int64(prio)), big.NewInt(int64(m.cfg.aging)))
	v.Sub(big.NewInt(enq), v)
	switch {
	case v.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case v.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return v.Int64()
}

// before reports whether a runs before b in the ready order.
func (m *fzModel) before(aPrio int, aEnq int64, aSeq uint64, bPrio int, bEnq int64, bSeq uint64) bool {
	if m.cfg.aging == 0 {
		if aPrio != bPrio {
			return aPrio > bPrio
		}
		if aEnq != bEnq {
			return aEnq < bEnq
		}
		return aSeq < bSeq
	}
	va, vb := m.vt(aPrio, aEnq), m.vt(bPrio, bEnq)
	if va != vb {
		return va < vb
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
		return ErrClosed
	}
	s := m.slots[op.key]
	if s == nil {
		var victim *fmCall
		if len(m.slots) >= m.cfg.capacity {
			// §3: a new key evicts the worst droppable pending call if
			// that call is worse than the newcomer, else is refused.
			victim = m.victim(op.prio)
			if victim == nil {
				return ErrBackpressure
			}
		}
		if mt != nil && m.tickets >= m.maxWaiters() {
			return ErrBackpressure
		}
		if op.drop && m.cfg.breaker && m.cfg.brRefuse && m.br == BreakerOpen {
			return ErrCircuitOpen
		}
		if victim != nil {
			m.settleAll(victim, Dropped, "dropped", nil, false)
			m.endCall(victim, Dropped, "dropped")
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
		return ErrStale
	}
	if mt != nil && m.tickets >= m.maxWaiters() {
		return ErrBackpressure
	}
	if op.gen > s.gen {
		s.gen = op.gen
		for _, c := range [2]*fmCall{s.next, s.run} {
			if c != nil && !c.orphan {
				m.settleAll(c, Stale, "stale", nil, false)
				m.endCall(c, Stale, "stale")
			}
		}
	}
	if c := s.next; c != nil {
		if !m.coalesce(c, val, op.idem) {
			return ErrMergeRejected
		}
		c.droppable = c.droppable && op.drop
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
	c := &fmCall{slot: s, val: val, gen: op.gen, seq: m.seq, idem: op.idem, droppable: op.drop, where: fmSucc}
	s.next = c
	return c
}

// coalesce merges val into c, or reports false and leaves c as it was.
func (m *fzModel) coalesce(c *fmCall, val int64, idem string) bool {
	if idem != "" && c.idem != "" && idem != c.idem {
		return false
	}
	switch m.cfg.merge {
	case 1:
		val += c.val
	case 2:
		if val%3 == 0 {
			return false
		}
		val += c.val
	}
	c.val = val
	if c.idem == "" {
		c.idem = idem
	}
	return true
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

func (m *fzModel) settle(t *fmTicket, c *fmCall, st State, class string, cause error) {
	t.done, t.call = true, nil
	t.state, t.val, t.waiters, t.attempts, t.class, t.cause = st, c.val, c.joined, c.attempts, class, cause
	m.outcomes[st]++
}

// settleAll ends every live waiter of c with st (or Expired, with expire,
// for a waiter whose deadline passed) and reports whether any got st.
func (m *fzModel) settleAll(c *fmCall, st State, class string, cause error, expire bool) bool {
	served := false
	for _, t := range c.tickets {
		if expire && t.deadline != 0 && t.deadline <= m.now {
			m.settle(t, c, Expired, "expired", nil)
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
			wst = Expired
		} else {
			served = true
		}
		m.outcomes[wst] += uint64(c.nff)
		m.liveFF -= c.nff
		c.nff, c.ffForever = 0, false
	}
	return served
}

func (m *fzModel) hook(c *fmCall, st State, class string) {
	m.callsBy[st]++
	m.hooks = append(m.hooks, fzHookRec{key: c.slot.key, state: st, val: c.val, attempts: c.attempts, waiters: c.joined, class: class})
}

// endCall ends a call that has no live waiters left: an in-flight one is
// orphaned (its execution will be reported when it returns), any other is
// removed and reported.
func (m *fzModel) endCall(c *fmCall, st State, class string) {
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

func (m *fzModel) leave(t *fmTicket, st State, class string, cause error) {
	if t.done {
		return
	}
	c := t.call
	i := slices.Index(c.tickets, t)
	c.tickets = slices.Delete(c.tickets, i, i+1)
	m.tickets--
	m.settle(t, c, st, class, cause)
	if st == Expired && m.cfg.honour && c.where == fmRunning && m.runDL == m.now {
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
			m.settleAll(c, Canceled, "canceled", cause, false)
			m.endCall(c, Canceled, "canceled")
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
				m.leave(t, Expired, "expired", nil)
			}
		}
		if c.nff > 0 && !c.ffForever && c.ffDL <= m.now {
			m.outcomes[Expired] += uint64(c.nff)
			m.liveFF -= c.nff
			c.nff = 0
			if c.live() == 0 {
				m.endCall(c, Expired, "expired")
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
	if m.br == BreakerOpen && m.openUntil > m.now {
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
		probe := m.br != BreakerClosed
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
			st, class = Stale, "stale"
			m.staleExecs++
		}
		m.hook(c, st, class)
	case out.hookErr:
		m.end(c, Failed, "retry:before-retry:before", out.ran)
	case out.done:
		m.alreadyDone++
		m.end(c, Succeeded, "nil", out.ran)
	case out.skipped:
		m.end(c, Skipped, "nil", out.ran)
	case out.ctxEnded:
		panic("fzModel: an execution ended by its context must be orphaned")
	case out.result == fzOK:
		m.end(c, Succeeded, "nil", out.ran)
	default:
		notBefore, reason := m.retryAt(c, out)
		if reason == "" {
			m.requeue(c, notBefore)
			return
		}
		m.end(c, Failed, fzFailClass(out.result, reason), out.ran)
	}
	m.calls--
	s.run = nil
	c.where = fmEnded
	if n := s.next; n != nil && n.where == fmSucc {
		m.push(n)
	}
	m.releaseSlot(s)
}

func (m *fzModel) end(c *fmCall, st State, class string, ran bool) {
	switch {
	case m.settleAll(c, st, class, nil, true):
		m.hook(c, st, class)
	case ran:
		m.staleExecs++
		m.hook(c, Stale, "stale")
	default:
		m.hook(c, Expired, "expired")
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
		if m.coalesce(c, n.val, n.idem) {
			m.absorb(c, n)
			s.run, s.next = nil, c
		}
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

func (m *fzModel) absorb(c, n *fmCall) {
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
	case BreakerOpen:
		if m.now < m.openUntil {
			return false
		}
		m.br = BreakerHalfOpen
		fallthrough
	case BreakerHalfOpen:
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
		if m.br == BreakerHalfOpen {
			m.br, m.probes = BreakerClosed, 0
		}
		return
	}
	m.consec++
	if m.br == BreakerHalfOpen || (m.br == BreakerClosed && m.consec >= m.cfg.brFailures) {
		m.br, m.openUntil, m.consec = BreakerOpen, m.now+int64(fzCooldown), 0
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
				m.settleAll(c, Closed, "closed", nil, false)
				m.endCall(c, Closed, "closed")
			}
		}
		m.releaseSlot(s)
	}
}

func (m *fzModel) closeReturned() bool { return m.stopped && m.running == nil }

func fzStateClass(st State) string {
	switch st {
	case Succeeded, Skipped:
		return "nil"
	case Canceled:
		return "canceled"
	case Expired:
		return "expired"
	case Dropped:
		return "dropped"
	case Stale:
		return "stale"
	case Closed:
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
	case errors.Is(err, ErrStale):
		return "stale"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrCanceled):
		return "canceled"
	case errors.Is(err, ErrDropped):
		return "dropped"
	}
	var re *RetryError
	if errors.As(err, &re) {
		return "retry:" + string(re.Reason) + ":" + fzErrClass(re.Last)
	}
	var pe *PanicError
	switch {
	case errors.Is(err, ErrExpired):
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

// ---------------------------------------------------------------------------
// The harness: the real Dispatcher, driven in step with the model.

type fzExec struct {
	key      int
	val      int64
	deadline int64
	release  chan int
	returned bool
}

type fzTicket struct {
	tk     *Ticket[int, int64]
	m      *fmTicket
	op     int // index of the op that submitted it
	cancel func()
	cause  error // what cancel cancels with
	seen   bool
	res    Result[int, int64]
}

type fzHarness struct {
	t     *testing.T
	cfg   fzConfig
	m     *fzModel
	d     *Dispatcher[int, int64]
	t0    time.Time
	trace []string

	mu    sync.Mutex // guards execs and hooks
	execs []*fzExec
	hooks []Result[int, int64]

	nHooks, nModelHooks int
	tickets             []*fzTicket
	ctxCancels          []func()

	closeStarted  bool
	closeCancel   context.CancelFunc
	closeDone     chan error
	closeReturned bool
	tearingDown   bool
}

func fzRun(t *testing.T, data []byte) {
	r := &fzReader{b: data}
	cfg := fzDecodeConfig(r)
	h := &fzHarness{t: t, cfg: cfg, m: newFzModel(cfg), closeDone: make(chan error, 1)}
	h.trace = append(h.trace, "config: "+cfg.String())
	dc := Config[int, int64]{
		Workers:        1,
		Capacity:       cfg.capacity,
		MaxWaiters:     cfg.maxWaiters,
		Aging:          cfg.aging,
		StrictPriority: cfg.aging == 0,
		OnDone: func(r Result[int, int64]) {
			h.mu.Lock()
			h.hooks = append(h.hooks, r)
			h.mu.Unlock()
		},
		Classify: func(err error) Class {
			switch {
			case errors.Is(err, errFuzzRetry):
				return Retry
			case errors.Is(err, errFuzzRecompute):
				return Recompute
			}
			return Permanent
		},
		Retry: RetryPolicy{
			MaxAttempts:    cfg.maxAttempts,
			InitialBackoff: fzBackoff,
			MaxBackoff:     fzMaxBackoff,
			Multiplier:     2,
			Jitter:         NoJitter,
			BudgetRatio:    math.Inf(1),
		},
	}
	if cfg.breaker {
		dc.Breaker = &BreakerPolicy{
			ConsecutiveFailures: cfg.brFailures,
			FailureRatio:        math.Inf(1),
			Cooldown:            fzCooldown,
			Probes:              1,
			RefuseDroppable:     cfg.brRefuse,
		}
	}
	switch cfg.merge {
	case 1:
		dc.Merge = func(p, in int64) (int64, error) { return p + in, nil }
	case 2:
		dc.Merge = func(p, in int64) (int64, error) {
			if in%3 == 0 {
				return 0, errFuzzMerge
			}
			return p + in, nil
		}
	}
	if cfg.noop {
		dc.NoOp = func(_ int, v int64) bool { return v%5 == 0 }
	}
	if cfg.before {
		dc.BeforeRetry = func(_ context.Context, _ int, v int64, _ error) (int64, bool, error) {
			switch {
			case v%7 == 0:
				return 0, true, nil
			case v%11 == 0:
				return 0, false, errFuzzBefore
			}
			return v + 1000, false, nil
		}
	}
	h.t0 = time.Now()
	d, err := New(h.exec, dc)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.d = d
	for i := 0; i < fzMaxOps && r.more(); i++ {
		op := fzDecodeOp(r)
		h.apply(i, op)
	}
	h.finalize()
	if os.Getenv("DISPATCH_FUZZ_TRACE") != "" {
		t.Logf("ops:\n  %s", strings.Join(h.trace, "\n  "))
	}
}

func (h *fzHarness) exec(ctx context.Context, key int, val int64) error {
	e := &fzExec{key: key, val: val, release: make(chan int, 1)}
	if dl, ok := ctx.Deadline(); ok {
		e.deadline = int64(dl.Sub(h.t0))
	}
	h.mu.Lock()
	h.execs = append(h.execs, e)
	h.mu.Unlock()
	var result int
	if h.cfg.honour {
		select {
		case result = <-e.release:
		case <-ctx.Done():
			h.mu.Lock()
			e.returned = true
			h.mu.Unlock()
			return context.Cause(ctx)
		}
	} else {
		result = <-e.release
	}
	h.mu.Lock()
	e.returned = true
	h.mu.Unlock()
	switch result {
	case fzPerm:
		return fmt.Errorf("key %d: %w", key, errFuzzPerm)
	case fzRetry:
		return fmt.Errorf("key %d: %w", key, errFuzzRetry)
	case fzRecompute:
		return fmt.Errorf("key %d: %w", key, errFuzzRecompute)
	case fzPanic:
		panic(fmt.Sprintf("fuzz exec panic, key %d", key))
	}
	return nil
}

func (h *fzHarness) fail(format string, args ...any) {
	h.t.Helper()
	msg := fmt.Sprintf(format, args...)
	h.teardown()
	h.t.Fatalf("%s\n\nops:\n  %s", msg, strings.Join(h.trace, "\n  "))
}

// teardown closes the dispatcher however it is, so that the bubble can end.
func (h *fzHarness) teardown() {
	if h.tearingDown {
		return
	}
	h.tearingDown = true
	if !h.closeStarted {
		h.startClose()
	}
	h.closeCancel()
	for range 1000 {
		synctest.Wait()
		select {
		case <-h.closeDone:
			h.closeReturned = true
		default:
		}
		if h.closeReturned {
			break
		}
		h.mu.Lock()
		for _, e := range h.execs {
			if !e.returned && len(e.release) == 0 {
				e.release <- fzOK
			}
		}
		h.mu.Unlock()
	}
	for _, c := range h.ctxCancels {
		c()
	}
}

func (h *fzHarness) startClose() {
	h.closeStarted = true
	ctx, cancel := context.WithCancel(context.Background())
	h.closeCancel = cancel
	go func() { h.closeDone <- h.d.Close(ctx) }()
}

func (h *fzHarness) apply(i int, op fzOp) {
	m := h.m
	h.trace = append(h.trace, fmt.Sprintf("%2d @%v: %v", i, time.Duration(m.now), op))
	val := int64(i + 1)
	switch op.kind {
	case fzSubmit:
		var o SubmitOptions
		o.Priority, o.Generation, o.IdempotencyKey, o.Droppable = op.prio, op.gen, op.idem, op.drop
		var deadline int64 // absolute; meaningful only with hasDL
		hasDL := op.hasDL
		if hasDL {
			deadline = m.now + int64(op.dl)
			o.Deadline = h.t0.Add(time.Duration(deadline))
		}
		ctx := context.Background()
		var cancel func()
		var cause, early error
		switch op.ctxKind {
		case fzCtxCancelable:
			c, cf := context.WithCancelCause(ctx)
			cause = fmt.Errorf("fuzz: ctx of op %d cancelled", i)
			ctx, cancel = c, func() { cf(cause) }
		case fzCtxDeadline:
			at := m.now + int64(op.ctxDL)
			c, cf := context.WithDeadline(ctx, h.t0.Add(time.Duration(at)))
			ctx, cancel, cause = c, cf, context.Canceled
			if at <= m.now {
				early = ErrExpired // the context is done already
			}
			if !hasDL || at < deadline {
				hasDL, deadline = true, at
			}
		case fzCtxDone:
			c, cf := context.WithCancel(ctx)
			cf()
			ctx, cancel = c, cf
			early = ErrCanceled
		}
		if cancel != nil {
			h.ctxCancels = append(h.ctxCancels, cancel)
		}
		if early == nil && hasDL && deadline <= m.now {
			early = ErrExpired
		}
		if !hasDL {
			deadline = 0
		}
		mt := &fmTicket{key: op.key}
		want := m.submit(op, val, deadline, early, mt)
		tk, err := h.d.Submit(ctx, op.key, val, o)
		h.compareErr("Submit", err, want)
		if want == nil && tk != nil {
			mt.ctxLive = op.ctxKind == fzCtxCancelable || op.ctxKind == fzCtxDeadline
			h.tickets = append(h.tickets, &fzTicket{tk: tk, m: mt, op: i, cancel: cancel, cause: cause})
		}
	case fzPost:
		var o SubmitOptions
		o.Priority, o.Generation, o.IdempotencyKey, o.Droppable = op.prio, op.gen, op.idem, op.drop
		var deadline int64
		var early error
		if op.hasDL {
			deadline = m.now + int64(op.dl)
			o.Deadline = h.t0.Add(time.Duration(deadline))
			if deadline <= m.now {
				early = ErrExpired
			}
		}
		want := m.submit(op, val, deadline, early, nil)
		err := h.d.Post(op.key, val, o)
		h.compareErr("Post", err, want)
	case fzTicketCancel:
		if len(h.tickets) == 0 {
			break
		}
		ft := h.tickets[op.idx%len(h.tickets)]
		h.trace[len(h.trace)-1] += fmt.Sprintf(" = ticket of op %d", ft.op)
		ft.tk.Cancel()
		m.leave(ft.m, Canceled, "canceled", nil)
	case fzCtxCancel:
		if len(h.tickets) == 0 {
			break
		}
		ft := h.tickets[op.idx%len(h.tickets)]
		h.trace[len(h.trace)-1] += fmt.Sprintf(" = ticket of op %d", ft.op)
		if ft.cancel != nil {
			ft.cancel()
		}
		if ft.m.ctxLive {
			ft.m.ctxLive = false
			m.leave(ft.m, Canceled, "canceled", ft.cause)
		}
	case fzCancelKey:
		cause := fmt.Errorf("fuzz: Cancel in op %d", i)
		got := h.d.Cancel(op.key, cause)
		if want := m.cancelKey(op.key, cause); got != want {
			h.fail("step %d: Cancel(k%d) = %v, model says %v", i, op.key, got, want)
		}
	case fzAdvance:
		time.Sleep(op.dur)
		m.advance(m.now + int64(op.dur))
	case fzFinish:
		if m.running == nil {
			break
		}
		h.releaseRunning(op.result)
		m.release(op.result)
	case fzClose:
		if !h.closeStarted {
			h.startClose()
			m.close()
		}
	case fzCloseAbort:
		if h.closeStarted {
			h.closeCancel()
			m.abort()
		}
	}
	m.work()
	h.check(fmt.Sprintf("step %d (%v)", i, op))
}

func (h *fzHarness) releaseRunning(result int) {
	h.mu.Lock()
	var open []*fzExec
	for _, e := range h.execs {
		if !e.returned {
			open = append(open, e)
		}
	}
	h.mu.Unlock()
	if len(open) != 1 {
		h.fail("the model has a call in flight, the dispatcher has %d unreturned exec calls", len(open))
	}
	open[0].release <- result
}

func (h *fzHarness) compareErr(what string, got, want error) {
	h.t.Helper()
	switch {
	case want == nil && got != nil:
		h.fail("%s: %v, model accepts it", what, got)
	case want != nil && got == nil:
		h.fail("%s accepted, model says %v", what, want)
	case want != nil && !errors.Is(got, want):
		h.fail("%s: %v, model says %v", what, got, want)
	}
}

// finalize closes the dispatcher (draining, or ending Close's context at
// once) and checks that everything ended.
func (h *fzHarness) finalize() {
	m := h.m
	if !h.closeStarted {
		h.trace = append(h.trace, "final: Close")
		h.startClose()
		m.close()
		m.work()
		h.check("final Close")
	}
	if !h.cfg.drainClose {
		h.trace = append(h.trace, "final: end Close's context")
		h.closeCancel()
		m.abort()
		m.work()
		h.check("final abort")
	}
	for i := 0; !h.closeReturned; i++ {
		switch {
		case i > 10*fzMaxOps:
			h.fail("Close does not return")
		case m.running != nil:
			h.trace = append(h.trace, "final: finish running exec: ok")
			h.releaseRunning(fzOK)
			m.release(fzOK)
			m.work()
			h.check("final finish")
		case m.nextEvent() != 0:
			dur := m.nextEvent() - m.now
			h.trace = append(h.trace, fmt.Sprintf("final: advance %v", time.Duration(dur)))
			time.Sleep(time.Duration(dur))
			m.advance(m.now + dur)
			h.check("final advance")
		default:
			h.fail("model: Close cannot return, nothing runs and nothing waits")
		}
	}
	s := h.d.Stats()
	if s.Live != 0 || s.Keys != 0 || s.InFlight != 0 || s.Tickets != 0 {
		h.fail("after Close: %+v", s)
	}
	for _, ft := range h.tickets {
		if !ft.seen {
			h.fail("after Close: ticket of op %d is not done", ft.op)
		}
	}
	// Close is idempotent.
	if err := h.d.Close(context.Background()); err != nil {
		h.fail("second Close: %v", err)
	}
	for _, c := range h.ctxCancels {
		c()
	}
}

func (h *fzHarness) check(step string) {
	h.t.Helper()
	synctest.Wait()
	m := h.m
	h.mu.Lock()
	execs := slices.Clone(h.execs)
	var snap []fzStart
	for _, e := range execs {
		snap = append(snap, fzStart{key: e.key, val: e.val, deadline: e.deadline})
	}
	hooks := slices.Clone(h.hooks[h.nHooks:])
	h.nHooks = len(h.hooks)
	h.mu.Unlock()

	// Executions started, in order.
	if !slices.Equal(snap, m.starts) {
		h.fail("%s: exec calls\n  got  %v\n  want %v", step, snap, m.starts)
	}

	// Completion hook, as a multiset.
	var got, want []string
	for _, r := range hooks {
		got = append(got, fzHookRec{key: r.Key, state: r.State, val: r.Call, attempts: r.Attempts, waiters: r.Waiters, class: fzErrClass(r.Err)}.String())
		if r.QueueWait < 0 || r.RunTime < 0 {
			h.fail("%s: hook result with negative duration: %+v", step, r)
		}
	}
	for _, r := range m.hooks[h.nModelHooks:] {
		want = append(want, r.String())
	}
	h.nModelHooks = len(m.hooks)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		h.fail("%s: completion hook\n  got  %v\n  want %v", step, got, want)
	}

	// Tickets.
	for _, ft := range h.tickets {
		done := false
		select {
		case <-ft.tk.Done():
			done = true
		default:
		}
		mt := ft.m
		if done != mt.done {
			h.fail("%s: ticket of op %d: done=%v, model says %v (model state %v)", step, ft.op, done, mt.done, mt.state)
		}
		if !done {
			if _, ok := ft.tk.Result(); ok {
				h.fail("%s: ticket of op %d: Result ok before Done", step, ft.op)
			}
			continue
		}
		res, ok := ft.tk.Result()
		if !ok {
			h.fail("%s: ticket of op %d: Done closed but Result not ok", step, ft.op)
		}
		if ft.seen {
			if res.State != ft.res.State || res.Call != ft.res.Call || res.Err != ft.res.Err {
				h.fail("%s: ticket of op %d: outcome changed from %+v to %+v", step, ft.op, ft.res, res)
			}
			continue
		}
		ft.seen, ft.res = true, res
		wres, werr := ft.tk.Wait(context.Background())
		if wres.State != res.State || werr != res.Err {
			h.fail("%s: ticket of op %d: Wait = %v, %v; Result = %+v", step, ft.op, wres.State, werr, res)
		}
		class := fzErrClass(res.Err)
		exact := res.Call == mt.val && res.Attempts == mt.attempts
		alt := mt.hasAlt && res.Call == mt.altVal && res.Attempts == mt.altAttempt
		bad := res.Key != mt.key || res.State != mt.state || !(exact || alt) ||
			res.Waiters != mt.waiters || class != mt.class ||
			res.QueueWait < 0 || res.RunTime < 0
		if bad {
			h.fail("%s: ticket of op %d:\n  got  k%d %v val=%d waiters=%d attempts=%d err=%s (%v)\n  want k%d %v val=%d waiters=%d attempts=%d err=%s",
				step, ft.op, res.Key, res.State, res.Call, res.Waiters, res.Attempts, class, res.Err,
				mt.key, mt.state, mt.val, mt.waiters, mt.attempts, mt.class)
		}
		if mt.cause != nil && !errors.Is(res.Err, mt.cause) {
			h.fail("%s: ticket of op %d: error %v does not match the cause %v", step, ft.op, res.Err, mt.cause)
		}
	}

	// Stats.
	s := h.d.Stats()
	ws := Stats{
		Keys:            len(m.slots),
		Ready:           m.count(fmReady),
		Delayed:         m.count(fmDelayed),
		Successors:      m.successors(),
		Tickets:         m.tickets,
		Live:            m.tickets + m.liveFF,
		Submitted:       m.submitted,
		Rejected:        m.rejected,
		Coalesced:       m.coalesced,
		Executions:      m.executions,
		StaleExecutions: m.staleExecs,
		Retries:         m.retries,
		AlreadyDone:     m.alreadyDone,
		Breaker:         m.br,
		Outcomes:        m.outcomes,
		Calls:           m.callsBy,
	}
	if m.running != nil {
		ws.InFlight = 1
	}
	// The per-reason and per-tenant maps are checked by the tenant and
	// shedding tests; the model tracks the totals.
	s.Backpressure, s.Shed, s.Tenants, s.Labels = nil, nil, nil, nil
	// Latency distributions are not modelled; their counts are.
	if s.ExecTime.Count != s.Executions {
		h.fail("%s: ExecTime.Count %d != Executions %d", step, s.ExecTime.Count, s.Executions)
	}
	s.QueueWait, s.ExecTime = Quantiles{}, Quantiles{}
	if !reflect.DeepEqual(s, ws) {
		h.fail("%s: Stats\n  got  %+v\n  want %+v", step, s, ws)
	}
	var sum uint64
	for _, n := range s.Outcomes {
		sum += n
	}
	if s.Submitted != s.Rejected+sum+uint64(s.Live) {
		h.fail("%s: conservation: Submitted %d != Rejected %d + Σ Outcomes %d + Live %d", step, s.Submitted, s.Rejected, sum, s.Live)
	}
	if m.calls != s.Ready+s.Delayed+s.Successors+s.InFlight {
		h.fail("%s: model calls %d != ready+delayed+successors+inflight in %+v", step, m.calls, s)
	}
	for k := range fzKeys {
		_, want := m.slots[k]
		if got := h.d.Pending(k); got != want {
			h.fail("%s: Pending(k%d) = %v, model says %v", step, k, got, want)
		}
	}

	// Close.
	if h.closeStarted && !h.closeReturned {
		select {
		case err := <-h.closeDone:
			h.closeReturned = true
			if !m.closeReturned() {
				h.fail("%s: Close returned %v, the model says it is still waiting", step, err)
			}
			if !errors.Is(err, m.closeErr) || (err == nil) != (m.closeErr == nil) {
				h.fail("%s: Close returned %v, model says %v", step, err, m.closeErr)
			}
		default:
			if m.closeReturned() {
				h.fail("%s: Close has not returned, the model says it has", step)
			}
		}
	}
}
