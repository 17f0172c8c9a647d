package dispatchprom

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// call is the test dispatcher's call: its type (the metric label), and how
// its execution behaves.
type call struct {
	typ       string
	block     chan struct{} // if set, exec waits for it to close
	fail      error         // returned by every attempt
	failFirst error         // returned by the first attempt only
}

// harness is a real Dispatcher wired to an Observer in a fresh registry.
type harness struct {
	d       *dispatch.Dispatcher[string, call]
	obs     *Observer
	reg     *prometheus.Registry
	started chan string // keys, as their executions start

	mu    sync.Mutex
	tries map[string]int
}

func newHarness(t *testing.T, cfg dispatch.Config[string, call]) *harness {
	t.Helper()
	h := &harness{started: make(chan string, 64), tries: map[string]int{}}
	var err error
	h.obs, err = NewObserver(Options{})
	require.NoError(t, err)
	h.reg = prometheus.NewPedanticRegistry()
	require.NoError(t, h.reg.Register(h.obs))
	cfg.Observer = h.obs
	cfg.Label = func(_ string, c call) string { return c.typ }
	h.d, err = dispatch.New(h.exec, cfg)
	require.NoError(t, err)
	h.obs.SetStats(h.d.Stats)
	return h
}

func (h *harness) exec(ctx context.Context, key string, c call) error {
	h.mu.Lock()
	h.tries[key]++
	n := h.tries[key]
	h.mu.Unlock()
	h.started <- key
	if c.block != nil {
		select {
		case <-c.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if n == 1 && c.failFirst != nil {
		return c.failFirst
	}
	return c.fail
}

func (h *harness) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return value(t, h.reg, name, labels...)
}

// TestDispatcherMetrics drives a real Dispatcher through success, failure,
// coalescing, a capacity drop and refusal, a retry, merge and stale
// refusals and Close, and checks the metric names, label sets and values,
// then that they agree with the dispatcher's own Stats.
func TestDispatcherMetrics(t *testing.T) {
	h := newHarness(t, dispatch.Config[string, call]{
		Workers:  1,
		Capacity: 4,
		Retry: dispatch.RetryPolicy{
			MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Jitter: dispatch.JitterNone,
		},
	})
	ctx := t.Context()
	gate := make(chan struct{})
	bind := func(key string, c call, o dispatch.SubmitOptions) *dispatch.Ticket[string, call] {
		t.Helper()
		c.typ = "bind"
		tk, err := h.d.Submit(ctx, key, c, o)
		require.NoError(t, err, key)
		return tk
	}

	// The one worker is held by "block", so what follows queues.
	tBlock := bind("block", call{block: gate}, dispatch.SubmitOptions{})
	require.Equal(t, "block", <-h.started)

	patch := dispatch.SubmitOptions{Tenant: "plugin-a", Droppable: true}
	tA, err := h.d.Submit(ctx, "a", call{typ: "status"}, patch)
	require.NoError(t, err)
	tA2, err := h.d.Submit(ctx, "a", call{typ: "status"}, patch) // coalesces
	require.NoError(t, err)
	tB := bind("b", call{fail: errors.New("forbidden")}, dispatch.SubmitOptions{IdempotencyKey: "b-1"})
	tC := bind("c", call{failFirst: io.ErrUnexpectedEOF}, dispatch.SubmitOptions{Generation: 2})

	// Four keys tracked, the capacity. The gauges come from the snapshot.
	assert.Equal(t, 3.0, h.value(t, "dispatch_pending_async_api_calls", "call_type", "bind")) // block, b, c
	assert.Equal(t, 1.0, h.value(t, "dispatch_pending_async_api_calls", "call_type", "status"))
	assert.Equal(t, 4.0, h.value(t, "dispatch_tracked_keys"))
	assert.Equal(t, 3.0, h.value(t, "dispatch_queued_calls", "state", "ready"))
	assert.Equal(t, 1.0, h.value(t, "dispatch_in_flight_calls"))
	assert.Equal(t, 2.0, h.value(t, "dispatch_tenant_queued_calls", "tenant", ""))
	assert.Equal(t, 1.0, h.value(t, "dispatch_tenant_queued_calls", "tenant", "plugin-a"))
	assert.Equal(t, 1.0, h.value(t, "dispatch_tenant_in_flight_calls", "tenant", ""))

	// A non-droppable newcomer evicts the droppable status patch.
	tD := bind("d", call{}, dispatch.SubmitOptions{Priority: 10})
	for _, tk := range []*dispatch.Ticket[string, call]{tA, tA2} {
		res, err := tk.Wait(ctx)
		require.ErrorIs(t, err, dispatch.ErrDropped)
		assert.Equal(t, dispatch.StateDropped, res.State)
	}
	// Nothing droppable is left: the next new key is refused.
	_, err = h.d.Submit(ctx, "e", call{typ: "status"}, patch)
	var bp *dispatch.BackpressureError
	require.ErrorAs(t, err, &bp)
	// A different idempotency key cannot merge; an older generation is stale.
	_, err = h.d.Submit(ctx, "b", call{typ: "bind"}, dispatch.SubmitOptions{IdempotencyKey: "b-2"})
	require.ErrorIs(t, err, dispatch.ErrMergeRejected)
	_, err = h.d.Submit(ctx, "c", call{typ: "bind"}, dispatch.SubmitOptions{Generation: 1})
	require.ErrorIs(t, err, dispatch.ErrStale)
	assert.Equal(t, 0.0, h.value(t, "dispatch_pending_async_api_calls", "call_type", "status"), "seen, now idle: 0, not gone")

	close(gate)
	for tk, want := range map[*dispatch.Ticket[string, call]]dispatch.State{
		tBlock: dispatch.StateSucceeded, tB: dispatch.StateFailed, tC: dispatch.StateSucceeded, tD: dispatch.StateSucceeded,
	} {
		res, _ := tk.Wait(ctx)
		assert.Equal(t, want, res.State, "%s: %v", res.Key, res.Err)
	}
	require.NoError(t, h.d.Close(ctx))
	_, err = h.d.Submit(ctx, "f", call{typ: "bind"}, dispatch.SubmitOptions{})
	require.ErrorIs(t, err, dispatch.ErrClosed)

	const want = `
# HELP dispatch_async_api_call_execution_total Calls finished, by call type and terminal state (result). A call that coalesced several submissions counts once.
# TYPE dispatch_async_api_call_execution_total counter
dispatch_async_api_call_execution_total{call_type="bind",result="failed"} 1
dispatch_async_api_call_execution_total{call_type="bind",result="succeeded"} 3
dispatch_async_api_call_execution_total{call_type="status",result="dropped"} 1
# HELP dispatch_async_api_call_attempts_total Attempts begun (retries included), by call type; one that Config.NoOp or BeforeRetry ends runs no exec.
# TYPE dispatch_async_api_call_attempts_total counter
dispatch_async_api_call_attempts_total{call_type="bind"} 5
# HELP dispatch_coalesced_total Submissions merged into a call already pending for their key (or, having waited behind their key's call in flight, into its retry), by call type.
# TYPE dispatch_coalesced_total counter
dispatch_coalesced_total{call_type="status"} 1
# HELP dispatch_dropped_total Queued calls shed to make room, by call type and reason (capacity, quota).
# TYPE dispatch_dropped_total counter
dispatch_dropped_total{call_type="status",reason="capacity"} 1
# HELP dispatch_rejected_total Submissions refused, by call type and reason (capacity, waiters, quota, backpressure, closed, circuit, stale, expired, merge, canceled, other).
# TYPE dispatch_rejected_total counter
dispatch_rejected_total{call_type="bind",reason="closed"} 1
dispatch_rejected_total{call_type="bind",reason="merge"} 1
dispatch_rejected_total{call_type="bind",reason="stale"} 1
dispatch_rejected_total{call_type="status",reason="capacity"} 1
# HELP dispatch_retries_total Executions scheduled again after a retryable failure, by call type: the dispatcher's own API retries.
# TYPE dispatch_retries_total counter
dispatch_retries_total{call_type="bind"} 1
# HELP dispatch_submissions_total Submissions (Submit and Post), accepted or rejected, by call type and tenant.
# TYPE dispatch_submissions_total counter
dispatch_submissions_total{call_type="bind",tenant=""} 7
dispatch_submissions_total{call_type="status",tenant="plugin-a"} 3
# HELP dispatch_pending_async_api_calls Calls queued or in flight, by call type.
# TYPE dispatch_pending_async_api_calls gauge
dispatch_pending_async_api_calls{call_type="bind"} 0
dispatch_pending_async_api_calls{call_type="status"} 0
# HELP dispatch_mode The dispatcher's mode: 0 async, 1 sync.
# TYPE dispatch_mode gauge
dispatch_mode 0
# HELP dispatch_breaker_state The circuit breaker's state: 0 closed, 1 open, 2 half_open.
# TYPE dispatch_breaker_state gauge
dispatch_breaker_state 0
`
	require.NoError(t, testutil.GatherAndCompare(h.reg, strings.NewReader(want),
		"dispatch_async_api_call_execution_total", "dispatch_async_api_call_attempts_total",
		"dispatch_coalesced_total", "dispatch_dropped_total", "dispatch_rejected_total",
		"dispatch_retries_total", "dispatch_submissions_total", "dispatch_pending_async_api_calls",
		"dispatch_mode", "dispatch_breaker_state",
	))
	// Histograms: one queue-wait sample per call that ran, one duration
	// sample per finished call that ran; the dropped call never ran.
	assert.Equal(t, 4.0, h.value(t, "dispatch_queue_wait_seconds", "call_type", "bind"))
	assert.Equal(t, 3.0, h.value(t, "dispatch_async_api_call_execution_duration_seconds", "call_type", "bind", "result", "succeeded"))
	assert.Equal(t, 1.0, h.value(t, "dispatch_async_api_call_execution_duration_seconds", "call_type", "bind", "result", "failed"))
	_, ok := sample(t, h.reg, "dispatch_async_api_call_execution_duration_seconds", "result", "dropped")
	assert.False(t, ok)

	// The event metrics agree with the dispatcher's own counters.
	s := h.d.Stats()
	assert.Equal(t, float64(s.Submitted), sum(t, h.reg, "dispatch_submissions_total"), "submitted")
	assert.Equal(t, float64(s.Rejected), sum(t, h.reg, "dispatch_rejected_total"), "rejected")
	assert.Equal(t, float64(s.Coalesced), sum(t, h.reg, "dispatch_coalesced_total"), "coalesced")
	assert.Equal(t, float64(s.Retries), sum(t, h.reg, "dispatch_retries_total"), "retries")
	assert.Equal(t, float64(s.Executions), sum(t, h.reg, "dispatch_async_api_call_attempts_total"), "executions")
	assert.Equal(t, float64(s.QueueWait.Count), sum(t, h.reg, "dispatch_queue_wait_seconds"), "queue waits")
	calls := uint64(0)
	for _, n := range s.Calls {
		calls += n
	}
	assert.Equal(t, float64(calls), sum(t, h.reg, "dispatch_async_api_call_execution_total"), "finished calls")
	shed := uint64(0)
	for _, n := range s.Shed {
		shed += n
	}
	assert.Equal(t, float64(shed), sum(t, h.reg, "dispatch_dropped_total"), "shed")

	lint(t, h.reg)
}

// TestDispatcherModeChanges switches a real Dispatcher to Sync and back.
func TestDispatcherModeChanges(t *testing.T) {
	h := newHarness(t, dispatch.Config[string, call]{})
	ctx := t.Context()
	require.NoError(t, h.d.SetMode(ctx, dispatch.ModeSync))
	assert.Equal(t, 1.0, h.value(t, "dispatch_mode"))

	// In Sync the call runs inline, through the same observer events.
	tk, err := h.d.Submit(ctx, "k", call{typ: "bind"}, dispatch.SubmitOptions{})
	require.NoError(t, err)
	res, err := tk.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, dispatch.StateSucceeded, res.State)
	assert.Equal(t, 1.0, h.value(t, "dispatch_async_api_call_execution_total", "call_type", "bind", "result", "succeeded"))
	assert.Equal(t, 1.0, h.value(t, "dispatch_submissions_total", "call_type", "bind"))

	require.NoError(t, h.d.SetMode(ctx, dispatch.ModeAsync))
	assert.Equal(t, 0.0, h.value(t, "dispatch_mode"))
	require.NoError(t, h.d.Close(ctx))

	const want = `
# HELP dispatch_mode_changes_total Mode switches, by mode entered (async, sync) and reason (manual, cool_down, backlog, failure_ratio, queue_wait, circuit_open, other).
# TYPE dispatch_mode_changes_total counter
dispatch_mode_changes_total{reason="manual",to="async"} 1
dispatch_mode_changes_total{reason="manual",to="sync"} 1
`
	require.NoError(t, testutil.GatherAndCompare(h.reg, strings.NewReader(want), "dispatch_mode_changes_total"))
	lint(t, h.reg)
}

