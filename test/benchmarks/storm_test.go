package benchmarks

// BenchmarkStorm replays the status-patch storm of kubernetes/kubernetes#135900
// in real time: 500 pod status patches posted over 2 s, and 20 binds
// submitted during them, against a fake API of 20 ms per call behind a token
// bucket of 100 qps / burst 10. One iteration is the whole scenario, 5–8 s
// (the bucket alone needs 5.2 s for 520 writes), so run each variant once
// per count; -count 6 takes about 5 minutes:
//
//	cd benchmarks
//	go test -run '^$' -bench Storm -benchtime 1x -count 6 . | tee storm.txt
//	benchstat storm.txt               # one table per metric, a row per variant
//	benchstat -col /variant storm.txt # each variant against fifo, the baseline
//
// The metrics, all per run:
//
//	bind-p50-ms, bind-p99-ms   a bind's latency, Submit → outcome
//	patch-p99-ms               a status patch's latency, Post → outcome
//	patch-drain-ms             storm start → last status patch done
//	api-writes                 requests that reached the fake API
//	lost                       submissions without exactly one outcome
//	requests-during-throttle   (throttle only) requests in the 429 window
//	recovery-ms                (throttle only) window end → success rate
//	                           back to 90% of the bucket's rate
//
// With 20 binds, p99 is the slowest bind. Wall time (ns/op) is suppressed: the
// scenario runs on the clock, so it would only say how long the storm lasted.
// Being on the clock, the figures suffer on a busy machine: a late timer or a
// worker waiting for a CPU adds straight to a latency. Run it on a quiet one.
// TestStormScenario runs the same scenarios under testing/synctest, on a fake
// clock, to check the harness's accounting in a fraction of a second; its
// log shows the figures the policy alone would give.

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"golang.org/x/time/rate"
)

// limitSide says where the token bucket sits.
type limitSide uint8

const (
	// clientSide: the API client waits on the bucket inside exec, as a
	// clientset's own rate limiter does; the dispatcher knows nothing of it.
	clientSide limitSide = iota
	// dispatcherSide: the bucket is the dispatcher's (Config.RateLimit) and
	// the client does not limit.
	dispatcherSide
)

// scenario is one storm: what is submitted when, and the API it meets.
type scenario struct {
	patches      int           // status patches posted, evenly over storm
	pods         int           // the pods they are for, round-robin: patches/pods each
	binds        int           // binds submitted, evenly over storm
	storm        time.Duration // the span the submissions are spread over
	bindPriority int           // the binds' priority; patches have 0
	patchTenant  string        // the patches' tenant ("" for the default)

	latency    time.Duration // of every API call
	qps        float64       // the token bucket's rate
	burst      int           // and its burst
	limit      limitSide     // where the bucket sits
	throttle   window        // the server answers 429 in it; zero: never
	retryAfter time.Duration // the 429's Retry-After
}

// theStorm is the scenario of kubernetes#135900 (500 status patches, then
// bindings, at a limited QPS), with the dispatcher as a drop-in: priorities on, the client's bucket.
func theStorm() scenario {
	return scenario{
		patches:      500,
		pods:         500,
		binds:        20,
		storm:        2 * time.Second,
		bindPriority: 10,
		latency:      20 * time.Millisecond,
		qps:          100,
		burst:        10,
		limit:        clientSide,
	}
}

// variant is a scenario with a dispatcher configuration, run at each of its
// worker counts. run sets the Config fields the harness relies on.
type variant struct {
	name    string
	workers []int
	sc      scenario
	cfg     dispatch.Config[string, call]
}

