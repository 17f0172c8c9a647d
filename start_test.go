package dispatch

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Priority holds where the scarce resource is handed out — a worker, the
// server's capacity (ratelimit_test.go has the rate limiter's token) — and
// a call that cannot finish in time is not started.

// startLog records when each key's execution started.
type startLog struct {
	mu sync.Mutex
	at map[string]time.Time
	n  int // executions running now
	hi int // the most that ran at once
}

func newStartLog() *startLog { return &startLog{at: map[string]time.Time{}} }

// exec records the start and takes d to return.
func (s *startLog) exec(d time.Duration) ExecFunc[string, int] {
	return func(ctx context.Context, k string, _ int) error {
		s.mu.Lock()
		s.at[k] = time.Now()
		s.n++
		s.hi = max(s.hi, s.n)
		s.mu.Unlock()
		time.Sleep(d)
		s.mu.Lock()
		s.n--
		s.mu.Unlock()
		return nil
	}
}

func (s *startLog) startOf(k string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.at[k]
	return t, ok
}

var inf = math.Inf(1)

// TestReservation: low-priority work may hold at most Workers −
// Reserve.Workers workers, so an urgent call finds a free worker at once
// even when the limit is workers, not tokens; Stats reports it; and aging
// lifts a waiting low-priority call to urgency.
func TestReservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newStartLog()
		d := newD(t, log.exec(100*time.Millisecond), Config[string, int]{
			Workers: 4,
			Start:   StartPolicy{ReservedWorkers: 1, UrgentPriority: 10},
			Aging:   time.Hour, // no call ages into urgency in this test
		})
		for i := range 40 {
			require.NoError(t, d.Post(fmt.Sprint("low", i), 1, SubmitOptions{}))
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		s := d.Stats()
		assert.Equal(t, 3, s.InFlight, "low work holds 3 of the 4 workers")
		assert.Equal(t, 1, s.Reserved)
		assert.Equal(t, 3, s.BelowReserve)
		submitted := time.Now()
		bind := submit(t, d, "bind", 1, prio(10))
		synctest.Wait()
		start, ok := log.startOf("bind")
		require.True(t, ok, "the bind started on the kept worker")
		assert.Equal(t, submitted, start)
		<-bind.Done()
		assert.LessOrEqual(t, log.hi, 4)
		closeD(t, d)
	})
	t.Run("aging never lifts into it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			log := newStartLog()
			d := newD(t, log.exec(10*time.Minute), Config[string, int]{
				Workers: 2,
				Start:   StartPolicy{ReservedWorkers: 1, UrgentPriority: 10},
				Aging:   time.Second,
			})
			for i := range 10 { // 100 minutes of work for one worker
				require.NoError(t, d.Post(fmt.Sprint("low", i), 9, SubmitOptions{}))
			}
			synctest.Wait()
			assert.Equal(t, 1, d.Stats().InFlight, "one low call; the other worker is kept")
			// An hour of aging would lift priority 9 far past 10; the
			// kept worker still waits for an urgent call.
			time.Sleep(time.Hour)
			synctest.Wait()
			assert.Equal(t, 1, d.Stats().InFlight)
			submitted := time.Now()
			bind := submit(t, d, "bind", 1, prio(10))
			synctest.Wait()
			start, ok := log.startOf("bind")
			require.True(t, ok, "the bind started on the kept worker")
			assert.Equal(t, submitted, start)
			bind.Cancel()
			closeD(t, d)
		})
	})
}

// TestStartCheck: a call whose deadline is closer than its label's usual
// execution time is not started: its waiters end Expired at once, with an
// error saying why, and the worker goes to the next call. Disabled, the
// call runs (and expires while running). Without Config.Label every call
// has one label, whose times are the dispatcher's execution times.
func TestStartCheck(t *testing.T) {
	for _, c := range []struct {
		disabled, labelled bool
	}{{false, true}, {true, true}, {false, false}, {true, false}} {
		disabled := c.disabled
		t.Run(fmt.Sprintf("disabled=%v/labelled=%v", c.disabled, c.labelled), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newStartLog()
				cfg := Config[string, int]{
					Workers: 1,
					Start:   StartPolicy{NoDeadlineCheck: disabled},
				}
				if c.labelled {
					cfg.Label = func(string, int) string { return "patch" }
				}
				d := newD(t, log.exec(100*time.Millisecond), cfg)
				var warm []*Ticket[string, int]
				for i := range 20 {
					warm = append(warm, submit(t, d, fmt.Sprint("warm", i), 1, prio(0)))
				}
				waitAll(warm...)
				tk, err := d.Submit(context.Background(), "late", 1, SubmitOptions{Deadline: time.Now().Add(50 * time.Millisecond)})
				require.NoError(t, err)
				<-tk.Done()
				r := outcome(t, tk)
				assert.Equal(t, StateExpired, r.State)
				_, ran := log.startOf("late")
				s := closeD(t, d)
				if disabled {
					assert.True(t, ran)
					assert.Zero(t, s.Unfinishable)
					return
				}
				assert.False(t, ran, "not started")
				assert.ErrorContains(t, r.Err, "not started")
				assert.Equal(t, uint64(1), s.Unfinishable)
				assert.Zero(t, r.Attempts)
			})
		})
	}
}

