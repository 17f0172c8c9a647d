package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"
)

var (
	errChaosRetry     = errors.New("chaos: transient")
	errChaosPerm      = errors.New("chaos: permanent")
	errChaosConflict  = errors.New("chaos: conflict")
	errChaosMerge     = errors.New("chaos: merge refused")
	errChaosKeyCancel = errors.New("chaos: key cancelled")
)

type chaosParams struct {
	keys, hotKeys int
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
	cooldown      time.Duration
}

// TestChaosSoak is a seeded random workload: many goroutines submit and post
// to a few hundred keys with random priorities, deadlines, generations and
// idempotency keys, cancel tickets, contexts and keys, and wait; exec
// randomly sleeps (honouring its context or not), fails (retryable,
// permanent, conflict) and panics; a merge function that unions the
// submissions' ids sometimes refuses; a no-op test, a rate limiter, retries
// with jitter and a circuit breaker are on; and Close comes in the middle of
// it all with a random grace period. It runs twice: in a testing/synctest
// bubble (virtual time, so the sleeps cost nothing) and in real time.
//
// Every call value is the list of ids of the submissions merged into it, so
// the test can tell where each submission went. It asserts that:
//
//   - every accepted ticket's Done closes, with a valid State whose error
//     matches the state's sentinel, and a Call that contains its own id;
//   - a ticket that succeeded had its id in an execution that returned nil,
//     and that execution returned before any Ticket.Cancel or Cancel(key)
//     aimed at the ticket returned (no success for a ticket cancelled before
//     its call ran);
//   - never two executions of one key at once;
//   - the completion hook fires once per finished call (its count equals
//     Σ Stats.Calls), and every accepted id appears in exactly one hook
//     result, rejected ids in none;
//   - conservation holds in every snapshot, gauges stay within their bounds,
//     and after Close: Live, Keys, InFlight, queues all zero, Submitted and
//     Rejected equal what the callers saw, Σ Outcomes equals the accepted
//     submissions, Executions equals the exec calls;
//   - nothing panics, nothing hangs (synctest reports a deadlock), no
//     goroutine leaks (goleak in TestMain).
//
// DISPATCH_CHAOS_SEED replays a seed. Goroutine scheduling is not
// deterministic, so a replay exercises the same workload, not necessarily
// the same interleaving. -short shrinks the workload.
func TestChaosSoak(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DISPATCH_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DISPATCH_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (DISPATCH_CHAOS_SEED=%d replays it)", seed, seed)

	virtual := chaosParams{
		keys: 300, hotKeys: 20, submitters: 32, ops: 3000, workers: 8,
		capacity: 150, maxWaiters: 300,
		step: 300 * time.Microsecond, execMax: 2 * time.Millisecond, deadlineMax: 20 * time.Millisecond,
		closeAfter: 300 * time.Millisecond, closeGrace: 20 * time.Millisecond,
		rate: 20000, burst: 20, cooldown: 5 * time.Millisecond,
	}
	real := chaosParams{
		keys: 300, hotKeys: 20, submitters: 16, ops: 10000, workers: 8,
		capacity: 150, maxWaiters: 300,
		step: 200 * time.Microsecond, execMax: 300 * time.Microsecond, deadlineMax: 5 * time.Millisecond,
		closeAfter: time.Second, closeGrace: 5 * time.Millisecond,
		rate: 50000, burst: 50, cooldown: time.Millisecond,
	}
	if testing.Short() {
		for _, p := range []*chaosParams{&virtual, &real} {
			p.keys, p.hotKeys, p.submitters, p.capacity, p.maxWaiters = 60, 8, 6, 40, 80
			p.ops /= 4
			p.closeAfter /= 4
		}
	}
	t.Run("virtual", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { newChaos(t, seed, virtual, true).run() })
	})
	t.Run("real", func(t *testing.T) {
		newChaos(t, seed, real, false).run()
	})
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
	closing atomic.Bool
	errs    atomic.Int32 // violations reported, to cap the noise

	submitted, rejected, execs atomic.Uint64
	trips                      atomic.Uint64 // circuit breaker openings
	start                      time.Time

	mu         sync.Mutex
	accepted   map[uint64]bool   // accepted submission ids (true: has a ticket)
	okEnd      map[uint64]uint64 // id → event order just before an exec with it returned nil
	hookIDs    map[uint64]int
	hookCalls  int
	hookWaiter int
	keyCancels []chaosKeyCancel
	tickets    []*chaosTicket
	cancels    []context.CancelFunc
}

