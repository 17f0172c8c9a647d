// Command quickstart shows dispatch in a scheduler-like setting, with no
// network: a hot loop that must never block posts a storm of low-priority
// status patches for unschedulable pods, and now and then binds a pod at high
// priority and waits for that bind. Every call goes to a fake API server
// that is slow (-latency per call) and now and then answers 503 with a
// Retry-After hint (-errors), which the dispatcher's default retry policy
// retries.
//
// The storm coalesces per pod (Config.Merge folds a pod's pending patches into
// one API call), so the API sees far fewer calls than the loop submits. And
// because binds outrank patches, and one worker is kept for them, a bind
// waits for neither the storm nor a free worker: its latency stays near one
// API round trip. With -compare (the
// default) the same workload is run again with every call at priority 0 —
// the FIFO-with-coalescing order of kube-scheduler's APIDispatcher, where a
// bind queues behind every pending patch (kubernetes/kubernetes#135900).
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -pods 1000 -latency 50ms -workers 8 # FIFO binds expire
//	go run ./examples/quickstart -svg docs/quickstart.svg            # and draw it
//
// With -svg FILE it also writes a picture of both runs to FILE: each bind's
// latency at the moment it was submitted, and the queue depth over time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch"
)

type config struct {
	pods        int           // unschedulable pods whose status is patched
	burst       int           // status patches posted per millisecond
	bindEvery   time.Duration // how often the loop binds a pod
	bindTimeout time.Duration // a bind's deadline
	deleteEvery time.Duration // how often a patched pod is deleted
	latency     time.Duration // mean fake API latency
	errRate     float64       // fraction of API calls that fail
	workers     int
	duration    time.Duration // how long the hot loop runs
	drain       time.Duration // how long Close may drain the backlog
	compare     bool          // also run the FIFO baseline
	svg         string        // write the picture here; "": no picture
}

// sampleEvery is how often a run records the queue depth for the picture.
const sampleEvery = 5 * time.Millisecond

func main() {
	c := parseFlags()
	fmt.Printf("dispatch quickstart: %d unschedulable pods, %d status patches/ms, a bind every %v (deadline %v),\n",
		c.pods, c.burst, c.bindEvery, c.bindTimeout)
	fmt.Printf("fake API %v ±50%% per call with %.0f%% 503s, %d workers, hot loop for %v\n\n",
		c.latency, 100*c.errRate, c.workers, c.duration)

	reports := []*report{run(c, false)}
	if c.compare {
		reports = append(reports, run(c, true))
	}
	printReports(reports, c.latency)
	if c.svg != "" {
		if err := saveSVG(c.svg, reports, c.duration, c.latency); err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(1)
		}
		fmt.Printf("\nWrote %s.\n", c.svg)
	}
	for _, r := range reports {
		if r.broken != "" {
			fmt.Fprintln(os.Stderr, "quickstart:", r.name+":", r.broken)
			os.Exit(1)
		}
	}
}

// parseFlags reads the command line; a bad value ends the program with
// its usage.
func parseFlags() config {
	var c config
	flag.IntVar(&c.pods, "pods", 200, "unschedulable pods whose status the loop keeps patching")
	flag.IntVar(&c.burst, "burst", 20, "status patches the loop posts per millisecond")
	flag.DurationVar(&c.bindEvery, "bind-every", 20*time.Millisecond, "how often the loop binds a pod (high priority)")
	flag.DurationVar(&c.bindTimeout, "bind-timeout", 2*time.Second, "deadline of each bind")
	flag.DurationVar(&c.deleteEvery, "delete-every", 100*time.Millisecond, "how often a patched pod is deleted (Cancel); 0: never")
	flag.DurationVar(&c.latency, "latency", 20*time.Millisecond, "mean latency of one fake API call")
	flag.Float64Var(&c.errRate, "errors", 0.02, "fraction of fake API calls that fail with a retryable 503")
	flag.IntVar(&c.workers, "workers", 4, "dispatcher workers (concurrent API calls)")
	flag.DurationVar(&c.duration, "duration", time.Second, "how long the hot loop runs")
	flag.DurationVar(&c.drain, "drain", 5*time.Second, "how long Close may drain the backlog before ending the rest as Closed")
	flag.BoolVar(&c.compare, "compare", true, "also run the same workload with every call at priority 0 (FIFO)")
	flag.StringVar(&c.svg, "svg", "", "also write an SVG picture of bind latency and queue depth over time to `FILE`")
	flag.Parse()
	if err := c.check(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		flag.Usage()
		os.Exit(2)
	}
	return c
}