// TestStartPolicyValidation: StartPolicy's bad values are errors from New
// that name the field.
func TestStartPolicyValidation(t *testing.T) {
	for name, cfg := range map[string]Config[string, int]{
		"Start.ReservedWorkers":     {Workers: 4, Start: StartPolicy{ReservedWorkers: 4}},
		"Start.Adaptive.MinWorkers": {Workers: 4, Start: StartPolicy{Adaptive: &AdaptivePolicy{MinWorkers: 5}}},
		"Start.Adaptive.Tolerance":  {Start: StartPolicy{Adaptive: &AdaptivePolicy{Tolerance: 0.5}}},
		"Start.DeadlineQuantile":    {Start: StartPolicy{DeadlineQuantile: 2}},
		"Start.DeadlineSamples":     {Start: StartPolicy{DeadlineSamples: -1}},
	} {
		_, err := New(nopExec, cfg)
		assert.ErrorContains(t, err, "Config."+name, name)
	}
}

// TestSyncUnfinishableKeepsReadyCount: in Sync mode, a submission whose
// call the start check finds unfinishable ends Expired, and the ready
// count stays true. (With no other ready call of its tenant, the same
// path panics under the dispatcher's lock: index out of range [-1].)
func TestSyncUnfinishableKeepsReadyCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		d := newD(t, func(_ context.Context, k string, _ int) error {
			if k == "hold" {
				<-gate
			}
			time.Sleep(100 * time.Millisecond)
			return nil
		}, Config[string, int]{Workers: 1})
		var warm []*Ticket[string, int]
		for i := range 20 { // samples for the start check's estimate: 100ms
			warm = append(warm, submit(t, d, fmt.Sprint("warm", i), 1, prio(0)))
		}
		waitAll(warm...)
		hold := submit(t, d, "hold", 1, prio(0)) // the worker waits at the gate
		queued := submit(t, d, "queued", 1, prio(0))
		synctest.Wait()
		go func() { _ = d.SetMode(context.Background(), ModeSync) }() // drains "queued" later
		synctest.Wait()
		late, err := d.Submit(context.Background(), "late", 1, SubmitOptions{Deadline: time.Now().Add(50 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := late.Result(); r.State != StateExpired {
			t.Errorf("late: %v, want Expired (unfinishable)", r.State)
		}
		if s := d.Stats(); s.Ready != 1 || s.Unfinishable != 1 {
			t.Errorf("Stats.Ready %d (want 1: %q), Unfinishable %d", s.Ready, "queued", s.Unfinishable)
		}
		close(gate)
		waitAll(hold, queued)
		if s := d.Stats(); s.Ready != 0 {
			t.Errorf("Stats.Ready %d with nothing queued", s.Ready)
		}
	})
}

// TestRetryAfterHoldRule: a Retry-After that one
// low-priority call draws holds the other calls below the reservation for
// at most Retry.MaxBackoff, and never holds a call that may use a reserved
// worker; the call that drew it waits out the whole Retry-After itself.
func TestRetryAfterHoldRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newStartLog()
		var drew atomic.Bool
		d := newD(t, func(ctx context.Context, k string, v int) error {
			_ = log.exec(time.Millisecond)(ctx, k, v)
			if k == "patch" && !drew.Swap(true) {
				return retryAfterErr{time.Hour}
			}
			return nil
		}, Config[string, int]{
			Workers: 4,
			Start:   StartPolicy{ReservedWorkers: 1, UrgentPriority: 100, Adaptive: &AdaptivePolicy{}},
			Retry:   RetryPolicy{MaxBackoff: time.Second},
		})
		patch := submit(t, d, "patch", 1, prio(0))
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		require.True(t, drew.Load())
		at := time.Now()
		bind := submit(t, d, "bind", 1, prio(100))
		low := submit(t, d, "low", 1, prio(0))
		<-bind.Done()
		start, _ := log.startOf("bind")
		assert.Equal(t, at, start, "an urgent call waited out the hold")
		<-low.Done()
		start, _ = log.startOf("low")
		held := start.Sub(at)
		assert.Greater(t, held, time.Duration(0), "a low call was not held")
		assert.LessOrEqual(t, held, time.Second, "the hold exceeded MaxBackoff")
		_, ended := patch.Result()
		assert.False(t, ended, "the throttled call retried before its own Retry-After")
		time.Sleep(time.Hour)
		<-patch.Done()
		assert.Equal(t, StateSucceeded, outcome(t, patch).State)
		closeD(t, d)
	})
}

