package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hintErr is a retryable error carrying a server's Retry-After.
type hintErr time.Duration

func (h hintErr) Error() string             { return "429 too many requests" }
func (h hintErr) RetryAfter() time.Duration { return time.Duration(h) }

// script is an exec whose n-th call (from 1) returns errs[n-1], nil after
// the list. It records when each attempt started (from when the script was
// made), what it ran and the idempotency key it saw.
type script struct {
	errs  []error
	calls atomic.Int32
	at    []time.Duration
	vals  []int
	idem  []string
	t0    time.Time
}

// newScript makes a script; call it inside the test's bubble.
func newScript(errs ...error) *script { return &script{errs: errs, t0: time.Now()} }

func (s *script) exec(ctx context.Context, _ string, v int) error {
	n := int(s.calls.Add(1))
	s.at = append(s.at, time.Since(s.t0))
	s.vals = append(s.vals, v)
	s.idem = append(s.idem, IdempotencyKey(ctx))
	if n <= len(s.errs) {
		return s.errs[n-1]
	}
	return nil
}

// heldExec is s.exec, except that the first execution waits for release:
// a test can queue more for the key while it is in flight.
func (s *script) heldExec(release <-chan struct{}) ExecFunc[string, int] {
	return func(ctx context.Context, k string, v int) error {
		if s.calls.Load() == 0 {
			<-release
		}
		return s.exec(ctx, k, v)
	}
}

// retryOnce returns a dispatcher with one worker whose first execution
// waits for release and then fails with a retryable error, so that its
// retry absorbs what was queued for the key meanwhile, and its script.
func retryOnce(t *testing.T) (*Dispatcher[string, int], *script, chan struct{}) {
	release := make(chan struct{})
	s := newScript(syscall.ECONNRESET)
	return newD(t, s.heldExec(release), Config[string, int]{Workers: 1, Retry: noJitter(3)}), s, release
}

// runOnce runs one call (key "k", value 1, submitted with o) to its end on
// a fresh dispatcher with one worker, closes the dispatcher, and returns the
// call's result and the final Stats.
func runOnce(t *testing.T, exec ExecFunc[string, int], cfg Config[string, int], o SubmitOptions) (Result[string, int], Stats) {
	t.Helper()
	cfg.Workers = 1
	d := newD(t, exec, cfg)
	r, _ := submit(t, d, "k", 1, o).Wait(bg)
	return r, closeD(t, d)
}

// TestRetryClasses: the classifier's judgement decides what a failure
// does — Retry runs the call again until it succeeds or runs out of
// attempts, Permanent ends it Failed at once, Recompute re-runs it as the
// before-retry hook rebuilt it (and fails without the hook) — and a failed
// call's *RetryError says why it gave up after how many attempts, and
// unwraps to the last error.
func TestRetryClasses(t *testing.T) {
	tests := []struct {
		name      string
		errs      []error
		before    bool
		wantState State
		wantCalls int
		wantWhy   string
	}{
		{"retry then success", []error{syscall.ECONNRESET, syscall.ECONNREFUSED}, false, StateSucceeded, 3, ""},
		{"permanent", []error{errors.New("403 forbidden")}, false, StateFailed, 1, giveUpPermanent},
		{"recompute without hook", []error{errConflict}, false, StateFailed, 1, giveUpRecompute},
		{"recompute with hook", []error{errConflict}, true, StateSucceeded, 2, ""},
		{"attempts exhausted", []error{syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET}, false, StateFailed, 3, giveUpAttempts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newScript(tc.errs...)
				cfg := Config[string, int]{Retry: noJitter(3), Classify: conflictClassifier}
				if tc.before {
					cfg.BeforeRetry = func(_ context.Context, _ string, v int, last error) (int, bool, error) {
						require.ErrorIs(t, last, errConflict)
						return v + 100, false, nil
					}
				}
				res, _ := runOnce(t, s.exec, cfg, SubmitOptions{})
				assert.Equal(t, tc.wantState, res.State)
				assert.Equal(t, tc.wantCalls, int(s.calls.Load()))
				assert.Equal(t, tc.wantCalls, res.Attempts, "Attempts counts API attempts")
				if tc.wantWhy != "" {
					var re *RetryError
					require.ErrorAs(t, res.Err, &re)
					assert.Equal(t, tc.wantWhy, re.Reason)
					assert.Equal(t, tc.wantCalls, re.Attempts)
					assert.ErrorIs(t, res.Err, tc.errs[len(tc.errs)-1], "unwraps to the last error")
				}
				if tc.before {
					assert.Equal(t, []int{1, 101}, s.vals, "the rebuilt call is executed")
					assert.Equal(t, 101, res.Call)
				}
			})
		})
	}
}

// TestRetryBackoffSequence: without jitter, retries wait InitialBackoff,
// then Multiplier times longer each time, capped at MaxBackoff.
func TestRetryBackoffSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET)
		res, st := runOnce(t, s.exec, Config[string, int]{
			Retry: RetryPolicy{
				MaxAttempts:    4,
				InitialBackoff: 100 * time.Millisecond,
				MaxBackoff:     300 * time.Millisecond,
				Multiplier:     2,
				Jitter:         JitterNone,
				BudgetRatio:    math.Inf(1),
			},
		}, SubmitOptions{})
		require.NoError(t, res.Err)
		assert.Equal(t, 4, res.Attempts)
		// 100ms, 200ms, then capped at 300ms.
		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond}, s.at)
		assert.Equal(t, uint64(3), st.Retries)
	})
}

