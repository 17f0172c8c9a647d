package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// The clock's duties are the times the dispatcher must act at without
// anyone asking: a waiter's deadline, a retry's backoff, a rate limiter's
// next token, a server's Retry-After hold, the circuit breaker's cool-down
// and the fallback policy's next check. TestClockDuties sets up every pair
// of them, each due at its own time, in both orders, and checks that each
// one acts at its time: arming the one timer for the earlier duty must
// never lose the later one.

// clockRig is one dispatcher set up with two duties.
type clockRig struct {
	NopObserver
	t  *testing.T
	t0 time.Time
	d  *Dispatcher[string, int]

	mu     sync.Mutex
	starts map[string][]time.Time
	fail   map[string]error // the first attempt of the key fails with it
	block  map[string]bool  // the key's executions wait for release
	modes  []time.Time      // when the mode went to Sync

	release chan struct{}
	tickets map[string]*Ticket[string, int]
	gated   *gatedLimiter // the token duty's limiter, if any
}

func (r *clockRig) exec(ctx context.Context, k string, _ int) error {
	r.mu.Lock()
	r.starts[k] = append(r.starts[k], time.Now())
	n := len(r.starts[k])
	err, block := r.fail[k], r.block[k]
	r.mu.Unlock()
	if block {
		<-r.release
	}
	if n == 1 && err != nil {
		return err
	}
	return nil
}

// blockKey holds key's executions until release, and failKey fails its
// first attempt with err; both under mu, since workers may be executing
// other keys meanwhile.
func (r *clockRig) blockKey(key string) {
	r.mu.Lock()
	r.block[key] = true
	r.mu.Unlock()
}

func (r *clockRig) failKey(key string, err error) {
	r.mu.Lock()
	r.fail[key] = err
	r.mu.Unlock()
}

// startsOf returns the times key's executions started.
func (r *clockRig) startsOf(key string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.starts[key]...)
}

func (r *clockRig) OnModeChange(_, to Mode, _ string) {
	if to == ModeSync {
		r.mu.Lock()
		r.modes = append(r.modes, time.Now())
		r.mu.Unlock()
	}
}

// gatedLimiter grants nothing before open and everything from then on; a
// worker that asks early is told when to come back, in the limiter's own
// shape: a reservation due at open, or a QPS whose interval ends at open.
type gatedLimiter struct {
	polled bool
	mu     sync.Mutex // shut runs on the test's goroutine while workers ask
	open   time.Time
	every  time.Duration
	closed *rate.Limiter // before open: one token per every, none left
	free   *rate.Limiter
}

func newGatedLimiter(polled bool, every time.Duration) *gatedLimiter {
	return &gatedLimiter{polled: polled, every: every, free: rate.NewLimiter(rate.Inf, 1)}
}

// shut closes the gate until every from now.
func (g *gatedLimiter) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.open = now.Add(g.every)
	g.closed = rate.NewLimiter(rate.Every(g.every), 1)
	g.closed.AllowN(now, 1)
}

func (g *gatedLimiter) isOpen(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed == nil || !now.Before(g.open)
}

// gate returns the limiter in force and when the gate opens.
func (g *gatedLimiter) gate() (*rate.Limiter, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed, g.open
}

func (g *gatedLimiter) Wait(ctx context.Context) error { return errors.New("not waited on") }

// reservingLimiter and pollingLimiter give the dispatcher one shape each.
type (
	reservingLimiter struct{ *gatedLimiter }
	pollingLimiter   struct{ *gatedLimiter }
)

func (g reservingLimiter) ReserveN(t time.Time, n int) *rate.Reservation {
	if g.isOpen(t) {
		return g.free.ReserveN(t, n)
	}
	closed, _ := g.gate()
	return closed.ReserveN(t, n)
}

func (g pollingLimiter) TryAccept() bool { return g.isOpen(time.Now()) }

