package dispatch

import (
	"context"
	"errors"
	"fmt"
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

// The rule for user code (package documentation, "Callbacks"): whatever a
// callback does — panic, exit its goroutine, block, call back in — no
// outcome is lost, no key is wedged, the process lives and Close returns.
// Every test here runs in a synctest bubble, so a hang fails it as a
// deadlock instead of hanging the suite.

// TestCloseFromCallback: Close called from exec, from the completion hook
// and from an observer method, on the dispatcher's own goroutines, returns
// ErrReentrant at once instead of waiting for itself; what was left ends
// Closed, and a later Close from outside waits for everything.
func TestCloseFromCallback(t *testing.T) {
	for _, where := range []string{"exec", "hook", "observer"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var d *Dispatcher[string, int]
				got := make(chan error, 1)
				closeOnce := sync.OnceFunc(func() { got <- d.Close(context.Background()) })
				cfg := Config[string, int]{Workers: 1}
				switch where {
				case "hook":
					cfg.OnDone = func(r Result[string, int]) {
						if r.Key == "k" {
							closeOnce()
						}
					}
				case "observer":
					cfg.Observer = &startHook{f: func(e Event) {
						if e.Label == "k" {
							closeOnce()
						}
					}}
					cfg.Label = func(k string, _ int) string { return k }
				}
				g := newGate()
				d = newD(t, func(ctx context.Context, k string, _ int) error {
					switch {
					case k == "hold":
						return g.wait(ctx)
					case where == "exec" && k == "k":
						closeOnce()
					}
					return nil
				}, cfg)
				hold := submit(t, d, "hold", 1, prio(0))
				synctest.Wait()
				tk := submit(t, d, "k", 1, prio(0))
				queued := submit(t, d, "later", 1, prio(-1))
				g.open()
				require.ErrorIs(t, <-got, ErrReentrant)
				waitAll(hold, tk, queued)
				outcome(t, tk)
				assert.Equal(t, StateClosed, outcome(t, queued).State)
				closeD(t, d)
			})
		})
	}
}

// startHook calls f from OnStart.
type startHook struct {
	NopObserver
	f func(Event)
}

func (s *startHook) OnStart(e Event, _ int, _ time.Duration) { s.f(e) }

// TestSyncSubmitOwnKeyFromExec: in Sync mode, exec submitting for the key
// it is executing would wait for itself: the submission is refused with
// ErrReentrant, and nothing is enqueued. Submitting for another key runs it
// inline, nested.
func TestSyncSubmitOwnKeyFromExec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d *Dispatcher[string, int]
		var own, other error
		d = newD(t, func(_ context.Context, k string, _ int) error {
			if k == "k" {
				own = d.Post("k", 2, SubmitOptions{})
				other = d.Post("other", 2, SubmitOptions{})
			}
			return nil
		}, Config[string, int]{Rollout: RolloutPolicy{Mode: ModeSync}})
		assert.Equal(t, StateSucceeded, outcome(t, submit(t, d, "k", 1, prio(0))).State)
		assert.ErrorIs(t, own, ErrReentrant)
		assert.NoError(t, other)
		s := closeD(t, d)
		assert.Equal(t, uint64(2), s.Outcomes[StateSucceeded])
		assert.Equal(t, uint64(1), s.Rejected)
	})
}

// TestSetModeFromExec: SetMode(Sync) from exec on the only worker would
// wait for a drain that needs this very worker: it switches and returns
// ErrReentrant at once, and the queue drains when exec returns.
func TestSetModeFromExec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d *Dispatcher[string, int]
		var err error
		d = newD(t, func(_ context.Context, k string, _ int) error {
			if k == "switch" {
				err = d.SetMode(context.Background(), ModeSync)
			}
			return nil
		}, Config[string, int]{Workers: 1})
		sw := submit(t, d, "switch", 1, prio(1))
		queued := submit(t, d, "queued", 1, prio(0))
		waitAll(sw, queued)
		assert.ErrorIs(t, err, ErrReentrant)
		assert.Equal(t, ModeSync, d.Mode())
		assert.Equal(t, map[State]int{StateSucceeded: 2}, tally(t, sw, queued))
		closeD(t, d)
	})
}