// TestRetryJitterBounds (internal): each Jitter keeps the delay within its
// range — full jitter [0, backoff], equal jitter [backoff/2, backoff], none
// exactly the backoff — and the random ones spread over it.
func TestRetryJitterBounds(t *testing.T) {
	for _, j := range []Jitter{JitterFull, JitterEqual, JitterNone} {
		p := RetryPolicy{InitialBackoff: time.Second, MaxBackoff: 8 * time.Second, Jitter: j}
		err := p.validate()
		require.NoError(t, err)
		for n := 1; n <= 6; n++ {
			base := min(time.Second<<(n-1), 8*time.Second)
			lo := map[Jitter]time.Duration{JitterFull: 0, JitterEqual: base / 2, JitterNone: base}[j]
			var seenLow, seenHigh bool
			for range 2000 {
				got := p.backoff(n)
				require.GreaterOrEqual(t, got, lo, "jitter %d attempt %d", j, n)
				require.LessOrEqual(t, got, base, "jitter %d attempt %d", j, n)
				seenLow = seenLow || got < lo+(base-lo)/4
				seenHigh = seenHigh || got > base-(base-lo)/4
			}
			if j != JitterNone {
				assert.True(t, seenLow && seenHigh, "jitter %d spreads over its range", j)
			}
		}
	}
}

// TestRetryAfterHintHonoured: a server's Retry-After hint (an error with a
// RetryAfter method, wrapped or not) sets the delay before the retry.
func TestRetryAfterHintHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(fmt.Errorf("patch: %w", hintErr(7*time.Second)))
		res, _ := runOnce(t, s.exec, Config[string, int]{Retry: noJitter(3)}, SubmitOptions{})
		require.NoError(t, res.Err)
		assert.Equal(t, []time.Duration{0, 7 * time.Second}, s.at)
	})
}

// TestRetryStoppedByDeadline: no retry starts that could not end before the
// call's deadline; the call ends Failed with giveUpDeadline, matching
// ErrExpired.
func TestRetryStoppedByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET, syscall.ECONNRESET)
		res, _ := runOnce(t, s.exec, Config[string, int]{
			Retry: RetryPolicy{
				MaxAttempts:    10,
				InitialBackoff: time.Second,
				Jitter:         JitterNone,
				BudgetRatio:    math.Inf(1),
			},
		}, SubmitOptions{Deadline: time.Now().Add(1500 * time.Millisecond)})
		assert.Equal(t, StateFailed, res.State)
		assert.ErrorIs(t, res.Err, ErrExpired, "a deadline that stops retries matches ErrExpired")
		var re *RetryError
		require.ErrorAs(t, res.Err, &re)
		assert.Equal(t, giveUpDeadline, re.Reason)
		assert.Equal(t, 2, re.Attempts, "attempt at 0s and 1s; the next (at 3s) would end past the deadline")
	})
}

// TestRetryHoldsNoWorker: a call waiting out its backoff waits in the
// delay index, not in a worker, so the only worker runs other calls
// meanwhile.
func TestRetryHoldsNoWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []string
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, k)
			if k == "slow" && len(order) == 1 {
				return syscall.ECONNRESET
			}
			return nil
		}, Config[string, int]{
			Workers: 1,
			Retry:   RetryPolicy{InitialBackoff: time.Hour, MaxBackoff: time.Hour, Jitter: JitterNone},
		})
		a := submit(t, d, "slow", 1, SubmitOptions{})
		synctest.Wait()
		st := d.Stats()
		assert.Equal(t, 1, st.Delayed)
		assert.Equal(t, 0, st.InFlight, "a retry waits in the delay index, not in a worker")
		<-submit(t, d, "other", 1, SubmitOptions{}).Done()
		mu.Lock()
		assert.Equal(t, []string{"slow", "other"}, order)
		mu.Unlock()
		res, err := a.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, 2, res.Attempts)
		closeD(t, d)
	})
}

// TestRetryMergesSubmissionsDuringBackoff: submissions for a key whose call
// waits out a backoff merge into it; the retry runs the merged call at its
// original time, and every waiter shares its one result.
func TestRetryMergesSubmissionsDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET)
		d := newD(t, s.exec, Config[string, int]{
			Workers: 1,
			Retry:   noJitter(3),
			Merge:   func(p, in int) (int, error) { return p + in, nil },
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait() // first attempt failed; the call waits out 100ms
		require.True(t, d.Busy("k"))
		require.NoError(t, d.Post("k", 10, SubmitOptions{}))
		second := submit(t, d, "k", 100, SubmitOptions{})
		r1, err := first.Wait(bg)
		require.NoError(t, err)
		r2, err := second.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, []int{1, 111}, s.vals, "the retry runs the merged call")
		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond}, s.at, "and keeps its backoff")
		assert.Equal(t, r1, r2)
		assert.Equal(t, 3, r1.Waiters)
		closeD(t, d)
	})
}

// TestRetrySuccessorAbsorbed: a successor queued while its key's call was
// in flight is absorbed into that call's retry (the newer value runs), so
// one retry serves both and there is no third execution.
func TestRetrySuccessorAbsorbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, s, release := retryOnce(t)
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()                                            // in flight
		second := submit(t, d, "k", 2, SubmitOptions{Priority: 5}) // the successor
		close(release)
		r1, _ := first.Wait(bg)
		r2, _ := second.Wait(bg)
		assert.Equal(t, StateSucceeded, r1.State)
		assert.Equal(t, StateSucceeded, r2.State)
		assert.Equal(t, []int{1, 2}, s.vals, "the retry took the successor's (newer) value")
		assert.Equal(t, 2, int(s.calls.Load()), "one retry served both, no third execution")
		closeD(t, d)
	})
}

