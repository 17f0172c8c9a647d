package dispatchprom

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestObserver(t *testing.T, opts Options) (*Observer, *prometheus.Registry) {
	t.Helper()
	obs, err := NewObserver(opts)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(obs))
	return obs, reg
}

// TestObserverEvents calls every Observer method directly, apart from any
// dispatcher, and checks the exported series exactly.
func TestObserverEvents(t *testing.T) {
	obs, reg := newTestObserver(t, Options{
		Namespace:   "scheduler",
		ConstLabels: prometheus.Labels{"dispatcher": "test"},
		ExecBuckets: []float64{0.01, 0.1, 1},
	})
	bind := dispatch.Event{Label: "bind", Tenant: "default-binder"}
	patch := dispatch.Event{Label: "status-patch", Tenant: "plugin-a"}

	obs.OnSubmit(bind, false)
	obs.OnSubmit(patch, false)
	obs.OnSubmit(patch, true)
	obs.OnSubmit(patch, true)
	obs.OnReject(patch, &dispatch.BackpressureError{Bound: dispatch.BoundCapacity, Depth: 4})
	obs.OnReject(bind, fmt.Errorf("%w: pod uid-123 generation 7", dispatch.ErrStale))
	obs.OnReject(bind, errors.New("pod uid-123: something unforeseen"))
	obs.OnStart(bind, 1, 20*time.Millisecond)
	obs.OnStart(bind, 2, 20*time.Millisecond) // a retry: no second queue-wait sample
	obs.OnStart(patch, 1, 3*time.Second)
	obs.OnRetry(bind, 1, 5*time.Millisecond, errors.New("connection reset by peer"))
	obs.OnDrop(patch, dispatch.BoundCapacity)
	obs.OnDrop(patch, dispatch.BoundQuota)
	obs.OnFinish(bind, dispatch.Outcome{State: dispatch.StateSucceeded, Attempts: 2, Waiters: 1, RunTime: 50 * time.Millisecond})
	obs.OnFinish(patch, dispatch.Outcome{State: dispatch.StateFailed, Attempts: 1, Waiters: 3, RunTime: 500 * time.Millisecond, Err: errors.New("forbidden: uid-9")})
	obs.OnFinish(patch, dispatch.Outcome{State: dispatch.StateDropped, Err: dispatch.ErrDropped}) // never ran
	obs.OnModeChange(dispatch.ModeAsync, dispatch.ModeSync, "backlog")
	obs.OnModeChange(dispatch.ModeSync, dispatch.ModeAsync, "manual")
	obs.OnCircuitChange(dispatch.CircuitClosed, dispatch.CircuitOpen)
	obs.OnCircuitChange(dispatch.CircuitOpen, dispatch.CircuitHalfOpen)
	obs.OnCircuitChange(dispatch.CircuitHalfOpen, dispatch.CircuitClosed)

	const want = `
# HELP scheduler_async_api_call_attempts_total Attempts begun (retries included), by call type; one that Config.NoOp or BeforeRetry ends runs no exec.
# TYPE scheduler_async_api_call_attempts_total counter
scheduler_async_api_call_attempts_total{call_type="bind",dispatcher="test"} 2
scheduler_async_api_call_attempts_total{call_type="status-patch",dispatcher="test"} 1
# HELP scheduler_async_api_call_execution_duration_seconds Time a finished call spent executing, over all its attempts, by call type and terminal state. Calls that never ran are not observed.
# TYPE scheduler_async_api_call_execution_duration_seconds histogram
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="bind",dispatcher="test",result="succeeded",le="0.01"} 0
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="bind",dispatcher="test",result="succeeded",le="0.1"} 1
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="bind",dispatcher="test",result="succeeded",le="1"} 1
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="bind",dispatcher="test",result="succeeded",le="+Inf"} 1
scheduler_async_api_call_execution_duration_seconds_sum{call_type="bind",dispatcher="test",result="succeeded"} 0.05
scheduler_async_api_call_execution_duration_seconds_count{call_type="bind",dispatcher="test",result="succeeded"} 1
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="status-patch",dispatcher="test",result="failed",le="0.01"} 0
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="status-patch",dispatcher="test",result="failed",le="0.1"} 0
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="status-patch",dispatcher="test",result="failed",le="1"} 1
scheduler_async_api_call_execution_duration_seconds_bucket{call_type="status-patch",dispatcher="test",result="failed",le="+Inf"} 1
scheduler_async_api_call_execution_duration_seconds_sum{call_type="status-patch",dispatcher="test",result="failed"} 0.5
scheduler_async_api_call_execution_duration_seconds_count{call_type="status-patch",dispatcher="test",result="failed"} 1
# HELP scheduler_async_api_call_execution_total Calls finished, by call type and terminal state (result). A call that coalesced several submissions counts once.
# TYPE scheduler_async_api_call_execution_total counter
scheduler_async_api_call_execution_total{call_type="bind",dispatcher="test",result="succeeded"} 1
scheduler_async_api_call_execution_total{call_type="status-patch",dispatcher="test",result="dropped"} 1
scheduler_async_api_call_execution_total{call_type="status-patch",dispatcher="test",result="failed"} 1
# HELP scheduler_breaker_transitions_total Circuit breaker state changes, by state left and state entered (closed, open, half_open).
# TYPE scheduler_breaker_transitions_total counter
scheduler_breaker_transitions_total{dispatcher="test",from="closed",to="open"} 1
scheduler_breaker_transitions_total{dispatcher="test",from="half_open",to="closed"} 1
scheduler_breaker_transitions_total{dispatcher="test",from="open",to="half_open"} 1
# HELP scheduler_coalesced_total Submissions merged into a call already pending for their key (or, having waited behind their key's call in flight, into its retry), by call type.
# TYPE scheduler_coalesced_total counter
scheduler_coalesced_total{call_type="status-patch",dispatcher="test"} 2
# HELP scheduler_dropped_total Queued calls shed to make room, by call type and reason (capacity, quota).
# TYPE scheduler_dropped_total counter
scheduler_dropped_total{call_type="status-patch",dispatcher="test",reason="capacity"} 1
scheduler_dropped_total{call_type="status-patch",dispatcher="test",reason="quota"} 1
# HELP scheduler_mode_changes_total Mode switches, by mode entered (async, sync) and reason (manual, cool_down, backlog, failure_ratio, queue_wait, circuit_open, other).
# TYPE scheduler_mode_changes_total counter
scheduler_mode_changes_total{dispatcher="test",reason="backlog",to="sync"} 1
scheduler_mode_changes_total{dispatcher="test",reason="manual",to="async"} 1
# HELP scheduler_rejected_total Submissions refused, by call type and reason (capacity, waiters, quota, backpressure, closed, circuit, stale, expired, merge, canceled, other).
# TYPE scheduler_rejected_total counter
scheduler_rejected_total{call_type="bind",dispatcher="test",reason="other"} 1
scheduler_rejected_total{call_type="bind",dispatcher="test",reason="stale"} 1
scheduler_rejected_total{call_type="status-patch",dispatcher="test",reason="capacity"} 1
# HELP scheduler_retries_total Executions scheduled again after a retryable failure, by call type: the dispatcher's own API retries.
# TYPE scheduler_retries_total counter
scheduler_retries_total{call_type="bind",dispatcher="test"} 1
# HELP scheduler_submissions_total Submissions (Submit and Post), accepted or rejected, by call type and tenant.
# TYPE scheduler_submissions_total counter
scheduler_submissions_total{call_type="bind",dispatcher="test",tenant="default-binder"} 3
scheduler_submissions_total{call_type="status-patch",dispatcher="test",tenant="plugin-a"} 4
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"scheduler_async_api_call_attempts_total",
		"scheduler_async_api_call_execution_duration_seconds",
		"scheduler_async_api_call_execution_total",
		"scheduler_breaker_transitions_total",
		"scheduler_coalesced_total",
		"scheduler_dropped_total",
		"scheduler_mode_changes_total",
		"scheduler_rejected_total",
		"scheduler_retries_total",
		"scheduler_submissions_total",
	))
	// Queue wait: one sample per call (first attempt only), in the default buckets.
	assert.Equal(t, 1.0, value(t, reg, "scheduler_queue_wait_seconds", "call_type", "bind"))
	assert.Equal(t, 1.0, value(t, reg, "scheduler_queue_wait_seconds", "call_type", "status-patch"))

	// No snapshot source: no gauges.
	n, err := testutil.GatherAndCount(reg, "scheduler_pending_async_api_calls", "scheduler_mode", "scheduler_breaker_state")
	require.NoError(t, err)
	assert.Zero(t, n)

	lint(t, reg)
	// Neither keys nor error text became a label value.
	for _, l := range []string{"call_type", "tenant", "reason", "result", "from", "to"} {
		for v := range labelValues(t, reg, l) {
			assert.NotContains(t, v, "uid", "label %s", l)
			assert.NotContains(t, v, " ", "label %s", l)
		}
	}
}

func lint(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	problems, err := testutil.GatherAndLint(g)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestSnapshotGauges checks the gauges read from a Stats source at scrape
// time, with a fixed snapshot.
func TestSnapshotGauges(t *testing.T) {
	obs, reg := newTestObserver(t, Options{Subsystem: "binds"})
	obs.OnSubmit(dispatch.Event{Label: "preemption", Tenant: "t2"}, false) // seen, idle now
	stats := dispatch.Stats{
		Keys: 7, Ready: 3, Delayed: 2, Successors: 1, InFlight: 1,
		Labels:  map[string]int{"bind": 4, "status-patch": 3},
		Tenants: map[string]dispatch.TenantStats{"": {Queued: 4, InFlight: 1}, "plugin-a": {Queued: 2}},
		Mode:    dispatch.ModeSync,
		Circuit: dispatch.CircuitHalfOpen,
	}
	obs.SetStats(func() dispatch.Stats { return stats })

	const want = `
# HELP dispatch_binds_breaker_state The circuit breaker's state: 0 closed, 1 open, 2 half_open.
# TYPE dispatch_binds_breaker_state gauge
dispatch_binds_breaker_state 2
# HELP dispatch_binds_in_flight_calls Calls executing.
# TYPE dispatch_binds_in_flight_calls gauge
dispatch_binds_in_flight_calls 1
# HELP dispatch_binds_mode The dispatcher's mode: 0 async, 1 sync.
# TYPE dispatch_binds_mode gauge
dispatch_binds_mode 1
# HELP dispatch_binds_pending_async_api_calls Calls queued or in flight, by call type.
# TYPE dispatch_binds_pending_async_api_calls gauge
dispatch_binds_pending_async_api_calls{call_type="bind"} 4
dispatch_binds_pending_async_api_calls{call_type="preemption"} 0
dispatch_binds_pending_async_api_calls{call_type="status-patch"} 3
# HELP dispatch_binds_queued_calls Calls waiting to run, by state: ready (for a worker), delayed (in retry backoff), successor (behind their key's in-flight call).
# TYPE dispatch_binds_queued_calls gauge
dispatch_binds_queued_calls{state="delayed"} 2
dispatch_binds_queued_calls{state="ready"} 3
dispatch_binds_queued_calls{state="successor"} 1
# HELP dispatch_binds_tenant_in_flight_calls Calls executing, by tenant.
# TYPE dispatch_binds_tenant_in_flight_calls gauge
dispatch_binds_tenant_in_flight_calls{tenant=""} 1
dispatch_binds_tenant_in_flight_calls{tenant="plugin-a"} 0
dispatch_binds_tenant_in_flight_calls{tenant="t2"} 0
# HELP dispatch_binds_tenant_queued_calls Calls waiting to run, by tenant.
# TYPE dispatch_binds_tenant_queued_calls gauge
dispatch_binds_tenant_queued_calls{tenant=""} 4
dispatch_binds_tenant_queued_calls{tenant="plugin-a"} 2
dispatch_binds_tenant_queued_calls{tenant="t2"} 0
# HELP dispatch_binds_tracked_keys Keys with a call queued or in flight: the quantity the capacity bounds.
# TYPE dispatch_binds_tracked_keys gauge
dispatch_binds_tracked_keys 7
`
	names := []string{
		"dispatch_binds_breaker_state", "dispatch_binds_in_flight_calls", "dispatch_binds_mode",
		"dispatch_binds_pending_async_api_calls", "dispatch_binds_queued_calls",
		"dispatch_binds_tenant_in_flight_calls", "dispatch_binds_tenant_queued_calls",
		"dispatch_binds_tracked_keys",
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), names...))
	lint(t, reg)

	obs.SetStats(nil)
	n, err := testutil.GatherAndCount(reg, names...)
	require.NoError(t, err)
	assert.Zero(t, n, "no source, no gauges")

	// Options.Stats is the same source, set at construction.
	obs2, reg2 := newTestObserver(t, Options{Stats: func() dispatch.Stats { return stats }})
	_ = obs2
	assert.Equal(t, 7.0, value(t, reg2, "dispatch_tracked_keys"))
}

// TestStatsOfDispatcherNotMadeYet: the Stats method of a Dispatcher not
// made yet (d.Stats with d nil), given as Options.Stats, panics when read.
// A scrape then fails with an error that names the source and the fix, as
// Options.Stats' doc says, and the event counters are still gathered;
// Collect called directly does not panic.
func TestStatsOfDispatcherNotMadeYet(t *testing.T) {
	var d *dispatch.Dispatcher[string, int]
	obs, reg := newTestObserver(t, Options{Stats: d.Stats})
	obs.OnSubmit(dispatch.Event{}, false)

	mfs, err := reg.Gather()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.Stats or SetStats")
	assert.Contains(t, err.Error(), "give d.Stats to SetStats once d exists")
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	assert.Contains(t, names, "dispatch_submissions_total", "the counters are gathered all the same")

	ch := make(chan prometheus.Metric, 100)
	require.NotPanics(t, func() { obs.Collect(ch) })

	src, err := os.ReadFile("observer.go")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(src), "\n\t//", "\n")), " ")
	assert.Contains(t, text, "d.Stats taken before, d still nil, panics at every scrape, which then fails with an error saying so")
}

// TestCardinalityBound shows that a label function that is not bounded
// (here: one label per key) cannot grow the registry without end.
func TestCardinalityBound(t *testing.T) {
	obs, reg := newTestObserver(t, Options{MaxLabelValues: 3})
	labels := map[string]int{}
	for i := range 100 {
		e := dispatch.Event{Label: fmt.Sprintf("key-%d", i), Tenant: fmt.Sprintf("tenant-%d", i%10)}
		obs.OnSubmit(e, i%2 == 0)
		obs.OnReject(e, fmt.Errorf("%w: key-%d", dispatch.ErrMergeRejected, i))
		obs.OnFinish(e, dispatch.Outcome{State: dispatch.StateSucceeded, Attempts: 1, RunTime: time.Millisecond})
		obs.OnModeChange(dispatch.ModeAsync, dispatch.ModeSync, string(fmt.Sprintf("reason-%d", i)))
		labels[e.Label] = 1
	}
	obs.SetStats(func() dispatch.Stats { return dispatch.Stats{Labels: labels} })

	assert.Equal(t, map[string]bool{"key-0": true, "key-1": true, "key-2": true, "other": true},
		labelValues(t, reg, "call_type"))
	assert.Equal(t, map[string]bool{"tenant-0": true, "tenant-1": true, "tenant-2": true, "other": true},
		labelValues(t, reg, "tenant"))
	// OnSubmit and OnReject each count a submission: nothing is lost, only
	// merged into "other".
	assert.Equal(t, 200.0, sum(t, reg, "dispatch_submissions_total"))
	n, err := testutil.GatherAndCount(reg, "dispatch_submissions_total")
	require.NoError(t, err)
	assert.LessOrEqual(t, n, 4*4)
	assert.Equal(t, 97.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", "other"))
	assert.Equal(t, 1.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", "key-2"))
	assert.Equal(t, 100.0, sum(t, reg, "dispatch_mode_changes_total"))
	// Reasons come from the dispatcher's fixed vocabulary; anything else is
	// "other".
	assert.Equal(t, map[string]bool{"merge": true, "other": true}, labelValues(t, reg, "reason"))
	lint(t, reg)

	// Unbounded on request.
	obs, reg = newTestObserver(t, Options{MaxLabelValues: -1})
	for i := range 100 {
		obs.OnSubmit(dispatch.Event{Label: fmt.Sprintf("type-%d", i)}, false)
	}
	assert.Len(t, labelValues(t, reg, "call_type"), 100)
}

func TestNewObserverErrors(t *testing.T) {
	for name, opts := range map[string]Options{
		"namespace":         {Namespace: "my-app"},
		"subsystem":         {Subsystem: "a b"},
		"const label name":  {ConstLabels: prometheus.Labels{"0bad": "x"}},
		"const label le":    {ConstLabels: prometheus.Labels{"le": "x"}},
		"const label clash": {ConstLabels: prometheus.Labels{"call_type": "x"}},
		"buckets order":     {ExecBuckets: []float64{1, 0.5}},
		"buckets equal":     {QueueWaitBuckets: []float64{1, 1}},
		"buckets NaN":       {ExecBuckets: []float64{0.1, math.NaN()}},
		"buckets empty":     {QueueWaitBuckets: []float64{}},
	} {
		t.Run(name, func(t *testing.T) {
			obs, err := NewObserver(opts)
			require.Error(t, err)
			assert.Nil(t, obs)
			assert.True(t, strings.HasPrefix(err.Error(), "dispatchprom: "), err.Error())
		})
	}

	obs, err := NewObserver(Options{})
	require.NoError(t, err)
	require.NotNil(t, obs)
}

// TestTwoObserversOneRegistry: constant labels tell the Observers of two
// Dispatchers apart in one registry.
func TestTwoObserversOneRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, name := range []string{"binds", "patches"} {
		obs, err := NewObserver(Options{ConstLabels: prometheus.Labels{"dispatcher": name}})
		require.NoError(t, err)
		require.NoError(t, reg.Register(obs))
		obs.OnSubmit(dispatch.Event{Label: name}, false)
	}
	assert.Equal(t, 1.0, value(t, reg, "dispatch_submissions_total", "dispatcher", "binds"))
	assert.Equal(t, 1.0, value(t, reg, "dispatch_submissions_total", "dispatcher", "patches"))
	lint(t, reg)
}

// TestLimitMetrics: adaptive limit changes are counted by direction, and
// the limit and the reservation are gauges read from Stats.
func TestLimitMetrics(t *testing.T) {
	obs, reg := newTestObserver(t, Options{})
	obs.OnLimitChange(8, 4)
	obs.OnLimitChange(4, 2)
	obs.OnLimitChange(2, 3)
	obs.SetStats(func() dispatch.Stats { return dispatch.Stats{Concurrency: 3, Reserved: 1, BelowReserve: 2} })
	assert.Equal(t, 2.0, value(t, reg, "dispatch_concurrency_limit_changes_total", "direction", "down"))
	assert.Equal(t, 1.0, value(t, reg, "dispatch_concurrency_limit_changes_total", "direction", "up"))
	assert.Equal(t, 3.0, value(t, reg, "dispatch_concurrency_limit"))
	assert.Equal(t, 1.0, value(t, reg, "dispatch_reserved_workers"))
	assert.Equal(t, 2.0, value(t, reg, "dispatch_below_reserve_in_flight_calls"))
	lint(t, reg)
}

// TestOverflowSeriesStay: once a call type or tenant has been exported as
// "other", its gauges stay, at 0 when idle, like those of the values seen
// by name, rather than vanishing and reading as "no data".
func TestOverflowSeriesStay(t *testing.T) {
	obs, reg := newTestObserver(t, Options{MaxLabelValues: 1})
	obs.OnSubmit(dispatch.Event{Label: "bind", Tenant: "plugin-a"}, false)
	obs.OnSubmit(dispatch.Event{Label: "status-patch", Tenant: "plugin-b"}, false) // both past the bound
	busy := dispatch.Stats{
		Labels:  map[string]int{"bind": 1, "status-patch": 2},
		Tenants: map[string]dispatch.TenantStats{"plugin-a": {Queued: 1}, "plugin-b": {Queued: 1, InFlight: 1}},
	}
	obs.SetStats(func() dispatch.Stats { return busy })
	assert.Equal(t, 2.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", "other"))
	assert.Equal(t, 1.0, value(t, reg, "dispatch_tenant_queued_calls", "tenant", "other"))
	assert.Equal(t, 1.0, value(t, reg, "dispatch_tenant_in_flight_calls", "tenant", "other"))

	obs.SetStats(func() dispatch.Stats { return dispatch.Stats{Labels: map[string]int{}} })
	assert.Equal(t, 0.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", "bind"))
	assert.Equal(t, 0.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", "other"))
	assert.Equal(t, 0.0, value(t, reg, "dispatch_tenant_queued_calls", "tenant", "plugin-a"))
	assert.Equal(t, 0.0, value(t, reg, "dispatch_tenant_queued_calls", "tenant", "other"))
	assert.Equal(t, 0.0, value(t, reg, "dispatch_tenant_in_flight_calls", "tenant", "other"))
	lint(t, reg)
}
