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

// forPost reads the clock for a Post and returns it with the Post's
// deadline (0: none): o's Deadline or Timeout, the earlier.
func (tb *timebase) forPost(o *SubmitOptions) (now, deadline int64) {
	now = tb.now()
	return now, within(tb.at(o.Deadline), now, o.Timeout)
}

// within is deadline (0: none) brought forward to timeout after now, if
// timeout is set (not 0) and that comes first; far timeouts saturate.
func within(deadline, now int64, timeout time.Duration) int64 {
	if timeout == 0 {
		return deadline
	}
	at := max(sat.Add(now, int64(timeout)), 1)
	if deadline == 0 || at < deadline {
		return at
	}
	return deadline
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