// TestRetryRefusedMergeKeepsOrder: a successor the merge function refuses
// to fold into the retry waits behind it, so the retry runs first and the
// successor after: order kept.
func TestRetryRefusedMergeKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := newScript(syscall.ECONNRESET)
		d := newD(t, s.heldExec(release), Config[string, int]{
			Workers: 2,
			Retry:   noJitter(3),
			Merge: func(p, in int) (int, error) {
				if p != in {
					return 0, errors.New("different operations")
				}
				return p, nil
			},
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()
		second := submit(t, d, "k", 2, SubmitOptions{})
		close(release)
		synctest.Wait()
		assert.Equal(t, 1, d.Stats().Delayed, "the retry waits; the successor waits behind it")
		r1, _ := first.Wait(bg)
		r2, _ := second.Wait(bg)
		assert.Equal(t, StateSucceeded, r1.State)
		assert.Equal(t, StateSucceeded, r2.State)
		assert.Equal(t, []int{1, 1, 2}, s.vals, "retry first, then the successor: order kept")
		closeD(t, d)
	})
}

// TestBeforeRetryDoneSkipsExecution: when the before-retry hook finds the
// earlier attempt took effect after all, the call ends Succeeded without
// another execution — an external resource is never created twice — and
// Stats.AlreadyDone counts it. The hook sees the idempotency key.
func TestBeforeRetryDoneSkipsExecution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET)
		hookCalls := 0
		res, st := runOnce(t, s.exec, Config[string, int]{
			Retry: noJitter(3),
			BeforeRetry: func(ctx context.Context, k string, v int, last error) (int, bool, error) {
				hookCalls++
				assert.Equal(t, "create-42", IdempotencyKey(ctx))
				return v, true, nil
			},
		}, SubmitOptions{IdempotencyKey: "create-42"})
		require.NoError(t, res.Err)
		assert.Equal(t, StateSucceeded, res.State)
		assert.Equal(t, 1, int(s.calls.Load()), "never created twice")
		assert.Equal(t, 1, hookCalls)
		assert.Equal(t, []string{"create-42"}, s.idem)
		assert.Equal(t, uint64(1), st.AlreadyDone)
	})
}

// TestBeforeRetryError: a before-retry hook that fails ends the call Failed
// with giveUpBeforeRetry, wrapping the hook's error.
func TestBeforeRetryError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET)
		boom := errors.New("cannot read fresh state")
		res, _ := runOnce(t, s.exec, Config[string, int]{
			Retry:       noJitter(3),
			BeforeRetry: func(context.Context, string, int, error) (int, bool, error) { return 0, false, boom },
		}, SubmitOptions{})
		assert.Equal(t, StateFailed, res.State)
		assert.ErrorIs(t, res.Err, boom)
		var re *RetryError
		require.ErrorAs(t, res.Err, &re)
		assert.Equal(t, giveUpBeforeRetry, re.Reason)
	})
}

// TestIdempotencyKeyOnEveryAttempt: exec sees the submission's idempotency
// key, unchanged, on every attempt.
func TestIdempotencyKeyOnEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET, syscall.ECONNRESET)
		res, _ := runOnce(t, s.exec, Config[string, int]{Retry: noJitter(3)}, SubmitOptions{IdempotencyKey: "op-7"})
		require.NoError(t, res.Err)
		assert.Equal(t, []string{"op-7", "op-7", "op-7"}, s.idem)
	})
}

// TestAttemptTimeoutRetried: an attempt that outlives
// RetryPolicy.AttemptTimeout has its context ended and is retried like any
// retryable failure.
func TestAttemptTimeoutRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		res, _ := runOnce(t, func(ctx context.Context, _ string, _ int) error {
			if calls.Add(1) == 1 {
				<-ctx.Done() // the API hangs; the attempt times out
				return ctx.Err()
			}
			return nil
		}, Config[string, int]{
			Retry: RetryPolicy{AttemptTimeout: time.Second, Jitter: JitterNone},
		}, SubmitOptions{})
		require.NoError(t, res.Err)
		assert.Equal(t, 2, res.Attempts)
	})
}

// TestAttemptTimeoutRetriedWhateverClassify: RetryPolicy.AttemptTimeout's
// promise, "a timed-out attempt is retried like ClassRetry", holds with a
// classifier that judges every error permanent, whatever error the
// timed-out exec returns: the classifier is not asked about it.
func TestAttemptTimeoutRetriedWhateverClassify(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		for name, wrap := range map[string]func(error) error{
			"ctx.Err": func(err error) error { return err },
			"its own": func(error) error { return errors.New("api: request abandoned") },
		} {
			t.Run(fmt.Sprintf("%v/%s", mode, name), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var calls, judged atomic.Int32
					res, _ := runOnce(t, func(ctx context.Context, _ string, _ int) error {
						if calls.Add(1) == 1 {
							<-ctx.Done() // the API hangs; the attempt times out
							return wrap(ctx.Err())
						}
						return nil
					}, Config[string, int]{
						Classify: func(error) Class { judged.Add(1); return ClassPermanent },
						Retry:    RetryPolicy{AttemptTimeout: time.Second, Jitter: JitterNone},
						Rollout:  RolloutPolicy{Mode: mode},
					}, SubmitOptions{})
					assert.Equal(t, StateSucceeded, res.State, "timed-out attempt not retried: %v", res.Err)
					assert.Equal(t, 2, res.Attempts)
					assert.Equal(t, int32(0), judged.Load(), "the classifier is not asked about a timed-out attempt")
				})
			})
		}
	}
}