// TestHookAndObserverPanicsOnWorker: a panic in the completion hook or in
// Observer.OnFinish on a worker is contained and counted; the worker lives
// on and every outcome is told.
func TestHookAndObserverPanicsOnWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers:  1,
			OnDone:   func(Result[string, int]) { panic("hook") },
			Observer: &panicky{on: "finish"},
		})
		var tks []*Ticket[string, int]
		for _, k := range []string{"a", "b", "c"} {
			tks = append(tks, submit(t, d, k, 1, prio(0)))
		}
		waitAll(tks...)
		assert.Equal(t, map[State]int{StateSucceeded: 3}, tally(t, tks...))
		s := closeD(t, d)
		assert.Equal(t, uint64(6), s.CallbackPanics)
	})
}

// TestBlockedObserverDoesNotDelayDeadlines: the clock runs no user code, so
// an observer that blocks on what the clock ends (here OnFinish of an
// expired call) delays no other deadline.
func TestBlockedObserverDoesNotDelayDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		g := f.block("hold")
		unblock := make(chan struct{})
		obs := &finishHook{f: func(e Event, o Outcome) {
			if o.State == StateExpired {
				<-unblock
			}
		}}
		d := newD(t, f.exec, Config[string, int]{Workers: 1, Observer: obs})
		hold := submit(t, d, "hold", 1, prio(0))
		synctest.Wait()
		start := time.Now()
		first := submit(t, d, "first", 1, SubmitOptions{Deadline: start.Add(50 * time.Millisecond)})
		second := submit(t, d, "second", 1, SubmitOptions{Deadline: start.Add(100 * time.Millisecond)})
		w := watchDone(first, second)
		time.Sleep(time.Second)
		synctest.Wait()
		at, ok := w.of(second)
		require.True(t, ok, "the second deadline was told while the observer blocked on the first")
		assert.Equal(t, 100*time.Millisecond, at)
		assert.Equal(t, StateExpired, outcome(t, second).State)
		close(unblock)
		g.open()
		waitAll(hold)
		closeD(t, d)
	})
}

// finishHook calls f from OnFinish.
type finishHook struct {
	NopObserver
	f func(Event, Outcome)
}

func (h *finishHook) OnFinish(e Event, o Outcome) { h.f(e, o) }

// TestCallbackPanicsEndTheCall: a panic in the no-op test, the before-retry
// hook or the classifier ends the call Failed with a *PanicError naming the
// callback (the classifier's wraps the error it was judging); nothing is
// retried.
func TestCallbackPanicsEndTheCall(t *testing.T) {
	errAPI := syscall.ECONNRESET
	for _, tc := range []struct {
		cb   string
		cfg  Config[string, int]
		runs int
	}{
		{callbackNoOp, Config[string, int]{NoOp: func(string, int) bool { panic("no-op") }}, 0},
		{callbackBeforeRetry, Config[string, int]{BeforeRetry: func(context.Context, string, int, error) (int, bool, error) { panic("before") }}, 1},
		{callbackClassify, Config[string, int]{Classify: func(error) Class { panic("classify") }}, 1},
	} {
		t.Run(string(tc.cb), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				runs := 0
				cfg := tc.cfg
				cfg.Workers, cfg.Retry = 1, noJitter(3)
				d := newD(t, func(context.Context, string, int) error { runs++; return errAPI }, cfg)
				r := outcome(t, waitFor(t, submit(t, d, "k", 1, prio(0))))
				assert.Equal(t, StateFailed, r.State)
				var pe *PanicError
				require.ErrorAs(t, r.Err, &pe)
				assert.Equal(t, tc.cb, pe.Callback)
				assert.Contains(t, r.Err.Error(), string(tc.cb)+" panicked")
				if tc.cb == callbackClassify {
					assert.ErrorIs(t, r.Err, errAPI, "the error being judged is kept")
				}
				assert.Equal(t, tc.runs, runs)
				closeD(t, d)
			})
		})
	}
}

