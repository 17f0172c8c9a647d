package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/window"
)

// Class is the judgement on a failed execution (Config.Classify). A Class
// other than the three below is taken as ClassPermanent.
type Class uint8

const (
	// ClassPermanent ends the call Failed. It is the zero Class: an
	// unknown error fails safe.
	ClassPermanent Class = iota
	// ClassRetry: transient (a timeout, 429, 5xx); the call waits out a
	// backoff in the queue, never in a worker, and runs again.
	ClassRetry
	// ClassRecompute: invalid as built (a conflict); Config.BeforeRetry
	// rebuilds it at once (without it, the call ends Failed).
	ClassRecompute
)

func (c Class) String() string {
	switch c {
	case ClassPermanent:
		return "permanent"
	case ClassRetry:
		return "retry"
	case ClassRecompute:
		return "recompute"
	}
	return fmt.Sprintf("class_%d", uint8(c))
}

// DefaultClassifier judges context.DeadlineExceeded, net.Error timeouts,
// ECONNREFUSED, ECONNRESET, io.ErrUnexpectedEOF and any error with a
// RetryAfter() time.Duration method ClassRetry, and anything else
// ClassPermanent.
func DefaultClassifier(err error) Class {
	var ne net.Error
	var hint interface{ RetryAfter() time.Duration }
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, &ne) && ne.Timeout(),
		errors.As(err, &hint):
		return ClassRetry
	}
	return ClassPermanent
}

// retryAfter returns a server's hint for the next delay, if err carries
// one.
func retryAfter(err error) (time.Duration, bool) {
	var hint interface{ RetryAfter() time.Duration }
	if errors.As(err, &hint) {
		if d := hint.RetryAfter(); d > 0 {
			return d, true
		}
	}
	return 0, false
}

// Jitter selects how backoff delays are randomised.
type Jitter uint8

const (
	JitterFull  Jitter = iota // the default: uniform in [0, backoff]
	JitterEqual               // backoff/2 plus uniform in [0, backoff/2]
	JitterNone                // exactly the backoff
)

// backoff returns the delay before retry number n (n ≥ 1: the delay after
// the n-th failed attempt), jittered. Every step saturates: a policy of
// maximal durations or an infinite multiplier means "as late as can be",
// never an overflow into the past or a panic.
func (p *RetryPolicy) backoff(n int) time.Duration {
	b := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(n-1))
	if b > float64(p.MaxBackoff) || math.IsInf(b, 0) || math.IsNaN(b) {
		b = float64(p.MaxBackoff)
	}
	d := sat.Duration(b)
	switch p.Jitter {
	case JitterFull:
		return time.Duration(rand.Uint64N(uint64(d) + 1)) // ≤ 2⁶³: no overflow
	case JitterEqual:
		half := d / 2
		return half + time.Duration(rand.Uint64N(uint64(d-half)+1))
	}
	return d
}

// retryDelay decides whether an attempt that failed after the call's
// attempts executions may run again, judged by its own verdict alone, and
// after what delay; or the reason it may not (recompute: a BeforeRetry
// hook is set).
func (p *RetryPolicy) retryDelay(a *attemptEnd, attempts int, recompute bool) (time.Duration, string) {
	switch {
	case a.panicked:
		return 0, giveUpPanic
	case a.callDone:
		return 0, giveUpDeadline
	case a.class == ClassPermanent:
		return 0, giveUpPermanent
	case a.class == ClassRecompute && !recompute:
		return 0, giveUpRecompute
	case attempts >= p.MaxAttempts:
		return 0, giveUpAttempts
	case a.class == ClassRecompute:
		// Rebuild from fresh state at once: waiting does not resolve a
		// conflict, re-reading does.
		return 0, ""
	}
	if a.hint > 0 {
		return a.hint, ""
	}
	return p.backoff(attempts), ""
}

// retry runs c, whose attempt a failed at now, again after the retry
// policy's delay — unless its deadline comes first, its tenant has no room
// for it to wait, or the retry budget is spent: then it fails.
func (d *Dispatcher[K, T]) retry(c *call[K, T], a *attempt[K, T], now int64, ob *outbox[K, T]) {
	delay, reason := d.cfg.Retry.retryDelay(&a.attemptEnd, c.attempts(), d.cfg.BeforeRetry != nil)
	notBefore := sat.Add(now, int64(delay))
	merge := false
	switch {
	case reason != "":
	case c.execDeadline() != 0 && notBefore >= c.execDeadline():
		reason = giveUpDeadline
	case !d.budget.allows(now):
		// Judged before room is made: a retry that does not take place
		// evicts nothing.
		reason = giveUpBudget
	default:
		var room bool
		if room, merge = d.roomForRetry(c, now, ob); !room {
			d.budget.refund(now)
			reason = giveUpQuota
		}
	}
	if reason == "" {
		// The observer hears of the attempt that failed, and of the wait
		// before the next: a replacement (ReplacePending) restarts the
		// call, which then runs at once.
		e, failed := c.event(), c.attempts()
		// requeued ends the retry's bookkeeping once requeue has decided,
		// also on the way out of a merge function that ended the goroutine.
		requeued := func(ok bool) {
			if !ok {
				// The successor whose place made room did not merge: both
				// would wait.
				d.budget.refund(now)
				d.giveUp(c, a, giveUpQuota, now, ob)
				return
			}
			if d.cfg.Observer != nil {
				var delay time.Duration
				if c.state == csDelayed {
					delay = time.Duration(c.notBefore() - now)
				}
				ob.notes = append(ob.notes, note{kind: noteRetry, e: e, n: failed, delay: delay, err: a.err})
			}
			d.totals.retries++
			d.wake.kick()
		}
		requeued(d.requeue(c, a.err, notBefore, now, merge, ob, requeued))
		return
	}
	d.giveUp(c, a, reason, now, ob)
}

