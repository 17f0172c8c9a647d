package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// tryLimiter is shaped like client-go's flowcontrol.RateLimiter: TryAccept,
// QPS and Wait, here over a rate.Limiter.
type tryLimiter struct{ l *rate.Limiter }

func (t tryLimiter) TryAccept() bool                { return t.l.Allow() }
func (t tryLimiter) QPS() float32                   { return float32(t.l.Limit()) }
func (t tryLimiter) Wait(ctx context.Context) error { return t.l.Wait(ctx) }

// waitLimiter offers only Wait: the dispatcher's fetcher goroutine waits on
// it.
type waitLimiter struct{ l *rate.Limiter }

func (w waitLimiter) Wait(ctx context.Context) error { return w.l.Wait(ctx) }

// allowLimiter offers Wait and Allow: a worker tries Allow, and the
// fetcher waits when it refuses.
type allowLimiter struct{ l *rate.Limiter }

func (a allowLimiter) Allow() bool                    { return a.l.Allow() }
func (a allowLimiter) Wait(ctx context.Context) error { return a.l.Wait(ctx) }

// TestTokenFirst: with a rate limit, a worker takes its token before it
// chooses the call, so a high-priority call that arrives while a backlog of
// low-priority calls waits for tokens runs on the very next token — however
// many workers there are — and no worker sits on a call waiting for a
// token. Each shape of limiter is handled.
func TestTokenFirst(t *testing.T) {
	limiters := map[string]func() RateLimiter{
		"rate.Limiter":       func() RateLimiter { return rate.NewLimiter(10, 1) },
		"TryAccept (client)": func() RateLimiter { return tryLimiter{rate.NewLimiter(10, 1)} },
		"Wait only":          func() RateLimiter { return waitLimiter{rate.NewLimiter(10, 1)} },
		"Wait and Allow":     func() RateLimiter { return allowLimiter{rate.NewLimiter(10, 1)} },
	}
	for name, limiter := range limiters {
		for _, workers := range []int{2, 16} {
			t.Run(fmt.Sprintf("%s/workers=%d", name, workers), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					log := newStartLog()
					d := newD(t, log.exec(time.Millisecond), Config[string, int]{
						Workers:   workers,
						RateLimit: limiter(),
					})
					for i := range 20 {
						require.NoError(t, d.Post(fmt.Sprint("low", i), 1, SubmitOptions{}))
					}
					time.Sleep(250 * time.Millisecond) // a few tokens spent
					synctest.Wait()
					s := d.Stats()
					assert.LessOrEqual(t, s.InFlight, 1, "no worker holds a call waiting for a token")
					submitted := time.Now()
					bind := submit(t, d, "bind", 1, prio(10))
					<-bind.Done()
					start, ok := log.startOf("bind")
					require.True(t, ok)
					assert.LessOrEqual(t, start.Sub(submitted), 100*time.Millisecond, "the next token (10/s) goes to the bind")
					for i := range 20 {
						if st, ok := log.startOf(fmt.Sprint("low", i)); ok && st.After(submitted) {
							assert.False(t, st.Before(start), "low%d took a token before the bind", i)
						}
					}
					closeD(t, d)
				})
			})
		}
	}
}

// TestRateLimiterRefusals: a limiter that can never
// grant a token is an error from New; a slow token rate does not fail calls
// under AttemptTimeout (meant for one execution), nor spend the retry
// budget; and with the retry budget off, nothing retries without limit.
func TestRateLimiterRefusals(t *testing.T) {
	for _, l := range []RateLimiter{rate.NewLimiter(0, 0), rate.NewLimiter(5, 0)} {
		_, err := New(nopExec, Config[string, int]{RateLimit: l})
		assert.ErrorContains(t, err, "Config.RateLimit", "%T", l)
	}
	_, err := New(nopExec, Config[string, int]{RateLimit: rate.NewLimiter(rate.Inf, 0)})
	assert.NoError(t, err, "an infinite rate needs no burst")

	for _, mode := range []Mode{ModeAsync, ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var runs atomic.Int32 // sync-mode execs run on the submitting goroutines
				d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil }, Config[string, int]{
					Rollout:   RolloutPolicy{Mode: mode},
					Workers:   2,
					RateLimit: rate.NewLimiter(2, 1), // a token every 500ms
					Retry:     RetryPolicy{AttemptTimeout: 10 * time.Millisecond, BudgetRatio: inf},
				})
				var tks []*Ticket[string, int]
				var mu sync.Mutex
				var wg sync.WaitGroup
				for i := range 6 {
					wg.Go(func() {
						tk := submit(t, d, fmt.Sprint(i), 1, prio(0))
						mu.Lock()
						tks = append(tks, tk)
						mu.Unlock()
					})
				}
				wg.Wait()
				waitAll(tks...)
				assert.Equal(t, map[State]int{StateSucceeded: 6}, tally(t, tks...))
				assert.Equal(t, int32(6), runs.Load())
				s := closeD(t, d)
				assert.Zero(t, s.Retries)
			})
		})
	}
}

