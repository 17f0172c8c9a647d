package dispatch

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/breaker"
)

// Circuit is the state of the circuit breaker (Config.Breaker).
type Circuit uint8

const (
	CircuitClosed   = Circuit(breaker.Closed)   // calls run; the only state without a breaker
	CircuitOpen     = Circuit(breaker.Open)     // no execution starts; queued calls wait
	CircuitHalfOpen = Circuit(breaker.HalfOpen) // probes run: a success closes, a failure opens
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

// BreakerPolicy configures the circuit breaker (Config.Breaker). It counts
// retryable failures only: the others say nothing of the API's health. A
// zero field means its default.
type BreakerPolicy struct {
	ConsecutiveFailures int // opens the circuit after this many in a row (default 5)
	// FailureRatio (default 0.5; math.Inf(1): off) opens it when failures
	// reach this fraction of the executions of the last Window (default
	// 10s), once there were MinSamples (default 20).
	FailureRatio float64
	Window       time.Duration
	MinSamples   int
	Cooldown     time.Duration // open before half-open (default 5s)
	Probes       int           // executions while half-open (default 1)
	// RefuseDroppable refuses droppable submissions for new keys with
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

// policy is p as the breaker takes it.
func (p *BreakerPolicy) policy() breaker.Policy {
	return breaker.Policy{
		ConsecutiveFailures: p.ConsecutiveFailures, FailureRatio: p.FailureRatio, MinSamples: p.MinSamples,
		Window: p.Window, Cooldown: p.Cooldown, Probes: p.Probes,
	}
}

// noteCircuit has ob tell the observer, if any, of the breaker's change ch.
func noteCircuit(obs Observer, ch breaker.Change, ob *notes) {
	if obs != nil && ch.Changed() {
		from, to := Circuit(ch.From), Circuit(ch.To)
		ob.add(func() { obs.OnCircuitChange(from, to) })
	}
}