// giveUp ends c, whose attempt a failed at now and is not retried for
// reason, Failed.
func (d *Dispatcher[K, T]) giveUp(c *call[K, T], a *attempt[K, T], reason string, now int64, ob *outbox[K, T]) {
	err := a.err
	if reason != giveUpPanic {
		err = &RetryError{Attempts: c.attempts(), Last: a.err, Reason: reason}
	}
	d.conclude(c, a, StateFailed, err, now, ob)
}

// roomForRetry reports whether c's tenant has room under its quota for c to
// wait again. A successor waiting behind c makes room if it merges into the
// retry, which then waits in its place: in its tenant, if it is of c's, or
// else in the successor's tenant, which takes the merged call over (merge:
// requeue must merge it so); else the tenant's worst droppable queued call
// is evicted if c would run before it.
func (d *Dispatcher[K, T]) roomForRetry(c *call[K, T], now int64, ob *outbox[K, T]) (room, merge bool) {
	ten := c.tag.ten
	if !ten.overQuota(0) {
		return true, false
	}
	if c.lane.pending != nil && !ten.overQuota(1) {
		return true, true
	}
	v := worst(ten.victims, d.q.of(c.prio, c.enq), c.seq, c.lane.pending, nil)
	if v == nil {
		return false, false
	}
	d.shed(v, BoundQuota, now, ob)
	d.tenants.keep(ten)
	return true, false
}

// requeue sends c back to the queue to run again at notBefore: a retry,
// or a call whose worker exited before its attempt began. The retry
// holds no worker: it waits in the delay index. While it waits it is the
// key's pending call, so new submissions coalesce into it and keep its
// backoff. A successor that arrived during the attempt is coalesced into it
// now (ReplacePending: the retry becomes the successor, afresh); if the
// merge refuses or finds it moot, the retry stays the lane's running call
// and the successor waits behind it, to run next — unless merge is set: the
// retry had room under its tenant's quota only in the successor's place,
// so if the merge refuses the successor, or keeps the call in its tenant
// beside another tenant's successor, requeue leaves the call's value as it
// was, changes nothing of its waiting and reports false, and the caller
// ends it.
//
// A merge function that ends the goroutine (runtime.Goexit) refuses the
// successor: on the way out, requeue does what it does for a refusal and
// then runs exit (if set) with what it would have reported, for the
// caller to finish its own work, before it releases the lock.
func (d *Dispatcher[K, T]) requeue(c *call[K, T], lastErr error, notBefore, now int64, merge bool, ob *outbox[K, T], exit func(requeued bool)) bool {
	l := c.lane
	c.tag.ten.queued++
	c.setLastErr(lastErr)
	c.enter(csTaken)
	if n := l.pending; n != nil {
		was := c.value() // restored if the merge does not make room
		pe, err := c.merge(n.val, n.idem(), d.cfg.Merge, func(pe *PanicError) {
			// The merge function ended this goroutine: the successor waits
			// behind the retry, as if the merge had refused — unless the
			// retry had room only in its place: then the caller ends it.
			d.tell.contain(pe)
			if !merge && d.q.schedule(c, notBefore, now) {
				d.wake.worker()
			}
			if exit != nil {
				exit(!merge)
			}
			d.wake.kick()
			d.mu.Unlock()
			d.tell.deliver(ob)
		})
		// No submitter is here to be refused with a panic of the merge
		// function: it is counted, as a hook's is.
		d.tell.contain(pe)
		if merge && err == nil && n.tag.ten != c.tag.ten && n.prio <= c.prio {
			// Merged, but c would stay in its tenant, one call more.
			c.setValue(was)
			return false
		}
		switch err {
		case nil:
			d.absorb(c, n, false, ob)
			l.running, l.pending = nil, c
		case ReplacePending:
			// The successor is a new operation: the retry becomes it,
			// at once and from its first attempt.
			d.restart(c)
			notBefore = now
			d.absorb(c, n, true, ob)
			l.running, l.pending = nil, c
		default:
			// Refused, or moot (SkipIncoming): l.running stays c, and n
			// stays its successor, to run after it. It was never judged
			// against a pending call, and the retry may yet fail.
			if merge {
				return false // taken, c ends as it is (finish)
			}
		}
	} else {
		l.running, l.pending = nil, c
	}
	if d.q.schedule(c, notBefore, now) {
		d.wake.worker()
	}
	return true
}

