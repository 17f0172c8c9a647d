package dispatch

import (
	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/due"

	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/window"
)

// fallbackState is the fallback policy's running state, guarded by the
// Dispatcher's lock. Its windows count per finished call and per first
// start, so no observation allocates.
type fallbackState struct {
	p        *FallbackPolicy // the Dispatcher's validated copy
	calls    window.Window   // Total: finished calls; Marked: Failed ones
	waits    window.Window   // Total: first starts; Marked: those that waited over MaxQueueWaitP99
	next     int64           // next check
	returnAt int64           // automatic return to Async, if set
	parked   bool            // no check is armed until wakeFallback
	reason   string
}

func newFallbackState(p *FallbackPolicy) *fallbackState {
	return &fallbackState{p: p, calls: window.New(p.Window), waits: window.New(p.Window)}
}

func (f *fallbackState) finished(now int64, failed bool) {
	b := f.calls.At(now)
	b.Total++
	if failed {
		b.Marked++
	}
}

func (f *fallbackState) waited(now int64, wait time.Duration) {
	b := f.waits.At(now)
	b.Total++
	if f.p.MaxQueueWaitP99 > 0 && wait > f.p.MaxQueueWaitP99 {
		b.Marked++
	}
}

// checkFallback runs on the clock: every tenth of the window it checks the
// thresholds (switching to Sync when one is crossed) or, after an automatic
// fallback, whether the cool-down return is due. While nothing it watches
// can change — Async with no live call, or Sync with no return due — it
// parks (fallbackIdle), and wakeFallback resumes it: an idle dispatcher
// does not wake.
func (d *Dispatcher[K, T]) checkFallback(now int64, ob *outbox[K, T]) {
	f := d.fallback
	if f.parked {
		return
	}
	if now < f.next {
		d.due.Set(due.Check, f.next)
		return
	}
	f.next = sat.Add(now, f.calls.Step())
	if d.mode == ModeSync {
		if f.returnAt != 0 && now >= f.returnAt {
			f.returnAt = 0
			d.switchMode(ModeAsync, reasonCoolDown, ob)
		}
	} else if code, detail := d.fallbackReason(now); code != "" {
		f.reason = detail
		if f.p.ReturnAfter > 0 {
			f.returnAt = sat.Add(now, int64(f.p.ReturnAfter))
		}
		d.switchMode(ModeSync, code, ob)
	}
	if d.fallbackIdle() {
		f.parked = true
		return
	}
	d.due.Set(due.Check, f.next)
}

// fallbackIdle reports whether nothing the fallback watches can change
// until a call is admitted or the mode is set: Sync with no return due, or
// Async with no live call and no breaker held open (whose time open is a
// threshold).
func (d *Dispatcher[K, T]) fallbackIdle() bool {
	f := d.fallback
	if d.mode == ModeSync {
		return f.returnAt == 0
	}
	breakerOpen := d.breaker != nil && d.breaker.State() != breaker.Closed && f.p.MaxCircuitOpen > 0
	return d.liveCalls == 0 && !breakerOpen
}

// wakeFallback resumes a parked fallback check at now: a call was admitted,
// or the mode went back to Async.
func (d *Dispatcher[K, T]) wakeFallback(now int64) {
	if f := d.fallback; f != nil && f.parked {
		f.parked = false
		f.next = now
		d.due.Set(due.Check, now)
	}
}