// TestLimiterValidation: New refuses exactly
// the limiters that are not a rate or can grant no token at all, and takes
// every other — among them one that grants its burst and then stops, and a
// nil *rate.Limiter, which means no limit.
func TestLimiterValidation(t *testing.T) {
	var unset *rate.Limiter
	for name, c := range map[string]struct {
		l     RateLimiter
		error string // "" if accepted
	}{
		"NaN rate":              {rate.NewLimiter(rate.Limit(math.NaN()), 1), "is not a rate"},
		"negative rate":         {rate.NewLimiter(-1, 1), "is not a rate"},
		"burst 0":               {rate.NewLimiter(5, 0), "can never grant a token"},
		"rate 0, burst 0":       {rate.NewLimiter(0, 0), "can never grant a token"},
		"NaN QPS (client)":      {tryLimiter{rate.NewLimiter(rate.Limit(math.NaN()), 1)}, "is not a rate"},
		"negative QPS (client)": {tryLimiter{rate.NewLimiter(-2, 1)}, "is not a rate"},
		"rate 0, burst 5":       {rate.NewLimiter(0, 5), ""},
		"QPS 0 (client)":        {tryLimiter{rate.NewLimiter(0, 1)}, ""},
		"infinite, burst 0":     {rate.NewLimiter(rate.Inf, 0), ""},
		"nil *rate.Limiter":     {unset, ""},
	} {
		_, err := New(nopExec, Config[string, int]{RateLimit: c.l})
		if c.error == "" {
			assert.NoError(t, err, name)
			continue
		}
		assert.ErrorContains(t, err, "Config.RateLimit", name)
		assert.ErrorContains(t, err, c.error, name)
	}

	t.Run("nil *rate.Limiter limits nothing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			log := newStartLog()
			d := newD(t, log.exec(time.Second), Config[string, int]{Workers: 20, RateLimit: unset})
			for i := range 20 {
				require.NoError(t, d.Post(fmt.Sprint(i), 1, SubmitOptions{}))
			}
			synctest.Wait()
			assert.Equal(t, 20, d.Stats().InFlight)
			closeD(t, d)
		})
	})
	t.Run("rate 0 grants its burst, then holds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lim := rate.NewLimiter(0, 5)
			d := newD(t, nopExec, Config[string, int]{Workers: 4, RateLimit: lim})
			for i := range 8 {
				require.NoError(t, d.Post(fmt.Sprint(i), 1, SubmitOptions{}))
			}
			time.Sleep(10 * time.Second)
			synctest.Wait()
			assert.Equal(t, uint64(5), d.Stats().Executions, "the burst, and no more")
			lim.SetLimit(100)
			time.Sleep(2 * time.Second)
			synctest.Wait()
			assert.Equal(t, uint64(8), d.Stats().Executions, "the rest, once the limiter grants again")
			closeD(t, d)
		})
	})
}

// TestLimiterPausedAtRunTime: a *rate.Limiter paused
// while calls wait — SetLimit(0), a limit so small that its next token is
// centuries away, SetBurst(0), a NaN limit — holds every execution (it used
// to lift the limit: now + InfDuration overflowed), and once it grants
// again the calls run at its rate within about a second.
func TestLimiterPausedAtRunTime(t *testing.T) {
	for name, pause := range map[string]func(*rate.Limiter){
		"SetLimit(0)":      func(l *rate.Limiter) { l.SetLimit(0) },
		"SetLimit(1e-300)": func(l *rate.Limiter) { l.SetLimit(1e-300) },
		"SetBurst(0)":      func(l *rate.Limiter) { l.SetBurst(0) },
		"SetLimit(NaN)":    func(l *rate.Limiter) { l.SetLimit(rate.Limit(math.NaN())) },
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := rate.NewLimiter(10, 1)
				d := newD(t, nopExec, Config[string, int]{Workers: 20, RateLimit: lim})
				for i := range 20 {
					require.NoError(t, d.Post(fmt.Sprint(i), 1, SubmitOptions{}))
				}
				time.Sleep(150 * time.Millisecond) // two tokens at 10/s
				synctest.Wait()
				before := d.Stats().Executions
				pause(lim)
				time.Sleep(30 * time.Second)
				synctest.Wait()
				paused := d.Stats().Executions - before
				assert.LessOrEqual(t, paused, uint64(1), "ran while paused") // a reservation already due may be spent
				lim.SetLimit(10)
				lim.SetBurst(1)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				assert.Equal(t, uint64(20), d.Stats().Executions, "drained once resumed")
				closeD(t, d)
			})
		})
	}
}

// failingLimiter's Wait fails at once, as a limiter with burst 0 does; it
// counts its calls, and after a million of them blocks until ctx ends, so
// that a dispatcher that spins on it is caught rather than hangs.
type failingLimiter struct{ waits atomic.Int64 }

func (f *failingLimiter) Wait(ctx context.Context) error {
	if f.waits.Add(1) > 1e6 {
		<-ctx.Done()
		return ctx.Err()
	}
	return errors.New("limiter: refused")
}

// TestFailingWaitLimiter: a Wait-only limiter whose
// Wait fails is asked again after a back-off, by the fetcher and by an
// inline (Sync) caller alike: a few dozen Waits in ten seconds, not
// millions; nothing runs without a token, and an inline call ends at its
// deadline.
func TestFailingWaitLimiter(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := &failingLimiter{}
				var runs atomic.Int32
				d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil },
					Config[string, int]{Workers: 2, RateLimit: lim, Rollout: RolloutPolicy{Mode: mode}})
				tk, err := d.Submit(bg, "k", 1, SubmitOptions{Deadline: time.Now().Add(10 * time.Second)})
				require.NoError(t, err)
				<-tk.Done()
				waits := lim.waits.Load()
				assert.Less(t, waits, int64(100), "Wait asked %d times in 10s", waits)
				assert.Zero(t, runs.Load(), "ran without a token")
				r := outcome(t, tk)
				assert.ErrorIs(t, r.Err, ErrExpired)
				closeD(t, d)
			})
		})
	}
}

