package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
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
	for _, m := range []Mode{ModeAsync, ModeSync} {
		t.Run("mode="+m.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { f(t, m) })
		})
	}
}

// TestModesShareBehaviour runs one call through each path of the call
// lifecycle — success, retry, permanent failure, attempts exhausted,
// recompute, panic, no-op — in Async and in Sync mode, and checks that both
// modes give the same state, attempts, give-up reason and backoff, and fire
// the completion hook once; in Sync, Submit returns only once the call has
// ended.
func TestModesShareBehaviour(t *testing.T) {
	docSays(t, "README.md", "one code path and one test suite (`TestModesShareBehaviour` runs it in both modes)")
	cases := []struct {
		name  string
		errs  []error
		panic bool
		noop  bool
		want  State
		calls int
		why   string
	}{
		{name: "success", want: StateSucceeded, calls: 1},
		{name: "retry then success", errs: []error{syscall.ECONNRESET}, want: StateSucceeded, calls: 2},
		{name: "permanent", errs: []error{errors.New("403")}, want: StateFailed, calls: 1, why: "permanent"},
		{name: "attempts exhausted", errs: []error{syscall.ECONNRESET, syscall.ECONNRESET, syscall.ECONNRESET}, want: StateFailed, calls: 3, why: "attempts"},
		{name: "recompute", errs: []error{errConflict}, want: StateSucceeded, calls: 2},
		{name: "panic", panic: true, want: StateFailed, calls: 1},
		{name: "no-op", noop: true, want: StateSkipped, calls: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bothModes(t, func(t *testing.T, mode Mode) {
				var calls, hooks atomic.Int32
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
				d := newD(t, exec, Config[string, int]{
					Rollout:  RolloutPolicy{Mode: mode},
					Workers:  1,
					Classify: conflictClassifier,
					Retry: RetryPolicy{
						MaxAttempts:    3,
						InitialBackoff: time.Second,
						Jitter:         JitterNone,
						BudgetRatio:    math.Inf(1),
					},
					BeforeRetry: func(_ context.Context, _ string, v int, _ error) (int, bool, error) { return v + 1, false, nil },
					NoOp:        func(string, int) bool { return tc.noop },
					OnDone:      func(Result[string, int]) { hooks.Add(1) },
				})
				tk := submit(t, d, "k", 1, SubmitOptions{})
				if mode == ModeSync {
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
				st := closeD(t, d)
				assert.Equal(t, int32(1), hooks.Load(), "the hook fires once per call")
				assert.Equal(t, mode, st.Mode)
			})
		})
	}
}

// TestModesShareAdmission: both modes refuse a submission the same way —
// a deadline already passed (ErrExpired), a done context (ErrCanceled),
// anything after Close (ErrClosed) — and count it.
func TestModesShareAdmission(t *testing.T) {
	bothModes(t, func(t *testing.T, mode Mode) {
		d := newD(t, nopExec, Config[string, int]{Rollout: RolloutPolicy{Mode: mode}, Capacity: 1})
		submit(t, d, "k", 1, SubmitOptions{Generation: 5})
		_, err := d.Submit(bg, "k", 1, SubmitOptions{Deadline: time.Now().Add(-time.Second)})
		assert.ErrorIs(t, err, ErrExpired)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		_, err = d.Submit(ctx, "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrCanceled)
		closeD(t, d)
		_, err = d.Submit(bg, "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, d.Post("k", 1, SubmitOptions{}), ErrClosed)
		s := checkConservation(t, d)
		assert.Equal(t, uint64(4), s.Rejected)
	})
}

// goroutineID returns the calling goroutine's id, from its stack header
// ("goroutine 42 [running]:").
func goroutineID() uint64 {
	var buf [64]byte
	f := strings.Fields(string(buf[:runtime.Stack(buf[:], false)]))
	id, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		panic("goroutineID: " + err.Error())
	}
	return id
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
		d := newD(t, func(context.Context, string, int) error { return errAPI }, Config[string, int]{
			Rollout: RolloutPolicy{Mode: mode},
			Workers: 1,
			OnDone:  hooks.add,
		})
		require.NoError(t, d.Post("k", 1, SubmitOptions{}), "an execution's failure is not a refusal")
		assert.ErrorIs(t, d.Post("x", 0, SubmitOptions{Deadline: time.Now().Add(-time.Second)}), ErrExpired, "a refusal is")
		closeD(t, d)
		assert.ErrorIs(t, d.Post("k", 1, SubmitOptions{}), ErrClosed)
		s := checkConservation(t, d)
		assert.Equal(t, uint64(1), s.Outcomes[StateFailed])
		require.Len(t, hooks.all(), 1)
		assert.ErrorIs(t, hooks.all()[0].Err, errAPI)
	})
}

