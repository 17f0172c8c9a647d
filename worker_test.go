package dispatch

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// TestTokensKeepWorkersBusy: while calls are ready, workers are free and
// the limiter grants, someone is always waiting for the next token, whatever
// the limiter's shape: calls that hang in exec do not stop the ones behind
// them from starting, one per token, up to the workers (or a tenant's cap).
func TestTokensKeepWorkersBusy(t *testing.T) {
	limiters := map[string]func() RateLimiter{
		"rate.Limiter":       func() RateLimiter { return rate.NewLimiter(100, 1) },
		"TryAccept (client)": func() RateLimiter { return tryLimiter{rate.NewLimiter(100, 1)} },
		"Wait only":          func() RateLimiter { return waitLimiter{rate.NewLimiter(100, 1)} },
		"Wait only, no wait": func() RateLimiter { return waitLimiter{rate.NewLimiter(rate.Inf, 0)} },
	}
	for name, limiter := range limiters {
		for _, capped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/tenant cap=%v", name, capped), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					release := make(chan struct{})
					var running atomic.Int32
					cfg := Config[string, int]{Workers: 8, RateLimit: limiter()}
					want := 8
					if capped {
						cfg.DefaultTenant = TenantConfig{MaxInFlight: 4}
						want = 4
					}
					d := newD(t, func(ctx context.Context, _ string, _ int) error {
						running.Add(1)
						<-release
						return nil
					}, cfg)
					for i := range 20 {
						require.NoError(t, d.Post(fmt.Sprint("k", i), 1, SubmitOptions{Tenant: "t"}))
					}
					time.Sleep(time.Second) // 100 tokens
					synctest.Wait()
					assert.EqualValues(t, want, running.Load(), "executions started")
					assert.Equal(t, want, d.Stats().InFlight)
					close(release)
					closeD(t, d)
				})
			})
		}
	}
}

// startExit is an observer whose OnStart panics or ends its goroutine
// (runtime.Goexit) the first times it is called (the first, if times is
// 0) and returns after.
type startExit struct {
	NopObserver
	goexit bool
	times  int32
	calls  atomic.Int32
	// If set, the first OnStart closes inStart and waits for leave.
	inStart, leave chan struct{}
}

func (o *startExit) OnStart(Event, int, time.Duration) {
	n := o.calls.Add(1)
	if n > max(o.times, 1) {
		return
	}
	if o.inStart != nil && n == 1 {
		close(o.inStart)
		<-o.leave
	}
	if o.goexit {
		runtime.Goexit()
	}
	panic("observer: start")
}

// runStarting submits one call of tenant t (MaxQueued 1) to a one-worker
// dispatcher in mode, with obs and retry, from a goroutine of its own (in
// Sync mode that goroutine executes the call, and OnStart's Goexit ends
// it). exec is told how many times it has run, this time included. It
// returns the call's outcome, how many times exec ran, and Stats after
// Close.
func runStarting(t *testing.T, mode Mode, obs Observer, retry RetryPolicy, exec func(n int32) error) (Result[string, int], int32, Stats) {
	var ran atomic.Int32
	done := make(chan Result[string, int], 1)
	d := newD(t, func(context.Context, string, int) error { return exec(ran.Add(1)) }, Config[string, int]{
		Workers:  1,
		Observer: obs,
		Retry:    retry,
		OnDone:   func(r Result[string, int]) { done <- r },
		Tenants:  map[string]TenantConfig{"t": {MaxQueued: 1}},
		Rollout:  RolloutPolicy{Mode: mode},
	})
	go func() { _, _ = d.Submit(bg, "k", 1, SubmitOptions{Tenant: "t"}) }()
	r := <-done
	return r, ran.Load(), closeD(t, d)
}

// TestOnStartPanicOrGoexitIsCounted: a panic or runtime.Goexit in an
// Observer method is counted (Stats.CallbackPanics) and ends no call
// (doc.go, "Callbacks"). OnStart runs before any of the call's own user
// code: after a panic the attempt goes on; after a Goexit, which ends the
// goroutine that was to execute the call, the call goes back to the queue
// untouched and runs later — exec runs once, the call succeeds after one
// attempt, and a tenant at its MaxQueued keeps the call's place meanwhile.
func TestOnStartPanicOrGoexitIsCounted(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		for _, goexit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/goexit=%v", mode, goexit), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					r, ran, s := runStarting(t, mode, &startExit{goexit: goexit}, RetryPolicy{}, func(int32) error { return nil })
					assert.Equal(t, StateSucceeded, r.State, "ended %v: %v", r.State, r.Err)
					assert.Equal(t, 1, r.Attempts)
					assert.Equal(t, int32(1), ran, "exec runs once")
					assert.Equal(t, uint64(1), s.CallbackPanics)
				})
			})
		}
	}
}

// TestOnStartGoexitKeepsPlace: while OnStart runs, before the call's own
// user code, the call keeps its place under its tenant's MaxQueued
// (TenantConfig.MaxQueued): a submission of the tenant is refused, and
// when OnStart ends the worker the call goes back into its place and runs.
func TestOnStartGoexitKeepsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &startExit{goexit: true, inStart: make(chan struct{}), leave: make(chan struct{})}
		d := newD(t, nopExec, Config[string, int]{
			Workers:  1,
			Observer: obs,
			Tenants:  map[string]TenantConfig{"t": {MaxQueued: 1}},
		})
		tk := submit(t, d, "k", 1, SubmitOptions{Tenant: "t"})
		<-obs.inStart
		_, err := d.Submit(bg, "other", 1, SubmitOptions{Tenant: "t"})
		assert.ErrorIs(t, err, ErrBackpressure, "k holds t's place until its attempt begins")
		close(obs.leave)
		r := outcome(t, waitFor(t, tk))
		assert.Equal(t, StateSucceeded, r.State, "ended %v: %v", r.State, r.Err)
		assert.LessOrEqual(t, d.Stats().Tenants["t"].Queued, 1)
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.CallbackPanics)
	})
}

// giveUp is how often a startExit of TestOnStartAlwaysExiting exits:
// always, as far as the dispatcher can tell, yet a dispatcher that would
// take the call again forever still lets the test end, and fail.
const giveUp = 100

// TestOnStartAlwaysExiting: an Observer.OnStart that always ends its
// goroutine cannot hold a call back forever. Each exit sends the call back
// to the queue untouched and is counted (Stats.CallbackPanics), as a
// one-off exit is; after maxStartExits of them in a row before one attempt,
// that attempt begins without OnStart, and the call runs and ends as exec
// says — an observer's exit ends no call. The count starts again with each
// attempt, so a retry tells OnStart again. One that always panics is
// counted once per attempt, and the attempt goes on.
func TestOnStartAlwaysExiting(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		for _, goexit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/goexit=%v", mode, goexit), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					obs := &startExit{goexit: goexit, times: giveUp}
					r, ran, s := runStarting(t, mode, obs, noJitter(2), func(n int32) error {
						if n == 1 {
							return syscall.ECONNRESET // retried once
						}
						return nil
					})
					assert.Equal(t, StateSucceeded, r.State, "ended %v: %v", r.State, r.Err)
					assert.Equal(t, 2, r.Attempts)
					assert.Equal(t, int32(2), ran, "exec runs once per attempt")
					perAttempt := 1
					if goexit {
						perAttempt = maxStartExits
					}
					assert.Equal(t, int32(2*perAttempt), obs.calls.Load(), "OnStart calls")
					assert.Equal(t, uint64(2*perAttempt), s.CallbackPanics)
					assert.Zero(t, s.Tenants["t"].Queued)
				})
			})
		}
	}
}
