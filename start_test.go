package dispatch

import (
	"context"
	"fmt"
	"math"
	mrand "math/rand/v2"
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
