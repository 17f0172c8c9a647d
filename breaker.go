package dispatch

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// BreakerState is the state of the circuit breaker.
type BreakerState uint8

const (
	// BreakerClosed: calls run normally. The zero state, and the only one
	// when no breaker is configured.
	BreakerClosed BreakerState = iota
	// BreakerOpen: no execution starts; queued calls wait (their deadlines
	// still run) until the cool-down ends.
	BreakerOpen
	// BreakerHalfOpen: a limited number of probe executions may run; a
	// success closes the breaker, a retryable failure opens it again.
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", uint8(s))
}

// BreakerPolicy configures the circuit breaker (WithBreaker). It trips on
// retryable failures only: Permanent errors, Recompute, and cancellations
// say nothing about the API's health and are not counted. The zero value of
// each field means its default.
type BreakerPolicy struct {
	// ConsecutiveFailures trips the breaker after this many retryable
	// failures in a row (default 5).
	ConsecutiveFailures int
	// FailureRatio trips it when retryable failures reach this fraction of
	// counted executions in Window, once MinSamples were seen (default 0.5;
	// math.Inf(1) disables the ratio rule).
	FailureRatio float64
	// Window is the span FailureRatio is measured over (default 10s).
	Window time.Duration
	// MinSamples is the fewest executions in Window before FailureRatio
	// applies (default 20).
	MinSamples int
	// Cooldown is how long the breaker stays open before probing (default
	// 5s).
	Cooldown time.Duration
	// Probes is how many executions may run at once while half-open
	// (default 1).
	Probes int
	// RefuseDroppable makes submissions of droppable work for a new key
	// fail with ErrCircuitOpen while the breaker is open, instead of
	// queueing behind it.
	RefuseDroppable bool
	// OnChange, if set, is told of every state change, outside every lock.
	OnChange func(from, to BreakerState)
}

func (p BreakerPolicy) withDefaults() (BreakerPolicy, error) {
	switch {
	case p.ConsecutiveFailures < 0, p.MinSamples < 0, p.Probes < 0:
		return p, errors.New("dispatch: WithBreaker: counts must not be negative")
	case p.Window < 0, p.Cooldown < 0:
		return p, errors.New("dispatch: WithBreaker: durations must not be negative")
	case p.FailureRatio < 0 || math.IsNaN(p.FailureRatio) || (p.FailureRatio > 1 && !math.IsInf(p.FailureRatio, 1)):
		return p, fmt.Errorf("dispatch: WithBreaker: FailureRatio %v must be in (0, 1] or +Inf", p.FailureRatio)
	}
	if p.ConsecutiveFailures == 0 {
		p.ConsecutiveFailures = 5
	}
	if p.FailureRatio == 0 {
		p.FailureRatio = 0.5
	}
	if p.Window == 0 {
		p.Window = 10 * time.Second
	}
	if p.MinSamples == 0 {
		p.MinSamples = 20
	}
	if p.Cooldown == 0 {
		p.Cooldown = 5 * time.Second
	}
	if p.Probes == 0 {
		p.Probes = 1
	}
	return p, nil
}

// WithBreaker enables a circuit breaker: after sustained retryable failures
// it stops executions for a cool-down, then lets probes through before
// resuming. Without it, no breaker runs.
func WithBreaker(p BreakerPolicy) Option {
	return optionFunc(func(c *config) error {
		p, err := p.withDefaults()
		if err != nil {
			return err
		}
		c.breaker = &p
		return nil
	})
}

// breaker is the circuit breaker's state, guarded by the Dispatcher's lock.
type breaker struct {
	p         BreakerPolicy
	state     BreakerState
	consec    int   // retryable failures in a row
	openUntil int64 // while open: when to go half-open
	probes    int   // probes in flight while half-open
	since     int64 // when it last left Closed
	win       window
	obs       Observer
}

// admits reports whether an execution may start now, and counts it as a
// probe if half-open. It moves open → half-open when the cool-down is over.
func (b *breaker) admits(now int64, ob *notes) bool {
	switch b.state {
	case BreakerOpen:
		if now < b.openUntil {
			return false
		}
		b.set(BreakerHalfOpen, ob)
		fallthrough
	case BreakerHalfOpen:
		if b.probes >= b.p.Probes {
			return false
		}
		b.probes++
	}
	return true
}

// record counts an execution's end. probe says whether it was admitted as a
// half-open probe. counted is false for outcomes that say nothing about the
// API's health (Permanent, Recompute, cancellation), which only release the
// probe.
func (b *breaker) record(now int64, probe, counted, failed bool, ob *notes) {
	if probe && b.probes > 0 {
		b.probes--
	}
	if !counted {
		return
	}
	bk := b.win.at(now)
	bk.total++
	if !failed {
		b.consec = 0
		if b.state == BreakerHalfOpen {
			b.set(BreakerClosed, ob)
		}
		return
	}
	bk.failures++
	b.consec++
	switch b.state {
	case BreakerHalfOpen:
		b.trip(now, ob)
	case BreakerClosed:
		s := b.win.sum(now)
		if b.consec >= b.p.ConsecutiveFailures ||
			(s.total >= uint64(b.p.MinSamples) && float64(s.failures) >= b.p.FailureRatio*float64(s.total)) {
			b.trip(now, ob)
		}
	}
}

func (b *breaker) trip(now int64, ob *notes) {
	if b.state == BreakerClosed {
		b.since = now
	}
	b.openUntil = now + int64(b.p.Cooldown)
	b.consec = 0
	b.win = newWindow(b.p.Window)
	b.set(BreakerOpen, ob)
}

func (b *breaker) set(to BreakerState, ob *notes) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	if to == BreakerClosed {
		b.probes = 0
	}
	if f := b.p.OnChange; f != nil {
		*ob = append(*ob, func() { f(from, to) })
	}
	if o := b.obs; o != nil {
		*ob = append(*ob, func() { o.OnBreakerChange(from, to) })
	}
}

// notes are callbacks to run once the lock is released.
type notes []func()
