// Package breaker is a circuit breaker: it counts the executions that say
// something about a server's health and decides whether the next one may
// start. Closed, executions run; sustained retryable failures (in a row,
// or as a ratio of a sliding window) open it, and nothing starts until a
// cool-down has passed; then it is half-open and lets a few probes start,
// whose first verdict closes or re-opens it.
//
// It takes times and verdicts and returns decisions and state changes; it
// tells nobody and keeps no timer: the caller reports each Change and
// arranges to ask again at OpenUntil. A Breaker is not safe for concurrent
// use: its owner guards it with its lock.
package breaker

import (
	"slices"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/window"
)

// State is a breaker's state.
type State uint8

const (
	Closed   State = iota // executions run
	Open                  // no execution starts until the cool-down ends
	HalfOpen              // probes run: a success closes, a failure opens
)

// Policy is a breaker's configuration, validated and with its defaults
// filled in by the owner.
type Policy struct {
	ConsecutiveFailures int           // opens after this many retryable failures in a row
	FailureRatio        float64       // opens when failures reach this fraction of the window's executions...
	MinSamples          int           // ...once the window holds this many
	Window              time.Duration // the span FailureRatio is measured over
	Cooldown            time.Duration // open before half-open
	Probes              int           // executions at once while half-open
}

// Verdict is what an execution says about the server's health.
type Verdict uint8

const (
	// Ignored: nothing (a permanent error, a cancellation, no execution).
	Ignored Verdict = iota
	Healthy         // it succeeded
	Failed          // it failed retryably
)

// Change is a move between states; From == To means none.
type Change struct{ From, To State }

// Changed reports whether the state moved.
func (c Change) Changed() bool { return c.From != c.To }

// Breaker is a circuit breaker's state. Its zero value is not usable:
// create one with New.
type Breaker struct {
	p         Policy
	state     State
	consec    int      // retryable failures in a row
	openUntil int64    // while open: when to go half-open
	probes    int      // probes in flight while half-open
	probers   []uint64 // the runners of the probes in flight
	stale     []uint64 // the runners of probes admitted before it last closed
	since     int64    // when it last left Closed
	win       window.Window
}

// New returns a closed breaker.
func New(p Policy) *Breaker { return &Breaker{p: p, win: window.New(p.Window)} }

// State returns the current state.
func (b *Breaker) State() State { return b.state }

// StateAt returns the state an execution asking at now finds: half-open
// once an open breaker's cool-down is over, though the move is made, and
// its Change returned, only when Admit is asked.
func (b *Breaker) StateAt(now int64) State {
	if b.state == Open && now >= b.openUntil {
		return HalfOpen
	}
	return b.state
}

// OpenUntil is, while open, when the breaker goes half-open.
func (b *Breaker) OpenUntil() int64 { return b.openUntil }

// Since is when the breaker last left Closed.
func (b *Breaker) Since() int64 { return b.since }

// Admit reports whether an execution may start at now, and counts it as a
// probe if half-open (probe). It moves open → half-open once the cool-down
// is over, and returns that change.
func (b *Breaker) Admit(now int64) (ok, probe bool, ch Change) {
	from := b.state
	switch b.state {
	case Open:
		if now < b.openUntil {
			return false, false, Change{from, from}
		}
		b.set(HalfOpen)
		fallthrough
	case HalfOpen:
		if b.probes >= b.p.Probes {
			return false, false, Change{from, b.state}
		}
		b.probes++
		return true, true, Change{from, b.state}
	}
	return true, false, Change{from, from}
}

// StartProbe records that runner id (a goroutine) runs an admitted probe.
func (b *Breaker) StartProbe(id uint64) { b.probers = append(b.probers, id) }

// EndProbe releases the slot of the probe runner id ran, when its
// execution ends. A probe admitted before the breaker last closed has no
// slot left to release (closing freed them all): the probes of a later
// half-open round keep theirs.
func (b *Breaker) EndProbe(id uint64) {
	if i := slices.Index(b.probers, id); i >= 0 {
		b.probers = slices.Delete(b.probers, i, i+1)
	} else if i := slices.Index(b.stale, id); i >= 0 {
		b.stale = slices.Delete(b.stale, i, i+1)
		return
	}
	if b.probes > 0 {
		b.probes--
	}
}

// ProbeRunning reports whether a probe runs while the breaker holds other
// executions back.
func (b *Breaker) ProbeRunning() bool {
	return b.state != Closed && len(b.probers) > 0
}

// Probing reports whether runner id runs a probe while the breaker holds
// other executions back: an execution it waited for would wait for it.
func (b *Breaker) Probing(id uint64) bool {
	return b.state != Closed && slices.Contains(b.probers, id)
}

// Record counts an execution's verdict at now and returns the change it
// made: half-open → closed on a success, → open on a failure, or closed →
// open once failures are sustained.
func (b *Breaker) Record(now int64, v Verdict) Change {
	from := b.state
	if v == Ignored {
		return Change{from, from}
	}
	bk := b.win.At(now)
	bk.Total++
	if v == Healthy {
		b.consec = 0
		if b.state == HalfOpen {
			b.set(Closed)
		}
		return Change{from, b.state}
	}
	bk.Marked++
	b.consec++
	switch b.state {
	case HalfOpen:
		b.trip(now)
	case Closed:
		s := b.win.Sum(now)
		if b.consec >= b.p.ConsecutiveFailures ||
			(s.Total >= uint64(b.p.MinSamples) && float64(s.Marked) >= b.p.FailureRatio*float64(s.Total)) {
			b.trip(now)
		}
	}
	return Change{from, b.state}
}

func (b *Breaker) trip(now int64) {
	if b.state == Closed {
		b.since = now
	}
	b.openUntil = sat.Add(now, int64(b.p.Cooldown))
	b.consec = 0
	b.win = window.New(b.p.Window)
	b.set(Open)
}

func (b *Breaker) set(to State) {
	b.state = to
	if to == Closed {
		b.probes = 0
		b.stale = append(b.stale, b.probers...)
		b.probers = b.probers[:0]
	}
}