func newChaos(t *testing.T, seed uint64, p chaosParams, virtual bool) *chaos {
	return &chaos{
		t: t, p: p, seed: seed, virtual: virtual,
		gens:     make([]atomic.Uint64, p.keys),
		running:  make([]atomic.Int32, p.keys),
		accepted: map[uint64]bool{},
		okEnd:    map[uint64]uint64{},
		hookIDs:  map[uint64]int{},
	}
}

func (c *chaos) errorf(format string, args ...any) {
	c.t.Helper()
	if c.errs.Add(1) <= 20 {
		c.t.Errorf(format, args...)
	}
}

func (c *chaos) run() {
	t, p := c.t, c.p
	d, err := New(c.exec, Config[int, []uint64]{
		Workers:    p.workers,
		RateLimit:  rate.NewLimiter(p.rate, p.burst),
		Capacity:   p.capacity,
		MaxWaiters: p.maxWaiters,
		Aging:      time.Millisecond,
		Merge: func(pending, incoming []uint64) ([]uint64, error) {
			if incoming[0]%29 == 0 {
				return nil, errChaosMerge
			}
			out := make([]uint64, 0, len(pending)+len(incoming))
			return append(append(out, pending...), incoming...), nil
		},
		NoOp:   func(_ int, ids []uint64) bool { return ids[0]%41 == 0 },
		OnDone: c.hook,
		Classify: func(err error) Class {
			switch {
			case errors.Is(err, errChaosRetry):
				return Retry
			case errors.Is(err, errChaosConflict):
				return Recompute
			}
			return Permanent
		},
		Retry:    RetryPolicy{MaxAttempts: 3, InitialBackoff: p.execMax / 4, MaxBackoff: p.execMax},
		Breaker:  &BreakerPolicy{ConsecutiveFailures: 6, Cooldown: p.cooldown, RefuseDroppable: true},
		Observer: breakerTrips{n: &c.trips},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.d = d
	c.start = time.Now()

	var wg sync.WaitGroup
	for g := range p.submitters {
		wg.Go(func() { c.submitter(g) })
	}
	closeDone := make(chan struct{})
	wg.Go(func() {
		defer close(closeDone)
		r := rand.New(rand.NewPCG(c.seed, 1<<32))
		time.Sleep(p.closeAfter/2 + time.Duration(r.Int64N(int64(p.closeAfter))))
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(p.closeGrace)+1)))
		defer cancel()
		c.closing.Store(true)
		err := d.Close(ctx)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			c.errorf("Close: %v", err)
		}
		s := d.Stats()
		if s.Live != 0 || s.Keys != 0 || s.InFlight != 0 || s.Tickets != 0 || s.Ready != 0 || s.Delayed != 0 || s.Successors != 0 {
			c.errorf("right after Close returned: %+v", s)
		}
		c.checkStats(s, "after Close")
	})
	wg.Go(func() { // monitor
		for {
			select {
			case <-closeDone:
				return
			case <-time.After(4 * p.step):
			}
			c.checkStats(d.Stats(), "monitor")
		}
	})
	if c.virtual {
		wg.Wait()
	} else {
		waited := make(chan struct{})
		go func() { wg.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(30 * time.Second):
			t.Fatalf("workload did not finish in 30s (Close hangs?): %+v", d.Stats())
		}
	}
	c.verify()
	for _, cancel := range c.cancels {
		cancel()
	}
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