// TestGoexitInCallbacks: runtime.Goexit in any callback ends only the
// goroutine running it. What the callback interrupted is finished on the
// way out: every outcome is told (the call the callback belonged to ends
// Failed with a *PanicError of Value ErrGoexit where it cannot go on), the
// key is not wedged, a worker is replaced, and Close returns.
func TestGoexitInCallbacks(t *testing.T) {
	exit := func(k string) bool { return k == "exit" }
	goexitOn := func(v int) func(p, in int) (int, error) {
		return func(p, in int) (int, error) {
			if in == v {
				goexit()
			}
			return in, nil
		}
	}
	for _, tc := range []struct {
		name string
		cfg  func(*Config[string, int])
		// drive makes the callback run (from a goroutine it may end, where
		// that is the submitter) and returns the tickets whose outcomes must
		// be told.
		drive func(t *testing.T, e *cbEnv) []*Ticket[string, int]
		want  State // the outcome of those tickets
	}{
		{"no-op", func(c *Config[string, int]) {
			c.NoOp = func(k string, _ int) bool {
				if exit(k) {
					goexit()
				}
				return false
			}
		}, submitExit, StateFailed},
		{"before-retry", func(c *Config[string, int]) {
			c.BeforeRetry = func(_ context.Context, k string, v int, _ error) (int, bool, error) {
				if exit(k) {
					goexit()
				}
				return v, false, nil
			}
		}, submitFailingExit, StateFailed},
		{"classify", func(c *Config[string, int]) {
			c.Classify = func(error) Class { goexit(); return ClassRetry }
		}, submitFailingExit, StateFailed},
		{"on-done", func(c *Config[string, int]) {
			c.OnDone = func(r Result[string, int]) {
				if exit(r.Key) {
					goexit()
				}
			}
		}, submitExit, StateSucceeded},
		{"observer", func(c *Config[string, int]) {
			c.Label = func(k string, _ int) string { return k }
			c.Observer = &finishHook{f: func(e Event, _ Outcome) {
				if exit(e.Label) {
					goexit()
				}
			}}
		}, submitExit, StateSucceeded},
		{"label", func(c *Config[string, int]) {
			c.Label = func(k string, _ int) string {
				if exit(k) {
					goexit()
				}
				return k
			}
		}, func(t *testing.T, e *cbEnv) []*Ticket[string, int] {
			e.inGoroutine(func() { _, _ = e.d.Submit(bg, "exit", 1, SubmitOptions{}) })
			assert.False(t, e.d.Busy("exit"), "nothing was admitted")
			return nil
		}, 0},
		{"merge on submit", func(c *Config[string, int]) { c.Merge = goexitOn(99) },
			func(t *testing.T, e *cbEnv) []*Ticket[string, int] {
				hold := submit(t, e.d, "hold", 1, prio(0))
				synctest.Wait()
				pending := submit(t, e.d, "exit", 1, prio(0))
				e.inGoroutine(func() { _, _ = e.d.Submit(bg, "exit", 99, SubmitOptions{}) })
				e.open()
				return []*Ticket[string, int]{hold, pending}
			}, StateSucceeded},
		{"merge in a retry", func(c *Config[string, int]) { c.Merge = goexitOn(99) },
			func(t *testing.T, e *cbEnv) []*Ticket[string, int] {
				e.failFirst = true
				running := submit(t, e.d, "hold", 1, prio(0)) // fails once, after the gate
				synctest.Wait()
				successor := submit(t, e.d, "hold", 99, prio(0))
				e.open() // the retry merges its successor: the worker exits under the lock
				return []*Ticket[string, int]{running, successor}
			}, StateSucceeded},
		{"amend", nil, func(t *testing.T, e *cbEnv) []*Ticket[string, int] {
			hold := submit(t, e.d, "hold", 1, prio(0))
			synctest.Wait()
			pending := submit(t, e.d, "exit", 1, prio(0))
			e.inGoroutine(func() {
				_, _ = e.d.Amend("exit", func(int) (int, error) { goexit(); return 0, nil })
			})
			e.open()
			return []*Ticket[string, int]{hold, pending}
		}, StateSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config[string, int]{Workers: 1, Retry: noJitter(2)}
				if tc.cfg != nil {
					tc.cfg(&cfg)
				}
				goexits.Store(0)
				e := &cbEnv{gate: newGate()}
				e.d = newD(t, e.exec, cfg)
				tks := tc.drive(t, e)
				waitAll(tks...)
				for _, tk := range tks {
					r := outcome(t, tk)
					assert.Equal(t, tc.want, r.State)
					if tc.want == StateFailed {
						var pe *PanicError
						require.ErrorAs(t, r.Err, &pe)
						assert.ErrorIs(t, pe, ErrGoexit)
					}
				}
				synctest.Wait()
				assert.Equal(t, int32(1), goexits.Load(), "the callback exited its goroutine")
				assert.False(t, e.d.Busy("exit"), "the key is not wedged")
				// The dispatcher goes on, on a replaced worker if need be.
				assert.Equal(t, StateSucceeded, outcome(t, waitFor(t, submit(t, e.d, "after", 1, prio(0)))).State)
				closeD(t, e.d)
			})
		})
	}
}

