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
// queued. Calls in flight always run to their end.
type SwitchPolicy uint8

const (
	// SwitchDrain keeps running the queued calls on the workers until they
	// are done (SetMode waits for them until its ctx ends, then cancels the
	// rest with ErrFallback). It is the default.
	SwitchDrain SwitchPolicy = iota
	// SwitchCancel ends every queued call at once: waiters get Canceled with
	// ErrFallback.
	SwitchCancel
)

// WithMode sets the mode the dispatcher starts in (default Async): a
// feature gate's position at start-up.
func WithMode(m Mode) Option {
	return optionFunc(func(c *config) error {
		if m > Sync {
			return fmt.Errorf("dispatch: WithMode(%d): unknown mode", m)
		}
		c.mode = m
		return nil
	})
}

// WithSwitchPolicy sets what a switch to Sync does with queued calls
// (default SwitchDrain), for SetMode and the fallback policy alike.
func WithSwitchPolicy(p SwitchPolicy) Option {
	return optionFunc(func(c *config) error {
		if p > SwitchCancel {
			return fmt.Errorf("dispatch: WithSwitchPolicy(%d): unknown policy", p)
		}
		c.switchTo = p
		return nil
	})
}

// FallbackPolicy switches the dispatcher to Sync by itself when the async
// path is doing harm (WithFallback). Each threshold is checked over a sliding
// Window; a zero threshold is not checked. Crossing any one switches to Sync
// with the SwitchPolicy, records the reason (Stats.FallbackReason) and tells
// the observer.
type FallbackPolicy struct {
	// Window is the span the thresholds are measured over, and how often
	// they are checked (a tenth of it). Default 10s.
	Window time.Duration
	// MaxBacklog trips when this many calls are queued (not in flight).
	MaxBacklog int
	// MaxQueueWaitP99 trips when the 99th percentile of queue wait over the
	// window exceeds it.
	MaxQueueWaitP99 time.Duration
	// MaxFailureRatio trips when failed calls reach this fraction of the
	// calls finished in the window, once MinSamples have finished.
	MaxFailureRatio float64
	// MinSamples is the fewest finished calls before MaxFailureRatio and
	// MaxQueueWaitP99 apply (default 20).
	MinSamples int
	// MaxBreakerOpen trips when the circuit breaker has been open (or
	// half-open) for longer than this without closing.
	MaxBreakerOpen time.Duration
	// ReturnAfter, if set, switches back to Async this long after an
	// automatic fallback. Zero leaves the return to a person (SetMode).
	ReturnAfter time.Duration
}

func (p FallbackPolicy) withDefaults() (FallbackPolicy, error) {
	switch {
	case p.Window < 0, p.MaxQueueWaitP99 < 0, p.MaxBreakerOpen < 0, p.ReturnAfter < 0:
		return p, errors.New("dispatch: WithFallback: durations must not be negative")
	case p.MaxBacklog < 0, p.MinSamples < 0:
		return p, errors.New("dispatch: WithFallback: counts must not be negative")
	case p.MaxFailureRatio < 0 || p.MaxFailureRatio > 1 || p.MaxFailureRatio != p.MaxFailureRatio:
		return p, fmt.Errorf("dispatch: WithFallback: MaxFailureRatio %v must be in [0, 1]", p.MaxFailureRatio)
	case p.MaxBacklog == 0 && p.MaxQueueWaitP99 == 0 && p.MaxFailureRatio == 0 && p.MaxBreakerOpen == 0:
		return p, errors.New("dispatch: WithFallback: no threshold set")
	}
	if p.Window == 0 {
		p.Window = 10 * time.Second
	}
	if p.MinSamples == 0 {
		p.MinSamples = 20
	}
	return p, nil
}

// WithFallback enables automatic fallback to Sync (see FallbackPolicy).
func WithFallback(p FallbackPolicy) Option {
	return optionFunc(func(c *config) error {
		p, err := p.withDefaults()
		if err != nil {
			return err
		}
		c.fallback = &p
		return nil
	})
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
			d.switchMode(Async, "cool-down", ob)
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
func (d *Dispatcher[K, T]) fallbackReason(now int64) (code, detail string) {
	p := &d.fb.p
	if p.MaxBacklog > 0 {
		if n := d.calls - d.running; n > p.MaxBacklog {
			return "backlog", fmt.Sprintf("backlog %d > %d", n, p.MaxBacklog)
		}
	}
	if p.MaxFailureRatio > 0 {
		s := d.fb.calls.sum(now)
		if s.total >= uint64(p.MinSamples) && float64(s.failures) > p.MaxFailureRatio*float64(s.total) {
			return "failure-ratio", fmt.Sprintf("failure ratio %.3f > %.3f", float64(s.failures)/float64(s.total), p.MaxFailureRatio)
		}
	}
	if p.MaxQueueWaitP99 > 0 {
		// p99 > max exactly when more than 1% of the waits exceed max.
		s := d.fb.waits.sum(now)
		if s.total >= uint64(p.MinSamples) && float64(s.failures) > 0.01*float64(s.total) {
			return "queue-wait", fmt.Sprintf("queue wait p99 > %v (%d of %d waits)", p.MaxQueueWaitP99, s.failures, s.total)
		}
	}
	if p.MaxBreakerOpen > 0 && d.br != nil && d.br.state != BreakerClosed {
		if open := time.Duration(now - d.br.since); open > p.MaxBreakerOpen {
			return "breaker-open", fmt.Sprintf("breaker open for %v > %v", open, p.MaxBreakerOpen)
		}
	}
	return "", ""
}
