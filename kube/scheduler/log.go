package scheduler

import (
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"
)

// The dispatcher's own log lines, beside those of the calls (upstream's
// calls log from Execute through klog.FromContext: "Attempting to bind pod
// to node" and "Updating pod condition" at V(3)). Upstream's dispatcher
// logs nothing but internal errors, through utilruntime.HandleError; this
// one logs what it adds: retries at V(4), a queued call shed to make room
// at V(2), and a switch of mode or of the circuit breaker's state, which an
// operator must see, at V(0). A call whose Execute panicked, or whose
// OnFinish channel was closed (upstream's would crash the scheduler), is an
// internal error.

// logObserver logs the core's events worth a line, and passes every event
// on to the user's Observer (or NopObserver).
type logObserver struct {
	dispatch.Observer
	d *Dispatcher
}

func newLogObserver(d *Dispatcher, next dispatch.Observer) logObserver {
	if next == nil {
		next = dispatch.NopObserver{}
	}
	return logObserver{Observer: next, d: d}
}

// OnRetry also kicks the pending gauge: the call waits again, now in its
// backoff — and a retry that absorbed its successor may have moved the
// count from one call type to another.
func (o logObserver) OnRetry(e dispatch.Event, attempt int, delay time.Duration, err error) {
	o.d.pending.kick()
	o.d.log().V(4).Info("Retrying API call", "callType", e.Label, "attempt", attempt, "delay", delay, "err", err)
	o.Observer.OnRetry(e, attempt, delay, err)
}

func (o logObserver) OnDrop(e dispatch.Event, b dispatch.Bound) {
	o.d.log().V(2).Info("Dropped a queued API call to make room", "callType", e.Label, "bound", b)
	o.Observer.OnDrop(e, b)
}

func (o logObserver) OnModeChange(from, to dispatch.Mode, reason string) {
	o.d.log().Info("API dispatcher switched mode", "from", from, "to", to, "reason", reason)
	o.Observer.OnModeChange(from, to, reason)
}

func (o logObserver) OnCircuitChange(from, to dispatch.Circuit) {
	o.d.log().Info("API dispatcher's circuit breaker changed state", "from", from, "to", to)
	o.Observer.OnCircuitChange(from, to)
}

// logErr reports an internal error as upstream's dispatcher does.
func logErr(logger klog.Logger, err error, msg string, kv ...any) {
	utilruntime.HandleErrorWithLogger(logger, err, msg, kv...)
}

// panics counts the panics of user code the adapter runs and contains
// itself — a send on a closed OnFinish channel (tell), Metrics' methods —
// which the core never sees: Stats adds them to the core's
// Stats.CallbackPanics.
type panics struct {
	n    atomic.Uint64
	last atomic.Pointer[contained]
}

// contained is the latest panic the adapter contained, with the core's
// CallbackPanics when it was: while that count has not moved, it is the
// latest callback panic of all.
type contained struct {
	pe   *dispatch.PanicError
	core uint64
}

func (p *panics) add(core *dispatch.Dispatcher[types.UID, *entry], pe *dispatch.PanicError) {
	p.last.Store(&contained{pe: pe, core: core.Stats().CallbackPanics})
	p.n.Add(1) // after last: a count read non-zero finds last set
}

// into adds the adapter's contained panics to s, the core's snapshot.
func (p *panics) into(s *dispatch.Stats) {
	n := p.n.Load()
	if n == 0 {
		return
	}
	if last := p.last.Load(); s.LastCallbackPanic == nil || last.core >= s.CallbackPanics {
		s.LastCallbackPanic = last.pe
	}
	s.CallbackPanics += n
}

// contain records pe, a panic (or runtime.Goexit) of Metrics' method
// callback, and logs it as an internal error.
func (d *Dispatcher) contain(pe *dispatch.PanicError) {
	d.panics.add(d.core, pe)
	logErr(d.log(), pe, "A Metrics method panicked", "callback", pe.Callback)
}
