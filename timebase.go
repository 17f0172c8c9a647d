package dispatch

import (
	"time"

	"github.com/coalescer/dispatch/internal/sat"
)

// This file is the dispatcher's clock reading: the time base every time it
// compares is measured on, and the timer the due list arms.

// timebase is the dispatcher's clock: monotonic ns since an epoch, and
// the one timer the due list arms. Reading it needs no lock; the timer is
// the due list's, under the dispatcher's lock.
type timebase struct {
	epoch time.Time
	timer *time.Timer // nil until the goroutines start (launch)
}

// epochOffset puts the clock's origin before New, so that every time the
// dispatcher compares is positive, 0 can mean "no deadline", and a deadline
// from before New still compares as past.
const epochOffset = time.Hour

// now reads the clock once.
func (tb *timebase) now() int64 { return int64(time.Since(tb.epoch)) }

// at converts a wall-clock deadline to the clock; 0 means none.
func (tb *timebase) at(dl time.Time) int64 {
	if dl.IsZero() {
		return 0
	}
	return max(int64(dl.Sub(tb.epoch)), 1)
}

// deadline is o's deadline on the clock (0: none) for a submission made
// at now: the earlier of its Deadline and its Timeout after now; far
// timeouts saturate.
func (tb *timebase) deadline(o *SubmitOptions, now int64) int64 {
	dl := tb.at(o.Deadline)
	if o.Timeout == 0 {
		return dl
	}
	at := max(sat.Add(now, int64(o.Timeout)), 1)
	if dl == 0 || at < dl {
		return at
	}
	return dl
}

// wall converts a time on the clock to wall-clock time.
func (tb *timebase) wall(at int64) time.Time { return tb.epoch.Add(time.Duration(at)) }

// arm sets the timer to fire at at; it is the due list's arm function.
// Before the goroutines start there is no timer: launch arms it then.
func (tb *timebase) arm(at int64) bool {
	if tb.timer == nil {
		return false
	}
	tb.timer.Reset(time.Duration(at - tb.now()))
	return true
}
