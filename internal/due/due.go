// Package due keeps the times a dispatcher's clock must act at, one entry
// per duty, and the one timer that wakes the clock for the earliest.
//
// Every duty that needs the clock — a waiter's deadline, the end of a
// retry's backoff, a rate limiter's next token, the end of a server's
// Retry-After hold, the circuit breaker's cool-down, the fallback policy's
// next check, the key table's shrinking — records its time here with Set,
// which re-arms the timer if that time is earlier than the timer is set
// for. An entry leaves the list only through Take, which hands it to the
// clock to act on; the clock then records the duty's next time, if it
// still has one, and calls Rearm. So arming the timer for one duty can
// never make the clock forget another: after Rearm the timer is set no
// later than every entry left.
//
// A List is not safe for concurrent use: the dispatcher guards it with its
// lock.
package due

import "math"

// Never is the time of a duty with nothing due.
const Never = math.MaxInt64

// Duty is one kind of work the clock does at a time.
type Duty uint8

const (
	Expire  Duty = iota // end the waiters whose deadline passed
	Promote             // make ready the calls whose backoff ended
	Start               // wake a worker: a token is due, or a hold ended
	Probe               // the circuit breaker's cool-down ended: probe
	Check               // check the fallback policy's thresholds
	Shrink              // shrink the key table, if it has stayed sparse
	count
)

var names = [count]string{"expire", "promote", "start", "probe", "check", "shrink"}

func (d Duty) String() string {
	if d < count {
		return names[d]
	}
	return "duty(?)"
}

// Set is a set of duties.
type Set uint8

// Has reports whether d is in s.
func (s Set) Has(d Duty) bool { return s&(1<<d) != 0 }

// List is the clock's list of due times. Its zero value is not usable:
// create one with New.
type List struct {
	at    [count]int64 // per duty: act no later than this; Never: nothing
	armed int64        // when the timer fires; Never: it is not set
	arm   func(at int64) bool
}

// New returns an empty List whose timer arm sets to fire at a time, and
// reports whether it could (false: no timer yet; Rearm sets it later).
func New(arm func(at int64) bool) List {
	l := List{armed: Never, arm: arm}
	for i := range l.at {
		l.at[i] = Never
	}
	return l
}

// Set records that duty d must be done no later than at: its entry becomes
// the earlier of the two. The timer is re-armed if at is earlier than the
// timer is set for. A time earlier than needed costs a wake-up that finds
// nothing to do; a later one is never recorded over an earlier one.
func (l *List) Set(d Duty, at int64) {
	if at < l.at[d] {
		l.at[d] = at
	}
	if at < l.armed && l.arm(at) {
		l.armed = at
	}
}

// Take removes and returns the duties due at now, for the clock to act on,
// and forgets the timer, which has just fired.
func (l *List) Take(now int64) Set {
	l.armed = Never
	var s Set
	for d, at := range l.at {
		if at <= now {
			s |= 1 << d
			l.at[d] = Never
		}
	}
	return s
}

// Rearm sets the timer for the earliest entry, if it is not set for that
// or earlier already.
func (l *List) Rearm() {
	if at := l.Next(); at < l.armed && at != Never && l.arm(at) {
		l.armed = at
	}
}

// Next returns the earliest entry, or Never.
func (l *List) Next() int64 {
	next := int64(Never)
	for _, at := range l.at {
		next = min(next, at)
	}
	return next
}

// At returns duty d's entry, or Never.
func (l *List) At(d Duty) int64 { return l.at[d] }

// Armed returns when the timer is set to fire, or Never.
func (l *List) Armed() int64 { return l.armed }