// TestStartCheckLearnsSpeedUp: after 20 executions at
// 1 s the server answers in 5 ms. Calls with 500 ms deadlines, one every
// 500 ms, are refused at first (the estimate says 1 s), but a refused call
// starts as a probe once nothing of its label has run for a while, its
// fast answer drops the stale history, and from then on the calls succeed:
// within a few seconds, not after the minute it takes the slow samples to
// age out (it used to be 55 s, with 110 of 120 calls expired).
func TestStartCheckLearnsSpeedUp(t *testing.T) {
	docSays(t, "README.md", "unless `NoDeadlineCheck` is set, a call whose deadline is closer than its label's usual execution time (`DeadlineQuantile` of the last minute's, once there are `DeadlineSamples`) is not started, with a probe now and then so that a speed-up is noticed.")
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		latency := time.Second
		d := newD(t, func(ctx context.Context, _ string, _ int) error {
			mu.Lock()
			l := latency
			mu.Unlock()
			select {
			case <-time.After(l):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, Config[string, int]{Workers: 4})
		var slow []*Ticket[string, int]
		for i := range 20 {
			slow = append(slow, submit(t, d, fmt.Sprint("slow", i), 1, prio(0)))
		}
		waitAll(slow...)
		mu.Lock()
		latency = 5 * time.Millisecond
		mu.Unlock()
		start := time.Now()
		firstOK, ok := time.Duration(-1), false
		expired := 0
		for i := range 120 {
			tk, err := d.Submit(bg, fmt.Sprint("k", i), 1, SubmitOptions{Deadline: time.Now().Add(500 * time.Millisecond)})
			require.NoError(t, err)
			<-tk.Done()
			switch r := outcome(t, tk); r.State {
			case StateSucceeded:
				if !ok {
					firstOK, ok = time.Since(start), true
				}
			case StateExpired:
				expired++
			}
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * 500 * time.Millisecond)))
		}
		t.Logf("first success after %v; %d of 120 expired", firstOK, expired)
		assert.True(t, ok, "no call succeeded")
		assert.LessOrEqual(t, firstOK, 3*time.Second, "calls still refused after the speed-up")
		assert.LessOrEqual(t, expired, 6)
		closeD(t, d)
	})
}

// TestMergeThatMayStartWakesWorker: a ready call that no worker could take
// — passed over for the reservation, or for its tenant's in-flight cap —
// starts at once when a submission merged into it lets it: one that makes
// it urgent (Submit or Post), or one of another tenant that takes it over.
// It does not wait for an execution that runs long to end first.
func TestMergeThatMayStartWakesWorker(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config[string, int]
		low  SubmitOptions // the running call's and the waiting one's
		join func(d *Dispatcher[string, int]) error
	}{
		{
			name: "made urgent by Submit",
			cfg:  Config[string, int]{Workers: 2, Start: StartPolicy{ReservedWorkers: 1, UrgentPriority: 10}},
			join: func(d *Dispatcher[string, int]) error {
				_, err := d.Submit(bg, "k", 2, SubmitOptions{Priority: 10})
				return err
			},
		},
		{
			name: "made urgent by Post",
			cfg:  Config[string, int]{Workers: 2, Start: StartPolicy{ReservedWorkers: 1, UrgentPriority: 10}},
			join: func(d *Dispatcher[string, int]) error { return d.Post("k", 2, SubmitOptions{Priority: 10}) },
		},
		{
			name: "taken over by an uncapped tenant",
			cfg:  Config[string, int]{Workers: 2, Tenants: map[string]TenantConfig{"patch": {MaxInFlight: 1}}},
			low:  SubmitOptions{Tenant: "patch"},
			join: func(d *Dispatcher[string, int]) error {
				_, err := d.Submit(bg, "k", 2, SubmitOptions{Priority: 10, Tenant: "bind"})
				return err
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newStartLog()
				d := newD(t, log.exec(time.Hour), tc.cfg)
				require.NoError(t, d.Post("slow", 1, tc.low))
				synctest.Wait()
				require.NoError(t, d.Post("k", 1, tc.low))
				synctest.Wait()
				_, started := log.startOf("k")
				require.False(t, started, "k waits: the one worker it may use is busy")
				joined := time.Now()
				require.NoError(t, tc.join(d))
				synctest.Wait()
				start, ok := log.startOf("k")
				require.True(t, ok, "k starts on the free worker once it may")
				assert.Equal(t, joined, start)
				assert.Equal(t, 2, d.Stats().InFlight)
				closeD(t, d)
			})
		})
	}
}
