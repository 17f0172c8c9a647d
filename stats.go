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
	outcomes        StateCounts       // per submission
	calls           StateCounts       // per call (what the hook saw)
}

const numBounds = 3

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

// Stats is a consistent snapshot of a Dispatcher, taken under its lock.
//
// Conservation holds in every snapshot:
//
//	Submitted == Rejected + sum(Outcomes) + Live
type Stats struct {
	// Keys is the number of tracked keys (with a call queued or in flight),
	// the quantity Config.Capacity bounds.
	Keys int
	// Ready is the number of calls waiting for a worker.
	Ready int
	// Delayed is the number of calls waiting out a backoff.
	Delayed int
	// Successors is the number of calls waiting for their key's in-flight
	// call to finish.
	Successors int
	// InFlight is the number of calls being executed.
	InFlight int
	// Tickets is the number of live tickets, the quantity Config.MaxWaiters
	// bounds.
	Tickets int
	// Live is the number of accepted submissions without an outcome yet,
	// tickets and fire-and-forget alike.
	Live int

	// Submitted counts every Submit and Post, accepted or not.
	Submitted uint64
	// Rejected counts submissions refused with an error.
	Rejected uint64
	// Coalesced counts submissions merged into an existing pending call.
	Coalesced uint64
	// Executions counts exec calls (API attempts).
	Executions uint64
	// StaleExecutions counts executions that finished after their call had
	// lost every waiter: kept for audit, never reported as success.
	StaleExecutions uint64
	// Retries counts executions scheduled again after a retryable failure
	// or a Recompute: the dispatcher's own API retries, apart from anything
	// the caller retries.
	Retries uint64
	// AlreadyDone counts calls the before-retry hook found had taken effect,
	// so that they were not executed again.
	AlreadyDone uint64
	// Unfinishable counts calls not started because their waiters'
	// deadline was closer than their label's usual execution time
	// (Config.StartCheck); their waiters ended Expired.
	Unfinishable uint64
	// Concurrency is the number of worker executions allowed now:
	// Config.Workers, or the adaptive limit (Config.Adaptive).
	Concurrency int
	// Reserved is the number of workers kept for urgent calls
	// (Config.Reserve), and BelowReserve the number of worker executions
	// running below the reservation's priority, which may be at most
	// Concurrency − Reserved (and at least one).
	Reserved, BelowReserve int
	// Circuit is the circuit breaker's state.
	Circuit Circuit
	// Backpressure counts submissions refused with ErrBackpressure, by the
	// bound that refused them.
	Backpressure map[Bound]uint64
	// Shed counts calls dropped to make room, by the bound that forced it
	// (BoundCapacity or BoundQuota).
	Shed map[Bound]uint64
	// Tenants has each tenant's figures, by name ("" for submissions that
	// name none): every tenant of Config.Tenants, and any other while it has
	// calls queued or running — its figures go when it has none left, so
	// that made-up tenant names cannot grow memory.
	Tenants map[string]TenantStats
	// Labels counts live calls (queued or in flight) by the Config.Label label.
	Labels map[string]int
	// QueueWait is the distribution of queue wait (enqueue to first
	// execution) over the last LatencyWindow.
	QueueWait Quantiles
	// ExecTime is the distribution of execution latency (one attempt) over
	// the last LatencyWindow.
	ExecTime Quantiles
	// CallbackPanics counts panics (and runtime.Goexit calls) of user code
	// whose failure has nowhere else to go — the completion hook, observer
	// methods, the label function — which the dispatcher contained.
	// Panics of exec, the no-op test, the before-retry hook, the classifier
	// and the merge function end their call or submission instead, with a
	// *PanicError.
	CallbackPanics uint64
	// LastCallbackPanic is the most recent of them, with its stack; nil if
	// none.
	LastCallbackPanic *PanicError
	// Mode is the current mode.
	Mode Mode
	// FallbackReason says why the fallback policy last switched to Sync, ""
	// if it never did.
	FallbackReason string
	// Outcomes counts submissions by terminal state.
	Outcomes StateCounts
	// Calls counts finished calls by the state the completion hook saw.
	Calls StateCounts
}

// quantiles summarises a histogram.
func quantiles(h hist.Hist) Quantiles {
	return Quantiles{Count: h.Count(), P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99)}
}

// LatencyWindow is the span Stats' latency quantiles cover: they show the
// last minute, so a regression during a rollout shows at once instead of
// being averaged into everything since New.
const LatencyWindow = time.Minute

// Quantiles summarises a latency distribution over the last LatencyWindow,
// from a fixed-bucket histogram: each quantile is the upper bound of its
// bucket, which overstates the true value by at most 50%.
type Quantiles struct {
	// Count is the number of observations in the window.
	Count         uint64
	P50, P90, P99 time.Duration
}

// Stats returns a snapshot of the dispatcher's state and counters.
func (d *Dispatcher[K, T]) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	s := Stats{
		Keys:            d.lanes.Len(),
		Ready:           d.q.nready,
		QueueWait:       quantiles(d.queueWait.Sum(now)),
		ExecTime:        quantiles(d.execTime.Sum(now)),
		Mode:            d.mode,
		Delayed:         d.q.delayed.Len(),
		InFlight:        d.running,
		Tickets:         d.liveTickets,
		Live:            d.liveTickets + d.livePosts,
		Submitted:       d.totals.submitted,
		Rejected:        d.totals.rejected,
		Coalesced:       d.totals.coalesced,
		Executions:      d.totals.executions,
		StaleExecutions: d.totals.staleExecutions,
		Retries:         d.totals.retries,
		AlreadyDone:     d.totals.alreadyDone,
		Unfinishable:    d.totals.unfinishable,
		Concurrency:     d.concurrency(),
		Reserved:        d.cfg.Reserve.Workers,
		BelowReserve:    d.lowRunning,
		Outcomes:        d.totals.outcomes,
		Calls:           d.totals.calls,
	}
	s.Successors = d.liveCalls - s.Ready - s.Delayed - s.InFlight
	if d.breaker != nil {
		s.Circuit = d.breaker.state
	}
	s.Backpressure = make(map[Bound]uint64, numBounds)
	s.Shed = make(map[Bound]uint64, numBounds)
	for _, b := range Bounds() {
		s.Backpressure[b] = d.totals.refused[b.index()]
		if b != BoundWaiters {
			s.Shed[b] = d.totals.shed[b.index()]
		}
	}
	if d.fallback != nil {
		s.FallbackReason = d.fallback.reason
	}
	s.CallbackPanics, s.LastCallbackPanic = d.panics.Load(), d.lastPanic.Load()
	if d.labels != nil {
		s.Labels = make(map[string]int, len(d.labels))
		for l, n := range d.labels {
			s.Labels[l] = n
		}
	}
	s.Tenants = make(map[string]TenantStats, len(d.tenants))
	for name, t := range d.tenants {
		ts := t.st
		ts.Queued, ts.InFlight = t.queued, t.inflight
		s.Tenants[name] = ts
	}
	return s
}
