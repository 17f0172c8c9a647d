package dispatch

import (
	"runtime/debug"
	"sync"

	"github.com/coalescer/dispatch/internal/adaptive"
	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/due"
	"github.com/coalescer/dispatch/internal/startcheck"
	"github.com/coalescer/dispatch/internal/tokens"
)

// This file asks "may the next execution start?" (StartPolicy, and the
// rate limiter and circuit breaker), and tells the state machines that
// answer it how each attempt ended. The state machines are internal
// packages that take values and return decisions; what they decide is
// acted on here: the clock is armed, workers are woken, the observer is
// told. Everything here runs under the dispatcher's lock.

// startGate is what decides whether an execution may start: the concurrency
// (fixed, or an adaptive limit), the reservation of workers for urgent
// calls, a server's Retry-After hold, the deadline check, the rate
// limiter's tokens and the circuit breaker. Guarded by the Dispatcher's
// lock.
type startGate struct {
	workers  int              // Config.Workers: the concurrency without an adaptive limit
	reserved int              // StartPolicy.ReservedWorkers
	urgentAt int              // the first urgent priority (settings.urgent)
	adaptive *adaptive.Limit  // nil: concurrency fixed at workers
	breaker  *breaker.Breaker // nil: no circuit breaker
	check    *startcheck.Check
	tokens   tokens.Tokens
	running  int // executions on workers
	low      int // of those, below the reservation's priority

	due   *due.List  // the clock's: to look again at a time
	fetch *sync.Cond // the token fetcher's
	obs   Observer   // told of the breaker's changes
}

func newStartGate[K comparable, T any](set *settings[K, T], tb *timebase, dl *due.List, fetch *sync.Cond) startGate {
	g := startGate{
		workers: set.Workers, reserved: set.Start.ReservedWorkers, urgentAt: set.urgent,
		tokens: tokens.New(set.RateLimit, tb.epoch), due: dl, fetch: fetch, obs: set.Observer,
	}
	if p := set.Start.Adaptive; p != nil {
		g.adaptive = adaptive.New(p.limitPolicy(), set.Workers, set.Retry.MaxBackoff)
	}
	if sc := set.Start; !sc.NoDeadlineCheck {
		g.check = startcheck.New(startcheck.Policy{Quantile: sc.DeadlineQuantile, Samples: sc.DeadlineSamples, Window: latencyWindow})
	}
	if set.Breaker != nil {
		g.breaker = breaker.New(set.Breaker.policy())
	}
	return g
}

// limit is the number of worker executions allowed now.
func (g *startGate) limit() int {
	if g.adaptive != nil {
		return g.adaptive.Limit()
	}
	return g.workers
}

// urgent reports whether a call of priority prio may use a reserved
// worker: its priority is in the reservation's band or above.
func (g *startGate) urgent(prio int) bool { return prio >= g.urgentAt }

// held reports whether a call of priority prio waits out a server's
// Retry-After (AdaptivePolicy) at now, and until when. A call that may use
// a reserved worker is never held, so that a binding does not wait out a
// hold that a status patch drew; if the server throttles it too, its own
// retry waits.
func (g *startGate) held(prio int, now int64) (until int64, ok bool) {
	if a := g.adaptive; a != nil && now < a.Hold() && !(g.reserved > 0 && g.urgent(prio)) {
		return a.Hold(), true
	}
	return 0, false
}

// below reports whether a call of priority prio would run below the
// reservation (low), and whether no worker is left for it there (full):
// the rest of the concurrency, and at least one, may run such calls.
func (g *startGate) below(prio int) (low, full bool) {
	low = g.reserved > 0 && !g.urgent(prio)
	return low, low && g.low >= max(g.limit()-g.reserved, 1)
}

// unfinishable reports whether c cannot finish by its waiters' latest
// deadline (the deadline check); a call it would refuse may start as the
// check's probe.
func (c *call[K, T]) unfinishable(g *startGate, now int64) bool {
	if g.check == nil {
		return false
	}
	refuse, probe := g.check.Refuse(c.tag.label, c.execDeadline(), now)
	if probe {
		c.mark(fCheckProbe, true)
	}
	return refuse
}

// next pops the call a worker runs now, if any may start: under the
// concurrency limit, within tenant caps, outside a server's hold and the
// reservation, with a rate-limiter token, and past the circuit breaker — in
// that order, so that the token goes to the best call at the moment it is
// granted. A call that can no longer finish by its deadline is expired on
// the way (the deadline check), and the next one considered.
func (d *Dispatcher[K, T]) next(now int64, ob *outbox[K, T]) *call[K, T] {
	g := &d.gate
	fault := func(v any) { d.limiterFault(v, ob) }
	for d.q.nready > 0 && g.running < g.limit() {
		ten := d.q.pick(now)
		if ten == nil {
			return nil // every tenant with ready calls is at its in-flight cap
		}
		c := ten.ready.min().c
		if until, ok := g.held(c.prio, now); ok {
			g.lookAgainAt(until)
			return nil
		}
		if c.unfinishable(g, now) {
			// finish takes it out of the ready index, and the tenant's
			// pass stays: a call that never ran took no worker's share.
			d.expireUnfinishable(c, now, ob)
			continue
		}
		low, full := g.below(c.prio)
		if full {
			// The rest of the workers are kept for urgent calls, which
			// would be c's band or above: none is ready. A worker is
			// woken when a low call ends (endAttempt).
			return nil
		}
		probe, ok := g.mayStart(now, fault, &ob.notes)
		if !ok {
			return nil
		}
		d.q.popFrom(ten)
		c.mark(fProbe, probe)
		c.mark(fLow, low)
		return c
	}
	return nil
}