// TestSetModeDrainAndCancel switches to Sync with each rollout policy while
// one call is in flight, one waits out a backoff and one is queued: new
// submissions run inline at once; DrainQueued keeps running the queued and
// backing-off calls (retry included) and SetMode waits for them, while
// CancelQueued ends them Canceled with ErrFallback at once; the in-flight
// call runs to its end either way; switching back to Async queues again.
func TestSetModeDrainAndCancel(t *testing.T) {
	for _, cancelQueued := range []bool{false, true} {
		t.Run(fmt.Sprint("cancelQueued=", cancelQueued), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var mu sync.Mutex
				ran := map[string]int{}
				d := newD(t, func(ctx context.Context, k string, _ int) error {
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
				}, Config[string, int]{
					Workers: 2,
					Rollout: RolloutPolicy{CancelQueued: cancelQueued},
					Retry:   RetryPolicy{InitialBackoff: time.Second, Jitter: JitterNone},
				})
				inflight := submit(t, d, "inflight", 0, SubmitOptions{})
				backoff := submit(t, d, "backoff", 0, SubmitOptions{})
				synctest.Wait()
				// Second worker: hold it too, so "queued" stays queued.
				submit(t, d, "inflight2", 0, SubmitOptions{})
				queued := submit(t, d, "queued", 0, SubmitOptions{Priority: -1})
				synctest.Wait()
				st := d.Stats()
				require.Equal(t, 1, st.Delayed, "backoff waits")

				done := make(chan error, 1)
				go func() { done <- d.SetMode(t.Context(), ModeSync) }()
				synctest.Wait()
				assert.Equal(t, ModeSync, d.Mode())
				// New submissions now run inline, while the switch drains.
				var inlineRan bool
				go func() {
					_, err := d.Submit(t.Context(), "new", 0, SubmitOptions{})
					assert.NoError(t, err)
					inlineRan = true
				}()
				synctest.Wait()
				assert.True(t, inlineRan, "a submission after the switch runs inline at once")

				if cancelQueued {
					require.NoError(t, <-done)
					for _, tk := range []*Ticket[string, int]{queued, backoff} {
						res, err := tk.Wait(t.Context())
						assert.Equal(t, StateCanceled, res.State)
						assert.ErrorIs(t, err, ErrFallback)
					}
					close(release)
					res, err := inflight.Wait(t.Context())
					require.NoError(t, err, "in-flight calls run to their end")
					assert.Equal(t, StateSucceeded, res.State)
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
						assert.Equal(t, StateSucceeded, res.State)
					}
					mu.Lock()
					assert.Equal(t, 2, ran["backoff"], "the call in backoff was drained, retry included")
					mu.Unlock()
				}
				// Back to Async: submissions queue again.
				require.NoError(t, d.SetMode(t.Context(), ModeAsync))
				_, err := submit(t, d, "after", 0, SubmitOptions{}).Wait(t.Context())
				require.NoError(t, err)
				closeD(t, d)
			})
		})
	}
}

// TestSetModeDrainTimesOut: when SetMode's context ends before the queue
// has drained, SetMode returns the context's error and cancels what is
// still queued with ErrFallback; the call in flight runs to its end.
func TestSetModeDrainTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{})
		queued := submit(t, d, "queued", 0, SubmitOptions{})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		assert.ErrorIs(t, d.SetMode(ctx, ModeSync), context.DeadlineExceeded)
		res, err := queued.Wait(t.Context())
		assert.Equal(t, StateCanceled, res.State)
		assert.ErrorIs(t, err, ErrFallback)
		release()
		closeD(t, d)
	})
}