// retryBudget caps retries at a fraction of the first attempts of a
// recent window (RetryPolicy.BudgetRatio). Guarded by the Dispatcher's
// lock.
type retryBudget struct {
	win   window.Window // Total: first attempts; Marked: retries
	ratio float64       // math.Inf(1): no cap
	min   int           // retries always allowed in the window
}

// first counts a call's first attempt, at now.
func (b *retryBudget) first(now int64) { b.win.At(now).Total++ }

// allows reports whether one more retry at now fits the budget, and if so
// charges it.
func (b *retryBudget) allows(now int64) bool {
	if math.IsInf(b.ratio, 1) {
		return true
	}
	s := b.win.Sum(now)
	if s.Marked >= uint64(b.min) && float64(s.Marked+1) > b.ratio*float64(s.Total) {
		return false
	}
	b.win.At(now).Marked++
	return true
}

// refund gives back the retry allows charged at now, for one that did not
// take place.
func (b *retryBudget) refund(now int64) {
	if !math.IsInf(b.ratio, 1) {
		b.win.At(now).Marked--
	}
}

// RetryPolicy bounds retries; a zero field means its default. A retry also
// stops at the call's deadline and the tenant's TenantConfig.MaxQueued.
type RetryPolicy struct {
	MaxAttempts int // executions per call (default 3; 1: no retries)
	// InitialBackoff (default 100ms, or MaxBackoff if that is less) grows
	// by Multiplier (default 2) per retry up to MaxBackoff (default 10s, or
	// InitialBackoff if that is more); New refuses a MaxBackoff set below
	// an InitialBackoff set. A server's Retry-After (the RetryAfter()
	// time.Duration method of exec's error, if positive: zero or negative
	// is no hint, and the backoff applies) sets the delay in full instead,
	// unjittered and unbounded by MaxBackoff — a retry it would start at
	// or past the call's deadline is not made: the call ends Failed at
	// once (Reason "deadline") — and holds other calls for at most
	// MaxBackoff.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Multiplier     float64
	Jitter         Jitter
	// AttemptTimeout, if set, bounds one execution of exec, from its
	// start: the BeforeRetry hook and NoOp test before it take none of
	// it. A timed-out attempt is retried like ClassRetry, whatever
	// Config.Classify would say.
	AttemptTimeout time.Duration
	// BudgetRatio (default 0.2; math.Inf(1): none) caps retries at this
	// fraction of the first attempts of the last BudgetWindow (default
	// 10s), beyond BudgetMin (default 10): no retry storm in an outage.
	BudgetRatio  float64
	BudgetMin    int
	BudgetWindow time.Duration
}

func (p *RetryPolicy) validate() error {
	switch {
	case p.MaxAttempts < 0:
		return fieldErr("Retry.MaxAttempts", p.MaxAttempts, "must be at least 1 (0 means the default)")
	case p.InitialBackoff < 0:
		return fieldErr("Retry.InitialBackoff", p.InitialBackoff, "must not be negative")
	case p.MaxBackoff < 0:
		return fieldErr("Retry.MaxBackoff", p.MaxBackoff, "must not be negative")
	case p.AttemptTimeout < 0:
		return fieldErr("Retry.AttemptTimeout", p.AttemptTimeout, "must not be negative")
	case p.BudgetWindow < 0:
		return fieldErr("Retry.BudgetWindow", p.BudgetWindow, "must not be negative")
	case p.Multiplier < 0 || math.IsNaN(p.Multiplier) || (p.Multiplier > 0 && p.Multiplier < 1):
		return fieldErr("Retry.Multiplier", p.Multiplier, "must be at least 1")
	case p.Jitter > JitterNone:
		return fieldErr("Retry.Jitter", p.Jitter, "is not a Jitter")
	case p.BudgetRatio < 0 || math.IsNaN(p.BudgetRatio):
		return fieldErr("Retry.BudgetRatio", p.BudgetRatio, "must not be negative")
	case p.BudgetMin < 0:
		return fieldErr("Retry.BudgetMin", p.BudgetMin, "must not be negative")
	case p.MaxBackoff > 0 && p.MaxBackoff < p.InitialBackoff:
		return fieldErr("Retry.MaxBackoff", p.MaxBackoff, fmt.Sprintf("must be at least Retry.InitialBackoff (%v)", p.InitialBackoff))
	}
	p.MaxAttempts = cmp.Or(p.MaxAttempts, 3)
	if p.InitialBackoff == 0 {
		// A MaxBackoff set caps the first delay too.
		p.InitialBackoff = min(100*time.Millisecond, cmp.Or(p.MaxBackoff, math.MaxInt64))
	}
	p.MaxBackoff = max(cmp.Or(p.MaxBackoff, 10*time.Second), p.InitialBackoff)
	p.Multiplier = cmp.Or(p.Multiplier, 2)
	p.BudgetRatio = cmp.Or(p.BudgetRatio, 0.2)
	p.BudgetMin = cmp.Or(p.BudgetMin, 10)
	p.BudgetWindow = cmp.Or(p.BudgetWindow, 10*time.Second)
	return nil
}