func (c config) check() error {
	switch {
	case c.pods < 1, c.burst < 1, c.workers < 1:
		return errors.New("-pods, -burst and -workers must be positive")
	case c.bindEvery <= 0, c.bindTimeout <= 0, c.duration <= 0:
		return errors.New("-bind-every, -bind-timeout and -duration must be positive")
	case c.latency < 0, c.drain < 0, c.deleteEvery < 0:
		return errors.New("-latency, -drain and -delete-every must not be negative")
	case c.errRate < 0 || c.errRate > 1:
		return errors.New("-errors must be in [0, 1]")
	}
	return nil
}

// kind is the API operation a call performs.
type kind uint8

const (
	statusPatch kind = iota // PATCH pods/status: the PodScheduled=False condition
	bind                    // POST pods/binding: a prerequisite of the pod running
)

// call is one API operation on a pod. Status patches carry the latest
// condition and how many updates were folded into them.
type call struct {
	kind    kind
	attempt int    // statusPatch: the scheduling attempt that failed
	node    string // bind: the target node
	updates int    // statusPatch: submissions merged into this call
}

// mergeStatus folds an incoming call into its pod's pending one, for every
// write to a pod shares the pod's key: a bind replaces a pending status
// patch (the pod is scheduled, so its PodScheduled=False is moot), a status
// patch behind a pending bind is moot, and two status patches fold into
// one: the newest condition wins, the updates add up. A bind is never
// merged away. (This run binds pods the storm never patches, as in
// kubernetes/kubernetes#135900, so only patches meet here; a scheduler's
// pods meet the other two cases too.)
func mergeStatus(pending, incoming call) (call, error) {
	switch {
	case incoming.kind == bind:
		return incoming, dispatch.ReplacePending
	case pending.kind == bind:
		return pending, dispatch.SkipIncoming
	}
	incoming.updates += pending.updates
	return incoming, nil
}

// fakeAPI stands in for the API server: every call takes latency ±50% and
// fails with probability errRate.
type fakeAPI struct {
	latency time.Duration
	errRate float64
	calls   [2]atomic.Int64 // by kind
	updates atomic.Int64    // status updates carried by successful patches
}

// unavailable is the fake server's 503. Its Retry-After hint makes
// dispatch.DefaultClassifier judge it retryable.
type unavailable struct{ after time.Duration }

func (unavailable) Error() string               { return "fake API: 503 Service Unavailable" }
func (e unavailable) RetryAfter() time.Duration { return e.after }

func (a *fakeAPI) exec(ctx context.Context, pod string, c call) error {
	a.calls[c.kind].Add(1)
	if a.latency > 0 {
		t := time.NewTimer(a.latency/2 + rand.N(a.latency))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done(): // cancelled: pod deleted, deadline passed, or Close
			return context.Cause(ctx)
		}
	}
	if rand.Float64() < a.errRate {
		return unavailable{after: a.latency}
	}
	if c.kind == statusPatch {
		a.updates.Add(int64(c.updates))
	}
	return nil
}

// report is what one run measured.
type report struct {
	mu sync.Mutex // guards what the hook and the binding goroutines record

	name                string
	patches, binds      int // submissions by the hot loop
	rejected            int // of those, refused at once
	bindsRejected       int
	deleted             int
	apiCalls            [2]int64
	updates             int64
	bindLatency         []time.Duration        // Submit → outcome, per bind; guarded by mu
	bindPoints          []bindPoint            // the same, with when and how it ended, for the picture; guarded by mu
	depthSamples        []depthSample          // queue depth over time (-svg only)
	start               time.Time              // when the hot loop started
	bindStates          map[dispatch.State]int // guarded by mu
	patchWait, bindWait []time.Duration        // enqueue → first execution, per call; guarded by mu
	loopTime, loopMax   time.Duration          // Post and Submit in the loop: total, slowest
	closeTook           time.Duration
	closeErr            error
	stats               dispatch.Stats
	broken              string // a violated invariant, if any
}

// run runs the workload once, with priorities or (fifo) with every call at
// priority 0, and reports what it measured.
func run(c config, fifo bool) *report {
	r := &report{name: "priority", bindStates: map[dispatch.State]int{}}
	bindPriority := 10
	if fifo {
		r.name, bindPriority = "FIFO", 0
	}
	api := &fakeAPI{latency: c.latency, errRate: c.errRate}
	d := r.newDispatcher(c, api, fifo, bindPriority)
	stopSampling := r.hotLoop(c, d, bindPriority)
	r.shutdown(d, c.drain)
	stopSampling()

	r.stats = d.Stats()
	r.apiCalls = [2]int64{api.calls[statusPatch].Load(), api.calls[bind].Load()}
	r.updates = api.updates.Load()
	r.check()
	return r
}