// cbEnv is TestGoexitInCallbacks' dispatcher: exec of "hold" waits for the
// gate (and fails the first time if failFirst is set); exec of "exit" fails
// the first time if failExit is set.
type cbEnv struct {
	d         *Dispatcher[string, int]
	gate      *gate
	mu        sync.Mutex
	failFirst bool
	failExit  bool
}

func (e *cbEnv) exec(ctx context.Context, k string, _ int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case k == "hold":
		e.mu.Unlock()
		err := e.gate.wait(ctx)
		e.mu.Lock()
		if err == nil && e.failFirst {
			e.failFirst = false
			return syscall.ECONNRESET
		}
		return err
	case k == "exit" && e.failExit:
		e.failExit = false
		return syscall.ECONNRESET
	}
	return nil
}

func (e *cbEnv) open() { e.gate.open() }

// inGoroutine runs f in a goroutine that f may end, and waits for it.
func (e *cbEnv) inGoroutine(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// submitExit submits a call for "exit".
func submitExit(t *testing.T, e *cbEnv) []*Ticket[string, int] {
	return []*Ticket[string, int]{submit(t, e.d, "exit", 1, prio(0))}
}

// submitFailingExit submits a call for "exit" whose first execution fails
// retryably.
func submitFailingExit(t *testing.T, e *cbEnv) []*Ticket[string, int] {
	e.mu.Lock()
	e.failExit = true
	e.mu.Unlock()
	return submitExit(t, e)
}

// goexits counts goexit calls.
var goexits atomic.Int32

// goexit ends the calling goroutine, as t.FailNow does, and counts it.
func goexit() {
	goexits.Add(1)
	runtime.Goexit()
}

func TestGoexitInHookCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers: 1,
			OnDone:  func(r Result[string, int]) { runtime.Goexit() },
		})
		waitFor(t, submit(t, d, "k", 1, prio(0)))
		s := closeD(t, d)
		if s.CallbackPanics != 1 || s.LastCallbackPanic == nil {
			t.Errorf("a hook exited its goroutine: CallbackPanics %d, LastCallbackPanic %v; Stats.CallbackPanics says it counts runtime.Goexit calls", s.CallbackPanics, s.LastCallbackPanic)
		}
	})
}

func TestGoexitInObserverCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers:  1,
			Observer: &finishHook{f: func(Event, Outcome) { runtime.Goexit() }},
		})
		waitFor(t, submit(t, d, "k", 1, prio(0)))
		s := closeD(t, d)
		if s.CallbackPanics != 1 {
			t.Errorf("an observer exited its goroutine: CallbackPanics %d", s.CallbackPanics)
		}
	})
}

// TestHookGoexitBeforeNextCall: a completion hook that exits its goroutine
// on a worker that is about to run the next call (the worker tells the
// previous call's outcome after it has begun the next one) must not wedge
// that call: run registers its Goexit handler only after that delivery, so
// the begun attempt is never settled — the key stays in flight, InFlight
// stays 1 and Close waits forever (synctest reports the deadlock).
func TestHookGoexitBeforeNextCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers: 1,
			OnDone: func(r Result[string, int]) {
				if r.Key == "a" {
					runtime.Goexit()
				}
			},
		})
		a := submit(t, d, "a", 1, prio(1))
		b := submit(t, d, "b", 1, prio(0)) // ready when a ends: the worker begins it, then tells a's hook
		waitFor(t, a)
		synctest.Wait()
		if s := d.Stats(); s.InFlight != 0 || !isDone(b) {
			t.Errorf("after a's hook exited the worker: InFlight %d, b done %v, Pending(b) %v", s.InFlight, isDone(b), d.Busy("b"))
		}
	})
}

func isDone[K comparable, T any](tk *Ticket[K, T]) bool {
	select {
	case <-tk.Done():
		return true
	default:
		return false
	}
}

