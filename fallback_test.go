package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFallbackTriggers drives each FallbackPolicy threshold to exactly its
// value and just past it: at the threshold the dispatcher stays Async; past
// it, it switches to Sync, records the measured values in
// Stats.FallbackReason and tells the observer the threshold's string.
func TestFallbackTriggers(t *testing.T) {
	type env struct {
		d       *Dispatcher[string, int]
		release chan struct{}
	}
	cases := []struct {
		name   string
		policy FallbackPolicy
		brk    *BreakerPolicy
		// load drives the dispatcher to exactly the threshold (below=true)
		// or just past it.
		load func(t *testing.T, e env, below bool)
		want string // Stats.FallbackReason
		code string // the observer's reason
		// window is the policy's window (default a minute); settle is how
		// long to let the checks run after the load (default two checks).
		window, settle time.Duration
	}{
		{
			name:   "backlog",
			policy: FallbackPolicy{MaxBacklog: 10},
			load: func(t *testing.T, e env, below bool) {
				n := 11 // one in flight, ten queued
				if !below {
					n++
				}
				for i := range n {
					require.NoError(t, e.d.Post(fmt.Sprint("k", i), 0, SubmitOptions{}))
				}
			},
			want: "backlog 11 > 10", code: "backlog",
		},
		{
			name:   "failure ratio",
			policy: FallbackPolicy{MaxFailureRatio: 0.5, MinSamples: 10},
			load: func(t *testing.T, e env, below bool) {
				close(e.release)
				fails := 5
				if !below {
					fails = 6
				}
				for i := range 10 {
					v := 0
					if i < fails {
						v = 1 // exec fails it
					}
					tk, err := e.d.Submit(t.Context(), fmt.Sprint("k", i), v, SubmitOptions{})
					require.NoError(t, err)
					<-tk.Done()
				}
			},
			want: "failure ratio 0.600 > 0.500", code: "failure_ratio",
		},
		{
			name:   "queue wait p99",
			policy: FallbackPolicy{MaxQueueWaitP99: time.Second, MinSamples: 100},
			load: func(t *testing.T, e env, below bool) {
				close(e.release)
				// 100 calls at once on one worker taking 10ms each: waits
				// of 0..990ms, none over a second; the 101st and later wait
				// over a second.
				n := 100
				if !below {
					n = 103
				}
				var tks []*Ticket[string, int]
				for i := range n {
					tk, err := e.d.Submit(t.Context(), fmt.Sprint("k", i), 2, SubmitOptions{})
					require.NoError(t, err)
					tks = append(tks, tk)
				}
				waitAll(tks...)
			},
			want: "queue wait p99 > 1s (2 of 103 waits)", code: "queue_wait",
		},
		{
			name:   "breaker open",
			policy: FallbackPolicy{MaxCircuitOpen: 30 * time.Second},
			brk:    &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: time.Minute},
			load: func(t *testing.T, e env, below bool) {
				close(e.release)
				tk, err := e.d.Submit(t.Context(), "k", 3, SubmitOptions{})
				require.NoError(t, err)
				<-tk.Done()
				// Checks run every second (a tenth of the window).
				if below {
					time.Sleep(30*time.Second + 500*time.Millisecond)
				} else {
					time.Sleep(31*time.Second + 500*time.Millisecond)
				}
			},
			want:   "circuit open for 31s > 30s",
			code:   "circuit_open",
			window: 10 * time.Second,
			settle: time.Nanosecond,
		},
	}
	for _, tc := range cases {
		for _, below := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/below=%v", tc.name, below), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					release := make(chan struct{})
					var modes []string
					var mu sync.Mutex
					obs := &modeLog{f: func(from, to Mode, reason string) {
						mu.Lock()
						modes = append(modes, fmt.Sprint(from, ">", to, ": ", reason))
						mu.Unlock()
					}}
					p := tc.policy
					p.Window = cmp.Or(tc.window, time.Minute)
					d := newD(t, func(ctx context.Context, k string, v int) error {
						switch v {
						case 0:
							<-release
						case 1:
							return errors.New("400")
						case 2:
							time.Sleep(10 * time.Millisecond)
						case 3:
							return syscall.ECONNRESET
						}
						return nil
					}, Config[string, int]{
						Workers:  1,
						Capacity: 1000,
						Retry:    RetryPolicy{MaxAttempts: 1},
						Breaker:  tc.brk,
						Rollout:  RolloutPolicy{Fallback: &p},
						Observer: obs,
					})
					tc.load(t, env{d, release}, below)
					time.Sleep(cmp.Or(tc.settle, p.Window/5)) // two checks
					st := d.Stats()
					if below {
						assert.Equal(t, ModeAsync, st.Mode, "at the threshold, not past it")
						assert.Empty(t, st.FallbackReason)
					} else {
						assert.Equal(t, ModeSync, st.Mode)
						assert.Equal(t, tc.want, st.FallbackReason)
						mu.Lock()
						assert.Equal(t, []string{"async>sync: " + string(tc.code)}, modes)
						mu.Unlock()
					}
					select {
					case <-release:
					default:
						close(release)
					}
					closeD(t, d)
				})
			})
		}
	}
}

