package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"

	"github.com/coalescer/dispatch/internal/fallback"
	"github.com/coalescer/dispatch/internal/goid"
)

var (
	errChaosRetry     = errors.New("chaos: transient")
	errChaosPerm      = errors.New("chaos: permanent")
	errChaosConflict  = errors.New("chaos: conflict")
	errChaosMerge     = errors.New("chaos: merge refused")
	errChaosKeyCancel = errors.New("chaos: key cancelled")
	errChaosBefore    = errors.New("chaos: before-retry hook failed")
	errChaosAmend     = errors.New("chaos: amend refused")
	errChaosFollow    = errors.New("chaos: follow refused")
)

// chaosPanic is the value of every panic the soak injects, so that a
// *PanicError it did not cause stands out.
type chaosPanic string

// chaosErr is exec's error: it carries the ids of the call that failed, so
// that the classifier knows which call it judges.
type chaosErr struct {
	ids []uint64
	err error
}

func (e *chaosErr) Error() string { return e.err.Error() }
func (e *chaosErr) Unwrap() error { return e.err }

type chaosParams struct {
	keys, hotKeys int
	sideKeys      int // keys only callbacks submit to (see reenter)
	submitters    int
	ops           int // per submitter
	workers       int
	capacity      int
	maxWaiters    int
	step          time.Duration // longest pause between a submitter's ops
	execMax       time.Duration // longest exec latency
	deadlineMax   time.Duration
	closeAfter    time.Duration // Close comes at about this time...
	closeGrace    time.Duration // ...with a context of at most this
	rate          rate.Limit
	burst         int
	waitOnly      bool // the limiter can only be waited on: the fetcher hands out its tokens
	cooldown      time.Duration
	// The fallback policy: Sync when more than maxBacklog calls are queued,
	// checked every fbWindow/10, back to Async after returnAfter (0: never).
	maxBacklog  int
	fbWindow    time.Duration
	returnAfter time.Duration
	// flap lets callbacks switch back to Async and Close the dispatcher;
	// without it they only switch to Sync (the fallback run).
	flap bool
	// quiesce is the tenant-capped fallback run: no Close until every
	// submitter is done and the dispatcher has drained by itself.
	quiesce bool
}

// TestChaosSoak is a seeded random workload: many goroutines submit and post
// to a few hundred keys with random priorities (now and then an extreme one),
// tenants, deadlines, generations and idempotency keys, cancel tickets,
// contexts and keys, amend pending calls, and wait; exec randomly sleeps
// (honouring its context or not), fails (retryable, permanent, conflict);
// a merge function that unions the submissions' ids sometimes refuses and
// sometimes finds the incoming call moot (SkipIncoming) or replaces the
// pending call (ReplacePending); Config.Follow judges each submission made
// while its key's call is in flight against that call: moot, refused, or
// rewritten; a no-op test, a before-retry hook (rebuild, already done,
// failure), a rate limiter (in real time one that can only be waited on,
// whose tokens the dispatcher's fetcher hands out), retries with jitter, a circuit breaker, a
// tenant capped at one execution, two with queue quotas (MaxQueued: one
// configured, one by DefaultTenant, which is forgotten when idle) whose
// submissions often outrank — and so take over — other tenants' pending
// calls, and a fallback policy that switches to Sync on backlog are on;
// and Close comes in the middle of it all with a random grace period.
//
// User code misbehaves, as the package's rule for callbacks allows it to:
//
//   - Every callback panics now and then: exec, the completion hook, every
//     observer method, the label function, the no-op test, the before-retry
//     hook, the classifier, the merge function, Follow and Amend's function.
//   - exec, the completion hook, the observer, the no-op test, the
//     before-retry hook, the classifier and the merge function exit their
//     goroutine (runtime.Goexit) now and then, where the goroutine is one
//     the workload can lose: the dispatcher's own (a worker, the notifier)
//     or a context's, never a submitter's, and never in the middle of a
//     call back into the dispatcher (see mayExit).
//   - exec, the before-retry hook, the completion hook and the observer
//     call back into the dispatcher: Post, Submit, Cancel and Amend for
//     their own key or a side key, Pending, Stats, SetMode; and, near the
//     end, Close, which must return ErrReentrant at once while a later
//     Close from the test's goroutine returns.
//
// It runs three times: in a testing/synctest bubble (virtual time, so the
// sleeps cost nothing), in real time, and as the tenant-capped fallback
// (virtual time). There a burst of calls of the capped tenant trips the
// fallback to Sync while they are queued, submitters go on inline (the
// capped tenant's among them, which ignore the cap and hold it), and once
// they are done everything must finish without Close's help; then the
// tail replays a lost wake-up exactly (a worker that found the tenant
// capped by an inline call went idle, and nothing woke it when that call
// ended), on the same dispatcher.
//
// Every call value is the list of ids of the submissions merged into it, so
// the test can tell where each submission went. It asserts that:
//
//   - every accepted ticket's Done closes, with a valid State whose error
//     matches the state's sentinel, and a Call that contains its own id;
//   - a ticket that succeeded had its id in an execution that returned nil
//     (or that the before-retry hook found done), and that happened before
//     any Ticket.Cancel or Cancel(key) aimed at the ticket returned (no
//     success for a ticket cancelled before its call ran);
//   - never two executions of one key at once, and never more worker
//     executions at once than workers;
//   - a *PanicError is always one the soak injected, names a callback that
//     may end a call (or, refusing a submission, Merge or Follow), and the
//     call it ended never runs again (a panic is never retried);
//   - the completion hook fires once per finished call (its count equals
//     Σ Stats.Calls), and every accepted id appears in exactly one hook
//     result — except one that the merge or Follow found moot on arrival,
//     which ended Skipped alone and appears in none — rejected ids in none;
//   - conservation holds in every snapshot (also those taken in
//     callbacks), gauges stay within their bounds, no tenant has more calls
//     queued than its MaxQueued, the tenants' queued and in-flight counts
//     add up to Ready + Delayed + Successors and InFlight, and after Close:
//     Live, Keys, InFlight, queues all zero, Submitted and Rejected equal
//     what the callers saw, Σ Outcomes equals the accepted submissions,
//     Executions equals the exec calls;
//   - the quotas were at work: queued calls moved to another tenant, and
//     (but in the fallback run, whose submitters are few) submissions were
//     refused or calls evicted for a quota;
//   - Stats.CallbackPanics equals the panics injected into the completion
//     hook, observer methods and the label function (see panicsAgree for
//     the Goexits there);
//   - the heap the dispatcher keeps after Close is small whatever went
//     through it;
//   - nothing panics, nothing hangs (synctest reports a deadlock; a
//     watchdog ends a run that goes on too long with every goroutine's
//     stack), no goroutine leaks (goleak in TestMain).
//
// DISPATCH_CHAOS_SEED replays a seed. Goroutine scheduling is not
// deterministic, so a replay exercises the same workload, not necessarily
// the same interleaving. -short shrinks the workload; DISPATCH_CHAOS_SCALE=n
// multiplies it (a longer soak: the default run takes a few seconds).
func TestChaosSoak(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DISPATCH_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DISPATCH_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	scale := 1.0
	if s := os.Getenv("DISPATCH_CHAOS_SCALE"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			t.Fatalf("DISPATCH_CHAOS_SCALE=%q: want a positive number", s)
		}
		scale = v
	}
	t.Logf("seed %d (DISPATCH_CHAOS_SEED=%d replays it), scale %v", seed, seed, scale)

	virtual := chaosParams{
		keys: 300, hotKeys: 20, sideKeys: 20, submitters: 32, ops: 2000, workers: 8,
		capacity: 150, maxWaiters: 300,
		step: 300 * time.Microsecond, execMax: 2 * time.Millisecond, deadlineMax: 20 * time.Millisecond,
		closeAfter: 400 * time.Millisecond, closeGrace: 20 * time.Millisecond,
		rate: 20000, burst: 20, cooldown: 5 * time.Millisecond,
		maxBacklog: 100, fbWindow: 10 * time.Millisecond, returnAfter: 20 * time.Millisecond, flap: true,
	}
	real := chaosParams{
		keys: 300, hotKeys: 20, sideKeys: 20, submitters: 16, ops: 10000, workers: 8,
		capacity: 150, maxWaiters: 300,
		step: 200 * time.Microsecond, execMax: 300 * time.Microsecond, deadlineMax: 5 * time.Millisecond,
		closeAfter: time.Second, closeGrace: 5 * time.Millisecond,
		rate: 50000, burst: 50, waitOnly: true, cooldown: time.Millisecond,
		maxBacklog: 100, fbWindow: 10 * time.Millisecond, returnAfter: 20 * time.Millisecond, flap: true,
	}
	fallback := chaosParams{
		keys: 150, hotKeys: 10, sideKeys: 10, submitters: 12, ops: 400, workers: 4,
		capacity: 200, maxWaiters: 400,
		step: 300 * time.Microsecond, execMax: 2 * time.Millisecond, deadlineMax: 20 * time.Millisecond,
		rate: 20000, burst: 20, cooldown: 5 * time.Millisecond,
		maxBacklog: 30, fbWindow: 10 * time.Millisecond, quiesce: true,
	}
	for _, p := range []*chaosParams{&virtual, &real, &fallback} {
		if testing.Short() {
			p.keys, p.hotKeys, p.submitters = min(p.keys, 80), min(p.hotKeys, 8), min(p.submitters, 6)
			p.capacity, p.maxWaiters = min(p.capacity, 80), min(p.maxWaiters, 160)
			p.ops /= 4
			p.closeAfter /= 4
		}
		p.ops = int(float64(p.ops) * scale)
		p.closeAfter = time.Duration(float64(p.closeAfter) * scale)
	}
	t.Run("virtual", func(t *testing.T) {
		defer chaosWatchdog("TestChaosSoak/virtual", 2*time.Minute)()
		synctest.Test(t, func(t *testing.T) { newChaos(t, seed, virtual, true).run() })
	})
	t.Run("real", func(t *testing.T) {
		newChaos(t, seed, real, false).run()
	})
	t.Run("fallback", func(t *testing.T) {
		defer chaosWatchdog("TestChaosSoak/fallback", 2*time.Minute)()
		synctest.Test(t, func(t *testing.T) { newChaos(t, seed, fallback, true).run() })
	})
}