// stormVariants lists the variants BenchmarkStorm runs, in the order
// benchstat shows them; the first is the baseline.
func stormVariants() []variant {
	dropin := theStorm()

	fifo := dropin // kube-scheduler's own dispatcher: one FIFO
	fifo.bindPriority = 0

	limit := dropin
	limit.limit = dispatcherSide

	capped := dropin
	capped.patchTenant = "patch"

	coalesce := limit
	coalesce.patches = 5 * coalesce.pods

	// The server answers 429 with Retry-After 1s from 1 s to 3 s: the middle
	// of the backlog, which the bucket drains until about 5.2 s. Retries are
	// bounded by attempts alone, so that every call ends Succeeded and the
	// figures compare request counts, not give-ups.
	throttled := limit
	throttled.throttle = window{from: time.Second, to: 3 * time.Second}
	throttled.retryAfter = time.Second
	patientRetries := dispatch.RetryPolicy{MaxAttempts: 10, BudgetRatio: math.Inf(1)}

	return []variant{
		{name: "fifo", workers: []int{8}, sc: fifo},
		{name: "dropin", workers: []int{8, 16}, sc: dropin},
		{name: "dispatcher-limit", workers: []int{8, 16}, sc: limit},
		{name: "tenant-cap", workers: []int{8}, sc: capped, cfg: dispatch.Config[string, call]{
			Tenants: map[string]dispatch.TenantConfig{"patch": {MaxInFlight: 2}},
		}},
		{name: "coalesce", workers: []int{8}, sc: coalesce},

		// Urgent work keeps two workers whatever the patches do, so a bind
		// finds one even when the limit is workers, not tokens.
		{name: "reserved", workers: []int{8, 16}, sc: limit, cfg: dispatch.Config[string, call]{
			Start: dispatch.StartPolicy{ReservedWorkers: 2, UrgentPriority: dropin.bindPriority},
		}},
		// Concurrency that follows the server.
		{name: "adaptive", workers: []int{8, 16}, sc: limit, cfg: dispatch.Config[string, call]{
			Start: dispatch.StartPolicy{Adaptive: &dispatch.AdaptivePolicy{}},
		}},

		// The 429 scenario, in fixed and in adaptive mode: adaptive must
		// send fewer than half the requests into the 429 window and be back
		// to the bucket's rate within 2 s of its end.
		{name: "throttle", workers: []int{8}, sc: throttled, cfg: dispatch.Config[string, call]{
			Retry: patientRetries,
		}},
		{name: "throttle-adaptive", workers: []int{8}, sc: throttled, cfg: dispatch.Config[string, call]{
			Retry: patientRetries,
			Start: dispatch.StartPolicy{Adaptive: &dispatch.AdaptivePolicy{}},
		}},
	}
}

// call is one API write: a pod's status patch, or a bind. A status patch
// carries the rounds of the storm it stands for, so that the completion hook
// can tell which posts it answered: the merge keeps them contiguous, since
// a pod's posts coalesce in the order they arrive.
type call struct {
	bind        bool
	pod         int // status patch: the pod's index
	first, last int // status patch: the storm rounds merged into it
}

// mergePatches folds a pod's incoming status patch into its pending one.
// Binds never merge; they have keys of their own anyway.
func mergePatches(pending, incoming call) (call, error) {
	if pending.bind || incoming.bind {
		return pending, errBindMerge
	}
	incoming.first = pending.first
	return incoming, nil
}

var errBindMerge = fmt.Errorf("binds do not merge")

// metrics are one run's results.
type metrics struct {
	bindP50, bindP99 time.Duration
	patchP99         time.Duration
	patchDrain       time.Duration
	apiWrites        int
	lost             int

	throttled        bool // the scenario has a throttle window
	duringThrottle   int
	throttleRecovery time.Duration
}

func (m metrics) String() string {
	s := fmt.Sprintf("bind p50 %v p99 %v, patch p99 %v, drain %v, %d API writes, %d lost",
		m.bindP50, m.bindP99, m.patchP99, m.patchDrain, m.apiWrites, m.lost)
	if m.throttled {
		s += fmt.Sprintf(", %d requests during the 429s, recovered in %v", m.duringThrottle, m.throttleRecovery)
	}
	return s
}

// event is one submission of the storm, at an offset from its start.
type event struct {
	at   time.Duration
	bind bool
	i    int // the post's or bind's index
}