// TestModeSwitchRace: submitters race a goroutine flipping the mode. Every
// waiter hears exactly once, and no call runs twice.
func TestModeSwitchRace(t *testing.T) {
	var mu sync.Mutex
	ran := map[string]int{}
	d := newD(t, func(ctx context.Context, k string, _ int) error {
		mu.Lock()
		ran[k]++
		mu.Unlock()
		return nil
	}, Config[string, int]{
		Workers:    4,
		Capacity:   100000,
		MaxWaiters: 100000,
	})
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		for m := ModeSync; ; m = 1 - m {
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
						// Post returns refusals only, and with DrainQueued
						// a switch cancels nothing.
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
	require.NoError(t, d.SetMode(context.Background(), ModeAsync))
	var all []*Ticket[string, int]
	for _, tks := range tickets {
		all = append(all, tks...)
	}
	waitAll(all...)
	assert.Equal(t, map[State]int{StateSucceeded: len(all)}, tally(t, all...))
	closeD(t, d)
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, ran, 8*300)
	for k, n := range ran {
		if n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
}

// modeLog is an observer that passes mode changes to f.
type modeLog struct {
	NopObserver
	f func(from, to Mode, reason string)
}

func (m *modeLog) OnModeChange(from, to Mode, reason string) { m.f(from, to, reason) }

// modeChanges is an Observer that records each mode change as "from->to
// reason".
type modeChanges struct {
	NopObserver
	mu  sync.Mutex
	log []string
}

func (m *modeChanges) OnModeChange(from, to Mode, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log = append(m.log, fmt.Sprintf("%v->%v %s", from, to, reason))
}

// all returns the changes recorded so far.
func (m *modeChanges) all() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.log)
}

// TestSetModeValidation: SetMode refuses an unknown mode, and any switch
// after Close. (Config's Mode, SwitchPolicy and Fallback are checked by
// TestNewValidation.)
func TestSetModeValidation(t *testing.T) {
	d := newD(t, nopExec, Config[string, int]{})
	assert.Error(t, d.SetMode(bg, 5))
	closeD(t, d)
	assert.ErrorIs(t, d.SetMode(bg, ModeSync), ErrClosed)
}

// TestSetModeSameModeIsNoOp pins SetMode's "Setting the mode the
// dispatcher is in switches nothing: SetMode returns nil at once, waits for
// and cancels nothing, and the observer is not told". In Sync, a caller
// sleeps out its own call's retry backoff; a SetMode(ModeSync) re-asserting
// the gate (a config reload) has nothing of the workers' to drain, and must
// neither wait for that backoff nor end the call with ErrFallback.
func TestSetModeSameModeIsNoOp(t *testing.T) {
	bothModes(t, func(t *testing.T, mode Mode) {
		var execs atomic.Int32
		var changes atomic.Int32
		d := newD(t, func(context.Context, string, int) error {
			if execs.Add(1) == 1 {
				return syscall.ECONNRESET // retried once, after 10s
			}
			return nil
		}, Config[string, int]{
			Workers:  1,
			Retry:    RetryPolicy{InitialBackoff: 10 * time.Second, Jitter: JitterNone},
			Rollout:  RolloutPolicy{Mode: mode},
			Observer: &modeLog{f: func(Mode, Mode, string) { changes.Add(1) }},
		})
		done := make(chan *Ticket[string, int], 1)
		submitAside(t, d, "k", 1, done)
		time.Sleep(time.Second)
		require.Equal(t, int32(1), execs.Load(), "the call waits out its backoff")

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		t0 := time.Now()
		require.NoError(t, d.SetMode(ctx, mode))
		assert.Zero(t, time.Since(t0), "SetMode to the current mode returns at once")
		tk := <-done
		if mode == ModeAsync {
			waitAll(tk)
		}
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, StateSucceeded, res.State)
		assert.Equal(t, 2, res.Attempts)
		assert.Zero(t, changes.Load(), "no switch, nothing told")
		closeD(t, d)
	})
}

// TestSetModeDrainLeavesSyncCallersAlone pins SetMode's "a call that a
// Sync-mode caller runs or waits for (its own submission, or a queued call
// it coalesced into) is never cancelled": when the drain's ctx ends, only
// the calls queued before the switch that no Sync caller waits for end
// Canceled with ErrFallback. After the switch, one Sync caller waits
// behind its key's call in flight (a call of its own), and another
// coalesces into a call queued before the switch; both end Succeeded once
// the workers are free, as does the Async waiter of the coalesced call.
func TestSetModeDrainLeavesSyncCallersAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := newGate()
		d := newD(t, func(ctx context.Context, _ string, v int) error {
			if v == 0 {
				return release.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 2})
		runA := submit(t, d, "a", 0, SubmitOptions{}) // in flight, held
		runB := submit(t, d, "b", 0, SubmitOptions{}) // in flight, held
		synctest.Wait()
		behindA := submit(t, d, "a", 1, SubmitOptions{}) // queued behind a's call
		queued := submit(t, d, "q", 1, SubmitOptions{})  // queued: no worker free

		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		switched := make(chan error, 1)
		go func() { switched <- d.SetMode(ctx, ModeSync) }()
		synctest.Wait()
		require.Equal(t, ModeSync, d.Mode())
		inline := make(chan *Ticket[string, int], 2)
		submitAside(t, d, "a", 2, inline) // Sync: coalesces into a's queued call
		submitAside(t, d, "b", 2, inline) // Sync: a call of its own, behind b's
		synctest.Wait()

		time.Sleep(20 * time.Second)
		require.ErrorIs(t, <-switched, context.DeadlineExceeded)
		res, err := queued.Wait(t.Context())
		assert.Equal(t, StateCanceled, res.State)
		require.ErrorIs(t, err, ErrFallback)

		release.open()
		tickets := []*Ticket[string, int]{runA, runB, behindA, <-inline, <-inline}
		waitAll(tickets...)
		assert.Equal(t, map[State]int{StateSucceeded: 5}, tally(t, tickets...))
		closeD(t, d)
	})
}