// chaosWatchdog ends the process with every goroutine's stack if a run in
// virtual time goes on for limit of real time: synctest reports a deadlock,
// but not a livelock (timers that keep firing), which would hang go test.
func chaosWatchdog(name string, limit time.Duration) (stop func()) {
	tm := time.AfterFunc(limit, func() {
		debug.SetTraceback("all")
		panic(fmt.Sprintf("%s still running after %v of real time: a livelock?", name, limit))
	})
	return func() { tm.Stop() }
}

type chaosTicket struct {
	id        uint64
	key       int
	tk        *Ticket[int, []uint64]
	cancel    context.CancelFunc
	submitted uint64 // event order when Submit returned
	cancelled uint64 // event order when Ticket.Cancel first returned; 0: never
}

type chaosKeyCancel struct {
	key        int
	start, end uint64 // event order before and after Cancel(key)
}

// chaosG is what the soak knows of a goroutine: whether it is one of the
// test's own (a submitter, the closer, the monitor, the test itself), how
// many calls back into the dispatcher it is in the middle of, and which
// submission it is making.
type chaosG struct {
	test       bool
	frames     int
	amending   int    // inside Amend
	submitting uint64 // the id being submitted, 0 if none
}

// chaosInjected counts what the soak made user code do.
type chaosInjected struct {
	panics   [numCallbacks]atomic.Uint64
	goexits  [numCallbacks]atomic.Uint64
	reenter  atomic.Uint64 // calls back into the dispatcher
	setMode  atomic.Uint64
	skipped  atomic.Uint64 // merges that found the incoming call moot
	replaced atomic.Uint64 // merges that made the incoming call a new operation
	// Follow's answers: the incoming call moot, refused, rewritten.
	followSkipped, followRefused, followRewritten atomic.Uint64
	// adopted counts queued calls moved to another tenant: a ready call
	// re-indexed as ready, or a delayed one as delayed, which only adopt
	// does (seen through onTransition).
	adopted atomic.Uint64
	done    atomic.Uint64 // before-retry hooks that found the call done
}

// The callbacks, as indexes into chaosInjected.
var chaosCallbacks = [...]string{callbackExec, callbackMerge, callbackNoOp, callbackLabel, callbackOnDone,
	callbackClassify, callbackBeforeRetry, callbackObserver, callbackAmend, callbackFollow}

// chaosQuotas are the tenants' MaxQueued: "b" is configured with one, and
// "a", named nowhere, has the DefaultTenant's (the tenant of no name is
// configured without one). Their submissions often outrank, and now and
// then replace (ReplacePending), pending calls of other tenants, which
// then move into their tenant: every Stats snapshot must show each of them
// within its quota.
var chaosQuotas = map[string]int{"a": 6, "b": 3}

const numCallbacks = len(chaosCallbacks)

func cbIndex(cb string) int { return slices.Index(chaosCallbacks[:], cb) }

type chaos struct {
	t       *testing.T
	p       chaosParams
	seed    uint64
	virtual bool
	d       *Dispatcher[int, []uint64]

	order   atomic.Uint64 // event order
	nextID  atomic.Uint64
	gens    []atomic.Uint64
	running []atomic.Int32
	errs    atomic.Int32 // violations reported, to cap the noise

	submitted, rejected, execs atomic.Uint64
	trips                      atomic.Uint64 // circuit breaker openings
	switches                   sync.Map      // string → *atomic.Uint64
	workerExecs                atomic.Int32  // executions on workers now
	draws                      atomic.Uint64 // for chance
	inj                        chaosInjected
	// contained counts the panics and Goexits injected into the callbacks
	// whose failure has nowhere else to go (hook, observer, label).
	containedPanics, containedExits atomic.Uint64
	closeReq                        atomic.Bool // a callback is to Close
	cbClose                         chan string // where the callback's Close ran
	start                           time.Time

	gmu sync.Mutex
	gs  map[uint64]*chaosG

	mu         sync.Mutex
	accepted   map[uint64]bool   // accepted submission ids (true: has a ticket)
	okEnd      map[uint64]uint64 // id → event order just before an exec with it returned nil
	hookIDs    map[uint64]int
	hookCalls  int
	hookWaiter int
	keyCancels []chaosKeyCancel
	tickets    []*chaosTicket
	cancels    []context.CancelFunc
	panicked   map[uint64]string // id → the callback whose panic (or Goexit) ended its call
	skippedIn  map[uint64]bool   // ids the merge found moot on arrival
}

func newChaos(t *testing.T, seed uint64, p chaosParams, virtual bool) *chaos {
	return &chaos{
		t: t, p: p, seed: seed, virtual: virtual,
		gens:      make([]atomic.Uint64, p.keys+p.sideKeys+chaosTailKeys),
		running:   make([]atomic.Int32, p.keys+p.sideKeys+chaosTailKeys),
		cbClose:   make(chan string, 1),
		gs:        map[uint64]*chaosG{},
		accepted:  map[uint64]bool{},
		okEnd:     map[uint64]uint64{},
		hookIDs:   map[uint64]int{},
		panicked:  map[uint64]string{},
		skippedIn: map[uint64]bool{},
	}
}

func (c *chaos) errorf(format string, args ...any) {
	c.t.Helper()
	if c.errs.Add(1) <= 20 {
		c.t.Errorf(format, args...)
	}
}

// chance reports true with probability per10k/10000. It draws from a
// counter hashed with the seed: cheap, lock-free, and the same sequence of
// draws for a seed (which callback gets which draw depends on scheduling).
func (c *chaos) chance(per10k uint64) bool {
	x := c.seed + c.draws.Add(0x9e3779b97f4a7c15)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x%10000 < per10k
}

// Goroutines.

// testG registers the calling goroutine as one of the test's own.
func (c *chaos) testG() *chaosG {
	g := &chaosG{test: true}
	c.gmu.Lock()
	c.gs[goid.ID()] = g
	c.gmu.Unlock()
	return g
}

