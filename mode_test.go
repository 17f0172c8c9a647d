package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bothModes runs a behavioural test against a dispatcher in Async and in
// Sync mode: the feature gate's two positions share one suite.
func bothModes(t *testing.T, f func(t *testing.T, mode Mode)) {
	for _, m := range []Mode{Async, Sync} {
		t.Run("mode="+m.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { f(t, m) })
		})
	}
}

func TestModesShareBehaviour(t *testing.T) {
	cases := []struct {
		name  string
		errs  []error
		panic bool
		noop  bool
		want  State
		calls int
		why   GiveUp
	}{
		{name: "success", want: Succeeded, calls: 1},
		{name: "retry then success", errs: []error{syscall.ECONNRESET}, want: Succeeded, calls: 2},
		{name: "permanent", errs: []error{errors.New("403")}, want: Failed, calls: 1, why: "permanent"},
		{name: "attempts exhausted", errs: []error{syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET}, want: Failed, calls: 3, why: "attempts"},
		{name: "recompute", errs: []error{errConflict}, want: Succeeded, calls: 2},
		{name: "panic", panic: true, want: Failed, calls: 1},
		{name: "no-op", noop: true, want: Skipped, calls: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bothModes(t, func(t *testing.T, mode Mode) {
				var calls atomic.Int32
				var hooks atomic.Int32
				var at []time.Duration
				t0 := time.Now()
				exec := func(ctx context.Context, k string, v int) error {
					n := int(calls.Add(1))
					at = append(at, time.Since(t0))
					if tc.panic {
						panic("boom")
					}
					if n <= len(tc.errs) {
						return tc.errs[n-1]
					}
					return nil
				}
				d, err := New(exec, Config[string, int]{Mode: mode, Workers: 1, Classify: conflictClassifier, Retry: RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Jitter: NoJitter, BudgetRatio: math.Inf(1)}, BeforeRetry: func(_ context.Context, _ string, v int, _ error) (int, bool, error) { return v + 1, false, nil }, NoOp: func(string, int) bool { return tc.noop }, OnDone: func(Result[string, int]) { hooks.Add(1) }})
				require.NoError(t, err)
				tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
				require.NoError(t, err)
				if mode == Sync {
					select {
					case <-tk.Done():
					default:
						t.Fatal("Sync: Submit returned before the call ended")
					}
				}
				res, err := tk.Wait(t.Context())
				assert.Equal(t, tc.want, res.State)
				assert.Equal(t, tc.calls, int(calls.Load()))
				assert.Equal(t, tc.calls, res.Attempts)
				if tc.why != "" {
					var re *RetryError
					require.ErrorAs(t, err, &re)
					assert.Equal(t, tc.why, re.Reason)
				}
				if tc.panic {
					var pe *PanicError
					assert.ErrorAs(t, err, &pe)
				}
				if len(at) == 2 && tc.errs[0] == syscall.ECONNRESET {
					assert.Equal(t, time.Second, at[1]-at[0], "backoff is the same in both modes")
				}
				require.NoError(t, d.Close(t.Context()))
				assert.Equal(t, int32(1), hooks.Load(), "the hook fires once per call")
				st := d.Stats()
				assert.Equal(t, mode, st.Mode)
				checkConservation(t, d)
			})
		})
	}
}