// TestDispatcherFallback lets the fallback policy switch to Sync on a
// backlog: the reason label is the kind of threshold, not the message with
// its numbers.
func TestDispatcherFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		h := newHarness(t, dispatch.Config[string, call]{
			Workers: 1,
			Rollout: dispatch.RolloutPolicy{Fallback: &dispatch.FallbackPolicy{Window: time.Second, MaxBacklog: 2}},
		})
		ctx := context.Background()
		for _, k := range []string{"a", "b", "c", "d"} {
			require.NoError(t, h.d.Post(k, call{typ: "bind", block: gate}, dispatch.SubmitOptions{}))
		}
		time.Sleep(time.Second) // past a check of the thresholds
		synctest.Wait()
		assert.Equal(t, 1.0, h.value(t, "dispatch_mode"))
		assert.Equal(t, 1.0, h.value(t, "dispatch_mode_changes_total", "to", "sync", "reason", "backlog"))
		assert.Equal(t, map[string]bool{"backlog": true}, labelValues(t, h.reg, "reason"))
		close(gate)
		require.NoError(t, h.d.Close(ctx))
		lint(t, h.reg)
	})
}

// TestDispatcherBreaker trips the circuit breaker of a real Dispatcher and
// lets it recover, under a fake clock.
func TestDispatcherBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, dispatch.Config[string, call]{
			Workers: 1,
			Breaker: &dispatch.BreakerPolicy{ConsecutiveFailures: 1, Cooldown: time.Second},
			Retry:   dispatch.RetryPolicy{InitialBackoff: 10 * time.Millisecond, Jitter: dispatch.JitterNone},
		})
		ctx := context.Background()
		tk, err := h.d.Submit(ctx, "k", call{typ: "bind", failFirst: io.ErrUnexpectedEOF}, dispatch.SubmitOptions{})
		require.NoError(t, err)
		<-h.started
		synctest.Wait() // the first attempt failed: open, waiting out the cool-down
		assert.Equal(t, 1.0, h.value(t, "dispatch_breaker_state"))
		assert.Equal(t, 1.0, h.value(t, "dispatch_queued_calls", "state", "delayed")+h.value(t, "dispatch_queued_calls", "state", "ready"))

		res, err := tk.Wait(ctx)
		require.NoError(t, err)
		assert.Equal(t, dispatch.StateSucceeded, res.State)
		assert.Equal(t, 2, res.Attempts)
		require.NoError(t, h.d.Close(ctx))

		const want = `
# HELP dispatch_breaker_transitions_total Circuit breaker state changes, by state left and state entered (closed, open, half_open).
# TYPE dispatch_breaker_transitions_total counter
dispatch_breaker_transitions_total{from="closed",to="open"} 1
dispatch_breaker_transitions_total{from="half_open",to="closed"} 1
dispatch_breaker_transitions_total{from="open",to="half_open"} 1
# HELP dispatch_breaker_state The circuit breaker's state: 0 closed, 1 open, 2 half_open.
# TYPE dispatch_breaker_state gauge
dispatch_breaker_state 0
# HELP dispatch_retries_total Executions scheduled again after a retryable failure, by call type: the dispatcher's own API retries.
# TYPE dispatch_retries_total counter
dispatch_retries_total{call_type="bind"} 1
`
		require.NoError(t, testutil.GatherAndCompare(h.reg, strings.NewReader(want),
			"dispatch_breaker_transitions_total", "dispatch_breaker_state", "dispatch_retries_total"))
		lint(t, h.reg)
	})
}

