package dispatch

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/coalescer/dispatch/internal/due"
)

// field is one numeric setting of Config or of a policy nested in it, and
// how to set it. Values are given as float64 and converted to the field's
// type, so one list of extremes serves every field of a kind.
type field struct {
	name string
	kind string // "int", "duration" or "float"
	set  func(c *Config[string, int], v float64)
}

// configFields lists every numeric field of Config and its nested
// policies: adding a field without adding it here fails
// TestConfigFieldsListed.
var configFields = []field{
	{"Workers", "int", func(c *Config[string, int], v float64) { c.Workers = int(v) }},
	{"Capacity", "int", func(c *Config[string, int], v float64) { c.Capacity = int(v) }},
	{"MaxWaiters", "int", func(c *Config[string, int], v float64) { c.MaxWaiters = int(v) }},
	{"Aging", "duration", func(c *Config[string, int], v float64) { c.Aging = time.Duration(v) }},
	{"AgingBand", "int", func(c *Config[string, int], v float64) { c.AgingBand = int(v) }},
	{"Start.ReservedWorkers", "int", func(c *Config[string, int], v float64) { c.Start.ReservedWorkers = int(v) }},
	{"Start.UrgentPriority", "int", func(c *Config[string, int], v float64) {
		c.Start = StartPolicy{ReservedWorkers: 1, UrgentPriority: int(v)}
	}},
	{"Start.Adaptive.MinWorkers", "int", func(c *Config[string, int], v float64) { c.Start.Adaptive = &AdaptivePolicy{MinWorkers: int(v)} }},
	{"Start.Adaptive.Tolerance", "float", func(c *Config[string, int], v float64) { c.Start.Adaptive = &AdaptivePolicy{Tolerance: v} }},
	{"Start.Adaptive.Window", "duration", func(c *Config[string, int], v float64) {
		c.Start.Adaptive = &AdaptivePolicy{Window: time.Duration(v)}
	}},
	{"Start.DeadlineQuantile", "float", func(c *Config[string, int], v float64) { c.Start.DeadlineQuantile = v }},
	{"Start.DeadlineSamples", "int", func(c *Config[string, int], v float64) { c.Start.DeadlineSamples = int(v) }},
	{"Retry.MaxAttempts", "int", func(c *Config[string, int], v float64) { c.Retry.MaxAttempts = int(v) }},
	{"Retry.InitialBackoff", "duration", func(c *Config[string, int], v float64) { c.Retry.InitialBackoff = time.Duration(v) }},
	{"Retry.MaxBackoff", "duration", func(c *Config[string, int], v float64) { c.Retry.MaxBackoff = time.Duration(v) }},
	{"Retry.Multiplier", "float", func(c *Config[string, int], v float64) { c.Retry.Multiplier = v }},
	{"Retry.AttemptTimeout", "duration", func(c *Config[string, int], v float64) { c.Retry.AttemptTimeout = time.Duration(v) }},
	{"Retry.BudgetRatio", "float", func(c *Config[string, int], v float64) { c.Retry.BudgetRatio = v }},
	{"Retry.BudgetMin", "int", func(c *Config[string, int], v float64) { c.Retry.BudgetMin = int(v) }},
	{"Retry.BudgetWindow", "duration", func(c *Config[string, int], v float64) { c.Retry.BudgetWindow = time.Duration(v) }},
	{"Breaker.ConsecutiveFailures", "int", func(c *Config[string, int], v float64) {
		c.Breaker = &BreakerPolicy{ConsecutiveFailures: int(v)}
	}},
	{"Breaker.FailureRatio", "float", func(c *Config[string, int], v float64) { c.Breaker = &BreakerPolicy{FailureRatio: v} }},
	{"Breaker.Window", "duration", func(c *Config[string, int], v float64) { c.Breaker = &BreakerPolicy{Window: time.Duration(v)} }},
	{"Breaker.MinSamples", "int", func(c *Config[string, int], v float64) { c.Breaker = &BreakerPolicy{MinSamples: int(v)} }},
	{"Breaker.Cooldown", "duration", func(c *Config[string, int], v float64) { c.Breaker = &BreakerPolicy{Cooldown: time.Duration(v)} }},
	{"Breaker.Probes", "int", func(c *Config[string, int], v float64) { c.Breaker = &BreakerPolicy{Probes: int(v)} }},
	{"Rollout.Fallback.Window", "duration", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{Window: time.Duration(v), MaxBacklog: 100}
	}},
	{"Rollout.Fallback.MaxBacklog", "int", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{MaxBacklog: int(v), MaxCircuitOpen: time.Hour}
	}},
	{"Rollout.Fallback.MaxQueueWaitP99", "duration", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{MaxQueueWaitP99: time.Duration(v), MaxBacklog: 100}
	}},
	{"Rollout.Fallback.MaxFailureRatio", "float", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{MaxFailureRatio: v, MaxBacklog: 100}
	}},
	{"Rollout.Fallback.MinSamples", "int", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{MinSamples: int(v), MaxBacklog: 100}
	}},
	{"Rollout.Fallback.MaxCircuitOpen", "duration", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{MaxCircuitOpen: time.Duration(v), MaxBacklog: 100}
	}},
	{"Rollout.Fallback.ReturnAfter", "duration", func(c *Config[string, int], v float64) {
		c.Rollout.Fallback = &FallbackPolicy{ReturnAfter: time.Duration(v), MaxBacklog: 100}
	}},
	{`Tenants["t"].MaxQueued`, "int", func(c *Config[string, int], v float64) {
		c.Tenants = map[string]TenantConfig{"t": {MaxQueued: int(v)}}
	}},
	{`Tenants["t"].MaxInFlight`, "int", func(c *Config[string, int], v float64) {
		c.Tenants = map[string]TenantConfig{"t": {MaxInFlight: int(v)}}
	}},
	{`Tenants["t"].Weight`, "int", func(c *Config[string, int], v float64) {
		c.Tenants = map[string]TenantConfig{"t": {Weight: int(v)}}
	}},
	{"DefaultTenant.MaxQueued", "int", func(c *Config[string, int], v float64) { c.DefaultTenant.MaxQueued = int(v) }},
	{"DefaultTenant.MaxInFlight", "int", func(c *Config[string, int], v float64) { c.DefaultTenant.MaxInFlight = int(v) }},
	{"DefaultTenant.Weight", "int", func(c *Config[string, int], v float64) { c.DefaultTenant.Weight = int(v) }},
}

