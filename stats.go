package dispatch

import (
	"time"

	"github.com/coalescer/dispatch/internal/hist"
)

// counters are the dispatcher's running totals, guarded by its lock.
type counters struct {
	submitted       uint64
	rejected        uint64
	coalesced       uint64
	executions      uint64
	staleExecutions uint64
	retries         uint64
	alreadyDone     uint64
	unfinishable    uint64
	refused         [numBounds]uint64 // backpressure refusals by bound
	shed            [numBounds]uint64 // calls shed by bound
	calls           stateCounts       // per call (what the hook saw)
}

// refuse counts and returns a backpressure refusal under bound b, with
// depth keys tracked.
func (c *counters) refuse(b Bound, depth int) error {
	c.refused[b.index()]++
	return &BackpressureError{Bound: b, Depth: depth}
}

// stateCounts counts by terminal state, indexed by State.
type stateCounts [numStates]uint64

// byState is c as Stats reports it: every terminal state, counted or not.
func (c *stateCounts) byState() map[State]uint64 {
	m := make(map[State]uint64, numStates-1)
	for s := StateSucceeded; int(s) < numStates; s++ {
		m[s] = c[s]
	}
	return m
}

var bounds = [...]Bound{BoundCapacity, BoundWaiters, BoundQuota}

const numBounds = len(bounds)

// index is b's place in the counters' arrays.
func (b Bound) index() int {
	switch b {
	case BoundCapacity:
		return 0
	case BoundWaiters:
		return 1
	}
	return 2
}

// latencyWindow is the span Stats' latency quantiles cover: the last
// minute, so that a regression during a rollout shows at once.
const latencyWindow = time.Minute

// Stats is a consistent snapshot of a Dispatcher, in which
//
//	Submitted == Rejected + Σ Outcomes + Live
type Stats struct {
	Keys int // tracked keys (Config.Capacity)
	// Ready, Delayed and Successors count calls waiting to start (for a
	// worker, or for a rate-limiter token: in Sync mode the call whose
	// caller waits for its token), out a backoff, and for their key's
	// running call; InFlight, the calls executing, on a worker or inline
	// in a Sync-mode caller. A tenant's Queued and InFlight (Tenants) count
	// its calls the same way.
	Ready, Delayed, Successors int
	InFlight                   int
	// Live counts accepted submissions without an outcome; Tickets, those
	// that are tickets (Config.MaxWaiters).
	Tickets, Live int

	Submitted, Rejected, Coalesced uint64
	// StaleExecutions finished after their call lost every waiter;
	// AlreadyDone counts calls BeforeRetry found done; Unfinishable, calls
	// the deadline check did not start.
	Executions, StaleExecutions, Retries, AlreadyDone, Unfinishable uint64
	// Concurrency is the worker executions allowed now (Config.Workers, or
	// the adaptive limit); Reserved, StartPolicy.ReservedWorkers.
	// BelowReserve counts the worker executions running below the
	// reservation's priority: how much of the concurrency non-urgent calls
	// hold.
	Concurrency, Reserved, BelowReserve int
	// Circuit is the breaker's state as the next call finds it: half-open
	// as soon as an open circuit's cool-down is over (the observer hears
	// of the move when that call starts).
	Circuit Circuit
	// Backpressure counts refusals, and Shed calls dropped to make room,
	// by bound, each holding every bound as a key.
	Backpressure, Shed map[Bound]uint64
	// Tenants holds the configured tenants, and others while they have
	// calls; Labels counts live calls by label.
	Tenants map[string]TenantStats
	Labels  map[string]int
	// QueueWait (to the first execution) and ExecTime: the last minute.
	QueueWait, ExecTime Quantiles
	// CallbackPanics counts contained panics and runtime.Goexit calls of
	// OnDone, Observer methods, Label, the RateLimiter, and Merge as a
	// retry takes in its key's next call (no submitter is there to refuse:
	// the next call waits behind the retry).
	CallbackPanics    uint64
	LastCallbackPanic *PanicError
	// Mode is the current mode, as Dispatcher.Mode reports it.
	Mode Mode
	// FallbackReason holds the measured values behind the last fallback to
	// ModeSync ("" if none); a return to ModeAsync keeps them.
	FallbackReason string
	// Outcomes counts submissions, and Calls finished calls, by state, each
	// holding every state as a key.
	Outcomes, Calls map[State]uint64
}

// Quantiles summarises latencies: each is the upper bound of its
// histogram bucket, at most 50% above the true value.
type Quantiles struct {
	Count         uint64 // observations in the window
	P50, P90, P99 time.Duration
}

// quantiles summarises a histogram.
func quantiles(h hist.Hist) Quantiles {
	return Quantiles{Count: h.Count(), P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99)}
}

// Stats returns a snapshot, taken under the dispatcher's lock.
func (d *Dispatcher[K, T]) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.clk.now()
	t := &d.totals
	s := Stats{
		Keys: d.lanes.Len(), Ready: d.q.nready + d.awaiting, Delayed: d.q.delayed.Len(), InFlight: d.running,
		Tickets: d.waiters.tickets, Live: d.waiters.tickets + d.waiters.posts,
		Submitted: t.submitted, Rejected: t.rejected, Coalesced: t.coalesced,
		Executions: t.executions, StaleExecutions: t.staleExecutions, Retries: t.retries,
		AlreadyDone: t.alreadyDone, Unfinishable: t.unfinishable,
		Concurrency: d.gate.limit(), Reserved: d.cfg.Start.ReservedWorkers, BelowReserve: d.gate.low,
		QueueWait: quantiles(d.queueWait.Sum(now)), ExecTime: quantiles(d.execTime.Sum(now)),
		Mode: d.mode, Outcomes: d.waiters.outcomes.byState(), Calls: t.calls.byState(),
		Backpressure: make(map[Bound]uint64, numBounds), Shed: make(map[Bound]uint64, numBounds),
		Tenants: make(map[string]TenantStats, len(d.tenants.byName)),
	}
	s.Successors = d.calls.n - s.Ready - s.Delayed - s.InFlight
	if d.gate.breaker != nil {
		s.Circuit = Circuit(d.gate.breaker.StateAt(now))
	}
	for _, b := range bounds {
		s.Backpressure[b], s.Shed[b] = t.refused[b.index()], t.shed[b.index()]
	}
	if d.fallback != nil {
		s.FallbackReason = d.fallback.Reason()
	}
	s.CallbackPanics, s.LastCallbackPanic = d.tell.panics.Load(), d.tell.lastPanic.Load()
	if d.calls.tags != nil {
		s.Labels = d.calls.counts()
	}
	for name, ten := range d.tenants.byName {
		ts := ten.st
		ts.Queued, ts.InFlight = ten.queued, ten.inflight
		s.Tenants[name] = ts
	}
	return s
}