// TestDispatcherConcurrentScrape scrapes while many goroutines submit, for
// the race detector, and checks the totals at the end.
func TestDispatcherConcurrentScrape(t *testing.T) {
	h := newHarness(t, dispatch.Config[string, call]{Workers: 4, Capacity: 1000})
	ctx := t.Context()
	const goroutines, each = 8, 200
	done := make(chan struct{})
	var scrapes sync.WaitGroup
	scrapes.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
				_, err := h.reg.Gather()
				assert.NoError(t, err)
			}
		}
	})
	go func() {
		for range h.started { // drain: exec must not block on the channel
		}
	}()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			typ := []string{"bind", "status", "preempt"}[g%3]
			for i := range each {
				key := string(rune('a' + i%26))
				assert.NoError(t, h.d.Post(key, call{typ: typ}, dispatch.SubmitOptions{Tenant: typ}))
			}
		})
	}
	wg.Wait()
	require.NoError(t, h.d.Close(ctx))
	close(done)
	scrapes.Wait()
	close(h.started)

	s := h.d.Stats()
	assert.Equal(t, float64(goroutines*each), sum(t, h.reg, "dispatch_submissions_total"))
	assert.Equal(t, float64(s.Coalesced), sum(t, h.reg, "dispatch_coalesced_total"))
	assert.Equal(t, float64(s.Executions), sum(t, h.reg, "dispatch_async_api_call_attempts_total"))
	assert.Equal(t, 0.0, sum(t, h.reg, "dispatch_pending_async_api_calls"))
	lint(t, h.reg)
}