// schedule returns the storm's submissions in time order: post i at
// i × storm/patches, bind j in the middle of its slot of storm/binds.
func (sc scenario) schedule() []event {
	evs := make([]event, 0, sc.patches+sc.binds)
	for i := range sc.patches {
		evs = append(evs, event{at: time.Duration(i) * sc.storm / time.Duration(sc.patches), i: i})
	}
	for j := range sc.binds {
		evs = append(evs, event{at: time.Duration(2*j+1) * sc.storm / time.Duration(2*sc.binds), bind: true, i: j})
	}
	slices.SortStableFunc(evs, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	return evs
}

// run plays sc once against a new dispatcher configured by cfg, closes it
// (draining everything), and returns what it measured. It sets cfg's
// RateLimit (when sc puts the bucket on the dispatcher side), Merge and
// OnDone: the harness's accounting relies on them. Every submission is
// expected to be accepted and to succeed; anything else fails tb.
func run(tb testing.TB, sc scenario, cfg dispatch.Config[string, call]) metrics {
	tb.Helper()
	api := &fakeAPI{latency: sc.latency, throttle: sc.throttle, retryAfter: sc.retryAfter}
	bucket := rate.NewLimiter(rate.Limit(sc.qps), sc.burst)
	switch sc.limit {
	case clientSide:
		api.client = bucket
	case dispatcherSide:
		cfg.RateLimit = bucket
	}

	// The posts' outcomes, told by the completion hook.
	var (
		start    time.Time
		postAt   = make([]time.Duration, sc.patches) // Post was called
		mu       sync.Mutex                          // guards doneAt and outcomes
		doneAt   = make([]time.Duration, sc.patches) // its call finished
		outcomes = make([]int, sc.patches)           // how often it was told
	)
	cfg.Merge = mergePatches
	cfg.OnDone = func(r dispatch.Result[string, call]) {
		if r.Call.bind {
			return // timed by its ticket
		}
		at := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		for round := r.Call.first; round <= r.Call.last; round++ {
			i := round*sc.pods + r.Call.pod
			doneAt[i] = at
			outcomes[i]++
		}
	}
	d, err := dispatch.New(func(ctx context.Context, _ string, _ call) error {
		return api.do(ctx)
	}, cfg)
	if err != nil {
		tb.Fatal(err)
	}

	podKeys := make([]string, sc.pods)
	for i := range podKeys {
		podKeys[i] = fmt.Sprintf("pod-%04d", i)
	}
	events := sc.schedule()
	var (
		binders   sync.WaitGroup
		closed    = make(chan struct{})
		bindLat   = make([]time.Duration, sc.binds)
		bindTold  = make([]bool, sc.binds)
		accepted  = make([]bool, sc.patches)
		submitted int
	)

	start = time.Now()
	api.begin(start)
	for _, e := range events {
		if wait := time.Until(start.Add(e.at)); wait > 0 {
			time.Sleep(wait)
		}
		submitted++
		if e.bind {
			t0 := time.Now()
			t, err := d.Submit(context.Background(), fmt.Sprintf("bind-%02d", e.i), call{bind: true},
				dispatch.SubmitOptions{Priority: sc.bindPriority})
			if err != nil {
				tb.Errorf("bind %d refused: %v", e.i, err)
				continue
			}
			binders.Go(func() {
				select {
				case <-t.Done():
				case <-closed:
					// Close has told every waiter; a ticket still open
					// now never will be.
					select {
					case <-t.Done():
					default:
						return
					}
				}
				bindLat[e.i], bindTold[e.i] = time.Since(t0), true
			})
			continue
		}
		pod, round := e.i%sc.pods, e.i/sc.pods
		postAt[e.i] = time.Since(start)
		err := d.Post(podKeys[pod], call{pod: pod, first: round, last: round},
			dispatch.SubmitOptions{Tenant: sc.patchTenant})
		if err != nil {
			tb.Errorf("status patch %d refused: %v", e.i, err)
			continue
		}
		accepted[e.i] = true
	}

	// Close drains the backlog by priority and returns once every call has
	// ended and been told.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		tb.Errorf("Close did not drain: %v", err)
	}
	close(closed)
	binders.Wait()

	var m metrics
	s := d.Stats()
	// Conservation: Submitted == Rejected + Σ outcomes + Live, with Live 0
	// after Close. A shortfall (or a surplus: an outcome told twice) is
	// lost.
	statsLost := int(s.Submitted) - int(s.Rejected) - int(total(s.Outcomes))
	harnessLost := 0
	for i, ok := range accepted {
		if ok && outcomes[i] != 1 {
			harnessLost++
		}
	}
	var binds []time.Duration
	for j, told := range bindTold {
		if told {
			binds = append(binds, bindLat[j])
		} else {
			harnessLost++
		}
	}
	m.lost = max(abs(statsLost), harnessLost)
	if int(s.Submitted) != submitted {
		tb.Errorf("Stats.Submitted = %d, the storm submitted %d", s.Submitted, submitted)
	}
	if notOK := total(s.Outcomes) - s.Outcomes[dispatch.StateSucceeded] - s.Outcomes[dispatch.StateSkipped]; notOK > 0 {
		tb.Errorf("%d submissions did not succeed: %v", notOK, s.Outcomes)
	}

	m.bindP50, m.bindP99 = quantile(binds, 0.50), quantile(binds, 0.99)
	var patches []time.Duration
	for i, ok := range accepted {
		if ok && outcomes[i] > 0 {
			patches = append(patches, doneAt[i]-postAt[i])
			m.patchDrain = max(m.patchDrain, doneAt[i])
		}
	}
	m.patchP99 = quantile(patches, 0.99)
	m.apiWrites = api.requests()
	if !sc.throttle.zero() {
		m.throttled = true
		m.duringThrottle = api.requestsIn(sc.throttle)
		m.throttleRecovery = api.recovery(sc.qps, 500*time.Millisecond)
	}
	return m
}