// QPS says to come back exactly when the gate opens: the dispatcher tries
// again one token interval after a refusal.
func (g pollingLimiter) QPS() float32 {
	if now := time.Now(); !g.isOpen(now) {
		_, open := g.gate()
		return float32(time.Second) / float32(open.Sub(now))
	}
	return 1000
}

// duty is one thing the clock must do at a time: its configuration, how to
// make it due at t0+at, and what it blocks.
type duty struct {
	name string
	// phase orders the setup: a duty whose setup needs an execution goes
	// before the duties that would hold that execution back.
	phase int
	// gates reports whether the duty keeps every other execution from
	// starting before it is due.
	gates bool
	cfg   func(c *Config[string, int], at time.Duration)
	arm   func(r *clockRig, at time.Duration)
	// check asserts the duty acted on time; startBy is when an execution
	// it needs may start at the earliest (its own time, or a gate's).
	check func(r *clockRig, at time.Duration, startBy time.Time)
}

var errOnce = errors.New("fails once")

// urgent is the priority of the rigs' reserved workers.
const urgent = 100

func clockDuties() []duty {
	return []duty{{
		name: "deadline",
		cfg:  func(*Config[string, int], time.Duration) {},
		arm: func(r *clockRig, at time.Duration) {
			r.blockKey("dl")
			require.NoError(r.t, r.d.Post("dl", 1, SubmitOptions{}))
			synctest.Wait() // running, held
			ctx, cancel := context.WithDeadline(bg, r.t0.Add(at))
			r.t.Cleanup(cancel)
			tk, err := r.d.Submit(ctx, "dl", 2, SubmitOptions{})
			require.NoError(r.t, err)
			r.tickets["dl"] = tk
		},
		check: func(r *clockRig, at time.Duration, _ time.Time) {
			tk := r.tickets["dl"]
			res := outcome(r.t, tk)
			assert.Equal(r.t, StateExpired, res.State, "deadline: the waiter's outcome")
		},
	}, {
		name: "delay",
		cfg: func(c *Config[string, int], at time.Duration) {
			c.Retry.InitialBackoff, c.Retry.Jitter = at, JitterNone
		},
		arm: func(r *clockRig, _ time.Duration) {
			r.failKey("dly", errOnce)
			require.NoError(r.t, r.d.Post("dly", 1, SubmitOptions{}))
			synctest.Wait() // failed once, waiting out its backoff
		},
		check: func(r *clockRig, _ time.Duration, startBy time.Time) {
			s := r.startsOf("dly")
			if assert.Len(r.t, s, 2, "delay: the retry ran") {
				assert.Equal(r.t, startBy, s[1], "delay: the retry started at")
			}
		},
	}, {
		name:  "token (reservation)",
		phase: 3,
		gates: true,
		cfg: func(c *Config[string, int], at time.Duration) {
			c.RateLimit = reservingLimiter{newGatedLimiter(false, at)}
		},
		arm: func(r *clockRig, _ time.Duration) { r.armToken() },
		check: func(r *clockRig, _ time.Duration, startBy time.Time) {
			r.checkStart("tok", startBy)
		},
	}, {
		name:  "token (polled)",
		phase: 3,
		gates: true,
		cfg: func(c *Config[string, int], at time.Duration) {
			c.RateLimit = pollingLimiter{newGatedLimiter(true, at)}
		},
		arm: func(r *clockRig, _ time.Duration) { r.armToken() },
		check: func(r *clockRig, _ time.Duration, startBy time.Time) {
			r.checkStart("tok", startBy)
		},
	}, {
		name:  "hold",
		phase: 1,
		gates: true,
		cfg: func(c *Config[string, int], at time.Duration) {
			c.Start.Adaptive = &AdaptivePolicy{}
			c.Retry.MaxBackoff = time.Hour
		},
		arm: func(r *clockRig, at time.Duration) {
			r.failKey("thr", retryAfterErr{at})
			require.NoError(r.t, r.d.Post("thr", 1, SubmitOptions{}))
			synctest.Wait() // throttled: every other call is held
			// Its own retry would wake a worker at the same time: only the
			// hold is left to.
			require.True(r.t, r.d.Cancel("thr", nil))
			require.NoError(r.t, r.d.Post("held", 1, SubmitOptions{}))
		},
		check: func(r *clockRig, _ time.Duration, startBy time.Time) {
			r.checkStart("held", startBy)
		},
	}, {
		name:  "probe",
		phase: 2,
		gates: true,
		cfg: func(c *Config[string, int], at time.Duration) {
			c.Breaker = &BreakerPolicy{ConsecutiveFailures: 1, FailureRatio: inf, Cooldown: at}
		},
		arm: func(r *clockRig, _ time.Duration) {
			// Any retryable failure opens the circuit: another duty's setup
			// may have done so already, at the same instant.
			if r.d.Stats().Circuit == CircuitClosed {
				r.failKey("brk", errOnce)
				// Urgent, so that a hold does not keep it from failing.
				require.NoError(r.t, r.d.Post("brk", 1, SubmitOptions{Priority: urgent}))
				synctest.Wait()
			}
			require.Equal(r.t, CircuitOpen, r.d.Stats().Circuit)
			require.NoError(r.t, r.d.Post("probe", 1, SubmitOptions{}))
		},
		check: func(r *clockRig, _ time.Duration, startBy time.Time) {
			r.checkStart("probe", startBy)
		},
	}, {
		name: "fallback",
		cfg: func(c *Config[string, int], at time.Duration) {
			c.Rollout.Fallback = &FallbackPolicy{Window: 10 * at, MaxBacklog: 1}
		},
		arm: func(r *clockRig, _ time.Duration) {
			for _, k := range []string{"fb1", "fb2"} {
				r.blockKey(k)
				require.NoError(r.t, r.d.Post(k, 1, SubmitOptions{}))
			}
			synctest.Wait()
			for _, k := range []string{"fb1", "fb2"} {
				require.NoError(r.t, r.d.Post(k, 2, SubmitOptions{})) // waits behind: backlog 2
			}
		},
		check: func(r *clockRig, at time.Duration, _ time.Time) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if assert.NotEmpty(r.t, r.modes, "fallback: no switch to Sync") {
				assert.Equal(r.t, r.t0.Add(at), r.modes[0], "fallback: the check that switched ran at")
			}
		},
	}}
}