// current returns what is known of the calling goroutine, nil if nothing.
func (c *chaos) current() *chaosG {
	id := goid.ID()
	c.gmu.Lock()
	defer c.gmu.Unlock()
	return c.gs[id]
}

// enter marks the calling goroutine as in the middle of a call back into
// the dispatcher: a callback on it must not end it now, or the soak would
// lose track of that call. The caller defers leave.
func (c *chaos) enter() (*chaosG, uint64) {
	id := goid.ID()
	c.gmu.Lock()
	defer c.gmu.Unlock()
	g := c.gs[id]
	if g == nil {
		g = &chaosG{}
		c.gs[id] = g
	}
	g.frames++
	return g, id
}

func (c *chaos) leave(g *chaosG, id uint64) {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if g.frames--; g.frames == 0 && !g.test {
		delete(c.gs, id)
	}
}

// mayExit reports whether a callback may end the calling goroutine: it is
// not one of the test's own, and not in the middle of a call back into the
// dispatcher (whose outcome the soak must see). That leaves the
// dispatcher's goroutines and those the context package runs AfterFuncs on.
func (c *chaos) mayExit() bool {
	g := c.current()
	return g == nil || (!g.test && g.frames == 0)
}

// onWorker reports whether an execution runs on a worker rather than
// inline, in a Sync-mode submission of the test's or of a callback's (whose
// goroutine is the test's own, or in the middle of a call back in).
func (c *chaos) onWorker() bool { return c.mayExit() }

// Misbehaviour.

// injectPanic panics in callback cb. contained says the dispatcher counts
// it in Stats.CallbackPanics.
func (c *chaos) injectPanic(cb string, contained bool) {
	c.inj.panics[cbIndex(cb)].Add(1)
	if contained {
		c.containedPanics.Add(1)
	}
	panic(chaosPanic(cb))
}

// injectExit ends the calling goroutine from callback cb, if it may (see
// mayExit), and otherwise returns. before runs just before the exit.
func (c *chaos) injectExit(cb string, contained bool, before func()) {
	if !c.mayExit() {
		return
	}
	if before != nil {
		before()
	}
	c.inj.goexits[cbIndex(cb)].Add(1)
	if contained {
		c.containedExits.Add(1)
	}
	runtime.Goexit()
}

// chaosRunning reports whether the calling goroutine has begun an attempt
// (it is inside Dispatcher.run): a hook told there runs on a goroutine
// that executes a call.
func chaosRunning() bool {
	return bytes.Contains(debug.Stack(), []byte(".(*Dispatcher[...]).runRelock("))
}

// ended records that the call with ids was ended by a panic (or Goexit) of
// cb: it must never run again.
func (c *chaos) ended(ids []uint64, cb string) {
	c.mu.Lock()
	for _, id := range ids {
		c.panicked[id] = cb
	}
	c.mu.Unlock()
}

// notAgain checks that no id of a call about to run (in exec, or in the
// before-retry hook) was in a call a panic ended.
func (c *chaos) notAgain(key int, ids []uint64, where string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if cb, ok := c.panicked[id]; ok {
			c.errorf("key %d: %s runs submission %d again after %s panicked in its call", key, where, id, cb)
			return
		}
	}
}

func (c *chaos) run() {
	t, p := c.t, c.p
	me := c.testG()
	heap0 := chaosHeap()
	onTransition = func(from, to callState) {
		if from == to {
			c.inj.adopted.Add(1)
		}
	}
	defer func() { onTransition = nil }()
	var limiter RateLimiter = rate.NewLimiter(p.rate, p.burst)
	if p.waitOnly {
		limiter = waitLimiter{rate.NewLimiter(p.rate, p.burst)}
	}
	d, err := New(c.exec, Config[int, []uint64]{
		Workers:    p.workers,
		RateLimit:  limiter,
		Capacity:   p.capacity,
		MaxWaiters: p.maxWaiters,
		Aging:      time.Millisecond,
		AgingBand:  4,                                                    // the priorities (-3..10 and extremes) span several bands
		Start:      StartPolicy{ReservedWorkers: 1, UrgentPriority: 100}, // the band of the side keys' calls
		Tenants: map[string]TenantConfig{
			"capped": {MaxInFlight: 1, Weight: 2},
			"":       {},
			"b":      {MaxQueued: chaosQuotas["b"], Weight: 3},
		},
		DefaultTenant: TenantConfig{MaxQueued: chaosQuotas["a"]},
		Merge:         c.merge,
		Follow:        c.follow,
		NoOp:          c.noop,
		Label:         c.label,
		OnDone:        c.hook,
		Classify:      c.classify,
		BeforeRetry:   c.beforeRetry,
		Retry:         RetryPolicy{MaxAttempts: 3, InitialBackoff: p.execMax / 4, MaxBackoff: p.execMax},
		Breaker:       &BreakerPolicy{ConsecutiveFailures: 6, Cooldown: p.cooldown, RefuseDroppable: true},
		Rollout:       RolloutPolicy{Fallback: &FallbackPolicy{MaxBacklog: p.maxBacklog, Window: p.fbWindow, ReturnAfter: p.returnAfter}},
		Observer:      chaosObserver{c},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.d = d
	c.start = time.Now()

	var subs, aux sync.WaitGroup
	if p.quiesce {
		// A burst of the capped tenant's calls: one runs, the rest queue,
		// and the backlog trips the fallback to Sync while they wait.
		r := rand.New(rand.NewPCG(c.seed, 1<<33))
		for key := range min(2*p.maxBacklog, p.keys) {
			c.post(me, r, key, SubmitOptions{Tenant: "capped", Generation: c.gens[key].Load()}, false)
		}
	}
	for g := range p.submitters {
		subs.Go(func() { c.submitter(g) })
	}
	closeDone := make(chan struct{})
	if !p.quiesce {
		aux.Go(func() {
			defer close(closeDone)
			c.closer()
		})
	}
	aux.Go(func() { // monitor
		c.testG()
		for {
			select {
			case <-closeDone:
				return
			case <-time.After(4 * p.step):
			}
			c.checkStats(d.Stats(), "monitor")
		}
	})
	waited := make(chan struct{})
	go func() {
		subs.Wait()
		if p.quiesce {
			c.quiesce()
			close(closeDone)
		}
		aux.Wait()
		close(waited)
	}()
	// The monitor's ticks keep virtual time moving, so a deadlock shows
	// here rather than as synctest's.
	limit := 30 * time.Second
	if c.virtual {
		limit = time.Minute // of virtual time: the workload takes well under a second
	}
	select {
	case <-waited:
	case <-time.After(limit):
		s := d.Stats()
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Logf("goroutines:\n%s", buf)
		msg := fmt.Sprintf("workload did not finish in %v (a wedged call? Close hangs?): %+v", limit, s)
		if c.virtual {
			// The bubble cannot end while its goroutines are stuck.
			panic(msg)
		}
		t.Fatal(msg)
	}
	c.verify()
	for _, cancel := range c.cancels {
		cancel()
	}

	// What the dispatcher keeps after Close must not grow with what went
	// through it: drop the test's own records, and weigh what is left.
	c.mu.Lock()
	c.accepted, c.okEnd, c.hookIDs, c.tickets, c.cancels, c.keyCancels, c.panicked, c.skippedIn = nil, nil, nil, nil, nil, nil, nil, nil
	c.mu.Unlock()
	if c.virtual {
		synctest.Wait()
	}
	if grown := chaosHeap() - heap0; grown > chaosHeapBound {
		c.errorf("the heap grew by %d bytes over the run with the dispatcher closed and the test's records dropped (bound %d)", grown, chaosHeapBound)
	} else {
		t.Logf("heap after Close: %+d bytes over the start", grown)
	}
	runtime.KeepAlive(d)
}

// chaosHeapBound bounds what a closed dispatcher may keep: its free lanes
// (a few hundred keys here), histograms, windows and empty indexes.
const chaosHeapBound = 4 << 20

// chaosHeap returns the live heap after a collection.
func chaosHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// closer closes the dispatcher in the middle of the workload. Half the
// time a callback Closes first, on a goroutine Close would wait for, and
// must get ErrReentrant; then the test's goroutine Closes, and must get
// its answer too. Otherwise the test's Close comes first, and a callback
// may Close during its drain.
func (c *chaos) closer() {
	p := c.p
	me := c.testG()
	r := rand.New(rand.NewPCG(c.seed, 1<<32))
	time.Sleep(p.closeAfter/2 + time.Duration(r.Int64N(int64(p.closeAfter))))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(p.closeGrace)+1)))
	defer cancel()
	callbackFirst := r.IntN(2) == 0
	c.closeReq.Store(true)
	if callbackFirst {
		// A call on a side key makes sure something runs soon.
		for i := 0; i < 10 && c.closeReq.Load(); i++ {
			c.post(me, r, p.keys+r.IntN(p.sideKeys), SubmitOptions{Priority: 100}, false)
		}
		select {
		case where := <-c.cbClose:
			c.t.Logf("Close from %s returned ErrReentrant; the test's Close follows", where)
		case <-time.After(5 * time.Second):
			c.errorf("no callback took the request to Close in 5s")
		}
	}
	err := c.d.Close(ctx)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.errorf("Close: %v", err)
	}
	if !callbackFirst {
		select {
		case where := <-c.cbClose:
			c.t.Logf("Close from %s during the test's Close returned ErrReentrant", where)
		default:
			c.closeReq.Store(false)
		}
	}
	s := c.d.Stats()
	if s.Live != 0 || s.Keys != 0 || s.InFlight != 0 || s.Tickets != 0 || s.Ready != 0 || s.Delayed != 0 || s.Successors != 0 {
		c.errorf("right after Close returned: %+v", s)
	}
	c.checkStats(s, "after Close")
}

