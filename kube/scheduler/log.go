package scheduler

import (
	"time"

	"github.com/coalescer/dispatch"
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