// TestPanicNotRetried: a panic in exec ends the call Failed with a
// *PanicError at once, however many attempts are left.
func TestPanicNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		res, _ := runOnce(t, func(context.Context, string, int) error {
			calls.Add(1)
			panic("boom")
		}, Config[string, int]{Retry: noJitter(5)}, SubmitOptions{})
		assert.Equal(t, StateFailed, res.State)
		var pe *PanicError
		require.ErrorAs(t, res.Err, &pe)
		assert.Equal(t, "boom", pe.Value)
		assert.Equal(t, int32(1), calls.Load())
	})
}

// TestRetryBudget: retries are capped at BudgetRatio of the first attempts
// in the window (but BudgetMin at least), so an outage cannot become a
// retry storm; calls denied a retry give up with giveUpBudget.
func TestRetryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(context.Context, string, int) error { return syscall.ECONNRESET }, Config[string, int]{
			Workers: 4,
			Retry: RetryPolicy{
				MaxAttempts:    2,
				InitialBackoff: time.Millisecond,
				Jitter:         JitterNone,
				BudgetRatio:    0.1,
				BudgetMin:      2,
				BudgetWindow:   time.Minute,
			},
		})
		var tickets []*Ticket[string, int]
		for i := range 40 {
			tickets = append(tickets, submit(t, d, fmt.Sprint(i), i, SubmitOptions{}))
		}
		reasons := map[string]int{}
		for _, tk := range tickets {
			_, err := tk.Wait(bg)
			var re *RetryError
			require.ErrorAs(t, err, &re)
			reasons[re.Reason]++
		}
		st := closeD(t, d)
		// 40 first attempts allow max(2, 0.1×40) = 4 retries at most.
		assert.LessOrEqual(t, int(st.Retries), 4)
		assert.GreaterOrEqual(t, int(st.Retries), 2)
		assert.Equal(t, 40, reasons[giveUpBudget]+reasons[giveUpAttempts])
		assert.Equal(t, int(st.Retries), reasons[giveUpAttempts])
	})
}

// TestCancelledCallNeverRetried: a call whose context ended because its
// waiters left is not classified, retried, or counted by the breaker; its
// execution is reported Stale.
func TestCancelledCallNeverRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		d := newD(t, func(ctx context.Context, _ string, _ int) error {
			calls.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}, Config[string, int]{
			Workers: 1,
			Retry:   noJitter(5),
			Breaker: &BreakerPolicy{ConsecutiveFailures: 1},
		})
		tk := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()
		assert.True(t, d.Cancel("k", errors.New("pod deleted")))
		res, err := tk.Wait(bg)
		assert.Equal(t, StateCanceled, res.State)
		assert.ErrorIs(t, err, ErrCanceled)
		synctest.Wait()
		st := closeD(t, d)
		assert.Equal(t, int32(1), calls.Load())
		assert.Equal(t, uint64(0), st.Retries)
		assert.Equal(t, CircuitClosed, st.Circuit, "a cancellation does not trip the breaker")
		assert.Equal(t, uint64(1), st.StaleExecutions)
	})
}

// TestRetryAbsorbsUrgentTenantAndLabel: a call carries the tenant and label
// of its most urgent submission. A retry that absorbs a more urgent
// successor (a bind arriving while a patch's attempt fails) runs at the
// bind's priority but stays the patch's: label "patch", tenant "patches".
func TestRetryAbsorbsUrgentTenantAndLabel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		first := true
		d := newD(t, func(context.Context, string, int) error {
			<-gate
			if first {
				first = false
				return syscall.ECONNRESET
			}
			return nil
		}, Config[string, int]{
			Workers: 1, Retry: noJitter(3),
			Merge: func(p, in int) (int, error) { return p + in, nil },
			Label: func(_ string, v int) string {
				if v >= 10 {
					return "bind"
				}
				return "patch"
			},
			Tenants: map[string]TenantConfig{"binds": {}, "patches": {}},
		})
		a := submit(t, d, "k", 1, SubmitOptions{Tenant: "patches"})
		synctest.Wait()
		b := submit(t, d, "k", 10, SubmitOptions{Priority: 10, Tenant: "binds"}) // the successor
		gate <- struct{}{}                                                       // a fails: its retry absorbs b
		synctest.Wait()
		s := d.Stats()
		assert.Equal(t, map[string]int{"bind": 1}, s.Labels)
		assert.Equal(t, 1, s.Tenants["binds"].Queued)
		close(gate)
		waitAll(a, b)
	})
}

// extremePolicies are retry policies at the edge of the duration range:
// each used to overflow the backoff's float-to-Duration
// conversion and panic in rand.Int64N under the dispatcher's lock.
var extremePolicies = map[string]RetryPolicy{
	"InitialBackoff max/full":    {InitialBackoff: math.MaxInt64, Jitter: JitterFull},
	"InitialBackoff max/equal":   {InitialBackoff: math.MaxInt64, Jitter: JitterEqual},
	"InitialBackoff max/none":    {InitialBackoff: math.MaxInt64, Jitter: JitterNone},
	"MaxBackoff max, ×Inf/full":  {MaxBackoff: math.MaxInt64, Multiplier: math.Inf(1), Jitter: JitterFull},
	"MaxBackoff max, ×Inf/equal": {MaxBackoff: math.MaxInt64, Multiplier: math.Inf(1), Jitter: JitterEqual},
	"MaxBackoff max, ×1e300":     {MaxBackoff: math.MaxInt64, Multiplier: 1e300},
}

// TestBackoffSaturates (internal): at every attempt of every extreme
// policy, the backoff is within [0, MaxBackoff] and never panics.
func TestBackoffSaturates(t *testing.T) {
	for name, p := range extremePolicies {
		err := p.validate()
		require.NoError(t, err, name)
		for n := 1; n <= 70; n++ {
			for range 50 {
				b := p.backoff(n)
				require.GreaterOrEqual(t, b, time.Duration(0), "%s attempt %d", name, n)
				require.LessOrEqual(t, b, p.MaxBackoff, "%s attempt %d", name, n)
			}
		}
	}
}

