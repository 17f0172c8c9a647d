package dispatch

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// throttleAPI answers 429 with a Retry-After hint while throttled, and
// counts requests.
type throttleAPI struct {
	mu        sync.Mutex
	throttled bool
	requests  int
	latency   time.Duration
}

type retryAfterErr struct{ d time.Duration }

func (e retryAfterErr) Error() string             { return "429 too many requests" }
func (e retryAfterErr) RetryAfter() time.Duration { return e.d }

func (a *throttleAPI) exec(ctx context.Context, _ string, _ int) error {
	a.mu.Lock()
	a.requests++
	throttled := a.throttled
	a.mu.Unlock()
	time.Sleep(a.latency)
	if throttled {
		return retryAfterErr{time.Second}
	}
	return nil
}

func (a *throttleAPI) set(throttled bool) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.throttled = throttled
	n := a.requests
	a.requests = 0
	return n
}

// limitLog records the observer's OnLimitChange calls.
type limitLog struct {
	NopObserver
	mu      sync.Mutex
	changes int
	last    int
}

func (l *limitLog) OnLimitChange(from, to int) {
	l.mu.Lock()
	l.changes++
	l.last = to
	l.mu.Unlock()
}

// TestAdaptiveThrottle: a server's Retry-After holds every new execution,
// not only the call that got it, and halves the concurrency limit; the
// limit grows back once the server is healthy. Against a fixed dispatcher
// the throttled window sees far fewer requests.
func TestAdaptiveThrottle(t *testing.T) {
	run := func(adaptiveOn bool) (during int, s Stats, obs *limitLog) {
		synctest.Test(t, func(t *testing.T) {
			api := &throttleAPI{latency: 10 * time.Millisecond}
			obs = &limitLog{}
			cfg := Config[string, int]{
				Workers:  8,
				Retry:    RetryPolicy{MaxAttempts: 100, BudgetRatio: inf},
				Observer: obs,
			}
			if adaptiveOn {
				cfg.Start.Adaptive = &AdaptivePolicy{}
			}
			d := newD(t, api.exec, cfg)
			stop := make(chan struct{})
			var feed sync.WaitGroup
			feed.Go(func() { // 400 calls a second
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(2500 * time.Microsecond):
					}
					_ = d.Post(fmt.Sprint(i), 1, SubmitOptions{})
				}
			})
			time.Sleep(time.Second)
			api.set(true)
			time.Sleep(2 * time.Second)
			during = api.set(false)
			time.Sleep(2 * time.Second)
			close(stop)
			feed.Wait()
			s = d.Stats()
			closeD(t, d)
		})
		return during, s, obs
	}
	fixed, fs, _ := run(false)
	adaptive, as, obs := run(true)
	t.Logf("requests during the 2s throttle: fixed %d, adaptive %d; limit after recovery %d", fixed, adaptive, as.Concurrency)
	assert.Less(t, adaptive, fixed/2, "adaptive sends under half the requests while throttled")
	assert.Equal(t, 8, fs.Concurrency)
	assert.Equal(t, 8, as.Concurrency, "recovered to the full limit")
	assert.Positive(t, obs.changes)
	assert.Equal(t, 8, obs.last)
}

// TestAdaptiveLatency: latency past Tolerance × baseline lowers the limit,
// to no less than MinWorkers.
func TestAdaptiveLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		latency := 10 * time.Millisecond
		d := newD(t, func(context.Context, string, int) error {
			mu.Lock()
			l := latency
			mu.Unlock()
			time.Sleep(l)
			return nil
		}, Config[string, int]{Workers: 8, Start: StartPolicy{Adaptive: &AdaptivePolicy{MinWorkers: 2}}})
		post := func(n int, prefix string) {
			var tks []*Ticket[string, int]
			for i := range n {
				tks = append(tks, submit(t, d, fmt.Sprint(prefix, i), 1, prio(0)))
			}
			waitAll(tks...)
		}
		post(100, "fast")
		assert.Equal(t, 8, d.Stats().Concurrency)
		mu.Lock()
		latency = 100 * time.Millisecond // ten times the baseline
		mu.Unlock()
		post(200, "slow")
		assert.Equal(t, 2, d.Stats().Concurrency, "down to the floor")
		closeD(t, d)
	})
}

