package dispatch

import (
	"fmt"
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
		d.armTimer(f.next)
		return
	}
	f.next = sat.Add(now, f.calls.Step())
	if d.mode == ModeSync {
		if f.returnAt != 0 && now >= f.returnAt {
			f.returnAt = 0
			d.switchMode(ModeAsync, SwitchCoolDown, ob)
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
	d.armTimer(f.next)
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
	breakerOpen := d.breaker != nil && d.breaker.state != CircuitClosed && f.p.MaxBreakerOpen > 0
	return d.liveCalls == 0 && !breakerOpen
}

// wakeFallback resumes a parked fallback check at now: a call was admitted,
// or the mode went back to Async.
func (d *Dispatcher[K, T]) wakeFallback(now int64) {
	if f := d.fallback; f != nil && f.parked {
		f.parked = false
		f.next = now
		d.armTimer(now)
	}
}

// fallbackReason says which threshold is exceeded, if any: its SwitchReason
// for the observer, and a detail with the measured values for
// Stats.FallbackReason.
func (d *Dispatcher[K, T]) fallbackReason(now int64) (code SwitchReason, detail string) {
	p := d.cfg.Fallback
	if p.MaxBacklog > 0 {
		if n := d.liveCalls - d.running; n > p.MaxBacklog {
			return SwitchBacklog, fmt.Sprintf("backlog %d > %d", n, p.MaxBacklog)
		}
	}
	if p.MaxFailureRatio > 0 {
		s := d.fallback.calls.Sum(now)
		if s.Total >= uint64(p.MinSamples) && float64(s.Marked) > p.MaxFailureRatio*float64(s.Total) {
			return SwitchFailureRatio, fmt.Sprintf("failure ratio %.3f > %.3f", float64(s.Marked)/float64(s.Total), p.MaxFailureRatio)
		}
	}
	if p.MaxQueueWaitP99 > 0 {
		// p99 > max exactly when more than 1% of the waits exceed max.
		s := d.fallback.waits.Sum(now)
		if s.Total >= uint64(p.MinSamples) && float64(s.Marked) > 0.01*float64(s.Total) {
			return SwitchQueueWait, fmt.Sprintf("queue wait p99 > %v (%d of %d waits)", p.MaxQueueWaitP99, s.Marked, s.Total)
		}
	}
	if p.MaxBreakerOpen > 0 && d.breaker != nil && d.breaker.state != CircuitClosed {
		if open := time.Duration(now - d.breaker.since); open > p.MaxBreakerOpen {
			return SwitchBreakerOpen, fmt.Sprintf("breaker open for %v > %v", open, p.MaxBreakerOpen)
		}
	}
	return "", ""
}