// extremeValues are the values every field of a kind is tried with.
var extremeValues = map[string][]float64{
	"int":      {0, 1, -1, math.MinInt64, math.MaxInt64, 1 << 32},
	"duration": {0, 1, -1, math.MinInt64, math.MaxInt64},
	"float":    {0, 1e-300, -1, math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64, 0.5, 1},
}

// TestConfigExtremes (every duration, count and rate is validated or
// saturates): every numeric field of Config and its nested
// policies, at 0, the smallest step, a negative value, NaN, ±Inf and its
// largest value, either is refused by New with an error naming the field,
// or gives a dispatcher that works: a call succeeds, a call failing
// retryably ends or waits without hanging anything, Stats answers, Close
// returns, and conservation holds.
func TestConfigExtremes(t *testing.T) {
	for _, f := range configFields {
		for _, v := range extremeValues[f.kind] {
			name := fmt.Sprintf("%s=%v", f.name, v)
			if f.kind == "duration" {
				name = fmt.Sprintf("%s=%v", f.name, time.Duration(v))
			}
			t.Run(name, func(t *testing.T) {
				var cfg Config[string, int]
				f.set(&cfg, v)
				if cfg.Workers == 0 {
					cfg.Workers = 4 // fewer goroutines than the default: a shorter run
				}
				synctest.Test(t, func(t *testing.T) {
					var failed atomic.Bool
					d, err := New(func(ctx context.Context, k string, _ int) error {
						if k == "retry" && !failed.Swap(true) {
							return syscall.ECONNRESET // once
						}
						return nil
					}, cfg)
					if err != nil {
						assert.Contains(t, err.Error(), "Config."+f.name, "the error names the field")
						assert.True(t, strings.HasPrefix(err.Error(), "dispatch: "), err.Error())
						return
					}
					smoke(t, d)
				})
			})
		}
	}
}

// smoke runs a few calls through d and closes it, checking that nothing
// hangs and nothing is lost. A tiny capacity or quota may refuse some of
// the submissions: with backpressure, and nothing else.
func smoke(t *testing.T, d *Dispatcher[string, int]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	defer func() {
		_ = d.Close(ctx) // returns, whatever happened
		checkConservation(t, d)
	}()
	o := SubmitOptions{Tenant: "t"}
	var tks []*Ticket[string, int]
	for _, k := range []string{"ok", "retry"} {
		tk, err := d.Submit(bg, k, 1, o)
		if err != nil {
			require.ErrorIs(t, err, ErrBackpressure, k)
			continue
		}
		tks = append(tks, tk)
	}
	if err := d.Post("post", 2, o); err != nil {
		require.ErrorIs(t, err, ErrBackpressure)
	}
	require.NotEmpty(t, tks, "every submission refused")
	r, err := tks[0].Wait(ctx)
	require.NoError(t, err, "the first call did not end within a minute")
	if r.Key == "ok" {
		assert.True(t, r.State.OK(), "the plain call: %v %v", r.State, r.Err)
	}
	for _, tk := range tks[1:] {
		_, _ = tk.Wait(ctx)
	}
	d.Stats() // a hang here fails the test by its timeout
	_ = d.Close(ctx)
	for _, tk := range tks {
		_, ended := tk.Result()
		assert.True(t, ended, "a ticket without an outcome after Close")
	}
}