// modelServer is an API server modelled for the adaptive limit's tests:
// each request takes a latency drawn from lat, and, if capacity is set,
// stretched by in-flight / capacity when more than capacity requests are
// in flight (a server that queues).
type modelServer struct {
	mu       sync.Mutex
	r        *mrand.Rand
	lat      func(r *mrand.Rand) time.Duration
	capacity int
	inflight int
	served   int
	total    time.Duration // server time summed over requests
}

func (s *modelServer) exec(ctx context.Context, _ string, _ int) error {
	s.mu.Lock()
	s.inflight++
	d := s.lat(s.r)
	if s.capacity > 0 && s.inflight > s.capacity {
		d = d * time.Duration(s.inflight) / time.Duration(s.capacity)
	}
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.inflight--
	s.served++
	s.total += d
	s.mu.Unlock()
	return nil
}

func (s *modelServer) setCapacity(c int) {
	s.mu.Lock()
	s.capacity = c
	s.mu.Unlock()
}

// meanLatency is the server's mean request latency since the last call.
func (s *modelServer) meanLatency() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.served == 0 {
		return 0
	}
	m := s.total / time.Duration(s.served)
	s.served, s.total = 0, 0
	return m
}

func uniform(lo, hi time.Duration) func(*mrand.Rand) time.Duration {
	return func(r *mrand.Rand) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
}

// limitRange records the lowest and the last concurrency limit.
type limitRange struct {
	NopObserver
	mu        sync.Mutex
	low, last int
}

func (l *limitRange) OnLimitChange(_, to int) {
	l.mu.Lock()
	l.low, l.last = min(l.low, to), to
	l.mu.Unlock()
}

// burst submits n calls at once and returns how long they took to end.
func burst(t *testing.T, d *Dispatcher[string, int], prefix string, n int) time.Duration {
	start := time.Now()
	tks := make([]*Ticket[string, int], n)
	for i := range n {
		tks[i] = submit(t, d, prefix+itoa(i), 1, SubmitOptions{})
	}
	waitAll(tks...)
	return time.Since(start)
}

// adaptiveServers are the modelled servers of TestAdaptiveModelledServers
// and of the table in BENCHMARKS.md: latency independent of load with
// three spreads, and a server that queues beyond 4 requests in flight.
var adaptiveServers = []struct {
	name     string
	lat      func(*mrand.Rand) time.Duration
	capacity int
}{
	{"10ms", uniform(10*time.Millisecond, 10*time.Millisecond), 0},
	{"10-20ms", uniform(10*time.Millisecond, 20*time.Millisecond), 0},
	{"2-20ms", uniform(2*time.Millisecond, 20*time.Millisecond), 0},
	{"queues>4", uniform(10*time.Millisecond, 10*time.Millisecond), 4},
}