// TestSetModeDrainWaitsForHandedOverOnly pins awaitDrain's "the calls
// queued before a switch to Sync mode": SetMode returns once those have
// run, though a Sync-mode caller's own call still waits out a retry
// backoff, and a worker may run that retry meanwhile.
func TestSetModeDrainWaitsForHandedOverOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inlineExecs atomic.Int32
		d, _, release := holdWorker(t, func(_ context.Context, k string, _ int) error {
			if k == "inline" && inlineExecs.Add(1) == 1 {
				return syscall.ECONNRESET // retried after 10s
			}
			return nil
		}, Config[string, int]{Retry: RetryPolicy{InitialBackoff: 10 * time.Second, Jitter: JitterNone}})
		queued := submit(t, d, "queued", 0, SubmitOptions{})
		switched := make(chan error, 1)
		go func() { switched <- d.SetMode(t.Context(), ModeSync) }()
		synctest.Wait()
		inline := make(chan *Ticket[string, int], 1)
		submitAside(t, d, "inline", 0, inline)
		synctest.Wait()
		require.Equal(t, int32(1), inlineExecs.Load(), "the Sync caller's call waits out its backoff")

		t0 := time.Now()
		release()
		require.NoError(t, <-switched)
		assert.Zero(t, time.Since(t0), "the drain waited for the Sync caller's backoff")
		assert.Equal(t, StateSucceeded, outcome(t, queued).State)
		assert.Equal(t, StateSucceeded, outcome(t, <-inline).State)
		closeD(t, d)
	})
}

// TestSetModeReassertSyncSparesDrain pins "Setting the mode the dispatcher
// is in ... waits for and cancels nothing": while one SetMode(ModeSync)
// drains the queue, a second one (a config reload re-asserting the gate)
// with a short deadline returns nil at once and leaves the drain to the
// first, which the queued call then completes.
func TestSetModeReassertSyncSparesDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{})
		queued := submit(t, d, "queued", 0, SubmitOptions{})
		switched := make(chan error, 1)
		go func() { switched <- d.SetMode(t.Context(), ModeSync) }()
		synctest.Wait()

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		t0 := time.Now()
		require.NoError(t, d.SetMode(ctx, ModeSync))
		assert.Zero(t, time.Since(t0))
		time.Sleep(time.Minute)
		release()
		require.NoError(t, <-switched)
		assert.Equal(t, StateSucceeded, outcome(t, queued).State, "not cancelled by the re-assertion")
		closeD(t, d)
	})
}

// submitAside submits key from a goroutine of its own, as a Sync-mode
// caller whose Submit returns only once its call has ended, and sends the
// ticket to out.
func submitAside(t *testing.T, d *Dispatcher[string, int], key string, v int, out chan<- *Ticket[string, int]) {
	go func() {
		tk, err := d.Submit(t.Context(), key, v, SubmitOptions{})
		assert.NoError(t, err)
		out <- tk
	}()
}

// TestSetModeDrainTimeoutSparesClose: a SetMode drain whose ctx ends after
// Close began does not cancel what is queued with ErrFallback, a path a
// closed dispatcher has not got: Close runs it, as it promises, until its
// own ctx ends. SetMode still reports its ctx's error.
func TestSetModeDrainTimeoutSparesClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{})
		queued := submit(t, d, "queued", 0, SubmitOptions{})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		switched := make(chan error, 1)
		go func() { switched <- d.SetMode(ctx, ModeSync) }()
		synctest.Wait()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(bg) }()
		synctest.Wait()
		assert.ErrorIs(t, <-switched, context.DeadlineExceeded)
		release()
		require.NoError(t, <-closed)
		res, err := queued.Wait(t.Context())
		assert.NoError(t, err)
		assert.Equal(t, StateSucceeded, res.State, "Close ran the queued call")
	})
}