// newDispatcher makes the run's dispatcher, calling api, with its
// completion hook recording into r.
func (r *report) newDispatcher(c config, api *fakeAPI, fifo bool, bindPriority int) *dispatch.Dispatcher[string, call] {
	// With priorities, one worker is kept for binds: however the storm
	// fills the others, a bind finds a free worker at once. (Upstream's
	// FIFO dispatcher has nothing of the kind.)
	var policy dispatch.StartPolicy
	if !fifo && c.workers > 1 {
		policy = dispatch.StartPolicy{ReservedWorkers: 1, UrgentPriority: bindPriority}
	}
	d, err := dispatch.New(api.exec,
		dispatch.Config[string, call]{
			Workers: c.workers,
			Start:   policy,
			Merge:   mergeStatus,
			// The completion hook is where a scheduler would requeue the pod
			// for re-evaluation; here it records how long each call queued.
			OnDone: func(res dispatch.Result[string, call]) {
				if res.Attempts == 0 {
					return // never ran: cancelled, expired or closed in the queue
				}
				r.mu.Lock()
				if res.Call.kind == bind {
					r.bindWait = append(r.bindWait, res.QueueWait)
				} else {
					r.patchWait = append(r.patchWait, res.QueueWait)
				}
				r.mu.Unlock()
			},
		},
	)
	if err != nil {
		panic(err) // the options above are valid
	}
	return d
}

// podSet is the loop's unschedulable pods; a deleted one is replaced by a
// new one.
type podSet struct {
	names   []string
	attempt int // scheduling attempts so far
	next    int // the number of the next pod made
}

func newPodSet(n int) *podSet {
	ps := &podSet{names: make([]string, n), next: n}
	for i := range ps.names {
		ps.names[i] = fmt.Sprintf("pending-%04d", i)
	}
	return ps
}

// hotLoop runs the scheduler-like loop for c.duration: every millisecond a
// burst of status patches, and now and then a bind and a pod deletion. It
// returns once every binding cycle it started has heard its outcome, with
// the function that stops the queue-depth sampling (-svg).
func (r *report) hotLoop(c config, d *dispatch.Dispatcher[string, call], bindPriority int) (stopSampling func()) {
	pods := newPodSet(c.pods)
	var binders sync.WaitGroup
	tick := time.NewTicker(time.Millisecond)
	start := time.Now()
	r.start = start
	stopSampling = func() {}
	if c.svg != "" {
		stopSampling = r.sampleDepth(d)
	}
	lastBind, lastDelete := start, start
	nbind := 0
	for now := range tick.C {
		if now.Sub(start) >= c.duration {
			break
		}
		r.storm(d, pods, c.burst)
		// A pod fits a node: bind it at high priority.
		if now.Sub(lastBind) >= c.bindEvery {
			lastBind = now
			nbind++
			r.bind(d, &binders, fmt.Sprintf("bound-%04d", nbind), fmt.Sprintf("node-%d", nbind%50),
				bindPriority, c.bindTimeout)
		}
		if c.deleteEvery > 0 && now.Sub(lastDelete) >= c.deleteEvery {
			lastDelete = now
			r.deletePod(d, pods)
		}
	}
	tick.Stop()
	binders.Wait()
	return stopSampling
}

// storm posts burst status patches: a scheduling attempt failed for these
// pods, so each gets one. Fire-and-forget, droppable, priority 0.
func (r *report) storm(d *dispatch.Dispatcher[string, call], pods *podSet, burst int) {
	for range burst {
		pod := pods.names[pods.attempt%len(pods.names)]
		pods.attempt++
		t0 := time.Now()
		err := d.Post(pod, call{kind: statusPatch, attempt: pods.attempt, updates: 1},
			dispatch.SubmitOptions{Priority: 0, Droppable: true})
		r.loopCall(t0)
		r.patches++
		if err != nil {
			r.rejected++
		}
	}
}

var errPodDeleted = errors.New("pod deleted")

// deletePod deletes a pod: whatever is queued or in flight for it is
// cancelled, and a new pod takes its place.
func (r *report) deletePod(d *dispatch.Dispatcher[string, call], pods *podSet) {
	i := rand.IntN(len(pods.names))
	d.Cancel(pods.names[i], errPodDeleted)
	r.deleted++
	pods.names[i] = fmt.Sprintf("pending-%04d", pods.next)
	pods.next++
}