// TestSyncSubmitFromProbe: in Sync mode, exec of the half-open breaker's
// probe submits for another key. That submission runs inline and waits for
// the breaker to admit it — but the one probe slot is held by the very
// execution making it, which waits for it: a deadlock (synctest reports
// it). The rule for callbacks promises ErrReentrant, or a run, instead of
// a hang.
func TestSyncSubmitFromProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d *Dispatcher[string, int]
		nested := make(chan error, 1)
		d = newD(t, func(_ context.Context, k string, _ int) error {
			switch k {
			case "fail":
				return syscall.ECONNRESET
			case "probe":
				nested <- d.Post("other", 1, SubmitOptions{})
			}
			return nil
		}, Config[string, int]{
			Rollout: RolloutPolicy{Mode: ModeSync},
			Retry:   RetryPolicy{MaxAttempts: 1},
			Breaker: &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: time.Second},
		})
		submit(t, d, "fail", 1, prio(0)) // opens the breaker
		time.Sleep(time.Second)          // half-open: the next execution is the probe
		done := make(chan struct{})
		go func() {
			defer close(done)
			submit(t, d, "probe", 1, prio(0))
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("the probe's nested submission never ended: %+v", d.Stats())
		}
		if err := <-nested; err != nil && !errors.Is(err, ErrReentrant) {
			t.Errorf("nested Post: %v", err)
		}
	})
}

func TestGoexitInLabelCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers: 1,
			Label:   func(string, int) string { runtime.Goexit(); return "" },
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = d.Post("k", 1, SubmitOptions{})
			t.Error("Post returned after its label function exited the goroutine")
		}()
		<-done
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.CallbackPanics, "the label function's Goexit is counted")
		assert.Zero(t, s.Submitted, "nothing was submitted")
	})
}

// exitOn is an observer whose OnSubmit or OnRetry ends its goroutine.
type exitOn struct {
	NopObserver
	submit bool
}

func (o exitOn) OnSubmit(Event, bool) {
	if o.submit {
		runtime.Goexit()
	}
}

func (o exitOn) OnRetry(Event, int, time.Duration, error) {
	if !o.submit {
		runtime.Goexit()
	}
}

// TestSyncObserverGoexitOnTheCaller: in Sync mode the caller runs its call
// inline, and tells the observer on its way: of the submission just before
// the call's first attempt (after the call is taken to run), of the retry
// while it waits out the backoff. The observer exits the caller's goroutine
// there. The call still runs to the end (a worker takes it: the attempt
// that had not begun goes back to the queue, the retry waits there), its
// outcome reaches the hook, and Close returns with nothing left live.
func TestSyncObserverGoexitOnTheCaller(t *testing.T) {
	for _, onSubmit := range []bool{true, false} {
		name := map[bool]string{true: "OnSubmit", false: "OnRetry"}[onSubmit]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var runs atomic.Int32
				done := make(chan Result[string, int], 1)
				d := newD(t, func(context.Context, string, int) error {
					if runs.Add(1) == 1 {
						return syscall.ECONNRESET
					}
					return nil
				}, Config[string, int]{
					Rollout:  RolloutPolicy{Mode: ModeSync},
					Workers:  1,
					Retry:    noJitter(3),
					Observer: exitOn{submit: onSubmit},
					OnDone:   func(r Result[string, int]) { done <- r },
				})
				exited := make(chan struct{})
				go func() {
					defer close(exited)
					_, _ = d.Submit(context.Background(), "k", 1, SubmitOptions{})
					t.Error("Submit returned after the observer exited its goroutine")
				}()
				<-exited
				r := <-done
				assert.Equal(t, StateSucceeded, r.State)
				assert.Equal(t, 2, r.Attempts)
				assert.Equal(t, int32(2), runs.Load())
				s := closeD(t, d)
				assert.Zero(t, s.Live)
				assert.Equal(t, uint64(1), s.CallbackPanics)
			})
		})
	}
}

// trapObserver is an observer one of whose methods (which) misbehaves
// once, as act says: panics, exits its goroutine, blocks until release, or
// calls back into the Dispatcher (Close with a deadline, or Stats and Post).
type trapObserver struct {
	which, act string
	d          *Dispatcher[string, int]
	release    chan struct{}
	fired      atomic.Bool
	closeErr   chan error
}

func (o *trapObserver) hit(m string) {
	if m != o.which || o.fired.Swap(true) {
		return
	}
	switch o.act {
	case "panic":
		panic("trap")
	case "goexit":
		runtime.Goexit()
	case "block":
		<-o.release
	case "close":
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		o.closeErr <- o.d.Close(ctx)
	case "call":
		_ = o.d.Stats()
		_ = o.d.Post("reentrant", 1, SubmitOptions{})
	}
}