// countingLimiter can only be waited on; it grants every Wait at once and
// counts them.
type countingLimiter struct{ waits atomic.Int64 }

func (c *countingLimiter) Wait(context.Context) error {
	c.waits.Add(1)
	return nil
}

// TestFetcherFetchesForFreeWorkers: the fetcher of a Wait-only limiter
// fetches tokens for the free workers' ready calls, and none that no free
// worker could spend: with every worker busy and calls waiting, it asks
// the limiter for nothing; as one worker frees up, for one token; in all,
// one token per execution.
func TestFetcherFetchesForFreeWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const workers, queued = 4, 10
		lim := &countingLimiter{}
		release := make(chan struct{})
		d := newD(t, func(context.Context, int, int) error { <-release; return nil },
			Config[int, int]{Workers: workers, RateLimit: lim})
		for k := range workers {
			require.NoError(t, d.Post(k, k, SubmitOptions{}))
		}
		synctest.Wait()
		require.Equal(t, workers, d.Stats().InFlight)
		assert.Equal(t, int64(workers), lim.waits.Load(), "one token per call started")
		for k := workers; k < workers+queued; k++ {
			require.NoError(t, d.Post(k, k, SubmitOptions{}))
		}
		synctest.Wait()
		assert.Equal(t, int64(workers), lim.waits.Load(), "every worker busy: no token fetched for the queued calls")

		release <- struct{}{} // one call ends; its worker starts the next
		synctest.Wait()
		assert.Equal(t, workers, d.Stats().InFlight)
		assert.Equal(t, int64(workers+1), lim.waits.Load(), "one worker free: one token")

		close(release)
		closeD(t, d)
		assert.Equal(t, int64(workers+queued), lim.waits.Load(), "one token per execution, none left over")
	})
}

// gateLimiter grants nothing until opened, then every token: Wait blocks
// until then, and Allow says whether it is open. Both are counted.
type gateLimiter struct {
	opened        chan struct{}
	allows, waits atomic.Int64
}

func (g *gateLimiter) Allow() bool {
	select {
	case <-g.opened:
		g.allows.Add(1)
		return true
	default:
		return false
	}
}