// TestAdaptiveModelledServers: 4 000 calls, 16
// workers, fixed against adaptive concurrency, on modelled servers
// (synctest: virtual time, so the figures are the model's, not the
// machine's). On a server whose latency varies but does not grow with
// load, adaptive keeps at least 90% of fixed workers' throughput (it used
// to fall to 5–6 workers on 10–20 ms and to 1 on 2–20 ms). On a server that
// queues, the limit falls once a lighter load has shown the server's
// latency, the server's own latency falls with it, and the limit recovers
// to the full worker count once the server has the capacity again. `go
// test -run TestAdaptiveModelledServers -v .` prints the table that
// BENCHMARKS.md shows.
func TestAdaptiveModelledServers(t *testing.T) {
	const calls, workers = 4000, 16
	type row struct {
		elapsed       time.Duration
		low, last     int
		serverLatency time.Duration
	}
	run := func(t *testing.T, i int, adaptiveOn bool) (r row) {
		srv := adaptiveServers[i]
		synctest.Test(t, func(t *testing.T) {
			s := &modelServer{r: mrand.New(mrand.NewPCG(uint64(i), 7)), lat: srv.lat}
			obs := &limitRange{low: workers, last: workers}
			cfg := Config[string, int]{Workers: workers, Capacity: calls, Observer: obs}
			if adaptiveOn {
				cfg.Start.Adaptive = &AdaptivePolicy{}
			}
			d := newD(t, s.exec, cfg)
			// A light load first, one call at a time: what the server
			// does unloaded.
			for k := range 100 {
				burst(t, d, "warm"+itoa(k)+"-", 1)
			}
			s.meanLatency()
			s.setCapacity(srv.capacity)
			r.elapsed = burst(t, d, "storm", calls)
			r.serverLatency = s.meanLatency()
			obs.mu.Lock()
			r.low = obs.low
			obs.mu.Unlock()
			if srv.capacity > 0 {
				// The server scales out: the limit grows back.
				s.setCapacity(workers)
				burst(t, d, "after", calls)
			}
			r.last = d.Stats().Concurrency
			closeD(t, d)
		})
		return r
	}
	t.Logf("%-9s %-9s %10s %10s %6s %6s %10s", "server", "mode", "4000 calls", "calls/s", "low", "final", "server lat")
	for i, srv := range adaptiveServers {
		t.Run(srv.name, func(t *testing.T) {
			fixed := run(t, i, false)
			adaptive := run(t, i, true)
			for _, x := range []struct {
				mode string
				r    row
			}{{"fixed", fixed}, {"adaptive", adaptive}} {
				t.Logf("%-9s %-9s %10v %10.0f %6d %6d %10v", srv.name, x.mode, x.r.elapsed,
					float64(calls)/x.r.elapsed.Seconds(), x.r.low, x.r.last, x.r.serverLatency)
			}
			if srv.capacity == 0 {
				assert.LessOrEqual(t, float64(adaptive.elapsed), float64(fixed.elapsed)/0.9,
					"adaptive throughput under 90%% of fixed: %v against %v", adaptive.elapsed, fixed.elapsed)
				return
			}
			assert.LessOrEqual(t, adaptive.low, 2*srv.capacity, "the limit did not fall on a queueing server")
			assert.Less(t, adaptive.serverLatency, fixed.serverLatency, "the queue stayed in the server")
			assert.LessOrEqual(t, float64(adaptive.elapsed), float64(fixed.elapsed)/0.9, "throughput lost to the smaller limit")
			assert.Equal(t, workers, adaptive.last, "the limit recovers once the server has the capacity")
		})
	}
}

// TestRetryAfterHoldIsTheWorkers: a Retry-After holds the other calls'
// executions on the workers (ModeAsync), but not a ModeSync caller's, who
// is its own concurrency — as ModeSync's doc says.
func TestRetryAfterHoldIsTheWorkers(t *testing.T) {
	docSays(t, "ModeSync", "Tenant in-flight caps do not apply, nor do Config.Start's limits on starting (ReservedWorkers, the adaptive limit and the hold a Retry-After puts on it): the callers are the concurrency.")
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var throttled atomic.Bool
				exec := func(_ context.Context, k string, _ int) error {
					if k == "a" && !throttled.Swap(true) {
						return retryAfterErr{d: 10 * time.Second}
					}
					return nil
				}
				d := newD(t, exec, Config[string, int]{
					Workers:  4,
					Rollout:  RolloutPolicy{Mode: mode},
					Classify: func(error) Class { return ClassRetry },
					Retry:    RetryPolicy{MaxAttempts: 3, MaxBackoff: time.Minute},
					Start:    StartPolicy{Adaptive: &AdaptivePolicy{}},
				})
				go func() { _ = d.Post("a", 1, SubmitOptions{}) }() // in ModeSync, its caller sleeps out the 10s
				synctest.Wait()
				require.True(t, throttled.Load())
				start := time.Now()
				tk, err := d.Submit(bg, "b", 1, SubmitOptions{})
				require.NoError(t, err)
				r, _ := tk.Wait(bg)
				require.Equal(t, StateSucceeded, r.State)
				took := time.Since(start)
				if mode == ModeSync {
					assert.Zero(t, took, "a ModeSync caller is not held")
				} else {
					assert.GreaterOrEqual(t, took, 10*time.Second, "the workers are held for the time asked")
				}
				closeD(t, d)
			})
		})
	}
}