// BenchmarkStorm runs each variant of the storm (see the comment at the top
// of this file for the command and the metrics).
func BenchmarkStorm(b *testing.B) {
	for _, v := range stormVariants() {
		for _, w := range v.workers {
			b.Run(fmt.Sprintf("variant=%s/workers=%d", v.name, w), func(b *testing.B) {
				cfg := v.cfg
				cfg.Workers = w
				var runs []metrics
				for b.Loop() {
					runs = append(runs, run(b, v.sc, cfg))
				}
				report(b, runs)
			})
		}
	}
}

// report reports the mean of each metric over the runs.
func report(b *testing.B, runs []metrics) {
	mean := func(f func(m metrics) float64) float64 {
		var sum float64
		for _, m := range runs {
			sum += f(m)
		}
		return sum / float64(len(runs))
	}
	ms := func(f func(m metrics) time.Duration) float64 {
		return mean(func(m metrics) float64 { return float64(f(m)) / float64(time.Millisecond) })
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(func(m metrics) time.Duration { return m.bindP50 }), "bind-p50-ms")
	b.ReportMetric(ms(func(m metrics) time.Duration { return m.bindP99 }), "bind-p99-ms")
	b.ReportMetric(ms(func(m metrics) time.Duration { return m.patchP99 }), "patch-p99-ms")
	b.ReportMetric(ms(func(m metrics) time.Duration { return m.patchDrain }), "patch-drain-ms")
	b.ReportMetric(mean(func(m metrics) float64 { return float64(m.apiWrites) }), "api-writes")
	b.ReportMetric(mean(func(m metrics) float64 { return float64(m.lost) }), "lost")
	if len(runs) > 0 && runs[0].throttled {
		b.ReportMetric(mean(func(m metrics) float64 { return float64(m.duringThrottle) }), "requests-during-throttle")
		b.ReportMetric(ms(func(m metrics) time.Duration { return m.throttleRecovery }), "recovery-ms")
	}
}