// shutdown drains the backlog by priority for up to drain, then ends the
// rest as Closed. Close returns once every worker has exited.
func (r *report) shutdown(d *dispatch.Dispatcher[string, call], drain time.Duration) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	r.closeErr = d.Close(ctx)
	cancel()
	r.closeTook = time.Since(t0)
}

// bind submits a bind at priority prio with a deadline, and starts its
// binding cycle: a goroutine (as in kube-scheduler) that waits for the
// outcome, so the hot loop does not.
func (r *report) bind(d *dispatch.Dispatcher[string, call], binders *sync.WaitGroup, pod, node string, prio int, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t0 := time.Now()
	t, err := d.Submit(ctx, pod, call{kind: bind, node: node}, dispatch.SubmitOptions{Priority: prio})
	r.loopCall(t0)
	r.binds++
	if err != nil {
		cancel()
		r.rejected++
		r.bindsRejected++
		return
	}
	binders.Go(func() {
		defer cancel()
		<-t.Done()
		res, _ := t.Result()
		took := time.Since(t0)
		r.mu.Lock()
		r.bindLatency = append(r.bindLatency, took)
		r.bindStates[res.State]++
		r.bindPoints = append(r.bindPoints, bindPoint{at: t0.Sub(r.start), latency: took, ok: res.State.OK()})
		r.mu.Unlock()
	})
}

// sampleDepth records the queue depth every sampleEvery, for the picture,
// until the function it returns is called; that function waits for the
// sampler to stop and records one last sample.
func (r *report) sampleDepth(d *dispatch.Dispatcher[string, call]) (stop func()) {
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				r.depthSamples = append(r.depthSamples, depthSample{at: time.Since(r.start), depth: queueDepth(d.Stats())})
			}
		}
	})
	return func() {
		close(done)
		sampler.Wait()
		r.depthSamples = append(r.depthSamples, depthSample{at: time.Since(r.start), depth: queueDepth(d.Stats())})
	}
}

// saveSVG writes the picture of rs to the file name.
func saveSVG(name string, rs []*report, loop, apiLatency time.Duration) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := writeSVG(f, rs, loop, apiLatency); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// loopCall records the cost of one Post or Submit made by the hot loop.
func (r *report) loopCall(t0 time.Time) {
	took := time.Since(t0)
	r.loopTime += took
	r.loopMax = max(r.loopMax, took)
}

// check verifies what the library promises, so that the demo fails loudly
// if it is ever broken: every submission is accounted for exactly once, and
// every accepted bind heard its outcome.
func (r *report) check() {
	s := r.stats
	var ended uint64
	for _, n := range s.Outcomes {
		ended += n
	}
	switch {
	case s.Live != 0:
		r.broken = fmt.Sprintf("%d submissions still live after Close", s.Live)
	case s.Submitted != uint64(r.patches+r.binds):
		r.broken = fmt.Sprintf("Stats.Submitted is %d, the loop submitted %d", s.Submitted, r.patches+r.binds)
	case s.Submitted != s.Rejected+ended:
		r.broken = fmt.Sprintf("submitted %d != rejected %d + outcomes %d", s.Submitted, s.Rejected, ended)
	case len(r.bindLatency) != r.binds-r.bindsRejected:
		r.broken = fmt.Sprintf("%d binds accepted, %d outcomes heard", r.binds-r.bindsRejected, len(r.bindLatency))
	}
}

// printReports prints what the runs measured side by side, and how the
// binds' p99 compares.
func printReports(rs []*report, lat time.Duration) {
	t := table(rs)
	t.header()
	t.loopAndAPI()
	t.latencies()
	t.outcomes()
	t.closing()
	if len(rs) == 2 {
		p, f := quantile(rs[0].bindLatency, 0.99), quantile(rs[1].bindLatency, 0.99)
		fmt.Printf("\nOne API call takes about %v. With priority, p99 bind latency is %v;\n", dur(lat), dur(p))
		fmt.Printf("in FIFO order it is %v (%.1f×): a FIFO bind waits behind every queued patch.\n",
			dur(f), float64(f)/float64(max(p, 1)))
	}
}

// table prints reports side by side, one column each.
type table []*report

// row prints label and a cell for each report.
func (t table) row(label string, cell func(r *report) string) {
	fmt.Printf("  %-36s", label)
	for _, r := range t {
		fmt.Printf("%16s", cell(r))
	}
	fmt.Println()
}

// count prints a row of a count.
func (t table) count(label string, n func(r *report) int64) {
	t.row(label, func(r *report) string { return group(n(r)) })
}