// TestExtremeBackoffNoDeadlock: with any extreme retry
// policy, a retryable failure schedules a retry as late as can be, and
// nothing hangs: Stats answers, a call with a deadline gives up at once
// (its retry could not start in time), and one without waits until Close
// ends it.
func TestExtremeBackoffNoDeadlock(t *testing.T) {
	for name, p := range extremePolicies {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newD(t, func(context.Context, string, int) error { return syscall.ECONNRESET }, Config[string, int]{
					Workers: 2, Retry: p,
				})
				withDL := submit(t, d, "deadline", 1, SubmitOptions{Deadline: time.Now().Add(time.Hour)})
				forever := submit(t, d, "forever", 1, SubmitOptions{})
				<-withDL.Done()
				r := outcome(t, withDL)
				assert.Equal(t, StateFailed, r.State)
				assert.ErrorIs(t, r.Err, ErrExpired, "gave up: the retry could not start before the deadline")
				time.Sleep(time.Minute)
				synctest.Wait()
				s := d.Stats()
				assert.Equal(t, 1, s.Delayed, "the other call waits for its retry")
				_, ended := forever.Result()
				assert.False(t, ended)
				ctx, cancel := context.WithCancel(bg)
				cancel()
				assert.ErrorIs(t, d.Close(ctx), context.Canceled)
				<-forever.Done()
				assert.Equal(t, StateClosed, outcome(t, forever).State)
				checkConservation(t, d)
			})
		})
	}
}

// TestHugeRetryAfterAndCooldown: a Retry-After near the
// largest duration delays the retry (it used to overflow into the past and
// run at once), and a breaker Cooldown of the largest duration keeps the
// breaker open (it used to probe within a second).
func TestHugeRetryAfterAndCooldown(t *testing.T) {
	t.Run("Retry-After", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newScript(hintErr(math.MaxInt64 - 1))
			d := newD(t, s.exec, Config[string, int]{Workers: 1})
			tk := submit(t, d, "k", 1, SubmitOptions{})
			time.Sleep(time.Hour)
			synctest.Wait()
			assert.Equal(t, int32(1), s.calls.Load(), "retried at once")
			tk.Cancel()
			<-tk.Done()
			assert.Equal(t, StateCanceled, outcome(t, tk).State)
			closeD(t, d)
		})
	})
	t.Run("Cooldown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var calls atomic.Int32
			d := newD(t, func(context.Context, string, int) error {
				calls.Add(1)
				return syscall.ECONNRESET
			}, Config[string, int]{
				Workers: 1,
				Retry:   RetryPolicy{MaxAttempts: 1},
				Breaker: &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: math.MaxInt64},
			})
			first := submit(t, d, "a", 1, SubmitOptions{})
			<-first.Done()
			assert.Equal(t, StateFailed, outcome(t, first).State)
			require.Equal(t, CircuitOpen, d.Stats().Circuit)
			second := submit(t, d, "b", 1, SubmitOptions{})
			time.Sleep(time.Hour)
			synctest.Wait()
			assert.Equal(t, int32(1), calls.Load(), "probed while the breaker should stay open")
			assert.Equal(t, CircuitOpen, d.Stats().Circuit)
			second.Cancel()
			closeD(t, d)
		})
	})
}

// TestPanicUnderLockCrashes: a panic in the
// dispatcher's own code while it holds its lock — only a bug could cause
// one; testHookUnderLock stands in for it — ends the process loudly, with
// the panic's value, instead of deadlocking on the lock. On a worker; and
// inline, in a Sync-mode caller that recovers panics, which would otherwise
// walk away with the lock held. The test runs itself in a subprocess.
func TestPanicUnderLockCrashes(t *testing.T) {
	if mode := os.Getenv("DISPATCH_CRASH_TEST"); mode != "" {
		testHookUnderLock = func() { panic("injected under the lock") }
		cfg := Config[string, int]{Workers: 1}
		if mode == "sync" {
			cfg.Rollout.Mode = ModeSync
		}
		d, err := New(nopExec, cfg)
		if err != nil {
			panic(err)
		}
		func() {
			defer func() { _ = recover() }() // a caller that recovers everything
			_, _ = d.Submit(bg, "k", 1, SubmitOptions{})
		}()
		d.Stats() // hangs if the lock was left held
		time.Sleep(time.Minute)
		os.Exit(0) // not reached: the process has crashed
	}
	for _, mode := range []string{"async", "sync"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPanicUnderLockCrashes$", "-test.count=1")
			cmd.Env = append(os.Environ(), "DISPATCH_CRASH_TEST="+mode)
			out, err := cmd.CombinedOutput()
			require.NoError(t, ctx.Err(), "the process hung instead of crashing:\n%s", out)
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "the process did not crash:\n%s", out)
			assert.Contains(t, string(out), "dispatch: internal panic")
			assert.Contains(t, string(out), "injected under the lock")
		})
	}
}

// retryDelays records the delays the observer hears a retry wait.
type retryDelays struct {
	NopObserver
	mu     sync.Mutex
	delays []time.Duration
}

func (o *retryDelays) OnRetry(_ Event, _ int, d time.Duration, _ error) {
	o.mu.Lock()
	o.delays = append(o.delays, d)
	o.mu.Unlock()
}

func (o *retryDelays) all() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.delays...)
}

