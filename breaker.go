package dispatch

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/window"
)

// Circuit is the state of the circuit breaker.
type Circuit uint8

const (
	// CircuitClosed: calls run normally. The zero state, and the only one
	// when no breaker is configured.
	CircuitClosed Circuit = iota
	// CircuitOpen: no execution starts; queued calls wait (their deadlines
	// still run) until the cool-down ends.
	CircuitOpen
	// CircuitHalfOpen: a limited number of probe executions may run; a
	// success closes the breaker, a retryable failure opens it again.
	CircuitHalfOpen
)

func (s Circuit) String() string {
	switch s {
	case CircuitClosed:
		return "closed"
	case CircuitOpen:
		return "open"
	case CircuitHalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("circuit_%d", uint8(s))
}

// breaker is the circuit breaker's state, guarded by the Dispatcher's lock.
type breaker struct {
	p         *BreakerPolicy // the Dispatcher's validated copy
	state     Circuit
	consec    int      // retryable failures in a row
	openUntil int64    // while open: when to go half-open
	probes    int      // probes in flight while half-open
	probers   []uint64 // the goroutines running probes (Sync-mode reentrancy)
	since     int64    // when it last left Closed
	win       window.Window
	obs       Observer
}

// verdict is what an execution says about the API's health.
type verdict uint8

const (
	// verdictIgnored: nothing (a Permanent error, a Recompute, a
	// cancellation, or no execution at all).
	verdictIgnored verdict = iota
	verdictHealthy         // it succeeded
	verdictFailed          // it failed retryably
)

// admits reports whether an execution may start now, and counts it as a
// probe if half-open. It moves open → half-open when the cool-down is over.
func (b *breaker) admits(now int64, ob *notes) bool {
	switch b.state {
	case CircuitOpen:
		if now < b.openUntil {
			return false
		}
		b.set(CircuitHalfOpen, ob)
		fallthrough
	case CircuitHalfOpen:
		if b.probes >= b.p.Probes {
			return false
		}
		b.probes++
	}
	return true
}

// startProbe records that goroutine id runs a probe.
func (b *breaker) startProbe(id uint64) { b.probers = append(b.probers, id) }

// endProbe releases the slot of the probe goroutine id ran, when its
// execution ends.
func (b *breaker) endProbe(id uint64) {
	if b.probes > 0 {
		b.probes--
	}
	for i, p := range b.probers {
		if p == id {
			b.probers = append(b.probers[:i], b.probers[i+1:]...)
			break
		}
	}
}

// probeRunning reports whether a probe runs while the breaker holds other
// executions back.
func (b *breaker) probeRunning() bool {
	return b != nil && b.state != CircuitClosed && len(b.probers) > 0
}

// probing reports whether goroutine id runs a probe while the breaker holds
// other executions back: an execution it waited for would wait for it.
func (b *breaker) probing(id uint64) bool {
	if b == nil || b.state == CircuitClosed {
		return false
	}
	for _, p := range b.probers {
		if p == id {
			return true
		}
	}
	return false
}

// record counts an execution's end.
func (b *breaker) record(now int64, v verdict, ob *notes) {
	if v == verdictIgnored {
		return
	}
	bk := b.win.At(now)
	bk.Total++
	if v == verdictHealthy {
		b.consec = 0
		if b.state == CircuitHalfOpen {
			b.set(CircuitClosed, ob)
		}
		return
	}
	bk.Marked++
	b.consec++
	switch b.state {
	case CircuitHalfOpen:
		b.trip(now, ob)
	case CircuitClosed:
		s := b.win.Sum(now)
		if b.consec >= b.p.ConsecutiveFailures ||
			(s.Total >= uint64(b.p.MinSamples) && float64(s.Marked) >= b.p.FailureRatio*float64(s.Total)) {
			b.trip(now, ob)
		}
	}
}

func (b *breaker) trip(now int64, ob *notes) {
	if b.state == CircuitClosed {
		b.since = now
	}
	b.openUntil = sat.Add(now, int64(b.p.Cooldown))
	b.consec = 0
	b.win = window.New(b.p.Window)
	b.set(CircuitOpen, ob)
}

func (b *breaker) set(to Circuit, ob *notes) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	if to == CircuitClosed {
		b.probes = 0
	}
	if o := b.obs; o != nil {
		*ob = append(*ob, func() { o.OnCircuitChange(from, to) })
	}
}

// BreakerPolicy configures the circuit breaker (Config.Breaker). It counts
// retryable failures only: permanent errors, Recompute and cancellations
// say nothing of the API's health. The zero value of each field means its
// default. State changes reach Observer.OnCircuitChange.
type BreakerPolicy struct {
	// ConsecutiveFailures opens the circuit after this many retryable
	// failures in a row (default 5).
	ConsecutiveFailures int
	// FailureRatio opens it when retryable failures reach this fraction
	// of the executions of the last Window (default 10s), once there were
	// MinSamples (default 20). Default 0.5; math.Inf(1) disables the rule.
	FailureRatio float64
	Window       time.Duration
	MinSamples   int
	// Cooldown is how long the circuit stays open before probing (default
	// 5s); Probes is how many executions may run while half-open (default
	// 1).
	Cooldown time.Duration
	Probes   int
	// RefuseDroppable refuses droppable submissions for a new key with
	// ErrCircuitOpen while the circuit is open, instead of queueing them.
	RefuseDroppable bool
}

func (p *BreakerPolicy) validate() error {
	switch {
	case p.ConsecutiveFailures < 0:
		return fieldErr("Breaker.ConsecutiveFailures", p.ConsecutiveFailures, "must not be negative")
	case p.MinSamples < 0:
		return fieldErr("Breaker.MinSamples", p.MinSamples, "must not be negative")
	case p.Probes < 0:
		return fieldErr("Breaker.Probes", p.Probes, "must not be negative")
	case p.Window < 0:
		return fieldErr("Breaker.Window", p.Window, "must not be negative")
	case p.Cooldown < 0:
		return fieldErr("Breaker.Cooldown", p.Cooldown, "must not be negative")
	case p.FailureRatio < 0 || math.IsNaN(p.FailureRatio) || (p.FailureRatio > 1 && !math.IsInf(p.FailureRatio, 1)):
		return fieldErr("Breaker.FailureRatio", p.FailureRatio, "must be in (0, 1] or +Inf")
	}
	p.ConsecutiveFailures = cmp.Or(p.ConsecutiveFailures, 5)
	p.FailureRatio = cmp.Or(p.FailureRatio, 0.5)
	p.Window = cmp.Or(p.Window, 10*time.Second)
	p.MinSamples = cmp.Or(p.MinSamples, 20)
	p.Cooldown = cmp.Or(p.Cooldown, 5*time.Second)
	p.Probes = cmp.Or(p.Probes, 1)
	return nil
}