func (g *gateLimiter) Wait(ctx context.Context) error {
	g.waits.Add(1)
	select {
	case <-g.opened:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestAllowBeforeFetcher: a limiter that can be waited on and also offers
// Allow is tried by the worker itself. While Allow refuses, the fetcher
// waits and starts the calls when the wait ends; once Allow grants, every
// execution takes its token from it (or from those held) and the fetcher
// asks nothing more.
//
// Every token taken, by a wait or by Allow, is spent by one execution or
// still held: the fetcher goes on fetching while free workers have ready
// calls, and the workers take tokens by Allow meanwhile, so when the
// calls have all run, up to one per worker may be left held, for the next
// calls (RateLimiter's doc). How many is a race between the fetcher and
// the workers; that the tokens add up is not.
func TestAllowBeforeFetcher(t *testing.T) {
	const workers = 4
	synctest.Test(t, func(t *testing.T) {
		lim := &gateLimiter{opened: make(chan struct{})}
		var runs atomic.Int64
		d := newD(t, func(context.Context, int, int) error { runs.Add(1); return nil },
			Config[int, int]{Workers: workers, RateLimit: lim})
		held := func() int64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			return int64(d.gate.tokens.Held())
		}
		for k := range 5 {
			require.NoError(t, d.Post(k, k, SubmitOptions{}))
		}
		synctest.Wait()
		assert.Zero(t, runs.Load(), "nothing runs before the limiter grants")
		assert.Equal(t, int64(1), lim.waits.Load(), "the fetcher waits once")

		close(lim.opened)
		synctest.Wait()
		require.Equal(t, int64(5), runs.Load())
		waits, allows, held1 := lim.waits.Load(), lim.allows.Load(), held()
		assert.LessOrEqual(t, held1, int64(workers), "tokens held beyond the free workers")
		assert.Equal(t, 5+held1, waits+allows, "one token per execution, by Allow or by a wait, or held")

		for k := 5; k < 25; k++ {
			require.NoError(t, d.Post(k, k, SubmitOptions{}))
			synctest.Wait()
		}
		assert.Equal(t, int64(25), runs.Load())
		held2 := held()
		assert.Equal(t, waits, lim.waits.Load(), "Allow grants: the fetcher waits no more")
		assert.Equal(t, allows+20-(held1-held2), lim.allows.Load(), "one Allow per execution, but for those held")
		assert.Equal(t, 25+held2, lim.waits.Load()+lim.allows.Load(), "one token per execution, or held")
		closeD(t, d)
	})
}

// faultyLimiter is a rate limiter, user code, whose method of the shape
// under test misbehaves — panics, or exits its goroutine as t.FailNow in
// a fake does — on its first call (every call if always), and grants a
// token at once otherwise.
type faultyLimiter struct {
	fault  func()
	always bool
	calls  atomic.Int64
}

func (f *faultyLimiter) call() {
	if f.calls.Add(1) == 1 || f.always {
		f.fault()
	}
}

func (f *faultyLimiter) Wait(context.Context) error { f.call(); return nil }

type (
	faultyAllow struct{ *faultyLimiter } // Allow misbehaves; Wait grants
	faultyTry   struct{ *faultyLimiter } // TryAccept misbehaves; Wait grants
)

func (f faultyAllow) Allow() bool                { f.call(); return true }
func (f faultyAllow) Wait(context.Context) error { return nil }
func (f faultyTry) TryAccept() bool              { f.call(); return true }
func (f faultyTry) QPS() float32                 { return 1 }
func (f faultyTry) Wait(context.Context) error   { return nil }

// limiterFaults are what a faulty limiter does: panic, or exit its
// goroutine.
var limiterFaults = []struct {
	name  string
	fault func()
	value any // the *PanicError's Value
}{
	{"panic", func() { panic("limiter broke") }, "limiter broke"},
	{"goexit", runtime.Goexit, ErrGoexit},
}

// TestLimiterFaults pins that a RateLimiter, user code, may panic or exit
// its goroutine (package documentation, "Callbacks"; RateLimiter) without
// losing an outcome, wedging the key or ending the process: in Wait —
// called by the fetcher goroutine, or by a Sync-mode caller for its own
// token — and in Allow or TryAccept, which a worker calls under the lock.
// Either is counted (Stats.CallbackPanics) and the limiter is asked again
// later: the call gets its token, runs, and Close returns.
func TestLimiterFaults(t *testing.T) {
	shapes := []struct {
		name string
		mode Mode
		lim  func(*faultyLimiter) RateLimiter
	}{
		{"wait/async", ModeAsync, func(f *faultyLimiter) RateLimiter { return f }},
		{"wait/sync", ModeSync, func(f *faultyLimiter) RateLimiter { return f }},
		{"allow", ModeAsync, func(f *faultyLimiter) RateLimiter { return faultyAllow{f} }},
		{"try", ModeAsync, func(f *faultyLimiter) RateLimiter { return faultyTry{f} }},
	}
	for _, sh := range shapes {
		for _, fl := range limiterFaults {
			t.Run(sh.name+"/"+fl.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					done := make(chan Result[string, int], 1)
					d := newD(t, nopExec, Config[string, int]{
						Workers: 1, RateLimit: sh.lim(&faultyLimiter{fault: fl.fault}),
						Rollout: RolloutPolicy{Mode: sh.mode},
						OnDone:  func(r Result[string, int]) { done <- r },
					})
					// A Sync-mode caller that the limiter ends never
					// returns from Submit: the outcome is read from OnDone.
					go func() { _, _ = d.Submit(bg, "k", 1, SubmitOptions{}) }()
					r := <-done
					assert.Equal(t, StateSucceeded, r.State, "%v", r.Err)
					s := closeD(t, d)
					assert.Equal(t, uint64(1), s.CallbackPanics)
					if pe := s.LastCallbackPanic; assert.NotNil(t, pe) {
						assert.Equal(t, "rate_limit", pe.Callback)
						assert.Equal(t, fl.value, pe.Value)
						if sh.mode == ModeSync {
							assert.Contains(t, string(pe.Stack), "inlineToken", "the caller's own Wait")
						}
					}
				})
			})
		}
	}
}

// TestLimiterAlwaysFaulting pins that a RateLimiter whose Wait panics or
// exits its goroutine every time holds every execution, as one whose Wait
// fails does (RateLimiter), and is asked again after a back-off — the
// fetcher that takes an exited one's place included — rather than in a
// spin; a call ends at its deadline, and Close returns.
func TestLimiterAlwaysFaulting(t *testing.T) {
	for _, fl := range limiterFaults {
		t.Run(fl.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := &faultyLimiter{fault: fl.fault, always: true}
				var runs atomic.Int32
				d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil },
					Config[string, int]{Workers: 2, RateLimit: lim})
				tk, err := d.Submit(bg, "k", 1, SubmitOptions{Deadline: time.Now().Add(10 * time.Second)})
				require.NoError(t, err)
				<-tk.Done()
				assert.ErrorIs(t, outcome(t, tk).Err, ErrExpired)
				assert.Zero(t, runs.Load(), "ran without a token")
				calls := lim.calls.Load()
				assert.Less(t, calls, int64(100), "Wait asked %d times in 10s", calls)
				s := closeD(t, d)
				assert.Equal(t, uint64(calls), s.CallbackPanics)
			})
		})
	}
}

// startExitObserver exits the goroutine in its first OnStart, as a fake
// that calls t.FailNow would.
type startExitObserver struct {
	NopObserver
	starts atomic.Int32
}

func (o *startExitObserver) OnStart(Event, int, time.Duration) {
	if o.starts.Add(1) == 1 {
		runtime.Goexit()
	}
}