// quantile returns the q-quantile of ds by the nearest-rank method: with 20
// values, p50 is the 10th smallest and p99 the largest.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// TestStormScenario runs every variant of the storm once on testing/synctest's
// fake clock — in well under a second, so that plain go test checks the
// harness — and holds it to what the scenario makes certain whatever the
// dispatcher's policy: nothing lost, one API write per call, and a drain no
// faster than the token bucket allows. It logs the figures, which on the fake
// clock show the policy's effect without scheduling noise.
func TestStormScenario(t *testing.T) {
	results := map[string]metrics{} // by variant/workers
	for _, v := range stormVariants() {
		for _, w := range v.workers {
			t.Run(fmt.Sprintf("variant=%s/workers=%d", v.name, w), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					cfg := v.cfg
					cfg.Workers = w
					m := run(t, v.sc, cfg)
					t.Log(m)
					results[fmt.Sprintf("%s/%d", v.name, w)] = m

					sc := v.sc
					if m.lost != 0 {
						t.Errorf("lost = %d, want 0", m.lost)
					}
					calls := sc.patches + sc.binds
					minCalls := sc.pods + sc.binds // every pod's patches coalesced into one
					switch {
					case m.throttled:
						if m.apiWrites <= calls {
							t.Errorf("api-writes = %d under a 429 window, want retries beyond %d", m.apiWrites, calls)
						}
						if limit := int(sc.qps*sc.throttle.length().Seconds()) + sc.burst; m.duringThrottle > limit {
							t.Errorf("requests-during-throttle = %d, more than the bucket allows (%d)", m.duringThrottle, limit)
						}
					case m.apiWrites < minCalls || m.apiWrites > calls:
						t.Errorf("api-writes = %d, want %d..%d", m.apiWrites, minCalls, calls)
					}
					// The bucket lets burst writes through at once, then one per
					// 1/qps; the last patch ends a round trip after its token.
					// (Less a millisecond: the bucket computes in floats.)
					floor := time.Duration(float64(m.apiWrites-sc.burst)/sc.qps*float64(time.Second)) + sc.latency - time.Millisecond
					if m.patchDrain < floor {
						t.Errorf("patch-drain = %v, faster than the bucket allows (%v)", m.patchDrain, floor)
					}
					if m.bindP50 > m.bindP99 || m.bindP99 <= 0 || m.patchP99 <= 0 {
						t.Errorf("implausible latencies: %+v", m)
					}
				})
			})
		}
	}
	t.Run("targets", func(t *testing.T) { checkStormTargets(t, results) })
}

// checkStormTargets checks the targets for priority at the wire on the fake clock, where the
// figures are the policy's alone: with the limit on the dispatcher's side,
// no tenant cap and no reservation, bind p99 ≤ 2 × (latency + one token
// interval) at 8 and at 16 workers, and the storm no slower than FIFO's;
// adaptive concurrency sends under half the requests of fixed mode into a
// 429 window and is back to the bucket's rate within 2 s of its end.
func checkStormTargets(t *testing.T, r map[string]metrics) {
	sc := theStorm()
	bound := 2 * (sc.latency + time.Duration(float64(time.Second)/sc.qps))
	fifo := r["fifo/8"]
	for _, k := range []string{"dispatcher-limit/8", "dispatcher-limit/16", "reserved/8", "reserved/16", "adaptive/8", "adaptive/16"} {
		m := r[k]
		if m.bindP99 > bound {
			t.Errorf("%s: bind p99 %v > %v", k, m.bindP99, bound)
		}
		if m.patchP99 > fifo.patchP99 || m.patchDrain > fifo.patchDrain {
			t.Errorf("%s: patch p99 %v, drain %v: slower than fifo's %v, %v", k, m.patchP99, m.patchDrain, fifo.patchP99, fifo.patchDrain)
		}
	}
	fixed, adaptive := r["throttle/8"], r["throttle-adaptive/8"]
	if 2*adaptive.duringThrottle >= fixed.duringThrottle {
		t.Errorf("requests during the 429 window: adaptive %d, fixed %d: want under half", adaptive.duringThrottle, fixed.duringThrottle)
	}
	if adaptive.throttleRecovery > 2*time.Second {
		t.Errorf("adaptive recovery %v > 2s", adaptive.throttleRecovery)
	}
}

// total sums Stats.Outcomes or Stats.Calls.
func total(c map[dispatch.State]uint64) uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}
