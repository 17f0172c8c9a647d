// Package dispatchprom exports a dispatch.Dispatcher's events and state as
// Prometheus metrics: the KEP-5229 metrics of kube-scheduler's APIDispatcher
// in spirit, plus what a rollout of the async path needs to watch (queue
// wait, coalescing, rejections and drops by reason, retries, breaker state,
// mode).
//
// Its import path is github.com/coalescer/dispatch/prometheus, a module of
// its own so that client_golang never enters the core module's go.mod. The
// package is named dispatchprom so that it does not shadow client_golang's
// prometheus package in the files that use both.
//
// # Mental model
//
// One Observer per Dispatcher plays two parts:
//
//   - As a dispatch.Observer (dispatch.Config.Observer) it counts events as they
//     happen: submissions, coalescing, rejections, starts, retries, drops,
//     finished calls with their execution time, mode switches and breaker
//     transitions. These are counters and histograms.
//   - As a prometheus.Collector it exports them, and at each scrape reads one
//     dispatch.Stats snapshot (SetStats) for the gauges that describe the
//     present: pending calls by call type, queue depth, calls in flight,
//     tracked keys, per-tenant queued and in-flight calls, mode and breaker
//     state.
//
// Labels are bounded: call_type is the dispatch.Config.Label label ("" for
// every call without one), tenant is SubmitOptions.Tenant, and every other
// label (result, reason, from, to, state, direction) takes values from a
// small fixed set. Keys and error text never become label values: reasons
// take their values from the dispatcher's own vocabularies (the
// dispatch.Bound constants, the sentinel errors, and the mode-change
// reasons that Observer.OnModeChange and FallbackPolicy name), and a value
// outside them is exported as "other". As a safety net, each of call_type
// and tenant takes at most Options.MaxLabelValues distinct values; later
// ones are exported as "other", and so is a value that is not valid UTF-8,
// which no exposition format can carry.
//
// # Example
//
//	obs, err := dispatchprom.NewObserver(dispatchprom.Options{Namespace: "scheduler"})
//	if err != nil { ... }
//	d, err := dispatch.New(exec, dispatch.Config[types.UID, Call]{
//		Observer: obs,
//		Label:    func(uid types.UID, c Call) string { return c.Type }, // "bind", "status-patch"
//	})
//	if err != nil { ... }
//	obs.SetStats(d.Stats)
//	prometheus.MustRegister(obs)
//
// # Metrics
//
// Names are given without the namespace and subsystem prefix
// (Options.Namespace defaults to "dispatch"):
//
//	async_api_call_execution_total{call_type,result}             counter: finished calls by terminal state
//	async_api_call_execution_duration_seconds{call_type,result}  histogram: exec time of finished calls that ran
//	async_api_call_attempts_total{call_type}                     counter: attempts begun, retries included
//	pending_async_api_calls{call_type}                           gauge: calls queued or in flight
//	queue_wait_seconds{call_type}                                histogram: enqueue to first execution
//	submissions_total{call_type,tenant}                          counter: submissions, accepted or rejected
//	coalesced_total{call_type}                                   counter: submissions merged into another call
//	rejected_total{call_type,reason}                             counter: refused submissions
//	dropped_total{call_type,reason}                              counter: queued calls shed to make room
//	retries_total{call_type}                                     counter: the dispatcher's own API retries
//	queued_calls{state}                                          gauge: ready, delayed, successor
//	in_flight_calls                                              gauge
//	tracked_keys                                                 gauge: what Config.Capacity bounds
//	tenant_queued_calls{tenant}, tenant_in_flight_calls{tenant}  gauges
//	breaker_state                                                gauge: 0 closed, 1 open, 2 half_open
//	breaker_transitions_total{from,to}                           counter
//	mode                                                         gauge: 0 async, 1 sync
//	mode_changes_total{to,reason}                                counter
//	concurrency_limit                                            gauge: workers, or the adaptive limit
//	concurrency_limit_changes_total{direction}                   counter: up, down
//	reserved_workers, below_reserve_in_flight_calls              gauges: Config.Start.ReservedWorkers
//
// result is the terminal state in lower case (succeeded, skipped, failed,
// canceled, expired, dropped, stale, closed). The rejection reason is the
// backpressure bound (capacity, waiters, quota; backpressure for another) or
// closed, circuit, stale, expired, merge, canceled, other; a drop's is the
// bound (capacity, quota). The mode-change reason is manual, cool_down, or
// the kind of fallback threshold crossed (backlog, failure_ratio,
// queue_wait, circuit_open); the fallback's full message, with its measured
// values, is in dispatch.Stats.FallbackReason. coalesced_total counts a
// submission merged into, or made moot by, its key's pending call when it
// is submitted (Observer.OnSubmit's coalesced), and one that arrived while
// its key's call was in flight, waited behind that call, and was merged
// into its retry later (Observer.OnCoalesce): it counts what
// dispatch.Stats.Coalesced does. An attempt that Config.NoOp
// or BeforeRetry ends has begun but runs no exec: attempts_total counts it,
// dispatch.Stats.Executions does not. The gauges exist only while a
// Stats source is set; a call type or tenant seen once, "other" included,
// keeps its gauges, at 0 while idle.
//
// # Rolling out
//
// Compare, per call type: the rate of async_api_call_execution_total by
// result (task failures), the P99 of queue_wait_seconds and of
// async_api_call_execution_duration_seconds (queue wait and API latency),
// coalesced_total against submissions_total (duplicate requests absorbed),
// retries_total against async_api_call_attempts_total, and rejected_total
// and dropped_total (backpressure). mode and mode_changes_total show when
// the dispatcher fell back to the synchronous path, and why.
//
// # Concurrency
//
// An Observer is safe for concurrent use: the dispatcher calls it from any
// goroutine while a registry scrapes it.
package dispatchprom