// TestAbandonedStartKeepsToken: a call sent back to the queue untouched,
// because user code ended the worker's goroutine before the call's
// attempt began (Observer.OnStart, or an earlier call's OnDone told as the
// worker took it), did not execute, so the token its worker took for it is
// not lost: it is held for the next call, and the call runs on it at once
// rather than waiting for the limiter's next token (an hour here). Each
// shape of limiter is handled; no more tokens are taken than executions.
func TestAbandonedStartKeepsToken(t *testing.T) {
	limiters := map[string]func(*rate.Limiter) RateLimiter{
		"rate.Limiter":       func(l *rate.Limiter) RateLimiter { return l },
		"TryAccept (client)": func(l *rate.Limiter) RateLimiter { return tryLimiter{l} },
		"Wait only":          func(l *rate.Limiter) RateLimiter { return waitLimiter{l} },
		"Wait and Allow":     func(l *rate.Limiter) RateLimiter { return allowLimiter{l} },
	}
	for name, limiter := range limiters {
		for _, by := range []string{"OnStart", "OnDone"} {
			t.Run(name+"/"+by, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					keys := []string{"a"} // a token each, from the burst
					cfg := Config[string, int]{Workers: 1}
					switch by {
					case "OnStart":
						cfg.Observer = &startExitObserver{}
					case "OnDone":
						// "a"'s OnDone is told as the worker takes "b".
						keys = append(keys, "b")
						var once atomic.Bool
						cfg.OnDone = func(Result[string, int]) {
							if once.CompareAndSwap(false, true) {
								runtime.Goexit()
							}
						}
					}
					lim := rate.NewLimiter(rate.Every(time.Hour), len(keys))
					cfg.RateLimit = limiter(lim)
					var runs atomic.Int32
					d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil }, cfg)
					start := time.Now()
					var tks []*Ticket[string, int]
					for _, k := range keys {
						tks = append(tks, submit(t, d, k, 1, SubmitOptions{}))
					}
					waitAll(tks...)
					assert.Less(t, time.Since(start), time.Minute, "a call sent back untouched waited for a new token")
					assert.Equal(t, map[State]int{StateSucceeded: len(keys)}, tally(t, tks...))
					assert.Equal(t, int32(len(keys)), runs.Load())
					s := closeD(t, d)
					assert.Equal(t, uint64(1), s.CallbackPanics)
					assert.Equal(t, uint64(len(keys)), s.Executions)
				})
			})
		}
	}
}

// pausableTry is shaped like client-go's flowcontrol.RateLimiter: it
// grants every TryAccept until paused, then none, and reports the QPS it
// is set to, which may be no rate at all (NaN, negative) once running.
type pausableTry struct {
	qps    atomic.Uint32 // float32 bits
	paused atomic.Bool
	tries  atomic.Int64
}

func (p *pausableTry) TryAccept() bool {
	p.tries.Add(1)
	return !p.paused.Load()
}
func (p *pausableTry) QPS() float32                   { return math.Float32frombits(p.qps.Load()) }
func (p *pausableTry) Wait(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

// TestTryLimiterPausedNoSpin: a TryAccept-shaped limiter that grants
// nothing while it reports a QPS that is no rate — 0, NaN or negative, set
// at run time — is paused (RateLimiter): it is asked again about once a
// second, as a paused *rate.Limiter is, not every 100µs; no call runs
// meanwhile, and once it grants again the calls run.
func TestTryLimiterPausedNoSpin(t *testing.T) {
	docSays(t, "RateLimiter", "the dispatcher asks again at least once a second, so a change takes effect within a second and nothing spins.")
	for name, qps := range map[string]float32{
		"QPS 0":        0,
		"QPS NaN":      float32(math.NaN()),
		"QPS negative": -5,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := &pausableTry{}
				lim.qps.Store(math.Float32bits(10))
				var runs atomic.Int32
				d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil },
					Config[string, int]{Workers: 2, RateLimit: lim})
				lim.paused.Store(true)
				lim.qps.Store(math.Float32bits(qps))
				for i := range 5 {
					require.NoError(t, d.Post(fmt.Sprint(i), 1, SubmitOptions{}))
				}
				time.Sleep(10 * time.Second)
				synctest.Wait()
				assert.Zero(t, runs.Load(), "ran while paused")
				tries := lim.tries.Load()
				assert.LessOrEqual(t, tries, int64(30), "TryAccept asked %d times in 10s while paused", tries)
				lim.paused.Store(false)
				time.Sleep(2 * time.Second)
				synctest.Wait()
				assert.Equal(t, int32(5), runs.Load(), "drained once it grants again")
				closeD(t, d)
			})
		})
	}
}

// TestTokenWaitIsQueueWait: the wait for a rate-limiter token comes
// before the execution, in Sync mode (where the caller waits for it) as
// in Async mode (where the call waits in the queue): Outcome.QueueWait
// runs to the execution, after the token, and a call that never got its
// token made no execution, so its QueueWait runs to its end and
// Stats.QueueWait, which counts first executions, does not count it.
func TestTokenWaitIsQueueWait(t *testing.T) {
	docSays(t, "Outcome.QueueWait", "from enqueue to the first execution, or the end")
	bothModes(t, func(t *testing.T, mode Mode) {
		lim := rate.NewLimiter(1, 1)
		require.True(t, lim.Allow()) // the next token in a second
		d := newD(t, nopExec, Config[string, int]{Workers: 1, RateLimit: lim, Rollout: RolloutPolicy{Mode: mode}})
		tk := submit(t, d, "a", 1, SubmitOptions{})
		<-tk.Done()
		r := outcome(t, tk)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, time.Second, r.QueueWait, "waited a second for the token")
		assert.Equal(t, uint64(1), d.Stats().QueueWait.Count)

		// The next token is a second away: past this deadline.
		tk, err := d.Submit(bg, "b", 1, SubmitOptions{Timeout: 500 * time.Millisecond})
		require.NoError(t, err)
		<-tk.Done()
		r = outcome(t, tk)
		assert.ErrorIs(t, r.Err, ErrExpired)
		assert.Zero(t, r.Attempts)
		assert.Equal(t, 500*time.Millisecond, r.QueueWait, "waited to its end, for a token it never got")
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.QueueWait.Count, "one call executed")
		assert.Equal(t, uint64(1), s.Executions)
	})
}