func (c *chaos) options(r *rand.Rand, key int) SubmitOptions {
	o := SubmitOptions{
		Priority:   r.IntN(14) - 3,
		Generation: c.gen(r, key),
		Droppable:  r.IntN(4) == 0,
	}
	if r.IntN(10) < 3 {
		o.Deadline = time.Now().Add(time.Duration(r.Int64N(int64(c.p.deadlineMax))))
	}
	if r.IntN(20) == 0 {
		o.IdempotencyKey = "op-" + strconv.Itoa(r.IntN(3))
	}
	return o
}

func (c *chaos) rejection(what string, err error) {
	c.rejected.Add(1)
	for _, ok := range []error{ErrBackpressure, ErrClosed, ErrStale, ErrMergeRejected, ErrExpired, ErrCanceled, ErrCircuitOpen} {
		if errors.Is(err, ok) {
			return
		}
	}
	c.errorf("%s: unexpected error %v", what, err)
}

func (c *chaos) submitter(g int) {
	r := rand.New(rand.NewPCG(c.seed, uint64(g)+1))
	var mine []*chaosTicket
	closedSeen := 0
	for i := 0; i < c.p.ops && closedSeen < 3; i++ {
		if pause := r.Int64N(int64(c.p.step)); pause > 0 {
			time.Sleep(time.Duration(pause))
		}
		key := c.pickKey(r)
		switch x := r.IntN(100); {
		case x < 50: // Submit
			id := c.nextID.Add(1)
			o := c.options(r, key)
			ctx, cancel := context.WithCancel(context.Background())
			switch r.IntN(8) {
			case 0:
				ctx, cancel = context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(c.p.deadlineMax))))
			case 1:
				ctx = context.WithoutCancel(ctx)
			}
			c.submitted.Add(1)
			tk, err := c.d.Submit(ctx, key, []uint64{id}, o)
			after := c.order.Add(1)
			if err != nil {
				cancel()
				c.rejection("Submit", err)
				if errors.Is(err, ErrClosed) {
					closedSeen++
				}
				continue
			}
			ct := &chaosTicket{id: id, key: key, tk: tk, cancel: cancel, submitted: after}
			mine = append(mine, ct)
			c.mu.Lock()
			c.accepted[id] = true
			c.tickets = append(c.tickets, ct)
			c.cancels = append(c.cancels, cancel)
			c.mu.Unlock()
		case x < 70: // Post
			id := c.nextID.Add(1)
			c.submitted.Add(1)
			if err := c.d.Post(key, []uint64{id}, c.options(r, key)); err != nil {
				c.rejection("Post", err)
				if errors.Is(err, ErrClosed) {
					closedSeen++
				}
				continue
			}
			c.mu.Lock()
			c.accepted[id] = false
			c.mu.Unlock()
		case x < 80: // Ticket.Cancel
			if len(mine) == 0 {
				continue
			}
			ct := mine[r.IntN(len(mine))]
			ct.tk.Cancel()
			if after := c.order.Add(1); ct.cancelled == 0 {
				ct.cancelled = after
			}
		case x < 86: // the submitter's context ends
			if len(mine) == 0 {
				continue
			}
			mine[r.IntN(len(mine))].cancel()
		case x < 89: // Cancel(key)
			start := c.order.Add(1)
			c.d.Cancel(key, errChaosKeyCancel)
			end := c.order.Add(1)
			c.mu.Lock()
			c.keyCancels = append(c.keyCancels, chaosKeyCancel{key: key, start: start, end: end})
			c.mu.Unlock()
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
			c.d.Pending(key)
			c.checkStats(c.d.Stats(), "submitter")
		}
	}
}

func (c *chaos) exec(ctx context.Context, key int, ids []uint64) error {
	if n := c.running[key].Add(1); n != 1 {
		c.errorf("key %d: %d executions at once", key, n)
	}
	defer c.running[key].Add(-1)
	c.execs.Add(1)
	at := c.order.Add(1)
	r := rand.New(rand.NewPCG(c.seed^ids[0], at))
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
	switch x := r.IntN(100); {
	case x < 10 || (outage && x < 80):
		return fmt.Errorf("key %d: %w", key, errChaosRetry)
	case x < 15:
		return fmt.Errorf("key %d: %w", key, errChaosPerm)
	case x < 18:
		return fmt.Errorf("key %d: %w", key, errChaosConflict)
	case x < 21:
		panic(fmt.Sprintf("chaos: exec panics on key %d", key))
	}
	end := c.order.Add(1)
	c.mu.Lock()
	for _, id := range ids {
		if _, ok := c.okEnd[id]; !ok {
			c.okEnd[id] = end
		}
	}
	c.mu.Unlock()
	return nil
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
}