// quiesce is the end of the tenant-capped fallback run: the submitters are
// done, and with the dispatcher in Sync mode only its workers, draining the
// calls queued before the switch, move anything. Everything must finish
// without Close's help, then Close must drain at once.
func (c *chaos) quiesce() {
	c.testG()
	d := c.d
	s := d.Stats()
	if s.Mode != ModeSync || s.FallbackReason == "" || c.switchCount(fallback.ReasonBacklog) == 0 {
		c.errorf("the fallback did not switch to Sync on backlog, so the run tested nothing: mode %v, reason %q", s.Mode, s.FallbackReason)
	}
	start := time.Now()
	for s.Live != 0 || s.Keys != 0 {
		if time.Since(start) > 5*time.Second {
			c.errorf("stranded: %v after the last submission, nothing more finishes: %+v", time.Since(start), s)
			break
		}
		time.Sleep(c.p.execMax)
		s = d.Stats()
	}
	c.t.Logf("drained %v after the last submission, in %v mode (%s)", time.Since(start), s.Mode, s.FallbackReason)
	c.tail()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		c.errorf("Close after the drain: %v", err)
	}
	s = d.Stats()
	if s.Live != 0 || s.Keys != 0 || s.InFlight != 0 || s.Tickets != 0 {
		c.errorf("right after Close returned: %+v", s)
	}
	c.checkStats(s, "after Close")
}

// chaosTailKeys are the keys of the fallback run's tail, after the side
// keys. Their callbacks behave, so that nothing but the dispatcher's own
// bookkeeping wakes a worker during the tail.
const chaosTailKeys = 64

func (c *chaos) isTail(key int) bool { return key >= c.p.keys+c.p.sideKeys }

// tail replays the lost wake-up of a capped tenant on the fallback run's dispatcher, with
// whatever state the chaos left in it. Back in Async, a burst of the
// capped tenant's calls (2ms each) trips the fallback again: one runs on a
// worker, the rest wait. Then the test's goroutine submits one more call
// of the tenant, which runs inline (5ms), ignoring the cap but holding it.
// The worker whose call ends meanwhile finds the tenant at its cap and
// goes idle; when the inline call ends, something must wake it, or the
// burst stays queued with idle workers, and never drains.
func (c *chaos) tail() {
	d, p := c.d, c.p
	me := c.current() // the quiesce goroutine
	if err := d.SetMode(context.Background(), ModeAsync); err != nil {
		c.errorf("tail: SetMode(Async): %v", err)
		return
	}
	backlogs := c.switchCount(fallback.ReasonBacklog)
	r := rand.New(rand.NewPCG(c.seed, 1<<34))
	first := p.keys + p.sideKeys
	for i := range min(2*p.maxBacklog, chaosTailKeys-1) {
		key := first + 1 + i
		c.post(me, r, key, SubmitOptions{Tenant: "capped", Generation: c.gens[key].Load()}, false)
	}
	for start := time.Now(); c.switchCount(fallback.ReasonBacklog) == backlogs; time.Sleep(p.fbWindow / 20) {
		if time.Since(start) > time.Second {
			c.errorf("tail: the burst did not trip the fallback: %+v", d.Stats())
			return
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	tk, err := c.submitWith(me, ctx, cancel, first, SubmitOptions{Tenant: "capped", Generation: c.gens[first].Load()}, false)
	if err != nil {
		c.errorf("tail: the inline call was refused: %v", err)
		return
	}
	if r, _ := tk.tk.Result(); r.State != StateSucceeded {
		c.errorf("tail: the inline call: %+v", r)
	}
	start := time.Now()
	s := d.Stats()
	for s.Live != 0 || s.Keys != 0 {
		if time.Since(start) > 5*time.Second {
			c.errorf("tail: stranded: the capped tenant's calls queued before the fallback do not run once the inline call that held its cap has ended: %+v", s)
			return
		}
		time.Sleep(p.execMax)
		s = d.Stats()
	}
	c.t.Logf("tail: drained %v after the inline call ended", time.Since(start))
}

func (c *chaos) switchCount(r string) uint64 {
	if n, ok := c.switches.Load(r); ok {
		return n.(*atomic.Uint64).Load()
	}
	return 0
}

func (c *chaos) pickKey(r *rand.Rand) int {
	if r.IntN(2) == 0 {
		return r.IntN(c.p.hotKeys)
	}
	return r.IntN(c.p.keys)
}

// gen mostly gives the key's current generation, sometimes a newer one
// (superseding what is queued), sometimes an older one (stale).
func (c *chaos) gen(r *rand.Rand, key int) uint64 {
	g := c.gens[key].Load()
	switch x := r.IntN(100); {
	case x < 4:
		c.gens[key].CompareAndSwap(g, g+1)
		return g + 1
	case x < 7 && g > 0:
		return g - 1
	}
	return g
}

// chaosPriorities are the extremes a submission sometimes has: the ready
// order must hold them without overflow.
var chaosPriorities = []int{2000000000, 2000001000, -2000000000, math.MaxInt, math.MinInt, math.MaxInt - 1}

func (c *chaos) options(r *rand.Rand, key int) SubmitOptions {
	o := SubmitOptions{
		Priority:   r.IntN(14) - 3,
		Generation: c.gen(r, key),
		Droppable:  r.IntN(4) == 0,
	}
	if r.IntN(50) == 0 {
		o.Priority = chaosPriorities[r.IntN(len(chaosPriorities))]
	}
	switch x := r.IntN(20); {
	case x < 5:
		o.Tenant = "capped"
	case x < 7:
		o.Tenant = "a" // not configured: its state lives while it has calls
	case x < 9:
		o.Tenant = "b"
	}
	if _, quota := chaosQuotas[o.Tenant]; quota && o.Priority < 100 && r.IntN(2) == 0 {
		o.Priority += 4 // to outrank other tenants' pending calls, and take them over
	}
	if r.IntN(10) < 3 {
		o.Deadline = time.Now().Add(time.Duration(r.Int64N(int64(c.p.deadlineMax))))
	}
	if r.IntN(20) == 0 {
		o.IdempotencyKey = "op-" + strconv.Itoa(r.IntN(3))
	}
	return o
}

// rejection records a refused submission. reentrant says ErrReentrant is a
// valid answer: a callback submitted for the key it executes.
func (c *chaos) rejection(what string, err error, reentrant bool) {
	c.rejected.Add(1)
	c.checkRefusal(what, err)
	for _, ok := range []error{ErrBackpressure, ErrClosed, ErrStale, ErrMergeRejected, ErrExpired, ErrCanceled, ErrCircuitOpen} {
		if errors.Is(err, ok) {
			return
		}
	}
	if reentrant && errors.Is(err, ErrReentrant) {
		return
	}
	c.errorf("%s: unexpected error %v", what, err)
}

// checkRefusal checks the error of a refused submission that a callback
// of admission (Merge, Follow) panicked in.
func (c *chaos) checkRefusal(what string, err error) {
	var pe *PanicError
	if !errors.As(err, &pe) {
		return
	}
	c.checkPanicError(pe, what)
	if pe.Callback != callbackMerge && pe.Callback != callbackFollow || !errors.Is(err, ErrMergeRejected) {
		c.errorf("%s: refused by a panic of %q: %v", what, pe.Callback, err)
	}
}

// submit makes a Submit for key from goroutine g and records it; own says
// a callback submits for the key it executes.
func (c *chaos) submit(g *chaosG, r *rand.Rand, key int, own bool) (*chaosTicket, error) {
	o := c.options(r, key)
	ctx, cancel := context.WithCancel(context.Background())
	switch r.IntN(8) {
	case 0:
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(c.p.deadlineMax))))
	case 1:
		ctx = context.WithoutCancel(ctx)
	}
	return c.submitWith(g, ctx, cancel, key, o, own)
}