// TestFallbackReturnsAfterCooldown: with FallbackPolicy.ReturnAfter, an
// automatic fallback to Sync returns to Async by itself after that long.
func TestFallbackReturnsAfterCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		d := newD(t, func(ctx context.Context, k string, _ int) error { <-release; return nil }, Config[string, int]{
			Workers: 1,
			Rollout: RolloutPolicy{Fallback: &FallbackPolicy{
				MaxBacklog:  1,
				Window:      10 * time.Second,
				ReturnAfter: time.Minute,
			}},
		})
		for i := range 3 {
			require.NoError(t, d.Post(fmt.Sprint(i), 0, SubmitOptions{}))
		}
		time.Sleep(2 * time.Second)
		assert.Equal(t, ModeSync, d.Mode())
		close(release)
		time.Sleep(time.Minute)
		assert.Equal(t, ModeAsync, d.Mode(), "back to Async after the cool-down")
		// The return keeps the measured values of the fallback, as
		// Stats.FallbackReason says.
		docSays(t, "Stats.FallbackReason", `FallbackReason holds the measured values behind the last fallback to ModeSync ("" if none); a return to ModeAsync keeps them.`)
		assert.Equal(t, "backlog 2 > 1", d.Stats().FallbackReason)
		closeD(t, d)
	})
}

// TestFallbackCoolDownSparesManualMode pins README's promise that a
// fallback returns to Async "only when a person calls SetMode — or after
// ReturnAfter": the cool-down undoes the fallback's own switch, never a
// mode a person set since. After an automatic fallback, a person either
// turns the gate on and off again, or re-asserts Sync; Sync traffic goes on
// well past ReturnAfter, and the dispatcher stays Sync.
func TestFallbackCoolDownSparesManualMode(t *testing.T) {
	docSays(t, "README.md", "returns to `ModeAsync` only when a person calls `SetMode` — or after `ReturnAfter`, if set and nobody called `SetMode` meanwhile: a mode a person set is never undone by an earlier fallback's cool-down.")
	for _, tc := range []struct {
		name   string
		manual []Mode
		want   []string
	}{
		{"async then sync", []Mode{ModeAsync, ModeSync},
			[]string{"async->sync backlog", "sync->async manual", "async->sync manual"}},
		{"sync re-asserted", []Mode{ModeSync},
			[]string{"async->sync backlog"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				changes := &modeChanges{}
				d := newD(t, func(_ context.Context, k string, _ int) error {
					if k != "later" {
						<-release
					}
					return nil
				}, Config[string, int]{
					Workers:  1,
					Observer: changes,
					Rollout: RolloutPolicy{Fallback: &FallbackPolicy{
						MaxBacklog:  1,
						Window:      10 * time.Second,
						ReturnAfter: time.Minute,
					}},
				})
				for i := range 3 {
					require.NoError(t, d.Post(fmt.Sprint(i), 0, SubmitOptions{}))
				}
				time.Sleep(2 * time.Second)
				require.Equal(t, ModeSync, d.Mode(), "the automatic fallback")
				close(release)
				for _, m := range tc.manual {
					time.Sleep(5 * time.Second)
					require.NoError(t, d.SetMode(t.Context(), m))
				}
				for range 2 * 60 { // Sync traffic wakes the fallback's checks
					require.NoError(t, d.Post("later", 0, SubmitOptions{}))
					time.Sleep(time.Second)
				}
				assert.Equal(t, ModeSync, d.Mode())
				closeD(t, d)
				assert.Equal(t, tc.want, changes.all())
			})
		})
	}
}