// TestCloseGivesBackReservation: a *rate.Limiter is often shared (a
// client's bucket, another dispatcher). A token the dispatcher reserved for
// a call that Close then ends Closed is given back to it, not spent on
// nothing: once due, the limiter grants it to someone else.
func TestCloseGivesBackReservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := rate.NewLimiter(2, 1) // a token every 500ms
		require.True(t, lim.Allow())
		var runs atomic.Int32
		d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil },
			Config[string, int]{Workers: 1, RateLimit: lim})
		tk := submit(t, d, "a", 1, SubmitOptions{})
		time.Sleep(100 * time.Millisecond) // its token is reserved, due at 500ms
		synctest.Wait()
		ctx, cancel := context.WithCancel(bg)
		cancel()
		require.ErrorIs(t, d.Close(ctx), context.Canceled)
		assert.ErrorIs(t, outcome(t, tk).Err, ErrClosed)
		assert.Zero(t, runs.Load())
		s := checkConservation(t, d)
		assert.Zero(t, s.Executions)
		time.Sleep(400 * time.Millisecond)
		assert.True(t, lim.Allow(), "the token reserved for the closed call is granted to another")
	})
}

// TestWaitTakesChangeWhenItReturns pins what RateLimiter says of a Wait
// under way: a *rate.Limiter paused by SetLimit(0) and resumed holds the
// calls whose token a Wait began to wait for meanwhile — the fetcher's,
// for a wrapper that hides ReserveN, and a Sync-mode caller's without a
// deadline — while the *rate.Limiter itself in Async mode, and a Sync-mode
// caller with a deadline, take the change within a second or so.
func TestWaitTakesChangeWhenItReturns(t *testing.T) {
	docSays(t, "RateLimiter", "A Wait under way is not asked again, though: a limiter waited on — by the dispatcher's goroutine (one with neither ReserveN nor TryAccept), or by a Sync-mode caller (any limiter) — takes a change once its Wait returns.")
	docSays(t, "RateLimiter", "in Async mode give the dispatcher the *rate.Limiter itself, not a wrapper that hides its ReserveN; in Sync mode give calls a deadline (a Wait that would pass it fails at once, and is tried again after a back-off).")
	for _, c := range []struct {
		name    string
		mode    Mode
		wrap    bool          // hide ReserveN: only Wait
		timeout time.Duration // each call's, if any
		resumes bool
	}{
		{"async/rate.Limiter", ModeAsync, false, 0, true},
		{"async/Wait only", ModeAsync, true, 0, false},
		{"sync/no deadline", ModeSync, false, 0, false},
		{"sync/deadline", ModeSync, false, time.Minute, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := rate.NewLimiter(10, 1)
				require.True(t, lim.Allow())
				lim.SetLimit(0) // paused before the calls come
				var l RateLimiter = lim
				if c.wrap {
					l = waitLimiter{lim}
				}
				var runs atomic.Int32
				d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil },
					Config[string, int]{Workers: 4, RateLimit: l, Rollout: RolloutPolicy{Mode: c.mode}})
				ctx, cancel := context.WithCancel(bg)
				var wg sync.WaitGroup
				for i := range 3 {
					wg.Go(func() {
						tk, err := d.Submit(ctx, fmt.Sprint(i), 1, SubmitOptions{Timeout: c.timeout})
						if err == nil {
							<-tk.Done()
						}
					})
				}
				time.Sleep(10 * time.Second)
				synctest.Wait()
				require.Zero(t, runs.Load(), "ran while paused")
				lim.SetLimit(10)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if c.resumes {
					assert.Equal(t, int32(3), runs.Load(), "the change took effect")
				} else {
					assert.Zero(t, runs.Load(), "a Wait under way still sleeps")
				}
				cancel()
				wg.Wait()
				closeD(t, d)
			})
		})
	}
}

// TestAttemptTimeoutExcludesTokenWait: RetryPolicy.AttemptTimeout bounds
// one execution, which begins with its token: a Sync-mode caller's wait
// for it, like a queued call's in Async mode, is not part of the attempt,
// so an exec that honours its context gets the whole AttemptTimeout
// however long the token took.
func TestAttemptTimeoutExcludesTokenWait(t *testing.T) {
	docSays(t, "RetryPolicy.AttemptTimeout", "AttemptTimeout, if set, bounds one execution")
	bothModes(t, func(t *testing.T, mode Mode) {
		lim := rate.NewLimiter(1, 1)
		require.True(t, lim.Allow()) // the next token in a second
		var budget atomic.Int64
		d := newD(t, func(ctx context.Context, _ string, _ int) error {
			if dl, ok := ctx.Deadline(); ok {
				budget.Store(int64(time.Until(dl)))
			}
			time.Sleep(10 * time.Millisecond)
			return ctx.Err()
		}, Config[string, int]{Workers: 1, RateLimit: lim, Rollout: RolloutPolicy{Mode: mode},
			Retry: RetryPolicy{AttemptTimeout: 100 * time.Millisecond, MaxAttempts: 1}})
		tk := submit(t, d, "a", 1, SubmitOptions{})
		<-tk.Done()
		r := outcome(t, tk)
		assert.Equal(t, StateSucceeded, r.State, "%v", r.Err)
		assert.Equal(t, 100*time.Millisecond, time.Duration(budget.Load()), "the execution's own AttemptTimeout")
		closeD(t, d)
	})
}