func (o *trapObserver) OnSubmit(Event, bool)                     { o.hit("OnSubmit") }
func (o *trapObserver) OnCoalesce(Event)                         { o.hit("OnCoalesce") }
func (o *trapObserver) OnReject(Event, error)                    { o.hit("OnReject") }
func (o *trapObserver) OnStart(Event, int, time.Duration)        { o.hit("OnStart") }
func (o *trapObserver) OnRetry(Event, int, time.Duration, error) { o.hit("OnRetry") }
func (o *trapObserver) OnDrop(Event, Bound)                      { o.hit("OnDrop") }
func (o *trapObserver) OnFinish(Event, Outcome)                  { o.hit("OnFinish") }
func (o *trapObserver) OnModeChange(Mode, Mode, string)          { o.hit("OnModeChange") }
func (o *trapObserver) OnCircuitChange(Circuit, Circuit)         { o.hit("OnCircuitChange") }
func (o *trapObserver) OnLimitChange(int, int)                   { o.hit("OnLimitChange") }

// TestObserverMisbehaves: whichever Observer method panics, exits its
// goroutine, blocks or calls back into the Dispatcher, in either mode, no
// outcome is lost and no key is wedged: Close with a deadline returns with
// nothing live. One that blocks on a goroutine Close waits for (a worker,
// the notifier, a Sync-mode caller running its call or telling of it)
// holds Close past its
// deadline until it returns, as an exec that ignores its context does;
// Close then returns nil if everything drained, else the context's error.
// Close called from one returns
// ErrReentrant there, or does its work on a goroutine it does not wait for.
func TestObserverMisbehaves(t *testing.T) {
	docSays(t, "", "Close, though, waits for a callback that blocks a goroutine Close waits for (a worker, the notifier, a Sync-mode caller running its call or telling of it), past the end of Close's context, as for an exec that ignores its context.")
	docSays(t, "Dispatcher.Close", "(an exec that ignores its context, or a callback blocked on one of those goroutines, holds Close up)")
	methods := []string{"OnSubmit", "OnReject", "OnStart", "OnRetry", "OnDrop", "OnFinish", "OnModeChange", "OnCircuitChange", "OnLimitChange"}
	for _, which := range methods {
		for _, act := range []string{"panic", "goexit", "block", "close", "call"} {
			for _, mode := range []Mode{ModeAsync, ModeSync} {
				t.Run(fmt.Sprintf("%s/%s/%v", which, act, mode), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						o := &trapObserver{which: which, act: act, release: make(chan struct{}), closeErr: make(chan error, 1)}
						var fails atomic.Int32
						d := newD(t, func(ctx context.Context, k string, _ int) error {
							if k == "fail" && fails.Add(1) == 1 {
								return retryAfterErr{10 * time.Millisecond} // a retry, the breaker, the limit
							}
							return nil
						}, Config[string, int]{
							Workers: 2, Capacity: 2, Retry: noJitter(3),
							Breaker:  &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: time.Second},
							Start:    StartPolicy{Adaptive: &AdaptivePolicy{}},
							Observer: o, Rollout: RolloutPolicy{Mode: mode},
						})
						o.d = d
						var wg sync.WaitGroup
						submitter := func(k string, so SubmitOptions) {
							wg.Go(func() { // a Sync-mode Submit runs the call
								if tk, err := d.Submit(context.Background(), k, 1, so); err == nil {
									<-tk.Done()
								}
							})
							synctest.Wait()
						}
						submitter("fail", SubmitOptions{})
						submitter("exp", SubmitOptions{Deadline: time.Now().Add(5 * time.Millisecond), Droppable: true})
						submitter("x", SubmitOptions{Droppable: true}) // refused: no room
						submitter("y", SubmitOptions{Priority: 5})     // sheds a droppable call
						submitter("z", SubmitOptions{Priority: 5})
						time.Sleep(2 * time.Second)
						synctest.Wait()
						wg.Go(func() { _ = d.SetMode(context.Background(), 1-mode) })
						time.Sleep(time.Second)
						synctest.Wait()
						require.True(t, o.fired.Load(), "the workload never reached %s", which)

						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						defer cancel()
						closed := make(chan error, 1)
						go func() { closed <- d.Close(ctx) }()
						time.Sleep(2 * time.Second)
						synctest.Wait()
						var err error
						select {
						case err = <-closed:
						default:
							require.Equal(t, "block", act, "Close did not return by its deadline")
							close(o.release)
							err = <-closed // nil if everything drained before the deadline
						}
						if err != nil {
							assert.ErrorIs(t, err, context.DeadlineExceeded)
						}
						if act == "block" {
							select {
							case <-o.release:
							default:
								close(o.release) // it blocked a goroutine Close does not wait for
							}
						}
						wg.Wait()
						if act == "close" {
							err := <-o.closeErr
							if err != nil && !errors.Is(err, ErrReentrant) {
								assert.ErrorIs(t, err, context.DeadlineExceeded)
							}
						}
						s := checkConservation(t, d)
						assert.Zero(t, s.Live, "live submissions after Close")
						assert.Zero(t, s.Keys, "tracked keys after Close")
						assert.Zero(t, s.InFlight, "in-flight calls after Close")
						if act == "panic" || act == "goexit" {
							assert.Equal(t, uint64(1), s.CallbackPanics)
						}
					})
				})
			}
		}
	}
}