// badHintErr is an error of user code whose methods the dispatcher reads
// panic: its Retry-After, or its Is (errors.Is, errors.As).
type badHintErr struct{ inIs bool }

func (e badHintErr) Error() string { return "bad hint" }
func (e badHintErr) RetryAfter() time.Duration {
	panic("RetryAfter of user code")
}
func (e badHintErr) Is(error) bool {
	if e.inIs {
		panic("Is of user code")
	}
	return false
}

// TestErrorMethodsThatPanic: exec's error is user code too. A method of it
// the dispatcher asks (Is, for SkipCall and timeouts; RetryAfter, for the
// backoff and the adaptive limit's hold) that panics ends the call Failed
// with a *PanicError blaming exec, as a panic in exec does; it neither
// crashes the worker nor wedges the key, and Close returns.
func TestErrorMethodsThatPanic(t *testing.T) {
	for _, inIs := range []bool{false, true} {
		t.Run(fmt.Sprintf("inIs=%v", inIs), func(t *testing.T) {
			for _, mode := range []Mode{ModeAsync, ModeSync} {
				t.Run(mode.String(), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						exec := func(_ context.Context, k string, _ int) error {
							if k == "bad" {
								return badHintErr{inIs: inIs}
							}
							return nil
						}
						d := newD(t, exec, Config[string, int]{
							Workers:  2,
							Rollout:  RolloutPolicy{Mode: mode},
							Classify: func(error) Class { return ClassRetry },
							Retry:    RetryPolicy{MaxAttempts: 3},
							Start:    StartPolicy{Adaptive: &AdaptivePolicy{}},
						})
						tk, err := d.Submit(bg, "bad", 1, SubmitOptions{})
						require.NoError(t, err)
						r, _ := tk.Wait(bg)
						assert.Equal(t, StateFailed, r.State)
						var pe *PanicError
						require.ErrorAs(t, r.Err, &pe)
						assert.Equal(t, "exec", pe.Callback)
						assert.Equal(t, 1, r.Attempts, "a panic is never retried")
						ok, err := d.Submit(bg, "bad2", 1, SubmitOptions{})
						require.NoError(t, err)
						r, _ = ok.Wait(bg)
						assert.Equal(t, StateSucceeded, r.State, "the dispatcher goes on")
						closeD(t, d)
					})
				})
			}
		})
	}
}

// TestMergeErrorMethodsThatPanic: an error Config.Merge or Config.Follow
// returns is user code too: an Is of it that panics (asked, under the
// lock, whether it is SkipIncoming or ReplacePending) refuses the
// submission with ErrMergeRejected and the *PanicError of the callback, as
// a panic in the callback itself does, and the dispatcher goes on.
func TestMergeErrorMethodsThatPanic(t *testing.T) {
	bad := func(int, int) (int, error) { return 0, badHintErr{inIs: true} }
	for _, c := range []struct {
		name string
		cfg  Config[string, int]
	}{
		{"merge", Config[string, int]{Merge: bad}},
		{"follow", Config[string, int]{Follow: func(r, i int, _ bool) (int, error) { return bad(r, i) }}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d, _, release := holdWorker(t, nopExec, c.cfg)
				key := "k"
				if c.name == "follow" {
					key = holdKey // Follow is asked about the running call's key
				} else {
					submit(t, d, key, 1, SubmitOptions{}) // pending behind the held worker
				}
				err := d.Post(key, 2, SubmitOptions{})
				require.ErrorIs(t, err, ErrMergeRejected)
				var pe *PanicError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, c.name, pe.Callback)
				release()
				require.NoError(t, d.Post("other", 3, SubmitOptions{}))
				closeD(t, d)
			})
		})
	}
}