// TestNoOpTakesNoToken: each execution takes one token (RateLimiter), and
// a call Config.NoOp skips ends without executing: it spends none — the
// token taken for it before the test ran (by the worker before choosing
// it, or by the Sync-mode caller before the attempt began) is held for
// the next call — so a backlog of no-ops does not wait out the rate limit,
// and the calls that execute spend the tokens.
func TestNoOpTakesNoToken(t *testing.T) {
	docSays(t, "Config.NoOp", "NoOp reports a call that would change nothing: it ends Skipped without executing.")
	docSays(t, "RateLimiter", "RateLimiter bounds the rate of executions (Config.RateLimit): each execution takes one token.")
	docSays(t, "RateLimiter", "a call that then does not execute (Config.NoOp skips it) leaves its token to the next call.")
	bothModes(t, func(t *testing.T, mode Mode) {
		lim := rate.NewLimiter(rate.Every(time.Hour), 1) // one token now, the next in an hour
		var runs atomic.Int32
		d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil }, Config[string, int]{
			Workers: 1, RateLimit: lim, Rollout: RolloutPolicy{Mode: mode},
			NoOp: func(_ string, v int) bool { return v == 0 },
		})
		start := time.Now()
		var tks []*Ticket[string, int]
		for i := range 5 {
			tks = append(tks, submit(t, d, fmt.Sprint("noop", i), 0, SubmitOptions{}))
		}
		tks = append(tks, submit(t, d, "real", 1, SubmitOptions{}))
		waitAll(tks...)
		assert.Less(t, time.Since(start), time.Minute, "no-ops waited for tokens")
		assert.Equal(t, map[State]int{StateSkipped: 5, StateSucceeded: 1}, tally(t, tks...))
		assert.Equal(t, int32(1), runs.Load())
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.Executions)
	})
}

// startWaits records what Observer.OnStart is told: each attempt's queue
// wait, and when it was told.
type startWaits struct {
	NopObserver
	mu    sync.Mutex
	waits []time.Duration
	at    []time.Time
}

func (o *startWaits) OnStart(_ Event, _ int, w time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.waits, o.at = append(o.waits, w), append(o.at, time.Now())
}

// TestOnStartAfterToken: Observer.OnStart runs as the attempt is about to
// begin, once its rate-limiter token came, in Sync mode (where the caller
// waits for it) as in Async mode (where the call waits in the queue), so
// the queue wait it is told includes the wait for the token, as
// Outcome.QueueWait and Stats.QueueWait do.
func TestOnStartAfterToken(t *testing.T) {
	docSays(t, "Observer.OnStart", "OnStart runs as an attempt is about to begin, on the goroutine that executes it, once the attempt has its rate-limiter token (in Sync mode the caller waits for it first); attempt counts from 1, and queueWait is the call's wait to its first execution, as Outcome.QueueWait and Stats.QueueWait count it: the wait for that token included.")
	bothModes(t, func(t *testing.T, mode Mode) {
		lim := rate.NewLimiter(1, 1)
		require.True(t, lim.Allow()) // the next token in a second
		obs := &startWaits{}
		d := newD(t, nopExec, Config[string, int]{Workers: 1, RateLimit: lim, Observer: obs, Rollout: RolloutPolicy{Mode: mode}})
		start := time.Now()
		tk := submit(t, d, "a", 1, SubmitOptions{})
		<-tk.Done()
		r := outcome(t, tk)
		require.Equal(t, time.Second, r.QueueWait)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		require.Len(t, obs.waits, 1)
		assert.Equal(t, r.QueueWait, obs.waits[0], "OnStart's queue wait")
		assert.Equal(t, time.Second, obs.at[0].Sub(start), "OnStart told before the token came")
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.QueueWait.Count)
		assert.GreaterOrEqual(t, s.QueueWait.P50, time.Second, "Stats.QueueWait")
	})
}

// TestTokenWaitIsNotInFlight: a call waiting for its rate-limiter token is
// not executing: in Sync mode, where its caller waits for the token, as in
// Async mode, where it waits in the queue, Stats counts it Ready, and its
// tenant's Queued, not InFlight; once it executes, InFlight.
func TestTokenWaitIsNotInFlight(t *testing.T) {
	docSays(t, "Stats.Ready", "Ready, Delayed and Successors count calls waiting to start (for a worker, or for a rate-limiter token: in Sync mode the call whose caller waits for its token), out a backoff, and for their key's running call; InFlight, the calls executing, on a worker or inline in a Sync-mode caller.")
	bothModes(t, func(t *testing.T, mode Mode) {
		lim := rate.NewLimiter(1, 1)
		require.True(t, lim.Allow()) // the next token in a second
		release := newGate()
		d := newD(t, func(ctx context.Context, _ string, _ int) error { return release.wait(ctx) },
			Config[string, int]{Workers: 1, RateLimit: lim, Rollout: RolloutPolicy{Mode: mode}})
		done := make(chan *Ticket[string, int], 1)
		go func() { done <- submit(t, d, "a", 1, SubmitOptions{Tenant: "t"}) }()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		s := d.Stats()
		assert.Equal(t, 0, s.InFlight, "waiting for its token")
		assert.Equal(t, 1, s.Ready, "waiting for its token")
		assert.Equal(t, 0, s.Successors)
		assert.Equal(t, TenantStats{Queued: 1, Admitted: 1}, s.Tenants["t"])
		time.Sleep(time.Second)
		synctest.Wait()
		s = d.Stats()
		assert.Equal(t, 1, s.InFlight, "executing")
		assert.Equal(t, 0, s.Ready)
		assert.Equal(t, TenantStats{InFlight: 1, Admitted: 1}, s.Tenants["t"])
		release.open()
		if mode == ModeAsync {
			<-(<-done).Done()
		} else {
			<-done
		}
		closeD(t, d)
	})
}

