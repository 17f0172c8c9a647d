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
