package scheduler

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/internal/goid"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// Metrics receives what kube-scheduler's own async-call metrics record
// (pkg/scheduler/metrics: scheduler_async_api_call_execution_total,
// scheduler_async_api_call_execution_duration_seconds,
// scheduler_pending_async_api_calls). The drop-in package implements it with
// those metrics; dispatch's own figures are in Stats and, through
// Options.Observer, in dispatchprom.
//
// A panic in either method is contained, as the dispatcher's other
// callbacks' are: logged as an internal error and counted in
// Stats.CallbackPanics; it changes no call's outcome, and a count Pending
// did not take is told again at the next change. Executed runs on the
// worker, inside the execution: one that ends its goroutine
// (runtime.Goexit) ends the execution as an Execute that did (the call
// fails); a Pending that does is followed by a goroutine of its own.
type Metrics interface {
	// Executed reports one execution of a call of type t: its Execute
	// returned err after elapsed. It is called on the goroutine that ran
	// the execution — a worker, or, in dispatch.ModeSync, the Add that ran
	// it inline — after every execution, retries included.
	Executed(t fwk.APICallType, err error, elapsed time.Duration)
	// Pending reports that n calls of type t are waiting to run: queued,
	// waiting out a retry's backoff, or behind their object's call in
	// flight. It is called from one goroutine, which Start starts: at
	// once, for the calls added before Start, then shortly after the
	// number changes, and once more when the dispatcher closes. Before
	// Start it is not called, and a dispatcher closed before Start never
	// calls it.
	Pending(t fwk.APICallType, n int)
}

// pendingGauge keeps Metrics.Pending up to date. Events (an Add, an
// execution's start, a retry, a call's end) kick it; one goroutine, started by
// Start, answers each batch of kicks by reading the core's count of each
// call type's (tenant's) waiting calls — dispatch.Dispatcher.Queued, one
// counter read under the core's lock per type, no allocation — and reports
// the types whose count changed. A kick arriving during a read is kept, so
// the last change is always reported.
type pendingGauge struct {
	core    *dispatch.Dispatcher[types.UID, *entry]
	m       Metrics
	contain func(*dispatch.PanicError) // a panic (or Goexit) of m.Pending
	kc      chan struct{}              // kicks, capacity 1

	// types holds every call type added so far, never changed once
	// stored: Add looks its type up without a lock, and adds a new one
	// under mu by storing a copy.
	types atomic.Pointer[map[fwk.APICallType]struct{}]

	mu      sync.Mutex
	running bool
	stopped bool
	quit    chan struct{}
	wg      sync.WaitGroup
	id      atomic.Uint64 // the goroutine's (goid), once it runs

	reported map[fwk.APICallType]int // owned by the goroutine
}

func (g *pendingGauge) init(core *dispatch.Dispatcher[types.UID, *entry], m Metrics, contain func(*dispatch.PanicError)) {
	g.core, g.m, g.contain = core, m, contain
	g.types.Store(&map[fwk.APICallType]struct{}{})
	if m != nil {
		g.kc = make(chan struct{}, 1)
		g.quit = make(chan struct{})
		g.reported = make(map[fwk.APICallType]int)
	}
}

// see records that calls of type t are added, for the goroutine (and
// Dispatcher.demand) to read.
func (g *pendingGauge) see(t fwk.APICallType) {
	if _, ok := (*g.types.Load())[t]; ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.types.Load()
	if _, ok := old[t]; ok {
		return
	}
	next := make(map[fwk.APICallType]struct{}, len(old)+1)
	for k := range old {
		next[k] = struct{}{}
	}
	next[t] = struct{}{}
	g.types.Store(&next)
}

// kick says the number of waiting calls may have changed.
func (g *pendingGauge) kick() {
	if g.kc == nil {
		return
	}
	select {
	case g.kc <- struct{}{}:
	default:
	}
}

func (g *pendingGauge) start() {
	if g.m == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running || g.stopped {
		return
	}
	g.running = true
	g.wg.Add(1)
	go g.loop()
	g.kick()
}

// stop ends the goroutine after a last report, and waits for it — unless
// called from it (a Metrics.Pending that calls Close): then it cannot, and
// reports so (self); the goroutine makes its last report and exits once
// Pending returns.
func (g *pendingGauge) stop() (self bool) {
	if g.m == nil {
		return false
	}
	g.mu.Lock()
	if !g.stopped {
		g.stopped = true
		close(g.quit)
	}
	running := g.running
	g.mu.Unlock()
	if !running {
		return false
	}
	if g.id.Load() == goid.ID() {
		return true
	}
	g.wg.Wait()
	return false
}

// loop reports the counts as they change. If Pending ends its goroutine
// (runtime.Goexit), another takes over, as the core's goroutines do, and
// tells the count again at the next change — unless the gauge is stopping.
func (g *pendingGauge) loop() {
	normal := false
	defer func() {
		if !normal {
			g.contain(&dispatch.PanicError{Callback: "metrics_pending", Value: dispatch.ErrGoexit, Stack: debug.Stack()})
			select {
			case <-g.quit: // its last report: the next one would be too
			default:
				g.wg.Add(1) // before Done: a Close waiting never finds none
				go g.loop()
			}
		}
		g.wg.Done()
	}()
	g.id.Store(goid.ID())
	for {
		select {
		case <-g.quit:
			g.report()
			normal = true
			return
		case <-g.kc:
			g.report()
		}
	}
}

// report tells Pending each count that changed since it last returned.
func (g *pendingGauge) report() {
	for t := range *g.types.Load() {
		n := g.core.Queued(string(t))
		if old, ok := g.reported[t]; (!ok || old != n) && g.tell(t, n) {
			g.reported[t] = n
		}
	}
}

// tell tells Pending, containing a panic in it; it reports whether Pending
// returned (a count it did not take is told again at the next report).
func (g *pendingGauge) tell(t fwk.APICallType, n int) (returned bool) {
	defer func() {
		if v := recover(); v != nil {
			g.contain(&dispatch.PanicError{Callback: "metrics_pending", Value: v, Stack: debug.Stack()})
		}
	}()
	g.m.Pending(t, n)
	return true
}