// TestBlockedOnDoneHoldsTheNextCall: a worker tells the completion hooks
// of the call it ended after taking its next call, so an OnDone that
// blocks holds up that call too, while another worker is free, until it
// returns — as the package doc says, for the trip through the lock it
// saves per call.
func TestBlockedOnDoneHoldsTheNextCall(t *testing.T) {
	docSays(t, "", "On a worker, that includes the call it has taken next: a worker tells the completion hooks and observer events of the call it ended after taking its next call, in one trip through the lock, so one that blocks there holds that call up too (no other worker starts it meanwhile)")
	synctest.Test(t, func(t *testing.T) {
		log := newStartLog()
		service := map[string]time.Duration{"long": 20 * time.Millisecond, "x": 10 * time.Millisecond}
		exec := func(ctx context.Context, k string, v int) error {
			return log.exec(service[k])(ctx, k, v)
		}
		hook := make(chan struct{})
		d := newD(t, exec, Config[string, int]{
			Workers: 2,
			OnDone: func(r Result[string, int]) {
				if r.Key == "x" {
					<-hook
				}
			},
		})
		start := time.Now()
		require.NoError(t, d.Post("long", 1, SubmitOptions{}))
		require.NoError(t, d.Post("x", 1, SubmitOptions{}))
		synctest.Wait()
		c := submit(t, d, "c", 1, SubmitOptions{})
		time.Sleep(25 * time.Millisecond) // x ended at 10ms, long at 20ms
		synctest.Wait()
		_, started := log.startOf("c")
		assert.False(t, started, "c waits for x's hook, on the worker that took it")
		s := d.Stats()
		assert.Zero(t, s.Ready, "c was taken")
		assert.Equal(t, 1, s.InFlight, "c counts as running")
		close(hook)
		<-c.Done()
		at, ok := log.startOf("c")
		require.True(t, ok)
		assert.Equal(t, 25*time.Millisecond, at.Sub(start), "c started as x's hook returned")
		closeD(t, d)
	})
}

// TestSetModeFromExecNothingToDrain: SetMode(Sync) from a callback on a
// worker returns ErrReentrant only when it leaves a drain unawaited, as
// its doc says: with Rollout.CancelQueued there is none (the queue is
// cancelled at once), and it returns nil.
func TestSetModeFromExecNothingToDrain(t *testing.T) {
	docSays(t, "Dispatcher.SetMode", "SetMode switches without waiting for the drain (which may need that goroutine) and, if there is one to wait for, returns ErrReentrant.")
	synctest.Test(t, func(t *testing.T) {
		var d *Dispatcher[string, int]
		var err error
		queuedIn := make(chan struct{}) // the switch waits for the call it cancels
		d = newD(t, func(_ context.Context, k string, _ int) error {
			if k == "switch" {
				<-queuedIn
				err = d.SetMode(context.Background(), ModeSync)
			}
			return nil
		}, Config[string, int]{Workers: 1, Rollout: RolloutPolicy{CancelQueued: true}})
		sw := submit(t, d, "switch", 1, prio(1))
		queued := submit(t, d, "queued", 1, prio(0))
		close(queuedIn)
		waitAll(sw, queued)
		assert.NoError(t, err)
		assert.Equal(t, ModeSync, d.Mode())
		assert.Equal(t, map[State]int{StateSucceeded: 1, StateCanceled: 1}, tally(t, sw, queued))
		closeD(t, d)
	})
}