// checkResult checks that a Result's state is a terminal one, that its
// error agrees with it (see sentinel), and that no count or duration is
// negative.
func (c *chaos) checkResult(r Result[int, []uint64], where string) {
	switch {
	case r.State < Succeeded || r.State > Closed:
		c.errorf("%s: invalid state %v in %+v", where, r.State, r)
	case r.State.OK() && r.Err != nil, r.State != Failed && !r.State.OK() && !errors.Is(r.Err, sentinel[r.State]):
		c.errorf("%s: %v result with error %v", where, r.State, r.Err)
	case r.State == Failed && r.Err == nil:
		c.errorf("%s: Failed result without an error", where)
	}
	if r.QueueWait < 0 || r.RunTime < 0 || r.Attempts < 0 || r.Waiters < 0 {
		c.errorf("%s: negative field in %+v", where, r)
	}
}

func (c *chaos) checkStats(s Stats, where string) {
	sum := s.Outcomes.Total()
	switch {
	case s.Submitted != s.Rejected+sum+uint64(s.Live):
		c.errorf("%s: conservation: Submitted %d != Rejected %d + Σ Outcomes %d + Live %d", where, s.Submitted, s.Rejected, sum, s.Live)
	case s.Outcomes[0] != 0 || s.Calls[0] != 0:
		c.errorf("%s: outcomes with the zero State: %+v", where, s)
	case s.Live < 0 || s.Tickets < 0 || s.Keys < 0 || s.Ready < 0 || s.Delayed < 0 || s.Successors < 0 || s.InFlight < 0:
		c.errorf("%s: negative gauge: %+v", where, s)
	case s.Keys > c.p.capacity || s.Tickets > c.p.maxWaiters || s.InFlight > c.p.workers || s.Tickets > s.Live:
		c.errorf("%s: gauge over its bound: %+v", where, s)
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
	s := c.d.Stats()
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

	c.mu.Lock()
	defer c.mu.Unlock()
	outcomes, calls := s.Outcomes.Total(), s.Calls.Total()
	if outcomes != uint64(len(c.accepted)) {
		c.errorf("final: Σ Outcomes %d, %d submissions were accepted", outcomes, len(c.accepted))
	}
	if calls != uint64(c.hookCalls) {
		c.errorf("final: the hook fired %d times, Σ Stats.Calls is %d", c.hookCalls, calls)
	}
	if c.hookWaiter != len(c.accepted) {
		c.errorf("final: hook results served %d waiters, %d submissions were accepted", c.hookWaiter, len(c.accepted))
	}
	for id := range c.accepted {
		if n := c.hookIDs[id]; n != 1 {
			c.errorf("submission %d is in %d hook results, want 1", id, n)
		}
	}
	for id, n := range c.hookIDs {
		if _, ok := c.accepted[id]; !ok {
			c.errorf("rejected submission %d is in %d hook results", id, n)
		}
	}

	var byState StateCounts
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
		if res.State != Succeeded {
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
		if byState[st] > s.Outcomes[st] {
			c.errorf("final: tickets ended %v %d times, Stats.Outcomes says %d", State(st), byState[st], s.Outcomes[st])
		}
	}
	t.Logf("%d submissions (%d accepted, %d tickets), %d hook calls, %d executions, %d retries, %d breaker trips; outcomes %v",
		s.Submitted, len(c.accepted), len(c.tickets), c.hookCalls, s.Executions, s.Retries, c.trips.Load(), s.Outcomes)
}

// breakerTrips counts the breaker's openings.
type breakerTrips struct {
	NopObserver
	n *atomic.Uint64
}

func (b breakerTrips) OnBreakerChange(_, to BreakerState) {
	if to == BreakerOpen {
		b.n.Add(1)
	}
}