// TestRetryAfterExtremes: a server's Retry-After at the edge of the
// duration range, or just past the call's deadline, never wraps into the
// past. Without a deadline the retry waits as long as the clock can say
// (MaxBackoff does not cap it; it only caps the hold on other calls), and
// the observer hears a positive delay; with one, a Retry-After past it
// ends the call at once as Failed, matching ErrExpired, while one that
// ends just before it runs the retry then. In both modes, with and
// without the adaptive limit's hold.
func TestRetryAfterExtremes(t *testing.T) {
	const dl = time.Hour
	tests := []struct {
		name     string
		hint     time.Duration
		deadline bool
		retried  bool // the retry runs (at the hint)
	}{
		{"MaxInt64", math.MaxInt64, false, false},
		{"MaxInt64-1", math.MaxInt64 - 1, false, false},
		{"MaxInt64 with deadline", math.MaxInt64, true, false},
		{"MaxInt64-1 with deadline", math.MaxInt64 - 1, true, false},
		{"deadline+1ns", dl + time.Nanosecond, true, false},
		{"at the deadline", dl, true, false},
		{"deadline-1ns", dl - time.Nanosecond, true, true},
	}
	for _, tt := range tests {
		for _, mode := range []Mode{ModeAsync, ModeSync} {
			for _, adaptive := range []bool{false, true} {
				name := fmt.Sprintf("%s/%v/adaptive=%v", tt.name, mode, adaptive)
				t.Run(name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						s := newScript(hintErr(tt.hint))
						obs := &retryDelays{}
						cfg := Config[string, int]{
							Workers: 1, Retry: RetryPolicy{MaxAttempts: 3, MaxBackoff: time.Second},
							Observer: obs, Rollout: RolloutPolicy{Mode: mode},
						}
						if adaptive {
							cfg.Start.Adaptive = &AdaptivePolicy{}
						}
						d := newD(t, s.exec, cfg)
						var o SubmitOptions
						if tt.deadline {
							o.Deadline = time.Now().Add(dl)
						}
						t0 := time.Now()
						tks := make(chan *Ticket[string, int], 1)
						go func() { tks <- submit(t, d, "k", 1, o) }() // Sync: Submit runs the call
						synctest.Wait()
						switch {
						case tt.retried:
							tk := <-tks
							<-tk.Done()
							assert.Equal(t, StateSucceeded, outcome(t, tk).State)
							assert.Equal(t, []time.Duration{0, tt.hint}, s.at, "the retry ran at its Retry-After")
							assert.Equal(t, []time.Duration{tt.hint}, obs.all())
						case tt.deadline:
							tk := <-tks
							r := outcome(t, tk)
							assert.Equal(t, StateFailed, r.State)
							assert.ErrorIs(t, r.Err, ErrExpired)
							var re *RetryError
							require.ErrorAs(t, r.Err, &re)
							assert.Equal(t, giveUpDeadline, re.Reason)
							assert.Equal(t, t0, time.Now(), "ended at once")
							assert.Equal(t, int32(1), s.calls.Load())
							assert.Empty(t, obs.all())
						default:
							time.Sleep(1000 * time.Hour)
							synctest.Wait()
							assert.Equal(t, int32(1), s.calls.Load(), "retried before its Retry-After")
							delays := obs.all()
							require.Len(t, delays, 1)
							assert.Greater(t, delays[0], 100*365*24*time.Hour, "the delay heard wrapped or was capped")
							if mode == ModeAsync {
								assert.Equal(t, 1, d.Stats().Delayed)
							}
						}
						ctx, cancel := context.WithCancel(bg)
						cancel()
						_ = d.Close(ctx)
						if !tt.retried && !tt.deadline {
							tk := <-tks
							assert.Equal(t, StateClosed, outcome(t, tk).State)
						}
						checkConservation(t, d)
					})
				})
			}
		}
	}
}

// TestUnknownClassFailsSafe: a classifier that returns a Class this
// package does not define (a value past ClassRecompute) gets what an
// unknown error gets, ClassPermanent: the call fails at once, in both
// modes, rather than being retried.
func TestUnknownClassFailsSafe(t *testing.T) {
	docSays(t, "Class", "A Class other than the three below is taken as ClassPermanent.")
	bothModes(t, func(t *testing.T, mode Mode) {
		var calls atomic.Int32
		errAPI := errors.New("api: refused")
		res, st := runOnce(t, func(context.Context, string, int) error {
			calls.Add(1)
			return errAPI
		}, Config[string, int]{
			Classify: func(error) Class { return Class(7) },
			Retry:    noJitter(5),
			Rollout:  RolloutPolicy{Mode: mode},
		}, SubmitOptions{})
		assert.Equal(t, StateFailed, res.State)
		assert.ErrorIs(t, res.Err, errAPI)
		assert.Equal(t, 1, res.Attempts, "an unknown class is not retried")
		assert.Equal(t, int32(1), calls.Load())
		assert.Equal(t, uint64(1), st.Executions)
	})
}

// TestRetryMergePanicCounted: the merge function panics, or ends the
// goroutine, as a retry takes in its successor. No submitter is there to
// be refused with the *PanicError, as at admission: it is counted
// (Stats.CallbackPanics, LastCallbackPanic), as a hook's or an observer's
// is, and the successor waits behind the retry, as for a refusal.
func TestRetryMergePanicCounted(t *testing.T) {
	docSays(t, "Stats.CallbackPanics", "CallbackPanics counts contained panics and runtime.Goexit calls of OnDone, Observer methods, Label, the RateLimiter, and Merge as a retry takes in its key's next call")
	for _, exit := range []bool{false, true} {
		t.Run(map[bool]string{false: "panic", true: "goexit"}[exit], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				d := newD(t, newFailFirst(g, syscall.ECONNRESET).exec, Config[string, int]{
					Workers: 1,
					Retry:   noJitter(3),
					Merge: func(int, int) (int, error) {
						if exit {
							runtime.Goexit()
						}
						panic("merge")
					},
				})
				first := submit(t, d, "k", 1, SubmitOptions{})
				synctest.Wait()
				second := submit(t, d, "k", 2, SubmitOptions{})
				g.open()
				waitAll(first, second)
				assert.Equal(t, StateSucceeded, outcome(t, first).State)
				assert.Equal(t, StateSucceeded, outcome(t, second).State)
				st := closeD(t, d)
				assert.Equal(t, uint64(1), st.CallbackPanics)
				require.NotNil(t, st.LastCallbackPanic)
				assert.Equal(t, "merge", st.LastCallbackPanic.Callback)
			})
		})
	}
}