// submitWith is submit with the context (and its cancel) and options given.
func (c *chaos) submitWith(g *chaosG, ctx context.Context, cancel context.CancelFunc, key int, o SubmitOptions, own bool) (*chaosTicket, error) {
	id := c.nextID.Add(1)
	c.submitted.Add(1)
	prev := g.submitting
	g.submitting = id
	tk, err := c.d.Submit(ctx, key, []uint64{id}, o)
	g.submitting = prev
	after := c.order.Add(1)
	if err != nil {
		cancel()
		c.rejection("Submit", err, own)
		return nil, err
	}
	ct := &chaosTicket{id: id, key: key, tk: tk, cancel: cancel, submitted: after}
	c.mu.Lock()
	c.accepted[id] = true
	c.tickets = append(c.tickets, ct)
	c.cancels = append(c.cancels, cancel)
	c.mu.Unlock()
	return ct, nil
}

// post makes a Post for key from goroutine g and records it.
func (c *chaos) post(g *chaosG, r *rand.Rand, key int, o SubmitOptions, own bool) error {
	id := c.nextID.Add(1)
	c.submitted.Add(1)
	prev := g.submitting
	g.submitting = id
	err := c.d.Post(key, []uint64{id}, o)
	g.submitting = prev
	if err != nil {
		c.rejection("Post", err, own)
		return err
	}
	c.mu.Lock()
	c.accepted[id] = false
	c.mu.Unlock()
	return nil
}

// cancelKey calls Cancel(key) and records when.
func (c *chaos) cancelKey(key int) {
	start := c.order.Add(1)
	c.d.Cancel(key, errChaosKeyCancel)
	end := c.order.Add(1)
	c.mu.Lock()
	c.keyCancels = append(c.keyCancels, chaosKeyCancel{key: key, start: start, end: end})
	c.mu.Unlock()
}

// amend rewrites key's pending call: its ids in reverse order (so the
// no-op test may now find it moot), now and then refusing or panicking.
func (c *chaos) amend(g *chaosG, r *rand.Rand, key int) {
	x := r.IntN(100)
	g.amending++
	_, err := c.d.Amend(key, func(ids []uint64) ([]uint64, error) {
		switch {
		case x < 5:
			c.injectPanic(callbackAmend, false)
		case x < 10:
			return nil, errChaosAmend
		}
		out := slices.Clone(ids)
		slices.Reverse(out)
		return out, nil
	})
	g.amending--
	var pe *PanicError
	switch {
	case err == nil, errors.Is(err, errChaosAmend):
	case errors.As(err, &pe) && (pe.Callback == callbackAmend || pe.Callback == callbackNoOp):
		c.checkPanicError(pe, "Amend")
	default:
		c.errorf("Amend(%d): %v", key, err)
	}
}

func (c *chaos) submitter(gi int) {
	r := rand.New(rand.NewPCG(c.seed, uint64(gi)+1))
	g := c.testG()
	var mine []*chaosTicket
	closedSeen := 0
	for i := 0; i < c.p.ops && closedSeen < 3; i++ {
		if pause := r.Int64N(int64(c.p.step)); pause > 0 {
			time.Sleep(time.Duration(pause))
		}
		key := c.pickKey(r)
		switch x := r.IntN(100); {
		case x < 50: // Submit
			ct, err := c.submit(g, r, key, false)
			if errors.Is(err, ErrClosed) {
				closedSeen++
			}
			if ct != nil {
				mine = append(mine, ct)
			}
		case x < 70: // Post
			if err := c.post(g, r, key, c.options(r, key), false); errors.Is(err, ErrClosed) {
				closedSeen++
			}
		case x < 80: // Ticket.Cancel
			if len(mine) == 0 {
				continue
			}
			ct := mine[r.IntN(len(mine))]
			ct.tk.Cancel()
			if after := c.order.Add(1); ct.cancelled == 0 {
				ct.cancelled = after
			}
		case x < 85: // the submitter's context ends
			if len(mine) == 0 {
				continue
			}
			mine[r.IntN(len(mine))].cancel()
		case x < 88: // Cancel(key)
			c.cancelKey(key)
		case x < 90:
			c.amend(g, r, key)
		case x < 95: // wait a little for one of ours
			if len(mine) == 0 {
				continue
			}
			ct := mine[r.IntN(len(mine))]
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(c.p.execMax))))
			res, err := ct.tk.Wait(ctx)
			cancel()
			if res.State != 0 {
				if err != res.Err {
					c.errorf("Wait returned %v with result error %v", err, res.Err)
				}
				c.checkResult(res, "Wait")
			} else if !errors.Is(err, context.DeadlineExceeded) {
				c.errorf("Wait without a result: %v", err)
			}
		default:
			c.d.Busy(key)
			c.checkStats(c.d.Stats(), "submitter")
		}
	}
}

// reenter calls back into the dispatcher from a callback about key (-1 if
// none). What it may submit keeps every wait acyclic in Sync mode, where a
// submission for a key whose call is running waits for it: a callback
// whose call is on a side key (leaf) submits nothing; other callbacks
// submit to side keys, whose callbacks never wait, and to their own key
// only when ownOK — exec and the before-retry hook (refused with
// ErrReentrant in Sync mode, never waiting), or a completion hook on a
// goroutine that executes nothing.
//
// anyKey says the callback cannot know which key its goroutine executes:
// a completion hook may be told by a worker or an inline caller that has
// just begun its next call (on a side key, say), and a Sync-mode
// submission for that key is refused with ErrReentrant.
func (c *chaos) reenter(r *rand.Rand, key int, where string, leaf, ownOK, anyKey bool) {
	g, id := c.enter()
	defer c.leave(g, id)
	c.inj.reenter.Add(1)
	target, own := c.p.keys+r.IntN(c.p.sideKeys), false
	if key >= 0 && r.IntN(3) == 0 {
		target, own = key, true
	}
	if own && !ownOK {
		target, own = c.p.keys+r.IntN(c.p.sideKeys), false
	}
	submitOwn := own || anyKey
	// A goroutine that executes a call may be running the circuit
	// breaker's half-open probe: a Sync-mode submission from it, for any
	// key, is refused with ErrReentrant (it would wait for the probe).
	probe := chaosRunning() && c.trips.Load() > 0
	submitOwn = submitOwn || probe
	switch x := r.IntN(100); {
	case x < 25:
		if !leaf {
			_ = c.post(g, r, target, c.options(r, target), submitOwn)
		}
	case x < 50:
		if !leaf {
			_, _ = c.submit(g, r, target, submitOwn)
		}
	case x < 60:
		c.cancelKey(target)
	case x < 72:
		c.amend(g, r, target)
	case x < 80:
		c.d.Busy(target)
	case x < 95:
		c.checkStats(c.d.Stats(), where)
	default:
		c.setMode(r, where)
	}
}