// TestFallbackStopsAtClose pins Close's promise that what is queued runs
// until nothing is left or ctx ends, and only then ends Closed: a
// threshold crossed while Close drains (here the failure ratio, by calls
// that fail during the drain) does not switch the mode, so, with
// Rollout.CancelQueued, does not cancel the rest with ErrFallback — a
// caller could not take the synchronous path of a closed dispatcher.
func TestFallbackStopsAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		changes := &modeChanges{}
		d := newD(t, func(_ context.Context, k string, _ int) error {
			switch {
			case k == "hold":
				<-release
			case strings.HasPrefix(k, "fail"):
				return errors.New("400")
			default:
				time.Sleep(time.Second)
			}
			return nil
		}, Config[string, int]{
			Workers:  1,
			Retry:    RetryPolicy{MaxAttempts: 1},
			Observer: changes,
			Rollout: RolloutPolicy{CancelQueued: true, Fallback: &FallbackPolicy{
				Window:          time.Second,
				MaxFailureRatio: 0.5,
				MinSamples:      3,
			}},
		})
		submit(t, d, "hold", 0, prio(2))
		var tks []*Ticket[string, int]
		for i := range 3 {
			submit(t, d, fmt.Sprint("fail", i), 0, prio(1))
		}
		for i := range 5 {
			tks = append(tks, submit(t, d, fmt.Sprint("ok", i), 0, prio(0)))
		}
		synctest.Wait()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(bg) }()
		synctest.Wait()
		close(release)
		require.NoError(t, <-closed)
		for _, tk := range tks {
			res, err := tk.Wait(bg)
			assert.NoError(t, err)
			assert.Equal(t, StateSucceeded, res.State, "a queued call runs while Close drains")
		}
		assert.Equal(t, ModeAsync, d.Mode())
		assert.Empty(t, changes.all(), "no mode switch after Close began")
	})
}

// TestFallbackReturnAfterShorterThanCheck pins FallbackPolicy.ReturnAfter:
// the return comes "this long after a fallback", even when that is
// shorter than the tenth of the Window the thresholds are checked at.
func TestFallbackReturnAfterShorterThanCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		var at []time.Duration
		start := time.Now()
		d := newD(t, func(ctx context.Context, k string, _ int) error { <-release; return nil }, Config[string, int]{
			Workers: 1,
			Observer: &modeLog{f: func(from, to Mode, reason string) {
				mu.Lock()
				defer mu.Unlock()
				at = append(at, time.Since(start))
			}},
			Rollout: RolloutPolicy{Fallback: &FallbackPolicy{
				MaxBacklog:  1,
				Window:      time.Minute, // checked every 6s
				ReturnAfter: time.Second,
			}},
		})
		for i := range 3 {
			require.NoError(t, d.Post(fmt.Sprint(i), 0, SubmitOptions{}))
		}
		time.Sleep(6*time.Second + time.Millisecond)
		require.Equal(t, ModeSync, d.Mode(), "the automatic fallback")
		time.Sleep(time.Second)
		assert.Equal(t, ModeAsync, d.Mode(), "back to Async ReturnAfter after the fallback")
		mu.Lock()
		assert.Equal(t, []time.Duration{6 * time.Second, 7 * time.Second}, at)
		mu.Unlock()
		close(release)
		closeD(t, d)
	})
}