// retryLog records what the observer hears of each retry.
type retryLog struct {
	NopObserver
	mu       sync.Mutex
	attempts []int
	delays   []time.Duration
}

func (o *retryLog) OnRetry(_ Event, n int, d time.Duration, _ error) {
	o.mu.Lock()
	o.attempts, o.delays = append(o.attempts, n), append(o.delays, d)
	o.mu.Unlock()
}

// TestRetryReplacedTellsFailedAttempt: a call fails retryably, and the
// submission that waited behind it replaces it (ReplacePending) as it goes
// back to the queue: it starts afresh, at once. The observer hears of the
// attempt that failed (OnRetry's attempt 1, as Observer.OnRetry counts
// from 1) and of the delay the call waits (none), not of the call's
// attempts after the restart (0) or a backoff it does not wait.
func TestRetryReplacedTellsFailedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		obs := &retryLog{}
		d := newD(t, newFailFirst(g, syscall.ECONNRESET).exec, Config[string, int]{
			Workers:  1,
			Retry:    RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour, Jitter: JitterNone, BudgetRatio: math.Inf(1)},
			Merge:    func(_, in int) (int, error) { return in, ReplacePending },
			Observer: obs,
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()
		second := submit(t, d, "k", 2, SubmitOptions{})
		g.open()
		waitAll(first, second)
		r := outcome(t, second)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, 1, r.Attempts, "the replacement ran from its first attempt")
		closeD(t, d)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		assert.Equal(t, []int{1}, obs.attempts, "the attempt that failed")
		assert.Equal(t, []time.Duration{0}, obs.delays, "the replacement runs at once")
	})
}

// TestAttemptTimeoutBoundsExecAlone: RetryPolicy.AttemptTimeout bounds
// exec from its start, in both modes: a before-retry hook slower than the
// timeout does not hand exec a context that has already expired (which
// would fail, and retry, every attempt).
func TestAttemptTimeoutBoundsExecAlone(t *testing.T) {
	docSays(t, "RetryPolicy.AttemptTimeout", "AttemptTimeout, if set, bounds one execution of exec, from its start: the BeforeRetry hook and NoOp test before it take none of it.")
	bothModes(t, func(t *testing.T, mode Mode) {
		var seen []error
		exec := func(ctx context.Context, _ string, _ int) error {
			seen = append(seen, ctx.Err())
			if len(seen) == 1 {
				return syscall.ECONNRESET
			}
			return nil
		}
		p := noJitter(3)
		p.AttemptTimeout = time.Second
		cfg := Config[string, int]{
			Retry: p, Rollout: RolloutPolicy{Mode: mode},
			BeforeRetry: func(_ context.Context, _ string, v int, _ error) (int, bool, error) {
				time.Sleep(2 * p.AttemptTimeout) // slower than the timeout
				return v, false, nil
			},
		}
		res, st := runOnce(t, exec, cfg, SubmitOptions{})
		require.NoError(t, res.Err)
		assert.Equal(t, 2, res.Attempts)
		assert.Equal(t, []error{nil, nil}, seen, "exec began with time left")
		assert.Equal(t, uint64(1), st.Retries)
	})
}

// TestMaxBackoffCapsTheDefaultInitial: a MaxBackoff below the default
// InitialBackoff caps every delay, the first included, rather than being
// raised to the default; a MaxBackoff set below an InitialBackoff set too
// is refused by New, naming the field.
func TestMaxBackoffCapsTheDefaultInitial(t *testing.T) {
	docSays(t, "RetryPolicy.InitialBackoff", "InitialBackoff (default 100ms, or MaxBackoff if that is less)")
	synctest.Test(t, func(t *testing.T) {
		s := newScript(syscall.ECONNRESET, syscall.ECONNRESET)
		res, _ := runOnce(t, s.exec, Config[string, int]{
			Retry: RetryPolicy{MaxBackoff: 10 * time.Millisecond, Jitter: JitterNone, BudgetRatio: math.Inf(1)},
		}, SubmitOptions{})
		require.NoError(t, res.Err)
		assert.Equal(t, []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond}, s.at, "every delay is at most MaxBackoff")
	})
	_, err := New(nopExec, Config[string, int]{Retry: RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Config.Retry.MaxBackoff")
	assert.Contains(t, err.Error(), "InitialBackoff")
	p := RetryPolicy{InitialBackoff: time.Minute} // MaxBackoff unset: raised to it
	require.NoError(t, p.validate())
	assert.Equal(t, time.Minute, p.MaxBackoff)
}

// TestRetryRefusedByBudgetEvictsNothing: a retry the budget refuses does
// not wait, so it needs no room under its tenant's MaxQueued: no queued
// call of the tenant is evicted for it.
func TestRetryRefusedByBudgetEvictsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		tries := map[string]int{}
		hold := newGate()
		exec := func(ctx context.Context, k string, _ int) error {
			if k == "x" {
				if err := hold.wait(ctx); err != nil {
					return err
				}
				return syscall.ECONNRESET
			}
			mu.Lock()
			defer mu.Unlock()
			if tries[k]++; k == "a" && tries[k] == 1 {
				return syscall.ECONNRESET
			}
			return nil
		}
		p := noJitter(3)
		p.BudgetRatio, p.BudgetMin = 0.2, 1
		d := newD(t, exec, Config[string, int]{Workers: 1, Retry: p, DefaultTenant: TenantConfig{MaxQueued: 1}})
		// One retry spends the budget of the window.
		require.Equal(t, StateSucceeded, outcomeWait(t, submit(t, d, "a", 1, SubmitOptions{})).State)
		x := submit(t, d, "x", 1, SubmitOptions{Priority: 5})
		synctest.Wait() // x runs
		v := submit(t, d, "v", 1, SubmitOptions{Droppable: true})
		hold.open() // x fails: its retry is over the budget
		rx, rv := outcomeWait(t, x), outcomeWait(t, v)
		var re *RetryError
		require.ErrorAs(t, rx.Err, &re)
		assert.Equal(t, giveUpBudget, re.Reason)
		assert.Equal(t, StateSucceeded, rv.State, "not evicted for a retry that did not take place: %v", rv.Err)
		st := closeD(t, d)
		assert.Equal(t, uint64(1), st.Retries, "a's retry alone")
	})
}