// setMode switches the mode from a callback: to Sync, or (with flap) back
// to Async.
func (c *chaos) setMode(r *rand.Rand, where string) {
	if c.p.quiesce && c.switchCount(fallback.ReasonBacklog) == 0 {
		return // the fallback run's switch to Sync is the fallback's
	}
	c.inj.setMode.Add(1)
	m := ModeSync
	if c.p.flap && r.IntN(3) != 0 {
		m = ModeAsync
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*c.p.execMax)
	err := c.d.SetMode(ctx, m)
	cancel()
	switch {
	case err == nil, errors.Is(err, ErrReentrant), errors.Is(err, ErrClosed), errors.Is(err, context.DeadlineExceeded):
	default:
		c.errorf("SetMode(%v) from %s: %v", m, where, err)
	}
}

// takeClose Closes the dispatcher from a callback, once, if the closer
// asked for it; the callback is on a goroutine Close would wait for, so
// Close must return ErrReentrant at once.
func (c *chaos) takeClose(where string) {
	if !c.closeReq.CompareAndSwap(true, false) {
		return
	}
	g, id := c.enter()
	defer c.leave(g, id)
	if err := c.d.Close(context.Background()); !errors.Is(err, ErrReentrant) {
		c.errorf("Close from %s: %v, want ErrReentrant", where, err)
	}
	c.cbClose <- where
}

// Callbacks.

func (c *chaos) exec(ctx context.Context, key int, ids []uint64) error {
	if c.onWorker() {
		if n := c.workerExecs.Add(1); n > int32(c.p.workers) {
			c.errorf("%d executions on workers at once, %d workers", n, c.p.workers)
		}
		defer c.workerExecs.Add(-1)
	}
	if n := c.running[key].Add(1); n != 1 {
		c.errorf("key %d: %d executions at once", key, n)
	}
	defer c.running[key].Add(-1)
	c.execs.Add(1)
	c.notAgain(key, ids, callbackExec)
	if c.isTail(key) {
		lat := 2 * time.Millisecond
		if key == c.p.keys+c.p.sideKeys {
			lat = 5 * time.Millisecond // the inline call
		}
		time.Sleep(lat)
		c.okAt(ids)
		return nil
	}
	at := c.order.Add(1)
	r := rand.New(rand.NewPCG(c.seed^ids[0], at))
	if c.closeReq.Load() {
		c.takeClose("exec")
	}
	if r.IntN(100) < 5 {
		c.reenter(r, key, "exec", key >= c.p.keys, true, false)
	}
	if lat := time.Duration(r.Int64N(int64(c.p.execMax) + 1)); lat > 0 {
		if r.IntN(8) == 0 {
			time.Sleep(lat) // an exec that does not honour its context
		} else {
			tm := time.NewTimer(lat)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				return context.Cause(ctx)
			}
		}
	}
	// Now and then the "API" has an outage: most calls fail retryably, which
	// trips the circuit breaker.
	outage := time.Since(c.start)%(8*c.p.cooldown) < 2*c.p.cooldown
	switch x := r.IntN(1000); {
	case x < 100 || (outage && x < 800):
		return &chaosErr{ids, fmt.Errorf("key %d: %w", key, errChaosRetry)}
	case x < 150:
		return &chaosErr{ids, fmt.Errorf("key %d: %w", key, errChaosPerm)}
	case x < 180:
		return &chaosErr{ids, fmt.Errorf("key %d: %w", key, errChaosConflict)}
	case x < 210:
		c.ended(ids, callbackExec)
		c.injectPanic(callbackExec, false)
	case x < 220:
		c.injectExit(callbackExec, false, func() { c.ended(ids, callbackExec) })
	}
	c.okAt(ids)
	return nil
}

// okAt records that the call of ids took effect: an execution of it is
// about to return nil, or the before-retry hook found it done.
func (c *chaos) okAt(ids []uint64) {
	end := c.order.Add(1)
	c.mu.Lock()
	for _, id := range ids {
		if _, ok := c.okEnd[id]; !ok {
			c.okEnd[id] = end
		}
	}
	c.mu.Unlock()
}

// merge unions the ids. It runs under the dispatcher's lock, so it calls
// nothing back.
func (c *chaos) merge(pending, incoming []uint64) ([]uint64, error) {
	// On arrival (a submission of one id by this goroutine) a panic or
	// Goexit refuses the submission; as a retry takes in its successor,
	// nobody is there to refuse, and Stats.CallbackPanics counts it.
	g := c.current()
	arrival := g != nil && len(incoming) == 1 && g.submitting == incoming[0]
	switch {
	case c.chance(30):
		c.injectPanic(callbackMerge, !arrival)
	case c.chance(20):
		c.injectExit(callbackMerge, !arrival, nil)
	}
	switch {
	case incoming[0]%29 == 0:
		return nil, errChaosMerge
	case incoming[0]%37 == 0:
		// The pending call makes the incoming one moot. On arrival (a
		// submission of one id by this goroutine) it ends Skipped alone,
		// in no call; a retry's successor stays behind the retry and runs
		// after it.
		c.inj.skipped.Add(1)
		if arrival {
			c.mu.Lock()
			c.skippedIn[incoming[0]] = true
			c.mu.Unlock()
		}
		if incoming[0]%2 == 0 {
			return nil, fmt.Errorf("chaos: moot: %w", SkipIncoming)
		}
		return nil, SkipIncoming
	}
	out := make([]uint64, 0, len(pending)+len(incoming))
	out = append(append(out, pending...), incoming...)
	if incoming[0]%41 == 0 {
		// Another operation: the call starts over as the union, with no
		// attempts or backoff carried over (ReplacePending).
		c.inj.replaced.Add(1)
		return out, ReplacePending
	}
	return out, nil
}

// follow decides a submission made while its key's call is in flight. It
// runs under the dispatcher's lock, so it calls nothing back (and it runs
// on the submitting goroutine, which the soak never ends: no Goexit). Its
// answer depends on both calls: the incoming call is moot, refused, or
// rewritten — a new slice, with the incoming ids only, so that each id is
// still in exactly one call.
func (c *chaos) follow(running, incoming []uint64, pending bool) ([]uint64, error) {
	if c.chance(100) {
		c.injectPanic(callbackFollow, false)
	}
	switch x := (incoming[0]*31 + running[0]) % 100; {
	case x < 6:
		c.inj.followRefused.Add(1)
		return nil, fmt.Errorf("chaos: %d behind %v (pending %v): %w", incoming[0], running, pending, errChaosFollow)
	case x < 16:
		// Moot behind the call in flight: it ends Skipped alone, in no call.
		c.inj.followSkipped.Add(1)
		if g := c.current(); g != nil && len(incoming) == 1 && g.submitting == incoming[0] {
			c.mu.Lock()
			c.skippedIn[incoming[0]] = true
			c.mu.Unlock()
		}
		if x%2 == 0 {
			return nil, fmt.Errorf("chaos: moot behind %v: %w", running, SkipIncoming)
		}
		return nil, SkipIncoming
	}
	c.inj.followRewritten.Add(1)
	return slices.Clone(incoming), nil
}

func (c *chaos) noop(key int, ids []uint64) bool {
	switch {
	case c.isTail(key):
		return false // the tail's calls all run
	case c.chance(30):
		// Asked by Amend, the call is left to run: only a worker's
		// no-op test ends it.
		if g := c.current(); g == nil || g.amending == 0 {
			c.ended(ids, callbackNoOp)
		}
		c.injectPanic(callbackNoOp, false)
	case c.chance(20):
		c.injectExit(callbackNoOp, false, func() { c.ended(ids, callbackNoOp) })
	}
	return ids[0]%41 == 0
}

// chaosLabels are the labels: a small fixed set, as Config.Label asks.
var chaosLabels = [...]string{"bind", "patch", "delete"}