// TestSetModeOverlapping pins SetMode's drain when the mode is switched
// again before it is over: a SetMode(ModeSync) returns nil only once the
// calls queued before its own switch have ended, whatever other SetMode
// calls do meanwhile — a switch back to ModeAsync (whose workers then run
// those calls) or back to ModeSync again (whose drain waits for more) does
// not let it return early. When its ctx ends, it cancels (ErrFallback)
// those of its calls still queued if the dispatcher is in ModeSync, and
// none if it is back in ModeAsync, where they run; a later switch's calls
// are left to that switch's drain.
func TestSetModeOverlapping(t *testing.T) {
	docSays(t, "Dispatcher.SetMode", "otherwise the workers drain it while SetMode waits, until ctx ends")
	docSays(t, "Dispatcher.SetMode", "Another switch meanwhile ends neither the wait nor its promise: SetMode returns nil only once what was queued before its own switch has ended (back in ModeAsync, the workers run it, and a ctx that ends then cancels nothing).")
	t.Run("back to async", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, release := holdWorker(t, nopExec, Config[string, int]{})
			queued := submit(t, d, "queued", 0, SubmitOptions{})
			first := make(chan error, 1)
			go func() { first <- d.SetMode(t.Context(), ModeSync) }()
			synctest.Wait()
			require.NoError(t, d.SetMode(t.Context(), ModeAsync))
			synctest.Wait()
			select {
			case err := <-first:
				t.Fatalf("SetMode(ModeSync) returned %v before the call queued before it ended", err)
			default:
			}
			release()
			require.NoError(t, <-first)
			assert.Equal(t, StateSucceeded, outcome(t, queued).State)
			closeD(t, d)
		})
	})
	t.Run("sync again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, release := holdWorker(t, nopExec, Config[string, int]{})
			queued := submit(t, d, "queued", 0, SubmitOptions{})
			first, third := make(chan error, 1), make(chan error, 1)
			go func() { first <- d.SetMode(t.Context(), ModeSync) }()
			synctest.Wait()
			require.NoError(t, d.SetMode(t.Context(), ModeAsync))
			later := submit(t, d, "later", 0, SubmitOptions{})
			go func() { third <- d.SetMode(t.Context(), ModeSync) }()
			synctest.Wait()
			for _, ch := range []chan error{first, third} {
				select {
				case err := <-ch:
					t.Fatalf("SetMode(ModeSync) returned %v before the calls queued before it ended", err)
				default:
				}
			}
			release()
			require.NoError(t, <-first)
			require.NoError(t, <-third)
			assert.Equal(t, StateSucceeded, outcome(t, queued).State)
			assert.Equal(t, StateSucceeded, outcome(t, later).State)
			closeD(t, d)
		})
	})
	t.Run("ctx ends back in async", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, release := holdWorker(t, nopExec, Config[string, int]{})
			queued := submit(t, d, "queued", 0, SubmitOptions{})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			first := make(chan error, 1)
			go func() { first <- d.SetMode(ctx, ModeSync) }()
			synctest.Wait()
			require.NoError(t, d.SetMode(t.Context(), ModeAsync))
			require.ErrorIs(t, <-first, context.DeadlineExceeded)
			release()
			assert.Equal(t, StateSucceeded, outcome(t, waitFor(t, queued)).State, "cancelled in ModeAsync")
			closeD(t, d)
		})
	})
	t.Run("ctx ends in sync again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, release := holdWorker(t, nopExec, Config[string, int]{})
			queued := submit(t, d, "queued", 0, SubmitOptions{})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			first, third := make(chan error, 1), make(chan error, 1)
			go func() { first <- d.SetMode(ctx, ModeSync) }()
			synctest.Wait()
			require.NoError(t, d.SetMode(t.Context(), ModeAsync))
			later := submit(t, d, "later", 0, SubmitOptions{})
			go func() { third <- d.SetMode(t.Context(), ModeSync) }()
			require.ErrorIs(t, <-first, context.DeadlineExceeded)
			res, err := queued.Wait(t.Context())
			assert.Equal(t, StateCanceled, res.State)
			require.ErrorIs(t, err, ErrFallback)
			synctest.Wait()
			select {
			case err := <-third:
				t.Fatalf("the last SetMode(ModeSync) returned %v before the call queued before it ended", err)
			default:
			}
			release()
			require.NoError(t, <-third)
			assert.Equal(t, StateSucceeded, outcome(t, later).State, "left to the last switch's drain")
			closeD(t, d)
		})
	})
}