// TestDispatcherRejectDoneContext: a submission whose context is already
// done is refused (Stats counts it as submitted and rejected), so the
// observer must hear of it too, or submissions_total and rejected_total
// fall behind the dispatcher's own counters.
func TestDispatcherRejectDoneContext(t *testing.T) {
	h := newHarness(t, dispatch.Config[string, call]{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := h.d.Submit(ctx, "k", call{typ: "bind"}, dispatch.SubmitOptions{})
	require.ErrorIs(t, err, dispatch.ErrCanceled)
	require.NoError(t, h.d.Close(t.Context()))

	s := h.d.Stats()
	require.Equal(t, uint64(1), s.Rejected)
	assert.Equal(t, float64(s.Submitted), sum(t, h.reg, "dispatch_submissions_total"), "submitted")
	assert.Equal(t, float64(s.Rejected), sum(t, h.reg, "dispatch_rejected_total"), "rejected")
	assert.Equal(t, 1.0, h.value(t, "dispatch_rejected_total", "call_type", "bind", "reason", "canceled"))
}

// TestDispatcherInvalidUTF8Labels: a call type or tenant that is not valid
// UTF-8 (a label derived from raw bytes, say) is exported as "other". As a
// label value it would fail the Observer's events, and then every scrape
// of the registry, for as long as the value stays known.
func TestDispatcherInvalidUTF8Labels(t *testing.T) {
	h := newHarness(t, dispatch.Config[string, call]{})
	ctx := t.Context()
	tk, err := h.d.Submit(ctx, "k", call{typ: "bind\xff"}, dispatch.SubmitOptions{Tenant: "plugin-\xfe"})
	require.NoError(t, err)
	_, err = tk.Wait(ctx)
	require.NoError(t, err)
	require.NoError(t, h.d.Close(ctx))

	_, err = h.reg.Gather()
	require.NoError(t, err, "the scrape fails")
	s := h.d.Stats()
	assert.Zero(t, s.CallbackPanics, "observer panics: %v", s.LastCallbackPanic)
	assert.Equal(t, 1.0, h.value(t, "dispatch_submissions_total", "call_type", "other", "tenant", "other"))
	assert.Equal(t, 1.0, h.value(t, "dispatch_async_api_call_execution_total", "call_type", "other", "result", "succeeded"))
	lint(t, h.reg)
}

// TestDispatcherPendingWithoutLabel: without Config.Label every call's
// call_type is "", and pending_async_api_calls counts them all, rather than
// reading 0 while calls wait.
func TestDispatcherPendingWithoutLabel(t *testing.T) {
	obs, err := NewObserver(Options{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(obs))
	gate, started := make(chan struct{}), make(chan string, 4)
	d, err := dispatch.New(func(_ context.Context, key string, _ int) error {
		started <- key
		<-gate
		return nil
	}, dispatch.Config[string, int]{Workers: 1, Observer: obs})
	require.NoError(t, err)
	obs.SetStats(d.Stats)

	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, d.Post(k, 0, dispatch.SubmitOptions{}))
	}
	<-started // one runs, two wait
	assert.Equal(t, 3.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", ""))
	assert.Equal(t, 3.0, value(t, reg, "dispatch_submissions_total", "call_type", ""))

	close(gate)
	require.NoError(t, d.Close(t.Context()))
	assert.Equal(t, 0.0, value(t, reg, "dispatch_pending_async_api_calls", "call_type", ""))
	lint(t, reg)
}

// TestAttemptsCountNoOpAttempts: an attempt that Config.NoOp ends is
// begun (the observer is told of it) but runs no exec, so attempts_total
// counts it where Stats.Executions does not, as the metric's help says.
func TestAttemptsCountNoOpAttempts(t *testing.T) {
	obs, err := NewObserver(Options{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(obs))
	ran := 0
	d, err := dispatch.New(func(context.Context, string, int) error {
		ran++
		return nil
	}, dispatch.Config[string, int]{Workers: 1, Observer: obs, NoOp: func(_ string, v int) bool { return v == 0 }})
	require.NoError(t, err)
	obs.SetStats(d.Stats)
	for i, k := range []string{"skipped", "run"} {
		tk, err := d.Submit(t.Context(), k, i, dispatch.SubmitOptions{})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.NoError(t, err)
	}
	require.NoError(t, d.Close(t.Context()))

	assert.Equal(t, 1, ran)
	assert.Equal(t, uint64(1), d.Stats().Executions)
	assert.Equal(t, 2.0, sum(t, reg, "dispatch_async_api_call_attempts_total"), "both attempts begun")
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == "dispatch_async_api_call_attempts_total" {
			assert.Contains(t, f.GetHelp(), "one that Config.NoOp or BeforeRetry ends runs no exec")
		}
	}
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(doc), "\n//", "\n")), " ")
	assert.Contains(t, text, "An attempt that Config.NoOp or BeforeRetry ends has begun but runs no exec: attempts_total counts it, dispatch.Stats.Executions does not.")
	lint(t, reg)
}