func (c *chaos) label(key int, ids []uint64) string {
	if !c.isTail(key) && c.chance(20) {
		c.injectPanic(callbackLabel, true)
	}
	return chaosLabels[ids[0]%3]
}

func (c *chaos) classify(err error) Class {
	var ce *chaosErr
	errors.As(err, &ce)
	switch {
	case c.chance(50):
		if ce != nil {
			c.ended(ce.ids, callbackClassify)
		}
		c.injectPanic(callbackClassify, false)
	case c.chance(30):
		c.injectExit(callbackClassify, false, func() {
			if ce != nil {
				c.ended(ce.ids, callbackClassify)
			}
		})
	}
	switch {
	case errors.Is(err, errChaosRetry):
		return ClassRetry
	case errors.Is(err, errChaosConflict):
		return ClassRecompute
	}
	return ClassPermanent
}

func (c *chaos) beforeRetry(_ context.Context, key int, ids []uint64, _ error) ([]uint64, bool, error) {
	c.notAgain(key, ids, callbackBeforeRetry)
	r := rand.New(rand.NewPCG(c.seed^ids[0], c.order.Add(1)))
	switch x := r.IntN(1000); {
	case x < 10:
		c.ended(ids, callbackBeforeRetry)
		c.injectPanic(callbackBeforeRetry, false)
	case x < 15:
		c.injectExit(callbackBeforeRetry, false, func() { c.ended(ids, callbackBeforeRetry) })
	case x < 65:
		c.reenter(r, key, "before-retry", key >= c.p.keys, true, false)
	}
	switch x := r.IntN(100); {
	case x < 10: // the earlier attempt took effect after all
		c.inj.done.Add(1)
		c.okAt(ids)
		return nil, true, nil
	case x < 15:
		return nil, false, errChaosBefore
	}
	return slices.Clone(ids), false, nil
}

func (c *chaos) hook(r Result[int, []uint64]) {
	c.checkResult(r, "hook")
	c.mu.Lock()
	c.hookCalls++
	c.hookWaiter += r.Waiters
	for _, id := range r.Call {
		c.hookIDs[id]++
	}
	c.mu.Unlock()
	if c.closeReq.Load() && c.d.reentrant() {
		c.takeClose("the completion hook")
	}
	switch {
	case c.isTail(r.Key):
	case c.chance(100):
		c.injectPanic(callbackOnDone, true)
	case c.chance(50):
		c.injectExit(callbackOnDone, true, nil)
	case c.chance(300):
		rr := rand.New(rand.NewPCG(c.seed, c.order.Add(1)))
		// Its own key only on a goroutine that executes nothing: this hook
		// may run inside a callback's call back into the dispatcher, or
		// on a goroutine that has begun its next call.
		g := c.current()
		idle := (g == nil || g.frames == 0) && !chaosRunning()
		c.reenter(rr, r.Key, "the completion hook", false, idle, true)
	}
}

// chaosObserver misbehaves in every method.
type chaosObserver struct{ c *chaos }

func (o chaosObserver) OnSubmit(Event, bool)                     { o.c.observe() }
func (o chaosObserver) OnCoalesce(Event)                         { o.c.observe() }
func (o chaosObserver) OnReject(Event, error)                    { o.c.observe() }
func (o chaosObserver) OnStart(Event, int, time.Duration)        { o.c.observe() }
func (o chaosObserver) OnRetry(Event, int, time.Duration, error) { o.c.observe() }
func (o chaosObserver) OnDrop(Event, Bound)                      { o.c.observe() }
func (o chaosObserver) OnFinish(Event, Outcome)                  { o.c.observe() }
func (o chaosObserver) OnLimitChange(int, int)                   { o.c.observe() }

func (o chaosObserver) OnModeChange(_, _ Mode, reason string) {
	n, _ := o.c.switches.LoadOrStore(reason, new(atomic.Uint64))
	n.(*atomic.Uint64).Add(1)
	o.c.observe()
}

func (o chaosObserver) OnCircuitChange(_, to Circuit) {
	if to == CircuitOpen {
		o.c.trips.Add(1)
	}
	o.c.observe()
}

func (c *chaos) observe() {
	if c.closeReq.Load() && c.d.reentrant() {
		c.takeClose("an observer method")
	}
	switch {
	case c.chance(20):
		c.injectPanic(callbackObserver, true)
	case c.chance(10):
		c.injectExit(callbackObserver, true, nil)
	case c.chance(5):
		c.checkStats(c.d.Stats(), "observer")
	}
}

// Checks.

// checkResult checks that a Result's state is a terminal one, that its
// error agrees with it (see sentinel), that no count or duration is
// negative, and that a *PanicError in it is one the soak injected.
func (c *chaos) checkResult(r Result[int, []uint64], where string) {
	switch {
	case r.State < StateSucceeded || r.State > StateClosed:
		c.errorf("%s: invalid state %v in %+v", where, r.State, r)
	case r.State.OK() && r.Err != nil, r.State != StateFailed && !r.State.OK() && !errors.Is(r.Err, sentinel[r.State]):
		c.errorf("%s: %v result with error %v", where, r.State, r.Err)
	case r.State == StateFailed && r.Err == nil:
		c.errorf("%s: Failed result without an error", where)
	}
	if r.QueueWait < 0 || r.RunTime < 0 || r.Attempts < 0 || r.Waiters < 0 {
		c.errorf("%s: negative field in %+v", where, r)
	}
	if pe := (*PanicError)(nil); errors.As(r.Err, &pe) {
		c.checkPanicError(pe, where)
		switch {
		case pe.Callback == callbackExec, pe.Callback == callbackNoOp, pe.Callback == callbackBeforeRetry, pe.Callback == callbackClassify:
		default:
			c.errorf("%s: a call ended by a panic of %q, which ends no call: %v", where, pe.Callback, pe)
		}
	}
}

// checkPanicError checks that pe is a panic or Goexit the soak injected.
func (c *chaos) checkPanicError(pe *PanicError, where string) {
	if v, ok := pe.Value.(chaosPanic); ok && string(v) == pe.Callback {
		return
	}
	if pe.Value == ErrGoexit {
		return
	}
	c.errorf("%s: a panic the soak did not inject: %v\n%s", where, pe, pe.Stack)
}

func (c *chaos) checkStats(s Stats, where string) {
	sum := total(s.Outcomes)
	contained := c.containedPanics.Load() + c.containedExits.Load() // after the snapshot
	switch {
	case s.Submitted != s.Rejected+sum+uint64(s.Live):
		c.errorf("%s: conservation: Submitted %d != Rejected %d + Σ Outcomes %d + Live %d", where, s.Submitted, s.Rejected, sum, s.Live)
	case s.Outcomes[0] != 0 || s.Calls[0] != 0:
		c.errorf("%s: outcomes with the zero State: %+v", where, s)
	case s.Live < 0 || s.Tickets < 0 || s.Keys < 0 || s.Ready < 0 || s.Delayed < 0 || s.Successors < 0 || s.InFlight < 0:
		c.errorf("%s: negative gauge: %+v", where, s)
	case s.Keys > c.p.capacity || s.Tickets > c.p.maxWaiters || s.Tickets > s.Live:
		c.errorf("%s: gauge over its bound: %+v", where, s)
	case len(s.Tenants) > 4 || len(s.Labels) > len(chaosLabels)+1:
		// "capped", "", "a" and "b"; the labels and "" (a label panic).
		c.errorf("%s: more tenants or labels than there are: %v, %v", where, s.Tenants, s.Labels)
	case s.CallbackPanics > contained:
		c.errorf("%s: %d contained callback panics, %d injected", where, s.CallbackPanics, contained)
	}
	for name, quota := range chaosQuotas {
		if q := s.Tenants[name].Queued; q > quota {
			c.errorf("%s: tenant %q has %d calls queued, over its MaxQueued %d: %+v", where, name, q, quota, s.Tenants)
		}
	}
	// Every call is some tenant's, and the tenants of Stats are every
	// tenant with a call: their counts add up to the gauges.
	queued, inFlight := 0, 0
	for _, ts := range s.Tenants {
		queued += ts.Queued
		inFlight += ts.InFlight
	}
	if queued != s.Ready+s.Delayed+s.Successors || inFlight != s.InFlight {
		c.errorf("%s: the tenants have %d calls queued and %d in flight; Ready %d + Delayed %d + Successors %d, InFlight %d: %+v",
			where, queued, inFlight, s.Ready, s.Delayed, s.Successors, s.InFlight, s.Tenants)
	}
}