// armToken shuts the rig's token gate (its limiter grants the next token
// at the duty's time) and posts the call that waits for it.
func (r *clockRig) armToken() {
	r.gated.shut()
	require.NoError(r.t, r.d.Post("tok", 1, SubmitOptions{}))
}

func (r *clockRig) checkStart(key string, startBy time.Time) {
	r.t.Helper()
	s := r.startsOf(key)
	if assert.NotEmpty(r.t, s, "%s never started", key) {
		assert.Equal(r.t, startBy, s[0], "%s started at", key)
	}
}

func TestClockDuties(t *testing.T) {
	const early, late = 250 * time.Millisecond, 500 * time.Millisecond
	duties := clockDuties()
	for _, a := range duties {
		for _, b := range duties {
			if a.name == b.name || a.gates && b.gates && a.name[:3] == b.name[:3] {
				continue // one limiter at a time
			}
			t.Run(fmt.Sprintf("%s then %s", a.name, b.name), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					runDutyPair(t, a, early, b, late)
				})
			})
		}
	}
}

func runDutyPair(t *testing.T, a duty, atA time.Duration, b duty, atB time.Duration) {
	r := &clockRig{
		t: t, t0: time.Now(), starts: map[string][]time.Time{}, fail: map[string]error{},
		block: map[string]bool{}, release: make(chan struct{}), tickets: map[string]*Ticket[string, int]{},
	}
	cfg := Config[string, int]{
		Workers:  16,
		Classify: func(error) Class { return ClassRetry },
		Retry:    RetryPolicy{BudgetRatio: inf},
		Observer: r,
		// Urgent setup calls pass a hold; the calls a test watches do not.
		Start: StartPolicy{ReservedWorkers: 1, UrgentPriority: urgent},
	}
	a.cfg(&cfg, atA)
	b.cfg(&cfg, atB)
	switch l := cfg.RateLimit.(type) {
	case reservingLimiter:
		r.gated = l.gatedLimiter
	case pollingLimiter:
		r.gated = l.gatedLimiter
	}
	r.d = newD(t, r.exec, cfg)
	first, second := a, b
	atFirst, atSecond := atA, atB
	if b.phase < a.phase {
		first, second, atFirst, atSecond = b, a, atB, atA
	}
	first.arm(r, atFirst)
	second.arm(r, atSecond)
	time.Sleep(atB + time.Second)
	synctest.Wait()

	gateOf := func(d duty, at time.Duration, self duty) time.Time {
		by := r.t0.Add(at)
		for _, o := range []struct {
			d  duty
			at time.Duration
		}{{a, atA}, {b, atB}} {
			if o.d.name != self.name && o.d.gates && r.t0.Add(o.at).After(by) {
				by = r.t0.Add(o.at)
			}
		}
		return by
	}
	a.check(r, atA, gateOf(a, atA, a))
	b.check(r, atB, gateOf(b, atB, b))
	close(r.release)
	closeD(t, r.d)
}