// TestCoalescedIntoARetry: two submissions arrive while their key's call is
// in flight, and wait behind it, the second merged into the first as it
// came; the call fails retryably, and they are merged into its retry. One
// call served the three submissions, and coalesced_total counts both
// merges, as dispatch.Stats.Coalesced does: the one made as the third
// submission came (Observer.OnSubmit), and the second submission's into
// the retry (Observer.OnCoalesce).
func TestCoalescedIntoARetry(t *testing.T) {
	h := newHarness(t, dispatch.Config[string, call]{
		Workers: 1,
		Retry:   dispatch.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Jitter: dispatch.JitterNone},
	})
	ctx := t.Context()
	gate := make(chan struct{})
	var tks []*dispatch.Ticket[string, call]
	for _, c := range []call{{typ: "bind", block: gate, failFirst: io.ErrUnexpectedEOF}, {typ: "bind"}, {typ: "bind"}} {
		tk, err := h.d.Submit(ctx, "a", c, dispatch.SubmitOptions{})
		require.NoError(t, err)
		tks = append(tks, tk)
		if len(tks) == 1 {
			require.Equal(t, "a", <-h.started) // in flight
		}
	}
	close(gate)
	for _, tk := range tks {
		res, err := tk.Wait(ctx)
		require.NoError(t, err)
		assert.Equal(t, dispatch.StateSucceeded, res.State)
	}
	require.NoError(t, h.d.Close(ctx))
	assert.Equal(t, 3.0, h.value(t, "dispatch_submissions_total", "call_type", "bind"))
	assert.Equal(t, 1.0, h.value(t, "dispatch_async_api_call_execution_total", "call_type", "bind", "result", "succeeded"), "one call")
	assert.Equal(t, 2.0, h.value(t, "dispatch_coalesced_total", "call_type", "bind"), "the merge as the third came, and the second's into the retry")
	assert.Equal(t, float64(h.d.Stats().Coalesced), h.value(t, "dispatch_coalesced_total", "call_type", "bind"))
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(doc), "\n//", "\n")), " ")
	assert.Contains(t, text, "and one that arrived while its key's call was in flight, waited behind that call, and was merged into its retry later (Observer.OnCoalesce): it counts what dispatch.Stats.Coalesced does.")
	lint(t, h.reg)
}