// byState prints a row for each state that any report counts.
func (t table) byState(n func(*report, dispatch.State) uint64) {
	for _, st := range states(t, n) {
		t.count(st.String(), func(r *report) int64 { return int64(n(r, st)) })
	}
}

func (t table) header() {
	fmt.Printf("%-38s", "")
	for _, r := range t {
		fmt.Printf("%16s", r.name)
	}
	fmt.Println()
}

func (t table) loopAndAPI() {
	fmt.Println("hot loop")
	t.count("status patches posted", func(r *report) int64 { return int64(r.patches) })
	t.count("binds submitted", func(r *report) int64 { return int64(r.binds) })
	t.count("pods deleted (Cancel)", func(r *report) int64 { return int64(r.deleted) })
	t.count("refused (backpressure, ...)", func(r *report) int64 { return int64(r.rejected) })
	t.row("mean Post/Submit", func(r *report) string { return dur(r.loopTime / time.Duration(max(r.patches+r.binds, 1))) })
	t.row("slowest Post/Submit", func(r *report) string { return dur(r.loopMax) })
	fmt.Println("fake API")
	t.count("status patch calls", func(r *report) int64 { return r.apiCalls[statusPatch] })
	t.count("bind calls", func(r *report) int64 { return r.apiCalls[bind] })
	t.row("submissions per API call", func(r *report) string {
		return fmt.Sprintf("%.1f", float64(r.patches+r.binds)/float64(max(r.apiCalls[0]+r.apiCalls[1], 1)))
	})
	t.count("retries (503 with Retry-After)", func(r *report) int64 { return int64(r.stats.Retries) })
	t.count("status updates delivered", func(r *report) int64 { return r.updates })
}

func (t table) latencies() {
	fmt.Println("bind latency (Submit → outcome)")
	for _, q := range []float64{0.50, 0.99, 1} {
		t.row(qname(q), func(r *report) string { return dur(quantile(r.bindLatency, q)) })
	}
	fmt.Println("queue wait (enqueue → first run)")
	for _, q := range []float64{0.50, 0.99} {
		t.row("bind "+qname(q), func(r *report) string { return dur(quantile(r.bindWait, q)) })
	}
	for _, q := range []float64{0.50, 0.99} {
		t.row("status patch "+qname(q), func(r *report) string { return dur(quantile(r.patchWait, q)) })
	}
}

func (t table) outcomes() {
	fmt.Println("bind outcomes")
	t.byState(func(r *report, st dispatch.State) uint64 { return uint64(r.bindStates[st]) })
	fmt.Println("Stats(): submissions by outcome")
	t.byState(func(r *report, st dispatch.State) uint64 { return r.stats.Outcomes[st] })
	t.count("coalesced", func(r *report) int64 { return int64(r.stats.Coalesced) })
	t.count("rejected", func(r *report) int64 { return int64(r.stats.Rejected) })
	fmt.Println("Stats(): API calls by outcome")
	t.byState(func(r *report, st dispatch.State) uint64 { return r.stats.Calls[st] })
	t.count("executions", func(r *report) int64 { return int64(r.stats.Executions) })
	t.count("stale executions", func(r *report) int64 { return int64(r.stats.StaleExecutions) })
}

func (t table) closing() {
	fmt.Println("Close")
	t.row("took", func(r *report) string { return dur(r.closeTook) })
	t.row("backlog", func(r *report) string {
		if r.closeErr == nil {
			return "drained"
		}
		return "rest Closed"
	})
	t.row("submitted = rejected + Σ outcomes", func(r *report) string {
		if r.broken != "" {
			return "BROKEN"
		}
		return "exact"
	})
}

// states lists the states that any report counts.
func states(rs []*report, count func(*report, dispatch.State) uint64) []dispatch.State {
	var out []dispatch.State
	for st := dispatch.StateSucceeded; st <= dispatch.StateClosed; st++ {
		for _, r := range rs {
			if count(r, st) > 0 {
				out = append(out, st)
				break
			}
		}
	}
	return out
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func qname(q float64) string {
	if q == 1 {
		return "max"
	}
	return fmt.Sprintf("p%.0f", q*100)
}

// dur rounds d for reading.
func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		d = d.Round(10 * time.Millisecond)
	case d >= 100*time.Millisecond:
		d = d.Round(time.Millisecond)
	case d >= time.Millisecond:
		d = d.Round(100 * time.Microsecond)
	case d >= 10*time.Microsecond:
		d = d.Round(time.Microsecond)
	case d >= time.Microsecond:
		d = d.Round(10 * time.Nanosecond)
	}
	return d.String()
}

// group writes n with thousands separators.
func group(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