func TestModesShareAdmission(t *testing.T) {
	bothModes(t, func(t *testing.T, mode Mode) {
		d, err := New(func(context.Context, string, int) error { return nil }, Config[string, int]{Mode: mode, Workers: 1, Capacity: 1})
		require.NoError(t, err)
		_, err = d.Submit(t.Context(), "k", 1, SubmitOptions{Generation: 5})
		require.NoError(t, err)
		// Generations are remembered only while the key is tracked; hold it
		// with a blocked Post in Async, nothing to hold in Sync.
		_, err = d.Submit(t.Context(), "k", 1, SubmitOptions{Deadline: time.Now().Add(-time.Second)})
		assert.ErrorIs(t, err, ErrExpired)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = d.Submit(ctx, "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrCanceled)
		require.NoError(t, d.Close(t.Context()))
		_, err = d.Submit(t.Context(), "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, d.Post("k", 1, SubmitOptions{}), ErrClosed)
		checkConservation(t, d)
	})
}

func TestSyncRunsInCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type gid struct{}
		d, err := New(func(ctx context.Context, _ string, _ int) error {
			if ctx.Value(gid{}) != nil {
				return errors.New("unexpected")
			}
			return nil
		}, Config[string, int]{Mode: Sync})
		require.NoError(t, err)
		var calls int
		d2, err := New(func(context.Context, string, int) error { calls++; return nil }, Config[string, int]{Mode: Sync})
		require.NoError(t, err)
		for i := range 5 {
			require.NoError(t, d2.Post(fmt.Sprint(i), i, SubmitOptions{}))
			assert.Equal(t, i+1, calls, "Post in Sync returns after the call ran")
		}
		assert.ErrorIs(t, d2.Post("x", 0, SubmitOptions{Deadline: time.Now().Add(-1)}), ErrExpired)
		require.NoError(t, d.Close(t.Context()))
		require.NoError(t, d2.Close(t.Context()))
	})
}

// TestPostReturnsRefusalsOnly: Post returns why a submission was refused,
// in both modes, and never the call's outcome: in Sync a failing execution
// still returns nil from Post, and the failure reaches the completion hook
// and Stats as it would in Async. So an errors.Is(err, ErrBackpressure)
// branch behind Post never starts receiving API errors when a fallback
// switches modes.
func TestPostReturnsRefusalsOnly(t *testing.T) {
	bothModes(t, func(t *testing.T, mode Mode) {
		errAPI := errors.New("403 forbidden")
		hooks := &hookLog[string, int]{}
		d, err := New(func(context.Context, string, int) error { return errAPI }, Config[string, int]{
			Mode: mode, Workers: 1, OnDone: hooks.add,
		})
		require.NoError(t, err)
		require.NoError(t, d.Post("k", 1, SubmitOptions{}), "an execution's failure is not a refusal")
		assert.ErrorIs(t, d.Post("x", 0, SubmitOptions{Deadline: time.Now().Add(-time.Second)}), ErrExpired, "a refusal is")
		require.NoError(t, d.Close(t.Context()))
		assert.ErrorIs(t, d.Post("k", 1, SubmitOptions{}), ErrClosed)
		s := checkConservation(t, d)
		assert.Equal(t, uint64(1), s.Outcomes[Failed])
		require.Len(t, hooks.all(), 1)
		assert.ErrorIs(t, hooks.all()[0].Err, errAPI)
	})
}

