// Package fallback decides when a dispatcher falls back to its synchronous
// path by itself: it counts finished calls (and which failed) and first
// starts (and which waited too long) in sliding windows, and, checked every
// tenth of its window, reports a threshold crossed — backlog, failure
// ratio, queue-wait p99, time the circuit stayed open — or, after a
// fallback, that the cool-down return is due, unless the owner's mode was
// set by hand since (CancelReturn).
//
// While nothing it watches can change — asynchronous with no live call and
// no circuit held open, or synchronous with no return due — it parks, so
// that an idle owner need not wake, until Wake resumes it.
//
// A State takes times and facts and returns decisions and the next time
// to check; it keeps no timer. It is not safe for concurrent use: its
// owner guards it with its lock. Its windows count per observation, so no
// observation allocates.
package fallback

import (
	"fmt"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/window"
)

// Policy is a fallback's configuration, validated and with its defaults
// filled in by the owner; a zero threshold is not checked.
type Policy struct {
	Window          time.Duration // the span thresholds are measured over
	MaxBacklog      int           // more calls than this wait to run
	MaxQueueWaitP99 time.Duration // the window's p99 queue wait exceeds it
	MaxFailureRatio float64       // more than this fraction of finished calls failed
	MinSamples      int           // the ratios are judged from this many observations on
	MaxCircuitOpen  time.Duration // the circuit stayed not closed longer
	ReturnAfter     time.Duration // back to asynchronous this long after a fallback; 0: never by itself
}

// The reasons a switch is made, as the owner's observer is told them.
const (
	ReasonCoolDown     = "cool_down"     // Policy.ReturnAfter passed after a fallback
	ReasonBacklog      = "backlog"       // Policy.MaxBacklog was exceeded
	ReasonFailureRatio = "failure_ratio" // Policy.MaxFailureRatio was exceeded
	ReasonQueueWait    = "queue_wait"    // Policy.MaxQueueWaitP99 was exceeded
	ReasonCircuitOpen  = "circuit_open"  // Policy.MaxCircuitOpen was exceeded
)

// Switch is a check's decision.
type Switch uint8

const (
	Stay    Switch = iota // no change
	ToSync                // a threshold was crossed: fall back
	ToAsync               // the cool-down return is due
)

// Facts are what a check looks at besides its own windows.
type Facts struct {
	Sync         bool  // the owner runs synchronously now
	Live         int   // calls not finished
	Backlog      int   // calls waiting to run
	CircuitOpen  bool  // the circuit is not closed
	CircuitSince int64 // when it last left closed
}

// State is a fallback's running state. Its zero value is not usable:
// create one with New.
type State struct {
	p        Policy
	calls    window.Window // Total: finished calls; Marked: failed ones
	waits    window.Window // Total: first starts; Marked: those that waited over MaxQueueWaitP99
	next     int64         // next check
	returnAt int64         // automatic return to asynchronous, if set
	parked   bool          // no check is due until Wake
	reason   string
}

// New returns a State that has seen nothing.
func New(p Policy) *State {
	return &State{p: p, calls: window.New(p.Window), waits: window.New(p.Window)}
}

// Finished counts a finished call at now.
func (f *State) Finished(now int64, failed bool) {
	b := f.calls.At(now)
	b.Total++
	if failed {
		b.Marked++
	}
}

// Waited counts a first start at now that waited wait.
func (f *State) Waited(now int64, wait time.Duration) {
	b := f.waits.At(now)
	b.Total++
	if f.p.MaxQueueWaitP99 > 0 && wait > f.p.MaxQueueWaitP99 {
		b.Marked++
	}
}

// Reason is the measured values behind the last fallback ("" if none).
func (f *State) Reason() string { return f.reason }

// Parked reports whether no check is due until Wake.
func (f *State) Parked() bool { return f.parked }

// Start returns the time of the first check, for an owner starting at now.
func (f *State) Start(now int64) int64 {
	f.next = now + f.calls.Step()
	return f.next
}

// Due reports whether a check is due at now; if not, at is when it is (0:
// parked, nothing to arm).
func (f *State) Due(now int64) (due bool, at int64) {
	switch {
	case f.parked:
		return false, 0
	case now < f.next:
		return false, f.next
	}
	return true, 0
}