// verify runs once every goroutine of the workload has finished and Close
// has returned.
func (c *chaos) verify() {
	t := c.t
	// Tickets ended by a context's AfterFunc are told on that goroutine.
	if c.virtual {
		synctest.Wait()
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, ct := range c.tickets {
		select {
		case <-ct.tk.Done():
		default:
			if c.virtual {
				c.errorf("ticket %d (key %d) never ended", ct.id, ct.key)
				continue
			}
			select {
			case <-ct.tk.Done():
			case <-time.After(time.Until(deadline)):
				c.errorf("ticket %d (key %d) never ended", ct.id, ct.key)
				continue
			}
		}
	}
	// The last hooks and observer events may still be running on a
	// context's AfterFunc goroutine (in real time).
	s := c.d.Stats()
	for !c.virtual && time.Now().Before(deadline) && !c.panicsAgree(s) {
		time.Sleep(time.Millisecond)
		s = c.d.Stats()
	}
	c.checkStats(s, "final")
	if s.Live != 0 || s.Keys != 0 || s.InFlight != 0 || s.Tickets != 0 {
		c.errorf("final: %+v", s)
	}
	if s.Submitted != c.submitted.Load() || s.Rejected != c.rejected.Load() {
		c.errorf("final: Submitted %d, Rejected %d; the callers saw %d and %d", s.Submitted, s.Rejected, c.submitted.Load(), c.rejected.Load())
	}
	if s.Executions != c.execs.Load() {
		c.errorf("final: Executions %d, exec was called %d times", s.Executions, c.execs.Load())
	}
	if !testing.Short() && (c.inj.adopted.Load() == 0 || !c.p.quiesce && s.Backpressure[BoundQuota]+s.Shed[BoundQuota] == 0) {
		c.errorf("final: the quotas were not at work: %d queued calls moved to another tenant; refused %v, shed %v",
			c.inj.adopted.Load(), s.Backpressure, s.Shed)
	}
	if !c.panicsAgree(s) {
		c.errorf("final: Stats.CallbackPanics %d; injected into the hook, observer, label and a retry's merge: %d panics and %d Goexits",
			s.CallbackPanics, c.containedPanics.Load(), c.containedExits.Load())
	}
	if s.CallbackPanics > 0 {
		if s.LastCallbackPanic == nil {
			c.errorf("final: %d callback panics, LastCallbackPanic nil", s.CallbackPanics)
		} else {
			c.checkPanicError(s.LastCallbackPanic, "LastCallbackPanic")
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	outcomes, calls := total(s.Outcomes), total(s.Calls)
	if outcomes != uint64(len(c.accepted)) {
		c.errorf("final: Σ Outcomes %d, %d submissions were accepted", outcomes, len(c.accepted))
	}
	if calls != uint64(c.hookCalls) {
		c.errorf("final: the hook fired %d times, Σ Stats.Calls is %d", c.hookCalls, calls)
	}
	if want := len(c.accepted) - len(c.skippedIn); c.hookWaiter != want {
		c.errorf("final: hook results served %d waiters; %d submissions were accepted, %d of them skipped on arrival", c.hookWaiter, len(c.accepted), len(c.skippedIn))
	}
	for id := range c.accepted {
		want := 1
		if c.skippedIn[id] {
			want = 0
		}
		if n := c.hookIDs[id]; n != want {
			c.errorf("submission %d is in %d hook results, want %d", id, n, want)
		}
	}
	for id := range c.skippedIn {
		if _, ok := c.accepted[id]; !ok {
			c.errorf("submission %d was skipped on arrival, but refused", id)
		}
	}
	for id, n := range c.hookIDs {
		if _, ok := c.accepted[id]; !ok {
			c.errorf("rejected submission %d is in %d hook results", id, n)
		}
	}

	var byState stateCounts
	for _, ct := range c.tickets {
		res, ok := ct.tk.Result()
		if !ok {
			continue
		}
		byState[res.State]++
		where := fmt.Sprintf("ticket %d (key %d)", ct.id, ct.key)
		c.checkResult(res, where)
		if res.Key != ct.key || !slices.Contains(res.Call, ct.id) {
			c.errorf("%s: result for key %d with call %v", where, res.Key, res.Call)
		}
		if c.skippedIn[ct.id] && (res.State != StateSkipped || res.Waiters != 1 || res.Attempts != 0 || len(res.Call) != 1) {
			c.errorf("%s: skipped on arrival, but %+v", where, res)
		}
		if res.State != StateSucceeded {
			continue
		}
		ok2, ran := c.okEnd[ct.id]
		switch {
		case !ran:
			c.errorf("%s: Succeeded, but no execution with it returned nil", where)
		case res.Attempts < 1:
			c.errorf("%s: Succeeded with %d attempts", where, res.Attempts)
		case ct.cancelled != 0 && ok2 > ct.cancelled:
			c.errorf("%s: Succeeded, but Ticket.Cancel returned (event %d) before its execution did (event %d)", where, ct.cancelled, ok2)
		}
		for _, kc := range c.keyCancels {
			if kc.key == ct.key && kc.start > ct.submitted && ok2 > kc.end {
				c.errorf("%s: Succeeded, but Cancel(key) ran (events %d-%d) after Submit returned (event %d) and before its execution returned (event %d)",
					where, kc.start, kc.end, ct.submitted, ok2)
			}
		}
	}
	for st := range byState {
		if byState[st] > s.Outcomes[State(st)] {
			c.errorf("final: tickets ended %v %d times, Stats.Outcomes says %d", State(st), byState[st], s.Outcomes[State(st)])
		}
	}
	var inj []string
	for i, cb := range chaosCallbacks {
		if p, e := c.inj.panics[i].Load(), c.inj.goexits[i].Load(); p+e > 0 {
			inj = append(inj, fmt.Sprintf("%s %d/%d", cb, p, e))
		}
	}
	var sw []string
	for _, r := range []string{reasonManual, fallback.ReasonCoolDown, fallback.ReasonBacklog, fallback.ReasonFailureRatio, fallback.ReasonQueueWait, fallback.ReasonCircuitOpen} {
		if n := c.switchCount(r); n > 0 {
			sw = append(sw, fmt.Sprintf("%s %d", r, n))
		}
	}
	t.Logf("%d submissions (%d accepted, %d tickets, %d skipped on arrival), %d hook calls, %d executions, %d retries, %d already done, %d breaker trips; outcomes %v",
		s.Submitted, len(c.accepted), len(c.tickets), len(c.skippedIn), c.hookCalls, s.Executions, s.Retries, s.AlreadyDone, c.trips.Load(), s.Outcomes)
	t.Logf("injected panics/Goexits: %v; %d calls back in, %d SetMode, %d merges found the incoming call moot, %d replaced the pending call, %d before-retry hooks found it done; %d contained (Stats.CallbackPanics); mode switches: %v",
		inj, c.inj.reenter.Load(), c.inj.setMode.Load(), c.inj.skipped.Load(), c.inj.replaced.Load(), c.inj.done.Load(), s.CallbackPanics, sw)
	t.Logf("Follow: %d moot, %d refused, %d rewritten; %d queued calls moved to another tenant; refused by bound %v, shed by bound %v; tenants %+v",
		c.inj.followSkipped.Load(), c.inj.followRefused.Load(), c.inj.followRewritten.Load(), c.inj.adopted.Load(), s.Backpressure, s.Shed, s.Tenants)
}

// panicsAgree reports whether Stats.CallbackPanics is what was injected
// into the callbacks whose failure has nowhere else to go — the completion
// hook, observer methods, the label function, the merge function as a
// retry takes in its successor — panics and Goexits alike.
func (c *chaos) panicsAgree(s Stats) bool {
	return s.CallbackPanics == c.containedPanics.Load()+c.containedExits.Load()
}