// stallCtx is a Submit context that is never done and lets go slowly: it
// has an AfterFunc method of its own (see context.AfterFunc), and the
// function that unregisters the dispatcher's watch from it — called as the
// ticket is told — waits until release is closed. So it holds whoever
// tells the ticket between ending the call and telling the ticket.
type stallCtx struct {
	context.Context
	done     chan struct{}
	stopping chan struct{} // closed once the watch is being unregistered
	release  chan struct{}
}

func newStallCtx() *stallCtx {
	return &stallCtx{Context: bg, done: make(chan struct{}), stopping: make(chan struct{}), release: make(chan struct{})}
}

func (c *stallCtx) Done() <-chan struct{} { return c.done }

func (c *stallCtx) AfterFunc(func()) func() bool {
	return func() bool {
		close(c.stopping)
		<-c.release
		return true
	}
}

// stalledExpiry sets up a call "k", queued behind a held worker with a
// one-second deadline and a stallCtx, whose OnDone sends on hooks whether
// its ticket had been told; it returns once the clock has ended the call
// and is telling its ticket, held there until unstall. release lets the
// held worker go; unstall is deferred to the test's end too, as Close
// waits for the clock.
func stalledExpiry(t *testing.T, hooks chan bool) (d *Dispatcher[string, int], k *Ticket[string, int], unstall, release func()) {
	t.Helper()
	var tk atomic.Pointer[Ticket[string, int]]
	d, _, release = holdWorker(t, nopExec, Config[string, int]{OnDone: func(r Result[string, int]) {
		if r.Key == "k" {
			_, ok := tk.Load().Result()
			hooks <- ok
		}
	}})
	ctx := newStallCtx()
	unstall = sync.OnceFunc(func() { close(ctx.release) })
	t.Cleanup(unstall)
	k, err := d.Submit(ctx, "k", 1, SubmitOptions{Timeout: time.Second})
	require.NoError(t, err)
	tk.Store(k)
	time.Sleep(time.Second) // the deadline passes: the clock ends the call
	synctest.Wait()
	<-ctx.stopping // the clock is telling the ticket
	return d, k, unstall, release
}

// TestClockTellsBeforeHooks: OnDone fires after its call's waiters were
// told (Config.OnDone), for a call the clock ends too: the clock tells the
// ticket whose deadline passed before the notifier may run the hook, even
// when telling it takes a while.
func TestClockTellsBeforeHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		told := make(chan bool, 1)
		d, k, unstall, release := stalledExpiry(t, told)
		select {
		case <-told:
			t.Fatal("OnDone ran before the clock told its call's ticket")
		default:
		}
		unstall()
		assert.True(t, <-told, "OnDone ran before its call's ticket was told")
		assert.Equal(t, StateExpired, outcome(t, k).State)
		release()
		closeD(t, d)
	})
}
