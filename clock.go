package dispatch

import (
	"math"
	"time"
)

const maxTime = math.MaxInt64

// clock is the dispatcher's one timer goroutine. It wakes at the earliest
// entry of the delay index or the deadline index, expires waiters whose
// deadline passed, and moves calls whose backoff ended to the ready index.
// Nothing else in the dispatcher sleeps or keeps a timer. It runs no user
// code — the hooks and observer events of what it ends go to the notifier —
// so a slow callback cannot make a deadline late. It takes the lock itself.
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
		d.timerAt = maxTime
		d.expireDue(now, &ob)
		if n := d.q.promote(now); n > 0 {
			for range n {
				d.wakeWorker()
			}
			d.kick()
		}
		if d.fallback != nil {
			d.checkFallback(now, &ob)
		}
		if d.startAt != 0 && now >= d.startAt {
			d.startAt = 0
			d.wakeWorker() // a token is due, or a hold has ended
		}
		if b := d.breaker; b != nil && b.state == CircuitOpen {
			if now >= b.openUntil {
				d.wakeWorker() // to probe
			} else {
				d.armTimer(b.openUntil)
			}
		}
		d.armTimer(d.q.nextWake())
		d.handOff(&ob)
		d.mu.Unlock()
		d.deliver(&ob) // tickets only
	}
}

// armTimer makes sure the timer fires no later than at. Called under the
// lock; it touches the timer only when at is earlier than what it is armed
// for, so a stream of submissions with later and later deadlines costs no
// timer operation.
func (d *Dispatcher[K, T]) armTimer(at int64) {
	if at >= d.timerAt || d.timer == nil {
		return
	}
	d.timerAt = at
	d.timer.Reset(time.Duration(at - d.now()))
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
