package dispatch

import (
	"errors"
	"fmt"
	"time"
)

// ErrFallback is the error of a queued call that a switch to Sync mode
// cancelled (SwitchCancel): its waiters end Canceled with an error matching
// ErrFallback, which tells the caller to run the call on the synchronous path
// itself.
var ErrFallback = errors.New("dispatch: switched to synchronous mode; take the synchronous path")

// SwitchPolicy says what a switch to Sync does with the calls already
// queued (Config.SwitchPolicy). Calls in flight always run to their end.
type SwitchPolicy uint8

const (
	// DrainQueued keeps running the queued calls on the workers until they
	// are done (SetMode waits for them until its ctx ends, then cancels the
	// rest with ErrFallback). It is the default.
	DrainQueued SwitchPolicy = iota
	// CancelQueued ends every queued call at once: waiters get Canceled
	// with ErrFallback.
	CancelQueued
)

// SwitchReason says why the dispatcher changed mode. Its values are a fixed
// set, safe as a metric label; the measured values behind an automatic
// switch are in Stats.FallbackReason.
type SwitchReason string

// The reasons for a mode change.
const (
	// SwitchManual: SetMode was called.
	SwitchManual SwitchReason = "manual"
	// SwitchCoolDown: FallbackPolicy.ReturnAfter passed after an automatic
	// fallback, and the dispatcher returned to Async.
	SwitchCoolDown SwitchReason = "cool-down"
	// SwitchBacklog: FallbackPolicy.MaxBacklog was exceeded.
	SwitchBacklog SwitchReason = "backlog"
	// SwitchFailureRatio: FallbackPolicy.MaxFailureRatio was exceeded.
	SwitchFailureRatio SwitchReason = "failure-ratio"
	// SwitchQueueWait: FallbackPolicy.MaxQueueWaitP99 was exceeded.
	SwitchQueueWait SwitchReason = "queue-wait"
	// SwitchBreakerOpen: the breaker stayed open longer than
	// FallbackPolicy.MaxBreakerOpen.
	SwitchBreakerOpen SwitchReason = "breaker-open"
)

// SwitchReasons lists every SwitchReason, for callers that set up one
// counter per value.
func SwitchReasons() []SwitchReason {
	return []SwitchReason{SwitchManual, SwitchCoolDown, SwitchBacklog, SwitchFailureRatio, SwitchQueueWait, SwitchBreakerOpen}
}

// fallbackState is the fallback policy's running state, guarded by the
// Dispatcher's lock. Its windows count per finished call and per first
// start, so no observation allocates.
type fallbackState struct {
	p        FallbackPolicy
	calls    window // total: finished calls; failures: Failed ones
	waits    window // total: first starts; failures: those that waited over MaxQueueWaitP99
	next     int64  // next check
	returnAt int64  // automatic return to Async, if set
	reason   string
}

func newFallbackState(p FallbackPolicy) *fallbackState {
	return &fallbackState{p: p, calls: newWindow(p.Window), waits: newWindow(p.Window)}
}

func (f *fallbackState) finished(now int64, failed bool) {
	b := f.calls.at(now)
	b.total++
	if failed {
		b.failures++
	}
}

func (f *fallbackState) waited(now int64, wait time.Duration) {
	b := f.waits.at(now)
	b.total++
	if f.p.MaxQueueWaitP99 > 0 && wait > f.p.MaxQueueWaitP99 {
		b.failures++
	}
}

// checkFallback runs on the clock: every tenth of the window it checks the
// thresholds (switching to Sync when one is crossed) or, after an automatic
// fallback, whether the cool-down return is due.
func (d *Dispatcher[K, T]) checkFallback(now int64, ob *outbox[K, T]) {
	f := d.fb
	if now < f.next {
		d.armTimer(f.next)
		return
	}
	f.next = now + max(int64(f.p.Window)/windowBuckets, 1)
	d.armTimer(f.next)
	if d.mode == Sync {
		if f.returnAt != 0 && now >= f.returnAt {
			f.returnAt = 0
			d.switchMode(Async, SwitchCoolDown, ob)
		}
		return
	}
	if code, detail := d.fallbackReason(now); code != "" {
		f.reason = detail
		if f.p.ReturnAfter > 0 {
			f.returnAt = now + int64(f.p.ReturnAfter)
		}
		d.switchMode(Sync, code, ob)
	}
}

// fallbackReason says which threshold is exceeded, if any: a fixed code for
// the observer ("backlog", "failure-ratio", "queue-wait", "breaker-open"),
// which is safe as a metric label, and a detail with the measured values for
// Stats.FallbackReason.
func (d *Dispatcher[K, T]) fallbackReason(now int64) (code SwitchReason, detail string) {
	p := d.cfg.Fallback
	if p.MaxBacklog > 0 {
		if n := d.calls - d.running; n > p.MaxBacklog {
			return SwitchBacklog, fmt.Sprintf("backlog %d > %d", n, p.MaxBacklog)
		}
	}
	if p.MaxFailureRatio > 0 {
		s := d.fb.calls.sum(now)
		if s.total >= uint64(p.MinSamples) && float64(s.failures) > p.MaxFailureRatio*float64(s.total) {
			return SwitchFailureRatio, fmt.Sprintf("failure ratio %.3f > %.3f", float64(s.failures)/float64(s.total), p.MaxFailureRatio)
		}
	}
	if p.MaxQueueWaitP99 > 0 {
		// p99 > max exactly when more than 1% of the waits exceed max.
		s := d.fb.waits.sum(now)
		if s.total >= uint64(p.MinSamples) && float64(s.failures) > 0.01*float64(s.total) {
			return SwitchQueueWait, fmt.Sprintf("queue wait p99 > %v (%d of %d waits)", p.MaxQueueWaitP99, s.failures, s.total)
		}
	}
	if p.MaxBreakerOpen > 0 && d.br != nil && d.br.state != BreakerClosed {
		if open := time.Duration(now - d.br.since); open > p.MaxBreakerOpen {
			return SwitchBreakerOpen, fmt.Sprintf("breaker open for %v > %v", open, p.MaxBreakerOpen)
		}
	}
	return "", ""
}
