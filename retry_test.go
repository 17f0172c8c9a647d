package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
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
// the list. It records when each attempt started and what it ran.
type script struct {
	errs  []error
	calls atomic.Int32
	at    []time.Duration
	vals  []int
	idem  []string
	t0    time.Time
}

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

// errConflict stands for a 409 Conflict, which conflictClassifier judges
// Recompute: rebuild the call from fresh state, not retry it as it is.
var errConflict = errors.New("409 conflict")

// conflictClassifier is DefaultClassifier, except that errConflict is
// Recompute.
func conflictClassifier(err error) Class {
	if errors.Is(err, errConflict) {
		return Recompute
	}
	return DefaultClassifier(err)
}

func noJitter(attempts int) RetryPolicy {
	return RetryPolicy{MaxAttempts: attempts, InitialBackoff: 100 * time.Millisecond, Jitter: NoJitter, BudgetRatio: math.Inf(1)}
}

func TestRetryClasses(t *testing.T) {
	tests := []struct {
		name      string
		errs      []error
		before    bool
		wantState State
		wantCalls int
		wantWhy   GiveUp
	}{
		{"retry then success", []error{syscall.ECONNRESET, syscall.ECONNREFUSED}, false, Succeeded, 3, ""},
		{"permanent", []error{errors.New("403 forbidden")}, false, Failed, 1, "permanent"},
		{"recompute without hook", []error{errConflict}, false, Failed, 1, "recompute"},
		{"recompute with hook", []error{errConflict}, true, Succeeded, 2, ""},
		{"attempts exhausted", []error{syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET}, false, Failed, 3, "attempts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{errs: tc.errs, t0: time.Now()}
				cfg := Config[string, int]{Workers: 1, Retry: noJitter(3), Classify: conflictClassifier}
				if tc.before {
					cfg.BeforeRetry = func(_ context.Context, _ string, v int, last error) (int, bool, error) {
						require.ErrorIs(t, last, errConflict)
						return v + 100, false, nil
					}
				}
				d, err := New(s.exec, cfg)
				require.NoError(t, err)
				tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
				require.NoError(t, err)
				res, _ := tk.Wait(t.Context())
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
				require.NoError(t, d.Close(t.Context()))
				checkConservation(t, d)
			})
		})
	}
}

func TestRetryBackoffSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET}, t0: time.Now()}
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: RetryPolicy{
			MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond,
			Multiplier: 2, Jitter: NoJitter, BudgetRatio: math.Inf(1),
		}})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 4, res.Attempts)
		// 100ms, 200ms, then capped at 300ms.
		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond}, s.at)
		assert.Equal(t, uint64(3), d.Stats().Retries)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestRetryJitterBounds(t *testing.T) {
	for _, j := range []Jitter{FullJitter, EqualJitter, NoJitter} {
		p, err := RetryPolicy{InitialBackoff: time.Second, MaxBackoff: 8 * time.Second, Jitter: j}.withDefaults()
		require.NoError(t, err)
		for n := 1; n <= 6; n++ {
			base := min(time.Second<<(n-1), 8*time.Second)
			lo := map[Jitter]time.Duration{FullJitter: 0, EqualJitter: base / 2, NoJitter: base}[j]
			var seenLow, seenHigh bool
			for range 2000 {
				got := p.backoff(n)
				require.GreaterOrEqual(t, got, lo, "jitter %d attempt %d", j, n)
				require.LessOrEqual(t, got, base, "jitter %d attempt %d", j, n)
				seenLow = seenLow || got < lo+(base-lo)/4
				seenHigh = seenHigh || got > base-(base-lo)/4
			}
			if j != NoJitter {
				assert.True(t, seenLow && seenHigh, "jitter %d spreads over its range", j)
			}
		}
	}
}

func TestRetryAfterHintHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{fmt.Errorf("patch: %w", hintErr(7*time.Second))}, t0: time.Now()}
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: noJitter(3)})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, []time.Duration{0, 7 * time.Second}, s.at)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestRetryStoppedByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{syscall.ECONNRESET, syscall.ECONNRESET}, t0: time.Now()}
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Second, Jitter: NoJitter, BudgetRatio: math.Inf(1)}})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{Deadline: time.Now().Add(1500 * time.Millisecond)})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		assert.Equal(t, Failed, res.State)
		assert.ErrorIs(t, err, ErrExpired, "a deadline that stops retries matches ErrExpired")
		var re *RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, GiveUpDeadline, re.Reason)
		assert.Equal(t, 2, re.Attempts, "attempt at 0s and 1s; the next (at 3s) would end past the deadline")
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestRetryHoldsNoWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []string
		d, err := New(func(ctx context.Context, k string, _ int) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, k)
			if k == "slow" && len(order) == 1 {
				return syscall.ECONNRESET
			}
			return nil
		}, Config[string, int]{Workers: 1, Retry: RetryPolicy{InitialBackoff: time.Hour, MaxBackoff: time.Hour, Jitter: NoJitter}})
		require.NoError(t, err)
		a, err := d.Submit(t.Context(), "slow", 1, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait()
		st := d.Stats()
		assert.Equal(t, 1, st.Delayed)
		assert.Equal(t, 0, st.InFlight, "a retry waits in the delay index, not in a worker")
		b, err := d.Submit(t.Context(), "other", 1, SubmitOptions{})
		require.NoError(t, err)
		<-b.Done()
		mu.Lock()
		assert.Equal(t, []string{"slow", "other"}, order)
		mu.Unlock()
		res, err := a.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Attempts)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestRetryMergesSubmissionsDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{syscall.ECONNRESET}, t0: time.Now()}
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: noJitter(3), Merge: func(p, in int) (int, error) { return p + in, nil }})
		require.NoError(t, err)
		first, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait() // first attempt failed; the call waits out 100ms
		require.True(t, d.Pending("k"))
		require.NoError(t, d.Post("k", 10, SubmitOptions{}))
		second, err := d.Submit(t.Context(), "k", 100, SubmitOptions{})
		require.NoError(t, err)
		r1, err := first.Wait(t.Context())
		require.NoError(t, err)
		r2, err := second.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, []int{1, 111}, s.vals, "the retry runs the merged call")
		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond}, s.at, "and keeps its backoff")
		assert.Equal(t, r1, r2)
		assert.Equal(t, 3, r1.Waiters)
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

func TestRetrySuccessorAbsorbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := &script{errs: []error{syscall.ECONNRESET}, t0: time.Now()}
		d, err := New(s.heldExec(release), Config[string, int]{Workers: 1, Retry: noJitter(3)})
		require.NoError(t, err)
		first, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait() // in flight
		second, err := d.Submit(t.Context(), "k", 2, SubmitOptions{Priority: 5})
		require.NoError(t, err) // the successor
		close(release)
		r1, _ := first.Wait(t.Context())
		r2, _ := second.Wait(t.Context())
		assert.Equal(t, Succeeded, r1.State)
		assert.Equal(t, Succeeded, r2.State)
		assert.Equal(t, []int{1, 2}, s.vals, "the retry took the successor's (newer) value")
		assert.Equal(t, 2, int(s.calls.Load()), "one retry served both, no third execution")
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

func TestRetryRefusedMergeKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := &script{errs: []error{syscall.ECONNRESET}, t0: time.Now()}
		d, err := New(s.heldExec(release), Config[string, int]{Workers: 2, Retry: noJitter(3), Merge: func(p, in int) (int, error) {
			if p != in {
				return 0, errors.New("different operations")
			}
			return p, nil
		}})
		require.NoError(t, err)
		first, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait()
		second, err := d.Submit(t.Context(), "k", 2, SubmitOptions{})
		require.NoError(t, err)
		close(release)
		synctest.Wait()
		assert.Equal(t, 1, d.Stats().Delayed, "the retry waits; the successor waits behind it")
		r1, _ := first.Wait(t.Context())
		r2, _ := second.Wait(t.Context())
		assert.Equal(t, Succeeded, r1.State)
		assert.Equal(t, Succeeded, r2.State)
		assert.Equal(t, []int{1, 1, 2}, s.vals, "retry first, then the successor: order kept")
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