// Check, when Due, checks the thresholds (asynchronous) or the cool-down
// return (synchronous) at now, and returns the switch to make and its
// reason. The owner makes it, then asks Next.
func (f *State) Check(now int64, in Facts) (Switch, string) {
	f.next = sat.Add(now, f.calls.Step())
	if in.Sync {
		if f.returnAt != 0 && now >= f.returnAt {
			f.returnAt = 0
			return ToAsync, ReasonCoolDown
		}
		return Stay, ""
	}
	code, detail := f.crossed(now, in)
	if code == "" {
		return Stay, ""
	}
	f.reason = detail
	if f.p.ReturnAfter > 0 {
		f.returnAt = sat.Add(now, int64(f.p.ReturnAfter))
	}
	return ToSync, code
}

// CancelReturn drops the cool-down return a fallback armed, if any: the
// owner's mode was set by hand, and a person's choice is not undone by an
// earlier fallback's timer. A later fallback arms its own.
func (f *State) CancelReturn() { f.returnAt = 0 }

// Next returns the time of the next check after Check, or 0 if the
// fallback parks: in (as the switch left it) shows nothing it watches can
// change until a call is admitted or the mode is set. A cool-down return
// due before the next tenth of the window is checked when it is due.
func (f *State) Next(in Facts) int64 {
	idle := f.returnAt == 0
	if !in.Sync {
		idle = in.Live == 0 && !(in.CircuitOpen && f.p.MaxCircuitOpen > 0)
	}
	if idle {
		f.parked = true
		return 0
	}
	if in.Sync && f.returnAt < f.next {
		f.next = f.returnAt
	}
	return f.next
}

// Afresh forgets the calls and waits the windows counted: the owner went
// back to asynchronous, and the thresholds judge what happens from then
// on, not what made it fall back, which would switch it back at once.
func (f *State) Afresh() {
	f.calls, f.waits = window.New(f.p.Window), window.New(f.p.Window)
}

// Wake resumes a parked fallback at now (a call was admitted, or the mode
// went back to asynchronous): ok reports that it was parked, and at is
// its next check — at once, unless the last was less than a tenth of the
// window ago: a fallback undone at once (by an observer, say) is checked
// again at the pace of the window, not as often as it is undone.
func (f *State) Wake(now int64) (at int64, ok bool) {
	if !f.parked {
		return 0, false
	}
	f.parked = false
	f.next = max(f.next, now)
	return f.next, true
}

// crossed says which threshold is exceeded, if any: its reason, and a
// detail with the measured values.
func (f *State) crossed(now int64, in Facts) (code, detail string) {
	p := &f.p
	if p.MaxBacklog > 0 && in.Backlog > p.MaxBacklog {
		return ReasonBacklog, fmt.Sprintf("backlog %d > %d", in.Backlog, p.MaxBacklog)
	}
	if p.MaxFailureRatio > 0 {
		s := f.calls.Sum(now)
		if s.Total >= uint64(p.MinSamples) && float64(s.Marked) > p.MaxFailureRatio*float64(s.Total) {
			return ReasonFailureRatio, fmt.Sprintf("failure ratio %.3f > %.3f", float64(s.Marked)/float64(s.Total), p.MaxFailureRatio)
		}
	}
	if p.MaxQueueWaitP99 > 0 {
		// p99 > max exactly when more than 1% of the waits exceed max.
		s := f.waits.Sum(now)
		if s.Total >= uint64(p.MinSamples) && float64(s.Marked) > 0.01*float64(s.Total) {
			return ReasonQueueWait, fmt.Sprintf("queue wait p99 > %v (%d of %d waits)", p.MaxQueueWaitP99, s.Marked, s.Total)
		}
	}
	if p.MaxCircuitOpen > 0 && in.CircuitOpen {
		if open := time.Duration(now - in.CircuitSince); open > p.MaxCircuitOpen {
			return ReasonCircuitOpen, fmt.Sprintf("circuit open for %v > %v", open, p.MaxCircuitOpen)
		}
	}
	return "", ""
}
