package dispatch

import (
	"github.com/coalescer/dispatch/internal/breaker"
	"time"

	"github.com/coalescer/dispatch/internal/due"
)

// clock is the goroutine that acts on time: it wakes when the earliest
// entry of the due list (internal/due) comes, takes the duties that are
// due, and does each — expires waiters whose deadline passed, moves calls
// whose backoff ended to the ready index, wakes a worker for a token that
// is due or a hold that ended, lets the circuit breaker probe, checks the
// fallback policy — recording each duty's next time, if it has one. The
// due list's timer is the dispatcher's one timer for all of them; the
// others it keeps are SetMode's wait for a drain and the back-off between
// failed Waits of a limiter that can only be waited on (ratelimit.go). The
// clock runs no user code — the hooks and observer events of what it ends
// go to the notifier — so a slow callback cannot make a deadline late. It
// takes the lock itself.
func (d *Dispatcher[K, T]) clock() {
	defer d.timer.Stop()
	var ob outbox[K, T]
	for {
		select {
		case <-d.timer.C:
		case <-d.stopCh:
			return
		}
		d.mu.Lock()
		now := d.now()
		duties := d.due.Take(now)
		if duties.Has(due.Expire) {
			d.expireDue(now, &ob)
			if w, ok := d.q.deadlines.Min(); ok {
				d.due.Set(due.Expire, w.at)
			}
		}
		if duties.Has(due.Promote) {
			if n := d.q.promote(now); n > 0 {
				for range n {
					d.wakeWorker()
				}
				d.kick()
			}
			if c, ok := d.q.delayed.Min(); ok {
				d.due.Set(due.Promote, c.notBefore)
			}
		}
		if duties.Has(due.Check) {
			d.checkFallback(now, &ob)
		}
		if duties.Has(due.Start) {
			// A token is due, or a hold has ended. The worker that looks
			// records the next time, if it still has to wait.
			d.wakeWorker()
		}
		if b := d.breaker; duties.Has(due.Probe) && b != nil && b.State() == breaker.Open {
			if now >= b.OpenUntil() {
				d.wakeWorker() // to probe
			} else {
				d.due.Set(due.Probe, b.OpenUntil())
			}
		}
		d.due.Rearm()
		d.handOff(&ob)
		d.mu.Unlock()
		d.deliver(&ob) // tickets only
	}
}

// armClock sets the due list's timer to fire at at; it is the list's arm
// function. Before the dispatcher starts there is no timer: start arms it
// then.
func (d *Dispatcher[K, T]) armClock(at int64) bool {
	if d.timer == nil {
		return false
	}
	d.timer.Reset(time.Duration(at - d.now()))
	return true
}

// expireDue ends every waiter whose deadline is at or before now.
func (d *Dispatcher[K, T]) expireDue(now int64, ob *outbox[K, T]) {
	for {
		w := d.q.popDeadline(now)
		if w == nil {
			return
		}
		if w.t != nil {
			d.leaveLocked(w.t, StateExpired, ErrExpired, now, ob)
			continue
		}
		// The posts aggregate: later submissions may have pushed its
		// deadline out since it was indexed.
		c := w.c
		if c.posts.deadline > now {
			d.q.addDeadline(w, c.posts.deadline)
			continue
		}
		d.settlePosts(c, StateExpired)
		if c.live() == 0 {
			d.finish(c, StateExpired, ErrExpired, now, ob)
			continue
		}
		d.reprioritize(c)
	}
}