// TestConfigFieldsListed: configFields names every numeric field of Config
// and of the policies nested in it, so TestConfigExtremes cannot miss a
// new one.
func TestConfigFieldsListed(t *testing.T) {
	listed := map[string]bool{}
	for _, f := range configFields {
		listed[f.name] = true
	}
	for _, name := range numericFields(reflectType[Config[string, int]](), "") {
		assert.True(t, listed[name], "TestConfigExtremes does not try Config.%s", name)
	}
}

// TestHugeCapacity: a Capacity near the largest int
// used to overflow the default MaxWaiters (4 × Capacity) into a negative
// bound that refused every Submit.
func TestHugeCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{Capacity: math.MaxInt / 4})
		tk, err := d.Submit(bg, "k", 1, SubmitOptions{})
		require.NoError(t, err)
		<-tk.Done()
		closeD(t, d)
	})
}

// TestFallbackWindow: a fallback window too short to
// check sensibly is refused, and an idle dispatcher's fallback check
// parks instead of waking every tenth of its window (at 1ns it burned a
// fifth of a core); the next call wakes it, and it still switches.
func TestFallbackWindow(t *testing.T) {
	_, err := New(nopExec, Config[string, int]{Rollout: RolloutPolicy{Fallback: &FallbackPolicy{Window: time.Nanosecond, MaxBacklog: 1}}})
	assert.ErrorContains(t, err, "Config.Rollout.Fallback.Window")
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		// Only "0" holds the one worker, so the others queue behind it.
		// The check may trip while the loop below still posts, and a Post
		// in ModeSync runs its call inline: one that waited on the gate
		// would block the only goroutine that opens it.
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			if k == "0" {
				<-gate
			}
			return nil
		}, Config[string, int]{Workers: 1, Rollout: RolloutPolicy{Fallback: &FallbackPolicy{Window: 10 * time.Millisecond, MaxBacklog: 3}}})
		tk := submit(t, d, "idle", 1, SubmitOptions{})
		<-tk.Done()
		time.Sleep(time.Second)
		synctest.Wait()
		d.mu.Lock()
		parked, armed := d.fallback.Parked(), d.due.Armed() != due.Never
		d.mu.Unlock()
		assert.True(t, parked, "the check parks while idle")
		assert.False(t, armed, "no timer armed while idle")
		for i := range 6 {
			require.NoError(t, d.Post(fmt.Sprint(i), 1, SubmitOptions{}))
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, ModeSync, d.Mode(), "the backlog still trips the fallback")
		close(gate)
		closeD(t, d)
	})
}

// TestUrgentBandIsTheUsers: StartPolicy.ReservedWorkers "are kept for calls
// whose priority (never raised by aging) is in UrgentPriority's band or
// above", the band of Config.AgingBand levels, however wide: a call at the
// last priority of the band below never takes the kept worker, and one at
// UrgentPriority does.
func TestUrgentBandIsTheUsers(t *testing.T) {
	for _, tc := range []struct {
		width int
		aging time.Duration
	}{
		{10, time.Second}, {1e9, 10 * time.Second}, {1e9, time.Nanosecond},
		{math.MaxInt, time.Nanosecond}, {math.MaxInt, math.MaxInt64},
	} {
		t.Run(fmt.Sprintf("band=%d/aging=%v", tc.width, tc.aging), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				d := newD(t, func(ctx context.Context, _ string, _ int) error { return g.wait(ctx) }, Config[string, int]{
					Workers: 2, AgingBand: tc.width, Aging: tc.aging,
					Start: StartPolicy{ReservedWorkers: 1, UrgentPriority: tc.width},
				})
				tks := []*Ticket[string, int]{
					submit(t, d, "a", 0, prio(tc.width-1)),
					submit(t, d, "b", 0, prio(tc.width-1)),
				}
				synctest.Wait()
				assert.Equal(t, 1, d.Stats().InFlight, "a call of the band below took the kept worker")
				tks = append(tks, submit(t, d, "urgent", 0, prio(tc.width)))
				synctest.Wait()
				assert.Equal(t, 2, d.Stats().InFlight, "the urgent call did not take the kept worker")
				g.open()
				waitAll(tks...)
				closeD(t, d)
			})
		})
	}
}