// fallbackReason says which threshold is exceeded, if any: its reason
// for the observer, and a detail with the measured values for
// Stats.FallbackReason.
func (d *Dispatcher[K, T]) fallbackReason(now int64) (code, detail string) {
	p := d.cfg.Rollout.Fallback
	if p.MaxBacklog > 0 {
		if n := d.liveCalls - d.running; n > p.MaxBacklog {
			return reasonBacklog, fmt.Sprintf("backlog %d > %d", n, p.MaxBacklog)
		}
	}
	if p.MaxFailureRatio > 0 {
		s := d.fallback.calls.Sum(now)
		if s.Total >= uint64(p.MinSamples) && float64(s.Marked) > p.MaxFailureRatio*float64(s.Total) {
			return reasonFailureRatio, fmt.Sprintf("failure ratio %.3f > %.3f", float64(s.Marked)/float64(s.Total), p.MaxFailureRatio)
		}
	}
	if p.MaxQueueWaitP99 > 0 {
		// p99 > max exactly when more than 1% of the waits exceed max.
		s := d.fallback.waits.Sum(now)
		if s.Total >= uint64(p.MinSamples) && float64(s.Marked) > 0.01*float64(s.Total) {
			return reasonQueueWait, fmt.Sprintf("queue wait p99 > %v (%d of %d waits)", p.MaxQueueWaitP99, s.Marked, s.Total)
		}
	}
	if p.MaxCircuitOpen > 0 && d.breaker != nil && d.breaker.State() != breaker.Closed {
		if open := time.Duration(now - d.breaker.Since()); open > p.MaxCircuitOpen {
			return reasonCircuitOpen, fmt.Sprintf("circuit open for %v > %v", open, p.MaxCircuitOpen)
		}
	}
	return "", ""
}

// FallbackPolicy switches to ModeSync, as SetMode would, when a threshold
// is crossed, and records the values in Stats.FallbackReason. A zero
// threshold is not checked; at least one must be set.
type FallbackPolicy struct {
	// Window is the span thresholds are measured over, checked every
	// tenth of it while there is work (default 10s; at least 10ms).
	Window     time.Duration
	MaxBacklog int // more calls than this wait to run ("backlog")
	// MaxQueueWaitP99: the window's p99 queue wait exceeds it
	// ("queue_wait"); MaxFailureRatio: more than this fraction of the
	// window's finished calls failed ("failure_ratio"); each once
	// MinSamples calls (default 20) counted.
	MaxQueueWaitP99 time.Duration
	MaxFailureRatio float64
	MinSamples      int
	MaxCircuitOpen  time.Duration // the circuit stayed not closed longer ("circuit_open")
	// ReturnAfter, if set, switches back to ModeAsync this long after a
	// fallback (reason "cool_down"); else only SetMode does.
	ReturnAfter time.Duration
}

// minFallbackWindow is the shortest FallbackPolicy.Window.
const minFallbackWindow = 10 * time.Millisecond

func (p *FallbackPolicy) validate() error {
	const f = "Rollout.Fallback."
	switch {
	case p.Window < 0 || (p.Window > 0 && p.Window < minFallbackWindow):
		return fieldErr(f+"Window", p.Window, fmt.Sprintf("must be at least %v (0 means the default)", minFallbackWindow))
	case p.MaxQueueWaitP99 < 0:
		return fieldErr(f+"MaxQueueWaitP99", p.MaxQueueWaitP99, "must not be negative")
	case p.MaxCircuitOpen < 0:
		return fieldErr(f+"MaxCircuitOpen", p.MaxCircuitOpen, "must not be negative")
	case p.ReturnAfter < 0:
		return fieldErr(f+"ReturnAfter", p.ReturnAfter, "must not be negative")
	case p.MaxBacklog < 0:
		return fieldErr(f+"MaxBacklog", p.MaxBacklog, "must not be negative")
	case p.MinSamples < 0:
		return fieldErr(f+"MinSamples", p.MinSamples, "must not be negative")
	case p.MaxFailureRatio < 0 || p.MaxFailureRatio > 1 || math.IsNaN(p.MaxFailureRatio):
		return fieldErr(f+"MaxFailureRatio", p.MaxFailureRatio, "must be in [0, 1]")
	case p.MaxBacklog == 0 && p.MaxQueueWaitP99 == 0 && p.MaxFailureRatio == 0 && p.MaxCircuitOpen == 0:
		return errors.New("dispatch: Config.Rollout.Fallback: no threshold set")
	}
	p.Window = cmp.Or(p.Window, 10*time.Second)
	p.MinSamples = cmp.Or(p.MinSamples, 20)
	return nil
}