func TestSetModeDrainAndCancel(t *testing.T) {
	for _, policy := range []SwitchPolicy{DrainQueued, CancelQueued} {
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var mu sync.Mutex
				ran := map[string]int{}
				d, err := New(func(ctx context.Context, k string, _ int) error {
					mu.Lock()
					ran[k]++
					n := ran[k]
					mu.Unlock()
					if strings.HasPrefix(k, "inflight") {
						<-release
					}
					if k == "backoff" && n == 1 {
						return syscall.ECONNRESET
					}
					return nil
				}, Config[string, int]{Workers: 2, SwitchPolicy: policy, Retry: RetryPolicy{InitialBackoff: time.Second, Jitter: NoJitter}})
				require.NoError(t, err)
				inflight, err := d.Submit(t.Context(), "inflight", 0, SubmitOptions{})
				require.NoError(t, err)
				backoff, err := d.Submit(t.Context(), "backoff", 0, SubmitOptions{})
				require.NoError(t, err)
				synctest.Wait()
				// Second worker: hold it too, so "queued" stays queued.
				hold, err := d.Submit(t.Context(), "inflight2", 0, SubmitOptions{})
				require.NoError(t, err)
				_ = hold
				queued, err := d.Submit(t.Context(), "queued", 0, SubmitOptions{Priority: -1})
				require.NoError(t, err)
				synctest.Wait()
				st := d.Stats()
				require.Equal(t, 1, st.Delayed, "backoff waits")

				done := make(chan error, 1)
				go func() { done <- d.SetMode(t.Context(), Sync) }()
				synctest.Wait()
				assert.Equal(t, Sync, d.Mode())
				// New submissions now run inline, while the switch drains.
				var inlineRan bool
				go func() {
					_, err := d.Submit(t.Context(), "new", 0, SubmitOptions{})
					assert.NoError(t, err)
					inlineRan = true
				}()
				synctest.Wait()
				assert.True(t, inlineRan, "a submission after the switch runs inline at once")

				if policy == CancelQueued {
					require.NoError(t, <-done)
					for _, tk := range []*Ticket[string, int]{queued, backoff} {
						res, err := tk.Wait(t.Context())
						assert.Equal(t, Canceled, res.State)
						assert.ErrorIs(t, err, ErrFallback)
					}
					close(release)
					res, err := inflight.Wait(t.Context())
					require.NoError(t, err, "in-flight calls run to their end")
					assert.Equal(t, Succeeded, res.State)
				} else {
					select {
					case <-done:
						t.Fatal("SetMode returned before the queue drained")
					default:
					}
					close(release)
					require.NoError(t, <-done)
					for _, tk := range []*Ticket[string, int]{inflight, queued, backoff} {
						res, err := tk.Wait(t.Context())
						require.NoError(t, err)
						assert.Equal(t, Succeeded, res.State)
					}
					mu.Lock()
					assert.Equal(t, 2, ran["backoff"], "the call in backoff was drained, retry included")
					mu.Unlock()
				}
				// Back to Async: submissions queue again.
				require.NoError(t, d.SetMode(t.Context(), Async))
				tk, err := d.Submit(t.Context(), "after", 0, SubmitOptions{})
				require.NoError(t, err)
				_, err = tk.Wait(t.Context())
				require.NoError(t, err)
				require.NoError(t, d.Close(t.Context()))
				checkConservation(t, d)
			})
		})
	}
}

func TestSetModeDrainTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		d, err := New(func(ctx context.Context, k string, _ int) error {
			if k == "hold" {
				<-release
			}
			return nil
		}, Config[string, int]{Workers: 1})
		require.NoError(t, err)
		_, err = d.Submit(t.Context(), "hold", 0, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait()
		queued, err := d.Submit(t.Context(), "queued", 0, SubmitOptions{})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		assert.ErrorIs(t, d.SetMode(ctx, Sync), context.DeadlineExceeded)
		res, err := queued.Wait(t.Context())
		assert.Equal(t, Canceled, res.State)
		assert.ErrorIs(t, err, ErrFallback)
		close(release)
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

// TestModeSwitchRace: submitters race a goroutine flipping the mode. Every
// waiter hears exactly once, and no call runs twice.
func TestModeSwitchRace(t *testing.T) {
	var mu sync.Mutex
	ran := map[string]int{}
	d, err := New(func(ctx context.Context, k string, _ int) error {
		mu.Lock()
		ran[k]++
		mu.Unlock()
		return nil
	}, Config[string, int]{Workers: 4, Capacity: 100000, MaxWaiters: 100000})
	require.NoError(t, err)
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		for m := Sync; ; m = 1 - m {
			select {
			case <-stop:
				return
			default:
			}
			_ = d.SetMode(context.Background(), m)
		}
	})
	var wg sync.WaitGroup
	tickets := make([][]*Ticket[string, int], 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				k := fmt.Sprint(g, "/", i)
				if i%3 == 0 {
					if err := d.Post(k, i, SubmitOptions{}); err != nil {
						// In Sync a Post reports the call's own error; with
						// DrainQueued nothing is cancelled.
						t.Errorf("Post: %v", err)
					}
					continue
				}
				tk, err := d.Submit(context.Background(), k, i, SubmitOptions{})
				if !assert.NoError(t, err) {
					return
				}
				tickets[g] = append(tickets[g], tk)
			}
		})
	}
	wg.Wait()
	close(stop)
	flips.Wait()
	require.NoError(t, d.SetMode(context.Background(), Async))
	var all []*Ticket[string, int]
	for _, tks := range tickets {
		all = append(all, tks...)
	}
	waitAll(all...)
	assert.Equal(t, map[State]int{Succeeded: len(all)}, tally(t, all...))
	require.NoError(t, d.Close(context.Background()))
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, ran, 8*300)
	for k, n := range ran {
		if n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
	checkConservation(t, d)
}

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
		want string       // Stats.FallbackReason
		code SwitchReason // the observer's reason
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
			want: "failure ratio 0.600 > 0.500", code: "failure-ratio",
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
			want: "queue wait p99 > 1s (2 of 103 waits)", code: "queue-wait",
		},
		{
			name:   "breaker open",
			policy: FallbackPolicy{MaxBreakerOpen: 30 * time.Second},
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
			want:   "breaker open for 31s > 30s",
			code:   "breaker-open",
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
					obs := &modeLog{f: func(from, to Mode, reason SwitchReason) {
						mu.Lock()
						modes = append(modes, fmt.Sprint(from, ">", to, ": ", reason))
						mu.Unlock()
					}}
					p := tc.policy
					p.Window = cmp.Or(tc.window, time.Minute)
					d, err := New(func(ctx context.Context, k string, v int) error {
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
						Workers: 1, Capacity: 1000, Fallback: &p, Observer: obs,
						Retry: RetryPolicy{MaxAttempts: 1}, Breaker: tc.brk,
					})
					require.NoError(t, err)
					tc.load(t, env{d, release}, below)
					time.Sleep(cmp.Or(tc.settle, p.Window/5)) // two checks
					st := d.Stats()
					if below {
						assert.Equal(t, Async, st.Mode, "at the threshold, not past it")
						assert.Empty(t, st.FallbackReason)
					} else {
						assert.Equal(t, Sync, st.Mode)
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
					require.NoError(t, d.Close(context.Background()))
				})
			})
		}
	}
}

func TestFallbackReturnsAfterCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		d, err := New(func(ctx context.Context, k string, _ int) error { <-release; return nil },
			Config[string, int]{Workers: 1, Fallback: &FallbackPolicy{MaxBacklog: 1, Window: 10 * time.Second, ReturnAfter: time.Minute}})
		require.NoError(t, err)
		for i := range 3 {
			require.NoError(t, d.Post(fmt.Sprint(i), 0, SubmitOptions{}))
		}
		time.Sleep(2 * time.Second)
		assert.Equal(t, Sync, d.Mode())
		close(release)
		time.Sleep(time.Minute)
		assert.Equal(t, Async, d.Mode(), "back to Async after the cool-down")
		require.NoError(t, d.Close(context.Background()))
	})
}

type modeLog struct {
	NopObserver
	f func(from, to Mode, reason SwitchReason)
}

func (m *modeLog) OnModeChange(from, to Mode, reason SwitchReason) { m.f(from, to, reason) }

// TestSetModeValidation: SetMode refuses an unknown mode, and any switch
// after Close. (Config's Mode, SwitchPolicy and Fallback are checked by
// TestNewValidation.)
func TestSetModeValidation(t *testing.T) {
	exec := func(context.Context, string, int) error { return nil }
	d, err := New(exec, Config[string, int]{})
	require.NoError(t, err)
	assert.Error(t, d.SetMode(context.Background(), 5))
	require.NoError(t, d.Close(context.Background()))
	assert.ErrorIs(t, d.SetMode(context.Background(), Sync), ErrClosed)
}
