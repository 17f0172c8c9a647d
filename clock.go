package dispatch

import (
	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/due"
)

// clock is the goroutine that acts on time: it wakes when the earliest
// entry of the due list (internal/due) comes, takes the duties that are
// due, and does each — expires waiters whose deadline passed, moves calls
// whose backoff ended to the ready index, wakes a worker for a token that
// is due or a hold that ended, lets the circuit breaker probe, checks the
// fallback policy, shrinks the key table once it has stayed sparse —
// recording each duty's next time, if it has one. The due list's timer is
// the one timer for all of them. Three other places keep timers of their
// own, none per queued call: an attempt under
// RetryPolicy.AttemptTimeout (attempt.go, the context package's timer), a
// Sync-mode caller waiting out a backoff or the breaker's cool-down
// (inline.go), and the back-off between failed Waits of a limiter that can
// only be waited on (ratelimit.go, internal/tokens). The clock runs no
// user code — it tells the waiters of what it ends, then hands the hooks
// and observer events to the notifier — so a slow callback cannot make a
// deadline late. It takes the lock itself.
func (d *Dispatcher[K, T]) clock() {
	defer d.clk.timer.Stop()
	var ob outbox[K, T]
	for {
		select {
		case <-d.clk.timer.C:
		case <-d.stopCh:
			return
		}
		d.mu.Lock()
		d.tick(d.clk.now(), &ob)
		d.due.Rearm()
		d.handOverUnlock(&ob)
	}
}

// tick does the duties that are due at now, recording each duty's next
// time, if it has one.
func (d *Dispatcher[K, T]) tick(now int64, ob *outbox[K, T]) {
	duties := d.due.Take(now)
	if duties.Has(due.Expire) {
		d.expireDue(now, ob)
		if at, ok := d.waiters.nextDue(); ok {
			d.due.Set(due.Expire, at)
		}
	}
	if duties.Has(due.Promote) {
		if n := d.q.promote(now); n > 0 {
			for range n {
				d.wake.worker()
			}
			d.wake.kick()
		}
		if c, ok := d.q.delayed.Min(); ok {
			d.due.Set(due.Promote, c.notBefore())
		}
	}
	if duties.Has(due.Check) {
		d.checkFallback(now, ob)
	}
	if duties.Has(due.Shrink) {
		if at, ok := d.lanes.shrinkDue(now); !ok {
			d.due.Set(due.Shrink, at)
		}
	}
	if duties.Has(due.Start) {
		// A token is due, or a hold has ended. The worker that looks
		// records the next time, if it still has to wait.
		d.wake.worker()
	}
	if b := d.gate.breaker; duties.Has(due.Probe) && b != nil && b.State() == breaker.Open {
		if now >= b.OpenUntil() {
			d.wake.worker() // to probe
		} else {
			d.due.Set(due.Probe, b.OpenUntil())
		}
	}
}

// expireDue ends every waiter whose deadline is at or before now.
func (d *Dispatcher[K, T]) expireDue(now int64, ob *outbox[K, T]) {
	for {
		c, t := d.waiters.popDue(now)
		if t != nil {
			d.dismiss(t, StateExpired, ErrExpired, now, ob)
			continue
		}
		if c == nil {
			return
		}
		// The posts aggregate: later submissions may have pushed its
		// deadline out since it was indexed.
		if c.posts.deadline > now {
			d.waiters.addPostsDue(c, c.posts.deadline)
			continue
		}
		d.waiters.settlePosts(c, StateExpired)
		if !c.waited() {
			d.finish(c, StateExpired, ErrExpired, now, ob)
			continue
		}
		d.q.reprioritize(c)
	}
}