// TestRetryAfterNonPositiveIsNoHint: a RetryAfter of zero or less is no
// hint: the retry waits the backoff, as for an error without the method.
func TestRetryAfterNonPositiveIsNoHint(t *testing.T) {
	docSays(t, "RetryPolicy.InitialBackoff", "A server's Retry-After (the RetryAfter() time.Duration method of exec's error, if positive: zero or negative is no hint, and the backoff applies) sets the delay in full instead, unjittered and unbounded by MaxBackoff")
	for _, hint := range []time.Duration{0, -time.Nanosecond, math.MinInt64} {
		t.Run(hint.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newScript(hintErr(hint), hintErr(hint))
				res, st := runOnce(t, s.exec, Config[string, int]{Retry: noJitter(3)}, SubmitOptions{})
				require.NoError(t, res.Err)
				assert.Equal(t, []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond}, s.at, "the backoff")
				assert.Equal(t, uint64(2), st.Retries)
			})
		})
	}
}

// TestNewerGenerationDuringBackoff: a newer generation that arrives while
// the key's call waits out a retry's backoff ends that call Stale (its
// failed attempt counted), and runs at once, from its first attempt — not
// after the older call's backoff.
func TestNewerGenerationDuringBackoff(t *testing.T) {
	docSays(t, "SubmitOptions.Generation", "A call waiting out a retry's backoff is queued: it ends Stale, and the newer one does not inherit its backoff or attempts; it runs as a new call would.")
	bothModes(t, func(t *testing.T, mode Mode) {
		s := newScript(hintErr(time.Hour))
		obs := &retryDelays{}
		d := newD(t, s.exec, Config[string, int]{Retry: noJitter(3), Observer: obs, Rollout: RolloutPolicy{Mode: mode}})
		olds := make(chan *Ticket[string, int], 1)
		go func() { olds <- submit(t, d, "k", 1, SubmitOptions{Generation: 1}) }() // Sync: Submit runs the call
		synctest.Wait()
		require.Equal(t, int32(1), s.calls.Load())
		time.Sleep(time.Minute) // into the hour's backoff
		nw := submit(t, d, "k", 2, SubmitOptions{Generation: 2})
		rn, ro := outcomeWait(t, nw), outcomeWait(t, <-olds)
		assert.Equal(t, StateStale, ro.State)
		assert.ErrorIs(t, ro.Err, ErrStale)
		assert.Equal(t, 1, ro.Attempts)
		assert.Equal(t, StateSucceeded, rn.State)
		assert.Equal(t, 1, rn.Attempts, "a new call")
		assert.Equal(t, []time.Duration{0, time.Minute}, s.at, "the newer ran at once")
		assert.Equal(t, []int{1, 2}, s.vals)
		st := closeD(t, d)
		assert.Equal(t, uint64(len(obs.all())), st.Retries)
	})
}

// TestLeftRetryLetsSuccessorRun: a call waiting out a retry's backoff,
// with a successor behind it (Merge refused to combine them), ends when its
// waiters leave or a newer generation supersedes it — and the successor
// (or the newer generation) runs at once, not after the backoff.
func TestLeftRetryLetsSuccessorRun(t *testing.T) {
	for _, how := range []string{"ticket", "generation"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				s := newScript(hintErr(time.Hour))
				d := newD(t, s.heldExec(release), Config[string, int]{
					Workers: 1, Retry: noJitter(3),
					Merge: func(int, int) (int, error) { return 0, errors.New("apart") },
				})
				first := submit(t, d, "k", 1, SubmitOptions{Generation: 1})
				synctest.Wait()
				succ := submit(t, d, "k", 2, SubmitOptions{Generation: 1}) // waits behind the running call
				close(release)
				synctest.Wait() // first failed: its retry waits an hour
				require.Equal(t, int32(1), s.calls.Load())
				time.Sleep(time.Minute)
				want, next := StateCanceled, succ
				if how == "ticket" {
					first.Cancel()
				} else {
					want, next = StateStale, submit(t, d, "k", 3, SubmitOptions{Generation: 2})
				}
				rn := outcomeWait(t, next)
				assert.Equal(t, StateSucceeded, rn.State)
				assert.Equal(t, want, outcome(t, first).State)
				assert.Equal(t, 1, outcome(t, first).Attempts)
				assert.Equal(t, []time.Duration{0, time.Minute}, s.at, "ran at once")
				closeD(t, d)
			})
		})
	}
}
