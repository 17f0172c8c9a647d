package dispatch

import (
	"time"

	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/goid"
)

// This file is Sync mode's execution: a submission's call runs inline, in
// the goroutine that submitted it, through the same path a worker takes —
// begin, execute, endAttempt, retries through the delay index — with the
// caller sleeping out a backoff itself.

// runSyncUnlock runs ticket t's call inline (Sync mode) after its submission,
// event e, was accepted. It is called with the lock held and returns
// without it, once t has its outcome. Close waits for the caller until it
// has told what it holds — its submission's observer event, its call's
// completion hook and observer events — so that none of them runs after
// Close returns: the caller is registered as admitted (d.callers), and
// unregistered once told, or as a callback ends its goroutine, on the way
// out.
func (d *Dispatcher[K, T]) runSyncUnlock(t *Ticket[K, T], e Event, coalesced bool, ob *outbox[K, T]) {
	t.inline = true // no drain's cancellation ends its call (cancelQueued)
	id := goid.ID()
	d.callers.add(id)
	told := false
	defer func() {
		if !told {
			d.callerTold(id) // a callback ended the goroutine, which told the rest
		}
	}()
	if d.cfg.Observer != nil {
		// Told by deliver, which contains it: not through observe, whose
		// own containment would count a Goexit twice.
		ob.notes = append(ob.notes, note{kind: noteSubmit, e: e, coalesced: coalesced})
	}
	d.runInlineUnlock(t, id, ob) // releases the lock
	d.tell.deliver(ob)
	told = true
	d.callerTold(id)
	// The outcome is recorded; if a worker ran the call (a retry it picked
	// up first), it may still be telling the ticket.
	<-t.Done()
}

// callerTold unregisters Sync-mode caller id, which has told what it held
// (runSyncUnlock), and wakes Close, which may wait for it. It takes the
// lock itself.
func (d *Dispatcher[K, T]) callerTold(id uint64) {
	d.mu.Lock()
	d.callers.drop(id)
	d.wake.kick()
	d.mu.Unlock()
}

// awaitedInline reports whether a Sync-mode caller waits for c: one of its
// live tickets was submitted in Sync mode. It walks the tickets: cold
// paths only.
func (c *call[K, T]) awaitedInline() bool {
	inline := false
	c.eachTicket(func(t *Ticket[K, T]) { inline = inline || t.inline })
	return inline
}

// runsHere reports whether a Sync-mode submission for key would wait for
// the calling goroutine: key's call is running on it, or it runs the
// circuit breaker's half-open probe, which holds every other execution
// back until it ends.
func (d *Dispatcher[K, T]) runsHere(key K) bool {
	l := d.lanes.lookup(key)
	keyRuns := l != nil && l.running != nil && l.running.state == csRunning
	b := d.gate.breaker
	probes := b != nil && b.ProbeRunning()
	if !keyRuns && !probes {
		return false // the usual case, without reading the goroutine id
	}
	id := goid.ID()
	return keyRuns && l.running.exec.runner == id || probes && b.Probing(id)
}

// runInlineUnlock runs t's call in the caller's goroutine (Sync mode), with the
// lock held on entry, and returns with it released once t has its outcome.
// The call takes the same path as on a worker — begin, execute, finish,
// retries through the delay index — but the caller sleeps out a backoff
// itself. If the key's previous call is still running (or a worker took a
// retry first), the caller waits for it.
func (d *Dispatcher[K, T]) runInlineUnlock(t *Ticket[K, T], id uint64, ob *outbox[K, T]) {
	rn := runner{id: id}
	for !t.ended() {
		now := d.clk.now()
		d.expireDue(now, ob)
		d.q.promote(now)
		if t.ended() {
			break
		}
		c := t.c
		wait := time.Duration(-1) // until something changes
		switch c.state {
		case csReady:
			if c.unfinishable(&d.gate, now) {
				d.expireUnfinishable(c, now, ob) // finish takes it out of the ready index
				continue
			}
			if probe, ok := d.gate.mayStart(now, nil, &ob.notes); ok {
				d.q.remove(c)
				c.enter(csTaken)
				c.mark(fProbe, probe)
				d.runRelock(c, now, ob, &rn)
				continue
			}
			if d.gate.breaker.State() == breaker.Open {
				wait = time.Duration(d.gate.breaker.OpenUntil() - now)
			}
		case csDelayed:
			wait = time.Duration(c.notBefore() - now)
		}
		ch := d.wake.kicked()
		d.mu.Unlock()
		d.tell.deliver(ob)
		waitChange(ch, t.Done(), wait)
		d.mu.Lock()
	}
	d.mu.Unlock()
}

// waitChange waits until kicked or done is closed, or wait has passed
// (wait < 0: no limit).
func waitChange(kicked, done <-chan struct{}, wait time.Duration) {
	var timer <-chan time.Time
	if wait >= 0 {
		tm := time.NewTimer(wait)
		defer tm.Stop()
		timer = tm.C
	}
	select {
	case <-kicked:
	case <-done:
	case <-timer:
	}
}