// TestSyncSpendsHeldToken: a token the dispatcher holds — granted and not
// spent, as when the call a worker took it for did not execute (NoOp) —
// is spent by the next execution in either mode ("such a token is held,
// never dropped, and the next calls spend it"): a Sync-mode call runs on
// it at once rather than waiting for the limiter's next token (an hour
// here). So does a token a *rate.Limiter reserved for a call that ended
// before it was due.
func TestSyncSpendsHeldToken(t *testing.T) {
	docSays(t, "RateLimiter", "such a token is held, never dropped, and the next calls spend it, in either mode. A Sync-mode call spends such a token if the dispatcher holds one (or a reservation that is due)")
	t.Run("held", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lim := rate.NewLimiter(rate.Every(time.Hour), 1) // one token now, the next in an hour
			var runs atomic.Int32
			d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil }, Config[string, int]{
				Workers: 1, RateLimit: lim,
				NoOp: func(_ string, v int) bool { return v == 0 },
			})
			assert.Equal(t, StateSkipped, outcome(t, waitFor(t, submit(t, d, "noop", 0, SubmitOptions{}))).State)
			require.NoError(t, d.SetMode(bg, ModeSync))
			start := time.Now()
			tk := submit(t, d, "real", 1, SubmitOptions{})
			assert.Equal(t, StateSucceeded, outcome(t, tk).State)
			assert.Zero(t, time.Since(start), "the Sync-mode call waited for a new token")
			assert.Equal(t, int32(1), runs.Load())
			closeD(t, d)
		})
	})
	t.Run("reserved", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lim := rate.NewLimiter(rate.Every(time.Second), 1)
			require.True(t, lim.Allow()) // the next token in a second
			var runs atomic.Int32
			d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil },
				Config[string, int]{Workers: 1, RateLimit: lim})
			tk := submit(t, d, "a", 1, SubmitOptions{})
			time.Sleep(100 * time.Millisecond) // its token is reserved, due at 1s
			synctest.Wait()
			tk.Cancel()
			require.NoError(t, d.SetMode(bg, ModeSync))
			time.Sleep(time.Second) // the reserved token is due, and the dispatcher's
			start := time.Now()
			assert.Equal(t, StateSucceeded, outcome(t, submit(t, d, "b", 1, SubmitOptions{})).State)
			assert.Zero(t, time.Since(start), "the Sync-mode call waited for a new token")
			assert.Equal(t, int32(1), runs.Load())
			closeD(t, d)
		})
	})
}

// panicQPS is a TryAccept-shaped limiter whose QPS panics.
type panicQPS struct{ tryLimiter }

func (panicQPS) QPS() float32 { panic("QPS broke") }

// TestLimiterCheckPanics: New checks Config.RateLimit's rate, and the
// limiter is user code (package documentation, "Callbacks"): one whose QPS
// panics there is reported as an error naming the field, as New promises
// of an invalid configuration, not a panic in New's caller.
func TestLimiterCheckPanics(t *testing.T) {
	docSays(t, "New", "An invalid configuration is reported here, never later, with an error naming the field.")
	var d *Dispatcher[string, int]
	var err error
	require.NotPanics(t, func() {
		d, err = New(nopExec, Config[string, int]{RateLimit: panicQPS{tryLimiter{rate.NewLimiter(1, 1)}}})
	})
	assert.Nil(t, d)
	assert.ErrorContains(t, err, "Config.RateLimit")
	assert.ErrorContains(t, err, "QPS broke")
}

// TestSyncAbandonedStartKeepsToken: in Sync mode too, OnStart runs once
// the attempt has its token; an OnStart that ends the caller's goroutine
// sends the call back to the queue untouched, and the token the caller
// took is held for the next execution: the worker that takes the call
// runs it at once rather than waiting for the limiter's next token (an
// hour here). No more tokens are taken than executions.
func TestSyncAbandonedStartKeepsToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := rate.NewLimiter(rate.Every(time.Hour), 1)
		done := make(chan Result[string, int], 1)
		var runs atomic.Int32
		d := newD(t, func(context.Context, string, int) error { runs.Add(1); return nil }, Config[string, int]{
			Workers: 1, RateLimit: lim, Observer: &startExitObserver{},
			Rollout: RolloutPolicy{Mode: ModeSync},
			OnDone:  func(r Result[string, int]) { done <- r },
		})
		start := time.Now()
		go func() { _, _ = d.Submit(bg, "k", 1, SubmitOptions{}) }() // OnStart ends this goroutine
		r := <-done
		assert.Equal(t, StateSucceeded, r.State, "%v", r.Err)
		assert.Less(t, time.Since(start), time.Minute, "a call sent back untouched waited for a new token")
		assert.Equal(t, int32(1), runs.Load())
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.CallbackPanics)
		assert.Equal(t, uint64(1), s.Executions)
	})
}