// expireUnfinishable ends call c, out of the ready index or about to be,
// whose waiters' deadline is closer than its label's usual execution time.
func (d *Dispatcher[K, T]) expireUnfinishable(c *call[K, T], now int64, ob *outbox[K, T]) {
	d.totals.unfinishable++
	d.waiters.settleAll(c, StateExpired, errUnfinishable, now, onTime, ob)
	d.finish(c, StateExpired, errUnfinishable, now, ob)
}

// mayStart takes a rate-limiter token (if fault is set: an inline
// execution waits for its own) and the circuit breaker's leave for an
// execution to start now, or neither; the clock or the token fetcher then
// wakes a worker to look again. probe: it runs as the half-open breaker's
// probe. fault is told if the limiter panics or exits the goroutine
// (tokens.Fault).
func (g *startGate) mayStart(now int64, fault tokens.Fault, ob *notes) (probe, ok bool) {
	token := fault != nil
	if token {
		if ok, at := g.tokens.Ready(now, fault); !ok {
			g.lookAgainAt(at)
			return false, false
		}
	}
	if b := g.breaker; b != nil {
		var ch breaker.Change
		ok, probe, ch = b.Admit(now)
		noteCircuit(g.obs, ch, ob)
		if !ok {
			if b.State() == breaker.Open {
				g.due.Set(due.Probe, b.OpenUntil())
			}
			return false, false
		}
	}
	if token {
		g.tokens.Spend()
	}
	return probe, true
}

// lookAgainAt has the clock wake a worker at at (tokens.WhenFetched: the
// token fetcher wakes one).
func (g *startGate) lookAgainAt(at int64) {
	if at == tokens.WhenFetched {
		g.fetch.Signal() // the fetcher waits for the limiter's next token
		return
	}
	g.due.Set(due.Start, at)
}

// recordAttempt tells the deadline check, the circuit breaker and the
// adaptive limit how an attempt of c ended, at now. The breaker and the
// limit hear only executions that say something about the API's health:
// ones that ran and were not cut short by the call's own end.
func (d *Dispatcher[K, T]) recordAttempt(c *call[K, T], a *attempt[K, T], now int64, ob *outbox[K, T]) {
	g := &d.gate
	if g.check != nil {
		g.check.Observe(c.tag.label, now, a.runTime, a.ran, c.is(fCheckProbe))
		c.mark(fCheckProbe, false)
	}
	said := a.ran && !a.callDone
	if b := g.breaker; b != nil {
		v := breaker.Ignored
		switch {
		case !said || c.orphaned():
		case a.err == nil:
			v = breaker.Healthy
		case a.class == ClassRetry:
			v = breaker.Failed
		}
		if c.is(fProbe) {
			b.EndProbe(c.exec.runner)
			c.mark(fProbe, false)
		}
		ch := b.Record(now, v)
		noteCircuit(d.cfg.Observer, ch, &ob.notes)
		switch {
		case ch.To == breaker.Closed && ch.Changed():
			d.wake.workers() // resume every worker
		case ch.To == breaker.Open:
			d.due.Set(due.Probe, b.OpenUntil())
		}
	}
	if g.adaptive != nil && said && !a.panicked {
		s, hint := strainOf(&a.attemptEnd)
		from, to := g.adaptive.Record(now, a.runTime, s, hint)
		if to > from {
			d.wake.worker()
		}
		if obs := d.cfg.Observer; obs != nil && to != from {
			ob.notes.add(func() { obs.OnLimitChange(from, to) })
		}
	}
}

// limiterFault is told that a method of the limiter that a worker asked
// for a token under the lock (next, startGate.mayStart) panicked with v,
// or (v nil) ended the goroutine. Either is counted as a callback's
// panic (Stats.CallbackPanics); the limiter grants nothing for a while
// (tokens.Fault). On an exit nothing of a call was taken yet: it releases
// the lock and tells what the worker's outbox ob holds, and spawn puts a
// new worker in its place.
func (d *Dispatcher[K, T]) limiterFault(v any, ob *outbox[K, T]) {
	exit := v == nil
	if exit {
		v = ErrGoexit
	}
	d.tell.contain(&PanicError{Callback: callbackRateLimit, Value: v, Stack: debug.Stack()})
	if exit {
		d.mu.Unlock()
		d.tell.deliver(ob)
	}
}
