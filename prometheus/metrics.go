package dispatchprom

import "github.com/prometheus/client_golang/prometheus"

// metrics builds an Observer's metrics under one namespace, subsystem and
// set of constant labels. The package documentation lists them.
type metrics struct {
	o       *Observer
	ns, sub string
	cl      prometheus.Labels
}

func (m *metrics) counter(name, help string, labels ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: m.ns, Subsystem: m.sub, Name: name, Help: help, ConstLabels: m.cl,
	}, labels)
	m.o.events = append(m.o.events, v)
	return v
}

func (m *metrics) histogram(name, help string, b []float64, labels ...string) *prometheus.HistogramVec {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: m.ns, Subsystem: m.sub, Name: name, Help: help, ConstLabels: m.cl, Buckets: b,
	}, labels)
	m.o.events = append(m.o.events, v)
	return v
}

func (m *metrics) gauge(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(m.ns, m.sub, name), help, labels, m.cl)
}

// newCounters makes the event counters.
func (o *Observer) newCounters(m *metrics) {
	o.finished = m.counter("async_api_call_execution_total",
		"Calls finished, by call type and terminal state (result). A call that coalesced several submissions counts once.", "call_type", "result")
	o.attempts = m.counter("async_api_call_attempts_total",
		"Attempts begun (retries included), by call type; one that Config.NoOp or BeforeRetry ends runs no exec.", "call_type")
	o.submissions = m.counter("submissions_total",
		"Submissions (Submit and Post), accepted or rejected, by call type and tenant.", "call_type", "tenant")
	o.coalesced = m.counter("coalesced_total",
		"Submissions merged into a call already pending for their key (or, having waited behind their key's call in flight, into its retry), by call type.", "call_type")
	o.rejected = m.counter("rejected_total",
		"Submissions refused, by call type and reason (capacity, waiters, quota, backpressure, closed, circuit, stale, expired, merge, canceled, other).", "call_type", "reason")
	o.dropped = m.counter("dropped_total",
		"Queued calls shed to make room, by call type and reason (capacity, quota).", "call_type", "reason")
	o.retries = m.counter("retries_total",
		"Executions scheduled again after a retryable failure, by call type: the dispatcher's own API retries.", "call_type")
	o.breakerChanges = m.counter("breaker_transitions_total",
		"Circuit breaker state changes, by state left and state entered (closed, open, half_open).", "from", "to")
	o.modeChanges = m.counter("mode_changes_total",
		"Mode switches, by mode entered (async, sync) and reason (manual, cool_down, backlog, failure_ratio, queue_wait, circuit_open, other).", "to", "reason")
	o.limitChanges = m.counter("concurrency_limit_changes_total",
		"Changes of the adaptive concurrency limit, by direction (up, down).", "direction")
}

// newGauges makes the descriptors of the gauges read from a Stats snapshot.
func (o *Observer) newGauges(m *metrics) {
	o.pending = m.gauge("pending_async_api_calls", "Calls queued or in flight, by call type.", "call_type")
	o.queued = m.gauge("queued_calls",
		"Calls waiting to run, by state: ready (for a worker), delayed (in retry backoff), successor (behind their key's in-flight call).", "state")
	o.inFlight = m.gauge("in_flight_calls", "Calls executing.")
	o.keys = m.gauge("tracked_keys", "Keys with a call queued or in flight: the quantity the capacity bounds.")
	o.mode = m.gauge("mode", "The dispatcher's mode: 0 async, 1 sync.")
	o.breaker = m.gauge("breaker_state", "The circuit breaker's state: 0 closed, 1 open, 2 half_open.")
	o.limit = m.gauge("concurrency_limit", "Worker executions allowed now: the worker count, or the adaptive limit.")
	o.reserved = m.gauge("reserved_workers", "Workers kept for urgent calls (Config.Start.ReservedWorkers).")
	o.belowReserve = m.gauge("below_reserve_in_flight_calls", "Worker executions running below the reservation's priority.")
	o.tenantQueued = m.gauge("tenant_queued_calls", "Calls waiting to run, by tenant.", "tenant")
	o.tenantInFlight = m.gauge("tenant_in_flight_calls", "Calls executing, by tenant.", "tenant")
}