// TestFallbackJudgesAsyncAfresh pins SetMode's promise that the mode a
// person sets stays until SetMode is called again or, in ModeAsync, a
// threshold is crossed: after an automatic fallback on the failure ratio,
// a person's return to ModeAsync (or the cool-down's) is not undone by the
// failures that caused the fallback — the thresholds judge what happens
// in ModeAsync from then on, and a new crossing does switch again.
func TestFallbackJudgesAsyncAfresh(t *testing.T) {
	for _, manual := range []bool{true, false} {
		t.Run(fmt.Sprint("manual=", manual), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				changes := &modeChanges{}
				p := FallbackPolicy{Window: 10 * time.Second, MaxFailureRatio: 0.5, MinSamples: 4}
				if !manual {
					p.ReturnAfter = 2 * time.Second
				}
				d := newD(t, func(_ context.Context, k string, _ int) error {
					if strings.HasPrefix(k, "fail") {
						return errors.New("400")
					}
					return nil
				}, Config[string, int]{
					Workers:  1,
					Retry:    RetryPolicy{MaxAttempts: 1},
					Observer: changes,
					Rollout:  RolloutPolicy{Fallback: &p},
				})
				fail := func(n int) {
					for i := range n {
						tk := submit(t, d, fmt.Sprint("fail", i), 0, SubmitOptions{})
						<-tk.Done()
					}
				}
				fail(4)
				time.Sleep(time.Second + time.Millisecond) // a check
				require.Equal(t, ModeSync, d.Mode(), "the automatic fallback")
				if manual {
					require.NoError(t, d.SetMode(t.Context(), ModeAsync))
				} else {
					time.Sleep(2 * time.Second)
				}
				time.Sleep(2 * time.Second) // two checks, and a new call's
				<-submit(t, d, "ok", 0, SubmitOptions{}).Done()
				time.Sleep(2 * time.Second)
				assert.Equal(t, ModeAsync, d.Mode(), "the failures before the return do not undo it")
				fail(4)                                    // a new crossing in ModeAsync
				time.Sleep(time.Second + time.Millisecond) // a check, before any cool-down
				assert.Equal(t, ModeSync, d.Mode())
				back := "sync->async manual"
				if !manual {
					back = "sync->async cool_down"
				}
				assert.Equal(t, []string{"async->sync failure_ratio", back, "async->sync failure_ratio"}, changes.all())
				closeD(t, d)
			})
		})
	}
}

// TestFallbackVetoedKeepsItsPace: an observer may call SetMode (the
// package documentation), and one that undoes every fallback at once, as
// a person in charge of the gate might, gets the thresholds checked every
// tenth of the Window, as FallbackPolicy says — not again at once, which
// switched the mode back and forth as fast as the clock and the notifier
// could take the lock, telling the observer each time.
func TestFallbackVetoedKeepsItsPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var d *Dispatcher[string, int]
		var mu sync.Mutex
		var changes []string
		start := time.Now()
		d = newD(t, func(ctx context.Context, k string, _ int) error { <-release; return nil }, Config[string, int]{
			Workers: 1,
			Observer: &modeLog{f: func(from, to Mode, reason string) {
				mu.Lock()
				changes = append(changes, fmt.Sprintf("%v %v %s", time.Since(start), to, reason))
				n := len(changes)
				mu.Unlock()
				if to == ModeSync && n < 100 {
					assert.NoError(t, d.SetMode(bg, ModeAsync))
				}
			}},
			Rollout: RolloutPolicy{Fallback: &FallbackPolicy{MaxBacklog: 1, Window: 10 * time.Second}},
		})
		for i := range 3 {
			require.NoError(t, d.Post(fmt.Sprint(i), 0, SubmitOptions{}))
		}
		time.Sleep(2*time.Second + time.Millisecond)
		mu.Lock()
		assert.Equal(t, []string{"1s sync backlog", "1s async manual", "2s sync backlog", "2s async manual"}, changes)
		mu.Unlock()
		close(release)
		closeD(t, d)
	})
}
