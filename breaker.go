package dispatch

import (
	"github.com/coalescer/dispatch/internal/due"

	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/window"
)

// Circuit is the state of the circuit breaker (Config.Breaker).
type Circuit uint8

const (
	CircuitClosed   Circuit = iota // calls run; the only state without a breaker
	CircuitOpen                    // no execution starts; queued calls wait
	CircuitHalfOpen                // probes run: a success closes, a failure opens
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

// breakerAdmits reports whether the circuit breaker lets an execution start
// now, and whether it runs as a half-open probe.
func (d *Dispatcher[K, T]) breakerAdmits(now int64, ob *outbox[K, T]) (probe, ok bool) {
	b := d.breaker
	if b == nil {
		return false, true
	}
	probe = b.state != CircuitClosed
	if !b.admits(now, &ob.notes) {
		if b.state == CircuitOpen {
			d.due.Set(due.Probe, b.openUntil)
		}
		return false, false
	}
	return probe, true
}

// breakerRecord tells the circuit breaker how an attempt of c ended. Only
// executions that say something about the API's health count: ones that
// ran, were not cut short by the call's own end, and succeeded or failed
// retryably.
func (d *Dispatcher[K, T]) breakerRecord(c *call[K, T], a *attempt[K, T], now int64, ob *outbox[K, T]) {
	b := d.breaker
	if b == nil {
		return
	}
	wasClosed := b.state == CircuitClosed
	v := verdictIgnored
	if a.ran && !c.orphan && !a.callDone {
		switch {
		case a.err == nil:
			v = verdictHealthy
		case a.class == ClassRetry:
			v = verdictFailed
		}
	}
	if c.probe {
		b.endProbe(c.runner)
		c.probe = false
	}
	b.record(now, v, &ob.notes)
	switch {
	case b.state == CircuitClosed && !wasClosed:
		d.cond.Broadcast() // resume every worker
	case b.state == CircuitOpen:
		d.due.Set(due.Probe, b.openUntil)
	}
}