func TestBeforeRetryDoneSkipsExecution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{syscall.ECONNRESET}, t0: time.Now()}
		hookCalls := 0
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: noJitter(3), BeforeRetry: func(ctx context.Context, k string, v int, last error) (int, bool, error) {
			hookCalls++
			assert.Equal(t, "create-42", IdempotencyKey(ctx))
			return v, true, nil
		}})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{IdempotencyKey: "create-42"})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Succeeded, res.State)
		assert.Equal(t, 1, int(s.calls.Load()), "never created twice")
		assert.Equal(t, 1, hookCalls)
		assert.Equal(t, []string{"create-42"}, s.idem)
		assert.Equal(t, uint64(1), d.Stats().AlreadyDone)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestBeforeRetryError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{syscall.ECONNRESET}, t0: time.Now()}
		boom := errors.New("cannot read fresh state")
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: noJitter(3), BeforeRetry: func(context.Context, string, int, error) (int, bool, error) { return 0, false, boom }})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		assert.Equal(t, Failed, res.State)
		assert.ErrorIs(t, err, boom)
		var re *RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, GiveUpBeforeRetry, re.Reason)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestIdempotencyKeyOnEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{syscall.ECONNRESET, syscall.ECONNRESET}, t0: time.Now()}
		d, err := New(s.exec, Config[string, int]{Workers: 1, Retry: noJitter(3)})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{IdempotencyKey: "op-7"})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, []string{"op-7", "op-7", "op-7"}, s.idem)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestAttemptTimeoutRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		d, err := New(func(ctx context.Context, _ string, _ int) error {
			if calls.Add(1) == 1 {
				<-ctx.Done() // the API hangs; the attempt times out
				return ctx.Err()
			}
			return nil
		}, Config[string, int]{Workers: 1, Retry: RetryPolicy{AttemptTimeout: time.Second, Jitter: NoJitter}})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Attempts)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestPanicNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		d, err := New(func(context.Context, string, int) error {
			calls.Add(1)
			panic("boom")
		}, Config[string, int]{Workers: 1, Retry: noJitter(5)})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		assert.Equal(t, Failed, res.State)
		var pe *PanicError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "boom", pe.Value)
		assert.Equal(t, int32(1), calls.Load())
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestRetryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := New(func(context.Context, string, int) error { return syscall.ECONNRESET },
			Config[string, int]{Workers: 4, Retry: RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, Jitter: NoJitter,
				BudgetRatio: 0.1, BudgetMin: 2, BudgetWindow: time.Minute}})
		require.NoError(t, err)
		var tickets []*Ticket[string, int]
		for i := range 40 {
			tk, err := d.Submit(t.Context(), fmt.Sprint(i), i, SubmitOptions{})
			require.NoError(t, err)
			tickets = append(tickets, tk)
		}
		reasons := map[GiveUp]int{}
		for _, tk := range tickets {
			_, err := tk.Wait(t.Context())
			var re *RetryError
			require.ErrorAs(t, err, &re)
			reasons[re.Reason]++
		}
		// 40 first attempts allow max(2, 0.1×40) = 4 retries at most.
		assert.LessOrEqual(t, int(d.Stats().Retries), 4)
		assert.GreaterOrEqual(t, int(d.Stats().Retries), 2)
		assert.Equal(t, 40, reasons[GiveUpBudget]+reasons[GiveUpAttempts])
		assert.Equal(t, int(d.Stats().Retries), reasons[GiveUpAttempts])
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

func TestCancelledCallNeverRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		d, err := New(func(ctx context.Context, _ string, _ int) error {
			calls.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}, Config[string, int]{Workers: 1, Retry: noJitter(5), Breaker: &BreakerPolicy{ConsecutiveFailures: 1}})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "k", 1, SubmitOptions{})
		require.NoError(t, err)
		synctest.Wait()
		assert.True(t, d.Cancel("k", errors.New("pod deleted")))
		res, err := tk.Wait(t.Context())
		assert.Equal(t, Canceled, res.State)
		assert.ErrorIs(t, err, ErrCanceled)
		synctest.Wait()
		st := d.Stats()
		assert.Equal(t, int32(1), calls.Load())
		assert.Equal(t, uint64(0), st.Retries)
		assert.Equal(t, BreakerClosed, st.Breaker, "a cancellation does not trip the breaker")
		assert.Equal(t, uint64(1), st.StaleExecutions)
		require.NoError(t, d.Close(t.Context()))
	})
}
